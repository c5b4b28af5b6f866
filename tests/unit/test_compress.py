"""The snappy and deflate stream codecs: nsqd's formats, bounded decoding, corrupt input refused."""

from __future__ import annotations

import os
import zlib

import snappy
from twisted.internet.testing import StringTransport
from twisted.trial.unittest import SynchronousTestCase
from zope.interface.verify import verifyObject

from nsqtw.interfaces import IStreamCodec
from nsqtw.protocol.compress import (
    READ_CHUNK,
    CodecError,
    CompressingTransport,
    DeflateCodec,
    SnappyCodec,
)

STREAM_ID = b"\xff\x06\x00\x00sNaPpY"


def read_all(codec) -> bytes:
    out = b""
    while True:
        piece = codec.read()
        if not piece:
            return out
        assert len(piece) <= READ_CHUNK
        out += piece


class SnappyCodecTests(SynchronousTestCase):
    def test_provides_interface(self) -> None:
        """Both codecs provide IStreamCodec."""
        self.assertTrue(verifyObject(IStreamCodec, SnappyCodec()))
        self.assertTrue(verifyObject(IStreamCodec, DeflateCodec(6)))

    def test_encoded_stream_decodes_with_python_snappy(self) -> None:
        """Writes form one framed stream: the identifier once, then chunks another decoder reads."""
        codec = SnappyCodec()
        parts = [b"hello " * 100, os.urandom(70000), b"x"]
        encoded = [codec.encode(p) for p in parts]
        self.assertTrue(encoded[0].startswith(STREAM_ID))
        self.assertFalse(encoded[1].startswith(STREAM_ID))
        d = snappy.StreamDecompressor()
        self.assertEqual(d.decompress(b"".join(encoded)), b"".join(parts))

    def test_decodes_client_stream_fed_bytewise(self) -> None:
        """A client's stream (stream identifier repeated per write, as pynsq sends) decodes in any chunking."""
        body = b"PUB t\n" + b"\x00\x00\x00\x05hello" + os.urandom(100000)
        wire = (snappy.StreamCompressor().compress(body[:50000])
                + snappy.StreamCompressor().compress(body[50000:]))
        codec = SnappyCodec()
        out = b""
        for i in range(0, len(wire), 997):
            codec.feed(wire[i:i + 997])
            out += read_all(codec)
        self.assertEqual(out, body)

    def test_skippable_and_padding_chunks_are_skipped(self) -> None:
        """Padding (0xfe) and reserved skippable chunks (0x80-0xfd) carry nothing."""
        codec = SnappyCodec()
        codec.feed(STREAM_ID + b"\xfe\x03\x00\x00abc" + b"\x80\x01\x00\x00z"
                   + SnappyCodec().encode(b"data")[len(STREAM_ID):])
        self.assertEqual(read_all(codec), b"data")

    def test_corrupt_input_is_refused(self) -> None:
        """A bad checksum, a missing identifier, an unskippable chunk or a huge chunk raise CodecError."""
        good = SnappyCodec().encode(b"some data to protect")
        bad_crc = bytearray(good)
        bad_crc[len(STREAM_ID) + 4] ^= 0xFF
        cases = {
            "checksum": bytes(bad_crc),
            "no stream identifier": good[len(STREAM_ID):],
            "bad identifier": b"\xff\x06\x00\x00sNaPpZ",
            "unskippable chunk": STREAM_ID + b"\x02\x01\x00\x00x",
            "oversized chunk": STREAM_ID + b"\x00\xff\xff\xff",
        }
        for name, data in cases.items():
            codec = SnappyCodec()
            codec.feed(data)
            with self.assertRaises(CodecError, msg=name):
                read_all(codec)

    def test_incomplete_chunk_waits(self) -> None:
        """Half a chunk gives nothing yet, and the rest completes it."""
        data = SnappyCodec().encode(b"abcdef" * 50)
        codec = SnappyCodec()
        codec.feed(data[:-3])
        self.assertEqual(codec.read(), b"")
        codec.feed(data[-3:])
        self.assertEqual(read_all(codec), b"abcdef" * 50)


class DeflateCodecTests(SynchronousTestCase):
    def test_each_write_decodes_at_once(self) -> None:
        """Every write ends in a sync flush: a raw-deflate reader decodes it without more input."""
        codec = DeflateCodec(3)
        reader = zlib.decompressobj(-zlib.MAX_WBITS)
        for part in (b"OK", b"message " * 1000, os.urandom(5000)):
            self.assertEqual(reader.decompress(codec.encode(part)), part)

    def test_decoding_is_bounded(self) -> None:
        """Ten megabytes that compress to a few kilobytes come out 64 KiB at a time."""
        c = zlib.compressobj(9, zlib.DEFLATED, -zlib.MAX_WBITS)
        wire = c.compress(b"\x00" * 10_000_000) + c.flush(zlib.Z_SYNC_FLUSH)
        self.assertLess(len(wire), 20_000)
        codec = DeflateCodec(6)
        codec.feed(wire)
        first = codec.read()
        self.assertEqual(len(first), READ_CHUNK)
        self.assertEqual(len(first) + len(read_all(codec)), 10_000_000)

    def test_corrupt_and_finished_streams_are_refused(self) -> None:
        """Garbage, and anything after the final block, raise CodecError."""
        codec = DeflateCodec(6)
        codec.feed(b"\xff\xff\xff\xff garbage")
        with self.assertRaises(CodecError):
            read_all(codec)
        c = zlib.compressobj(6, zlib.DEFLATED, -zlib.MAX_WBITS)
        finished = c.compress(b"bye") + c.flush()  # Z_FINISH: the final block
        codec = DeflateCodec(6)
        codec.feed(finished)
        self.assertEqual(read_all(codec), b"bye")
        codec.feed(b"more")
        with self.assertRaises(CodecError):
            read_all(codec)


class CompressingTransportTests(SynchronousTestCase):
    def test_writes_are_compressed_and_the_rest_passes_through(self) -> None:
        """write/writeSequence go through the codec; peer, producers and closing reach the real transport."""
        inner = StringTransport()
        transport = CompressingTransport(inner, DeflateCodec(6))
        transport.write(b"one")
        transport.writeSequence([b"two", b"three"])
        reader = zlib.decompressobj(-zlib.MAX_WBITS)
        self.assertEqual(reader.decompress(inner.value()), b"onetwothree")
        self.assertEqual(transport.getPeer(), inner.getPeer())
        transport.pauseProducing()
        self.assertEqual(inner.producerState, "paused")
        transport.loseConnection()
        self.assertTrue(inner.disconnecting)
