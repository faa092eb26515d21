"""Request framing an instance refuses before its app runs, as nginx does in front of a cluster.

gunicorn accepts `Transfer-Encoding: gzip, chunked` and hands the app a body that is still compressed
(nginx: 501), and reads a chunk of any announced size, so `FFFFFFFFFFFFFFFFFFFF` (2**80 bytes) makes
it wait for data until the client's read timeout (nginx: 400, a size over its largest file offset), and
so do chunks announcing more than `serving.max_content_length` in all (nginx: 413 once the size is read).
"""

from __future__ import annotations

from typing import Any

from gunicorn.http.body import Body, ChunkedReader
from gunicorn.http.errors import InvalidChunkSize, ParseException, UnsupportedTransferCoding

MAX_CHUNK_SIZE = 2**63 - 1  # nginx's largest off_t; no body is longer


def check_transfer_coding(req: Any) -> None:
    """UnsupportedTransferCoding (501) unless every Transfer-Encoding header is plain `chunked`: a coding such as
    gzip would leave the body compressed for the app, which reads JSON."""
    for name, value in req.headers:
        if name == "TRANSFER-ENCODING" and any(c.strip(" \t").lower() != "chunked" for c in value.split(",")):
            raise UnsupportedTransferCoding(value)


class ChunkedBodyTooLarge(ParseException):
    """The chunks announced so far add up to more than the largest body the instance takes (a 413)."""

    def __init__(self, announced: int, limit: int) -> None:
        super().__init__()
        self.announced, self.limit = announced, limit

    def __str__(self) -> str:
        return f"chunks of {self.announced} bytes announced, over the {self.limit}-byte limit"


class BoundedChunkedReader(ChunkedReader):
    """gunicorn's chunked body reader, refusing a chunk size over MAX_CHUNK_SIZE (InvalidChunkSize) or chunks
    announcing more than `max_body` bytes in all (ChunkedBodyTooLarge) once the size line is read."""

    def __init__(self, req: Any, unreader: Any, max_body: int | None = None) -> None:
        super().__init__(req, unreader)
        self.max_body, self.announced = max_body, 0

    def parse_chunk_size(self, unreader: Any, data: bytes | None = None) -> tuple[int, bytes | None]:
        size, rest = super().parse_chunk_size(unreader, data)
        if size > MAX_CHUNK_SIZE:
            raise InvalidChunkSize(b"chunk size over %d bytes" % MAX_CHUNK_SIZE)
        self.announced += size
        if self.max_body is not None and self.announced > self.max_body:
            raise ChunkedBodyTooLarge(self.announced, self.max_body)
        return size, rest


def bound_chunks(req: Any, max_body: int | None = None) -> None:
    """Give a chunked request (nothing of its body read yet) a BoundedChunkedReader."""
    if isinstance(req.body, Body) and type(req.body.reader) is ChunkedReader:
        req.body = Body(BoundedChunkedReader(req, req.unreader, max_body))
