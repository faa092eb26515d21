"""HTTP edges of a direct instance answer the API's JSON errors at once, as nginx does in a cluster: a
transfer coding other than chunked (501), a chunk size no body can have (400), chunks announcing more than
serving.max_content_length (413), a path with "//" (404)."""

from __future__ import annotations

import json

import pytest
from gunicorn.http.body import ChunkedReader
from gunicorn.http.errors import InvalidChunkSize, UnsupportedTransferCoding
from gunicorn.http.unreader import IterUnreader

from mindspore_relaygr.config import ServingConfig
from serving.framing import MAX_CHUNK_SIZE, BoundedChunkedReader, ChunkedBodyTooLarge, check_transfer_coding
from serving.worker import error_body
from tests.serving.conftest import rank_body
from tests.serving.servers import FAKE_FACTORY, serve, tail
from tests.serving.test_error_shape import assert_json_error, exchange, port_of

# The instance's read timeouts are far longer than the client's, so a 408 could never arrive in time:
# each of these must be answered at once.
PATIENT = ("serving.client_timeout_s=120", "serving.request_timeout_s=120")


class FakeRequest:
    def __init__(self, transfer_encoding: str) -> None:
        self.headers = [("HOST", "x"), ("TRANSFER-ENCODING", transfer_encoding)]
        self.limit_request_field_size = 8190
        self.max_buffer_headers = 32768


@pytest.mark.parametrize("value", ["gzip, chunked", "deflate,chunked", "compress , chunked", "GZIP, chunked"])
def test_a_compressed_transfer_coding_is_refused_like_nginx(value):
    with pytest.raises(UnsupportedTransferCoding):
        check_transfer_coding(FakeRequest(value))
    assert error_body(501, UnsupportedTransferCoding(value))[1] == "Transfer-Encoding"


def test_plain_chunked_passes():
    check_transfer_coding(FakeRequest("chunked"))


def chunked_reader(data: bytes, max_body: int | None = None) -> ChunkedReader:
    return BoundedChunkedReader(FakeRequest("chunked"), IterUnreader([data]), max_body)


def test_a_chunk_size_over_the_largest_body_is_refused_once_its_line_is_read():
    with pytest.raises(InvalidChunkSize):
        chunked_reader(b"F" * 20 + b"\r\nabc").read(10)  # 20 hex digits: 2**80 bytes
    with pytest.raises(InvalidChunkSize):
        chunked_reader(b"%X\r\n" % (MAX_CHUNK_SIZE + 1)).read(10)
    assert chunked_reader(b"0000000000000000000005\r\nhello\r\n0\r\n\r\n").read(10) == b"hello"  # leading zeros


def test_chunks_announcing_more_than_the_body_limit_are_refused_once_the_size_line_is_read():
    with pytest.raises(ChunkedBodyTooLarge):
        chunked_reader(b"1001\r\n{", max_body=4096).read(10)  # one chunk over the limit
    with pytest.raises(ChunkedBodyTooLarge):  # two chunks that add up to more than the limit
        chunked_reader(b"800\r\n" + b"x" * 0x800 + b"\r\n801\r\n{", max_body=4096).read(5000)
    exact = b"800\r\n" + b"x" * 0x800 + b"\r\n800\r\n" + b"y" * 0x800 + b"\r\n0\r\n\r\n"
    assert len(chunked_reader(exact, max_body=4096).read(5000)) == 4096


@pytest.mark.slow
def test_an_instance_answers_framing_edges_in_json_at_once(tmp_path):
    with serve(tmp_path, "h0", engine_factory=FAKE_FACTORY, overrides=PATIENT) as (url, proc, log):
        port = port_of(url)
        head = b"POST /v1/rank HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        gzip = exchange(port, head + b"Transfer-Encoding: gzip, chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n")
        assert_json_error(gzip, 501, "Transfer-Encoding")
        assert gzip[1]["connection"] == "close"
        huge = exchange(port, head + b"Transfer-Encoding: chunked\r\n\r\n" + b"F" * 20 + b'\r\n{"user_id": ')
        assert "chunk size" in assert_json_error(huge, 400)["error"]
        assert huge[1]["connection"] == "close"
        limit = ServingConfig().max_content_length  # one chunk a byte over it, of which only the start is sent
        over = exchange(port, head + b"Transfer-Encoding: chunked\r\n\r\n%X\r\n{\"user_id\": " % (limit + 1))
        assert_json_error(over, 413, "body")
        assert over[1]["connection"] == "close"
        body = json.dumps(rank_body()).encode()
        slash = exchange(port, b"POST /v1//rank HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                               b"Connection: close\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
        assert_json_error(slash, 404)
        text = log.read_text()
        assert "Traceback" not in text and "[ERROR]" not in text, tail(log)
