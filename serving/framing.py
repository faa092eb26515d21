"""Request framing an instance refuses before its app runs, as nginx does in front of a cluster.

gunicorn accepts `Transfer-Encoding: gzip, chunked` and hands the app a body that is still compressed
(nginx: 501), and reads a chunk of any announced size, so `FFFFFFFFFFFFFFFFFFFF` (2**80 bytes) makes
it wait for data until the client's read timeout (nginx: 400, a size over its largest file offset).
"""

from __future__ import annotations

from typing import Any

from gunicorn.http.body import Body, ChunkedReader
from gunicorn.http.errors import InvalidChunkSize, UnsupportedTransferCoding

MAX_CHUNK_SIZE = 2**63 - 1  # nginx's largest off_t; no body is longer


def check_transfer_coding(req: Any) -> None:
    """UnsupportedTransferCoding (501) unless every Transfer-Encoding header is plain `chunked`: a coding such as
    gzip would leave the body compressed for the app, which reads JSON."""
    for name, value in req.headers:
        if name == "TRANSFER-ENCODING" and any(c.strip(" \t").lower() != "chunked" for c in value.split(",")):
            raise UnsupportedTransferCoding(value)


class BoundedChunkedReader(ChunkedReader):
    """gunicorn's chunked body reader, refusing a chunk size over MAX_CHUNK_SIZE once its line is read."""

    def parse_chunk_size(self, unreader: Any, data: bytes | None = None) -> tuple[int, bytes | None]:
        size, rest = super().parse_chunk_size(unreader, data)
        if size > MAX_CHUNK_SIZE:
            raise InvalidChunkSize(b"chunk size over %d bytes" % MAX_CHUNK_SIZE)
        return size, rest


def bound_chunks(req: Any) -> None:
    """Give a chunked request (nothing of its body read yet) a BoundedChunkedReader."""
    if isinstance(req.body, Body) and type(req.body.reader) is ChunkedReader:
        req.body = Body(BoundedChunkedReader(req, req.unreader))
