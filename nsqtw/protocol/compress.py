"""Per-connection stream compression negotiated in IDENTIFY: snappy and deflate.

nsqd wraps a client's connection (after TLS, when both are on) in a snappy
*framed* stream (``github.com/golang/snappy`` Reader/Writer) or a raw
deflate stream (``compress/flate``, flushed after each write). The codecs
here speak the same formats; :class:`CompressingTransport` puts one in front
of the transport so every write of the protocol is compressed without the
protocol's write path knowing, and the protocol feeds what it reads through
``feed``/``read`` before parsing.
"""

from __future__ import annotations

import zlib
from typing import Any

from twisted.internet.interfaces import IAddress, ITransport
from zope.interface import implementer

from nsqtw.interfaces import IStreamCodec

__all__ = ["CodecError", "CompressingTransport", "DeflateCodec", "SnappyCodec"]

#: decoded bytes handed out per ``read`` (and snappy's largest chunk)
READ_CHUNK = 65536

_STREAM_ID = b"\xff\x06\x00\x00sNaPpY"
_CHUNK_COMPRESSED = 0x00
_CHUNK_UNCOMPRESSED = 0x01
_CHUNK_PADDING = 0xFE
_CHUNK_STREAM_ID = 0xFF
#: golang/snappy's bound on a chunk: the worst-case encoding of 64 KiB plus its checksum
_MAX_CHUNK = 32 + READ_CHUNK + READ_CHUNK // 6 + 4


class CodecError(Exception):
    """The peer sent bytes that are not a valid stream of the negotiated format."""


@implementer(IStreamCodec)
class SnappyCodec:
    """Snappy's framing format: a stream identifier, then CRC-checked chunks of at most 64 KiB."""

    name = "snappy"

    def __init__(self) -> None:
        # imported by the first snappy connection: cramjam's library is ~1.4 MB of RSS a node
        # whose clients never ask for snappy does without (docs/performance.md, Memory)
        from cramjam import snappy

        self._snappy = snappy
        self._started = False
        self._seen_stream_id = False
        self._buf = bytearray()

    def encode(self, data: bytes) -> bytes:
        if not data:
            return b""
        framed = bytes(self._snappy.compress(data))
        if self._started:
            return framed[len(_STREAM_ID):]  # the identifier opens the stream only once
        self._started = True
        return framed

    def feed(self, data: bytes) -> None:
        self._buf += data

    def read(self) -> bytes:
        buf = self._buf
        while len(buf) >= 4:
            kind = buf[0]
            size = buf[1] | buf[2] << 8 | buf[3] << 16
            if not self._seen_stream_id and kind != _CHUNK_STREAM_ID:
                raise CodecError("snappy: corrupt input (no stream identifier)")
            if size > _MAX_CHUNK:
                raise CodecError(f"snappy: chunk of {size} bytes is too large")
            if len(buf) < 4 + size:
                return b""
            chunk = bytes(buf[:4 + size])
            del buf[:4 + size]
            if kind == _CHUNK_STREAM_ID:
                if chunk != _STREAM_ID:
                    raise CodecError("snappy: corrupt input (bad stream identifier)")
                self._seen_stream_id = True
            elif kind == _CHUNK_COMPRESSED or kind == _CHUNK_UNCOMPRESSED:
                if size < 4:
                    raise CodecError("snappy: corrupt input (short chunk)")
                try:  # cramjam checks the CRC and the decoded length
                    out = bytes(self._snappy.decompress(_STREAM_ID + chunk))
                except Exception as e:  # cramjam.DecompressionError
                    raise CodecError(str(e)) from None
                if len(out) > READ_CHUNK:
                    raise CodecError("snappy: corrupt input (chunk decodes past 64 KiB)")
                if out:
                    return out
            elif kind < 0x80:
                raise CodecError(f"snappy: unsupported chunk type {kind:#x}")
            # padding (0xfe) and reserved skippable chunks (0x80-0xfd) carry nothing
        return b""


@implementer(IStreamCodec)
class DeflateCodec:
    """Raw deflate (no zlib header), each write ending in a sync flush as nsqd's flate writer."""

    name = "deflate"

    def __init__(self, level: int) -> None:
        self.level = level
        self._compress = zlib.compressobj(level, zlib.DEFLATED, -zlib.MAX_WBITS)
        self._decompress = zlib.decompressobj(-zlib.MAX_WBITS)
        self._pending = b""
        #: the last read stopped at the size limit: zlib may hold more output
        self._full = False

    def encode(self, data: bytes) -> bytes:
        c = self._compress
        return c.compress(data) + c.flush(zlib.Z_SYNC_FLUSH)

    def feed(self, data: bytes) -> None:
        self._pending += data

    def read(self) -> bytes:
        d = self._decompress
        while self._pending or self._full:
            if d.eof and self._pending:
                raise CodecError("flate: data after the final block")
            try:
                out = d.decompress(self._pending, READ_CHUNK)
            except zlib.error as e:
                raise CodecError(f"flate: corrupt input - {e}") from None
            self._pending = d.unconsumed_tail
            self._full = len(out) == READ_CHUNK
            if out:
                return out
        return b""


@implementer(ITransport)
class CompressingTransport:
    """A transport that compresses every write with a codec, and is the real one otherwise.

    Everything but ``write``/``writeSequence`` (producers, peer address,
    closing, the TLS handle) goes straight to the wrapped transport.
    """

    def __init__(self, transport: Any, codec: IStreamCodec) -> None:
        self.wrapped = transport
        self.codec = codec

    def write(self, data: bytes) -> None:
        self.wrapped.write(self.codec.encode(data))

    def writeSequence(self, data: Any) -> None:
        self.write(b"".join(data))

    def loseConnection(self) -> None:
        self.wrapped.loseConnection()

    def getPeer(self) -> IAddress:
        return self.wrapped.getPeer()  # type: ignore[no-any-return]

    def getHost(self) -> IAddress:
        return self.wrapped.getHost()  # type: ignore[no-any-return]

    def __getattr__(self, name: str) -> Any:
        return getattr(self.wrapped, name)
