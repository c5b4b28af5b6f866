"""Messages in blocks: numpy and Arrow columns instead of one Python object per message.

At 100,000 messages a second the Spark connector cannot afford Python work
per message in the driver-side consumer. What nsqd sends in one read becomes
one :class:`Block`: the frames are found with one short loop over their size
fields, and everything else (ids, timestamps, attempts, the bodies as an
Arrow binary array, the FIN/TOUCH/REQ commands for a whole block, the ids
written into Spark's offsets) is done with array operations.

The message frame (see :mod:`nsqtw.core.message`)::

    [size int32][type int32 = 2][timestamp int64 ns][attempts uint16][id 16 bytes][body]

All integers are big-endian; ``size`` counts everything after itself.
"""

from __future__ import annotations

import base64
import struct
import zlib
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
import pyarrow as pa

from nsqtw.core.message import FRAME_TYPE_MESSAGE

ID_LEN = 16
#: bytes from the start of a frame to its message body (size, type, timestamp, attempts, id)
BODY_AT = 4 + 4 + 8 + 2 + ID_LEN
_FRAME = struct.Struct(">ii")

#: the Arrow schema Spark expects for the source's rows (timestamps are UTC microseconds)
ARROW_SCHEMA = pa.schema([
    ("id", pa.string()), ("body", pa.binary()), ("timestamp", pa.timestamp("us", tz="UTC")),
    ("attempts", pa.int32()), ("topic", pa.string()), ("channel", pa.string()),
    ("nsqd_address", pa.string()),
])

#: nsqd message ids as numpy holds them (16 ASCII bytes each)
IDS_DTYPE = np.dtype(f"S{ID_LEN}")


def scan_frames(buf: bytes | bytearray | memoryview) -> tuple[list[int], list[tuple[int, bytes]], int]:
    """Walk the complete frames at the start of ``buf``.

    Returns where the message frames start, the other frames as ``(type,
    data)`` (responses, heartbeats, errors), and how many bytes the complete
    frames take; an incomplete frame at the end is left for the next read.
    This loop is the only per-message Python work on the receiving side.
    """
    unpack = _FRAME.unpack_from
    end = len(buf)
    pos = 0
    starts: list[int] = []
    others: list[tuple[int, bytes]] = []
    last_size = -1
    while pos + 8 <= end:
        size, ftype = unpack(buf, pos)
        nxt = pos + 4 + size
        if nxt > end:
            break
        if ftype == FRAME_TYPE_MESSAGE:
            if size == last_size and size > 0 and (end - pos) // (size + 4) >= RUN_MIN:
                # a run of equal-sized messages (common: fixed-size records): check the
                # frame headers of the rest of the buffer at once and take the run whole
                run = _equal_run(buf, pos, size)
                starts.extend(range(pos, pos + run * (size + 4), size + 4))
                pos += run * (size + 4)
                last_size = -1
                continue
            starts.append(pos)
            last_size = size
        else:
            others.append((ftype, bytes(buf[pos + 8:nxt])))
            last_size = -1
        pos = nxt
    return starts, others, pos


#: equal-sized message frames worth checking as one run
RUN_MIN = 16
_HEADER_DTYPE = np.dtype([("size", ">i4"), ("type", ">i4")])


def _equal_run(buf: bytes | bytearray | memoryview, pos: int, size: int) -> int:
    """How many frames from ``pos`` on are message frames of ``size`` (at least the one at ``pos``)."""
    step = size + 4
    count = (len(buf) - pos) // step
    raw = np.frombuffer(buf, np.uint8, count=count * step, offset=pos).reshape(count, step)
    headers = np.ascontiguousarray(raw[:, :8]).view(_HEADER_DTYPE).ravel()
    good = (headers["size"] == size) & (headers["type"] == FRAME_TYPE_MESSAGE)
    return count if good.all() else max(1, int(np.argmin(good)))


def _gather(raw: np.ndarray, at: np.ndarray, width: int) -> np.ndarray:
    """The ``width`` bytes at each offset in ``at`` as an (n, width) C-contiguous array."""
    return raw[at[:, None] + np.arange(width)]


class Block:
    """Some messages from one connection, as columns.

    ``ids`` holds 16-byte ids (numpy ``S16``), ``timestamps`` nanoseconds,
    ``attempts`` nsqd's delivery counts, ``bodies`` an Arrow binary array.
    ``first_seq`` numbers the block's first message once it is in a batch
    (the rest follow on); ``touched`` is when the messages were last
    received or TOUCHed.
    """

    __slots__ = ("conn", "ids", "timestamps", "attempts", "bodies", "touched", "first_seq", "size")

    def __init__(self, conn: Any, ids: np.ndarray, timestamps: np.ndarray, attempts: np.ndarray,
                 bodies: pa.Array, touched: float, first_seq: int = 0) -> None:
        self.conn = conn
        self.ids = ids
        self.timestamps = timestamps
        self.attempts = attempts
        self.bodies = bodies
        self.touched = touched
        self.first_seq = first_seq
        #: bytes of message bodies
        self.size = _data_size(bodies)

    @classmethod
    def parse(cls, conn: Any, data: bytes, starts: Sequence[int], now: float) -> Block:
        """The messages whose frames start at ``starts`` in ``data`` (from :func:`scan_frames`)."""
        raw = np.frombuffer(data, np.uint8)
        at = np.asarray(starts, np.int64)
        sizes = _gather(raw, at, 4).view(">i4").ravel().astype(np.int64)
        timestamps = _gather(raw, at + 8, 8).view(">i8").ravel().astype(np.int64)
        attempts = _gather(raw, at + 16, 2).view(">u2").ravel().astype(np.int32)
        ids = _gather(raw, at + 18, ID_LEN).view(IDS_DTYPE).ravel()
        lengths = sizes - (BODY_AT - 4)
        if (lengths < 0).any():
            raise ValueError("message frame shorter than its header")
        n = len(at)
        body_from = at + BODY_AT
        if n and (sizes == sizes[0]).all() and int(sizes[0] + 4) * n == len(raw):
            # only message frames, all of one size (fixed-size records): a strided copy
            offsets = np.arange(n + 1, dtype=np.int32) * np.int32(lengths[0])
            data_buf = raw.reshape(n, -1)[:, BODY_AT:].ravel()
            bodies = pa.Array.from_buffers(pa.binary(), n, [None, pa.py_buffer(offsets), pa.py_buffer(data_buf)])
        else:
            # cut the bytes into [gap, body, gap, body...] as one Arrow array and keep every
            # second piece: Arrow copies the bodies together in one call
            cuts = np.empty(2 * n + 1, np.int32)
            cuts[0] = 0
            cuts[1::2] = body_from
            cuts[2::2] = body_from + lengths
            pieces = pa.Array.from_buffers(pa.binary(), 2 * n, [None, pa.py_buffer(cuts), pa.py_buffer(raw)])
            bodies = pieces.take(pa.array(np.arange(1, 2 * n, 2)))
        return cls(conn, ids, timestamps, attempts, bodies, now)

    def __len__(self) -> int:
        return len(self.ids)

    @property
    def last_seq(self) -> int:
        return self.first_seq + len(self.ids) - 1

    def slice(self, start: int, stop: int) -> Block:
        return Block(self.conn, self.ids[start:stop], self.timestamps[start:stop],
                     self.attempts[start:stop], self.bodies.slice(start, stop - start), self.touched,
                     self.first_seq + start)

    def select(self, mask: np.ndarray) -> Block:
        """The messages where ``mask`` is true (numbering starts afresh: only for pending blocks)."""
        return Block(self.conn, self.ids[mask], self.timestamps[mask], self.attempts[mask],
                     self.bodies.filter(pa.array(mask)), self.touched)

    def rows(self) -> list[tuple[bytes, bytes, int, int]]:
        """``(id, body, timestamp, attempts)`` per message: for tests and debugging, not the data path."""
        return list(zip(self.ids.tolist(), self.bodies.to_pylist(), self.timestamps.tolist(),
                        self.attempts.tolist(), strict=True))


def commands(verb: bytes, ids: np.ndarray, tail: bytes = b"\n") -> bytes:
    """``<verb> <id><tail>`` for every id, as one string (FIN, TOUCH, ``REQ ... 0``)."""
    n = len(ids)
    if n == 0:
        return b""
    head = verb + b" "
    out = np.empty((n, len(head) + ID_LEN + len(tail)), np.uint8)
    out[:, :len(head)] = np.frombuffer(head, np.uint8)
    out[:, len(head):len(head) + ID_LEN] = np.ascontiguousarray(ids).view(np.uint8).reshape(n, ID_LEN)
    out[:, len(head) + ID_LEN:] = np.frombuffer(tail, np.uint8)
    return out.tobytes()


# -- message ids in Spark's offsets ------------------------------------------

_HEX = b"0123456789abcdef"
_NIBBLE = np.full(256, 255, np.uint8)
_NIBBLE[np.frombuffer(_HEX, np.uint8)] = np.arange(16, dtype=np.uint8)
_SHIFTS = np.arange(60, -4, -4, dtype=np.uint64)


def encode_ids(ids: np.ndarray) -> str:
    """A compact text form of a set of message ids for an offset.

    nsqd's ids are 16 lowercase hex digits of a 64-bit number that grows by
    one per message within a millisecond: sorted and written as differences,
    they compress to well under a byte each (``x:`` + base64 of zlib). Other
    ids are sorted and compressed as they are (``z:``).
    """
    if len(ids) == 0:
        return ""
    raw = np.ascontiguousarray(ids).view(np.uint8).reshape(len(ids), ID_LEN)
    nibbles = _NIBBLE[raw]
    if (nibbles != 255).all():
        values = np.zeros(len(ids), np.uint64)
        for j in range(ID_LEN):
            values = (values << np.uint64(4)) | nibbles[:, j].astype(np.uint64)
        values.sort()
        deltas = np.diff(values, prepend=np.uint64(0))
        return "x:" + base64.b64encode(zlib.compress(deltas.astype("<u8").tobytes(), 6)).decode()
    return "z:" + base64.b64encode(zlib.compress(np.sort(ids).tobytes(), 6)).decode()


def decode_ids(text: str) -> np.ndarray:
    """The ids :func:`encode_ids` wrote (or plain concatenated ids, the older form); ValueError if garbled."""
    try:
        if text.startswith("x:"):
            deltas = np.frombuffer(zlib.decompress(base64.b64decode(text[2:], validate=True)), "<u8")
            values = np.cumsum(deltas.astype(np.uint64), dtype=np.uint64)
            hexed = np.frombuffer(_HEX, np.uint8)[((values[:, None] >> _SHIFTS) & np.uint64(15)).astype(np.intp)]
            return np.ascontiguousarray(hexed.astype(np.uint8)).view(IDS_DTYPE).ravel()
        if text.startswith("z:"):
            raw = zlib.decompress(base64.b64decode(text[2:], validate=True))
        else:
            raw = text.encode()
    except (zlib.error, ValueError) as e:
        raise ValueError(f"garbled message ids in an offset: {e}") from None
    if len(raw) % ID_LEN:
        raise ValueError("garbled message ids in an offset: length is not a multiple of 16")
    return np.frombuffer(raw, IDS_DTYPE).copy()


# -- Arrow record batches for Spark --------------------------------------------


def _repeat_string(value: str, n: int) -> pa.Array:
    data = value.encode() * n
    offsets = np.arange(n + 1, dtype=np.int32) * len(value.encode())
    return pa.Array.from_buffers(pa.string(), n, [None, pa.py_buffer(offsets), pa.py_buffer(data)])


def _ids_array(ids: np.ndarray) -> pa.Array:
    n = len(ids)
    offsets = np.arange(n + 1, dtype=np.int32) * ID_LEN
    data = np.ascontiguousarray(ids).tobytes()
    return pa.Array.from_buffers(pa.string(), n, [None, pa.py_buffer(offsets), pa.py_buffer(data)])


def to_record_batch(blocks: Iterable[Block], topic: str, channel: str) -> pa.RecordBatch:
    """One record batch with the source's schema holding every message of ``blocks``."""
    blocks = [b for b in blocks if len(b)]
    if not blocks:
        return pa.RecordBatch.from_pylist([], schema=ARROW_SCHEMA)
    n = sum(len(b) for b in blocks)
    ids = np.concatenate([b.ids for b in blocks])
    timestamps = np.concatenate([b.timestamps for b in blocks]) // 1000
    attempts = np.concatenate([b.attempts for b in blocks]).astype(np.int32)
    bodies = pa.concat_arrays([b.bodies for b in blocks])
    addresses = pa.concat_arrays([_repeat_string(b.conn.address, len(b)) for b in blocks])
    return pa.RecordBatch.from_arrays([
        _ids_array(ids), bodies, pa.array(timestamps, pa.timestamp("us", tz="UTC")),
        pa.array(attempts, pa.int32()), _repeat_string(topic, n), _repeat_string(channel, n), addresses,
    ], schema=ARROW_SCHEMA)


def to_ipc(batch: pa.RecordBatch) -> bytes:
    """Arrow's IPC stream form of ``batch``: how a partition's rows travel to the executor."""
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, batch.schema) as writer:
        writer.write_batch(batch)
    return sink.getvalue().to_pybytes()  # type: ignore[no-any-return]


def from_ipc(data: bytes) -> list[pa.RecordBatch]:
    return list(pa.ipc.open_stream(pa.py_buffer(data)))


# -- MPUB bodies built from Arrow arrays ---------------------------------------


def mpub_chunks(values: pa.Array, max_msg_size: int, max_body_size: int) -> list[tuple[int, int]]:
    """Split a binary array into ``[start, stop)`` runs whose MPUB body stays under ``max_body_size``.

    Raises ValueError naming the first row that is empty, null or over ``max_msg_size``.
    """
    n = len(values)
    if n == 0:
        return []
    lengths = _lengths(values)
    bad = np.flatnonzero((lengths == 0) | (lengths > max_msg_size))
    if len(bad):
        i = int(bad[0])
        if lengths[i] == 0:
            raise ValueError(f"row {i}: empty value (NSQ messages need a body of at least one byte)")
        raise ValueError(f"row {i}: value of {int(lengths[i])} bytes is over max_msg_size ({max_msg_size})")
    # each message costs 4 bytes of size plus its body; the MPUB body adds a 4-byte count
    ends = np.cumsum(lengths + 4)
    runs = []
    start = 0
    base = 0
    while start < n:
        stop = int(np.searchsorted(ends, base + max_body_size - 4, side="right"))
        stop = max(stop, start + 1)
        runs.append((start, stop))
        base = int(ends[stop - 1])
        start = stop
    return runs


def _offsets(values: pa.Array) -> np.ndarray:
    """The offsets of a (large) binary array's values, slice-aware."""
    wide = not pa.types.is_binary(values.type)
    dtype = np.int64 if wide else np.int32
    return np.frombuffer(values.buffers()[1], dtype, count=len(values) + 1,
                         offset=values.offset * np.dtype(dtype).itemsize)


def _data_size(values: pa.Array) -> int:
    if not len(values):
        return 0
    offsets = _offsets(values)
    return int(offsets[-1] - offsets[0])


def _lengths(values: pa.Array) -> np.ndarray:
    return np.diff(_offsets(values)).astype(np.int64)


def mpub_body(values: pa.Array) -> bytes:
    """The MPUB body for a binary array: ``[count][size][body][size][body]...`` built without a per-row loop."""
    n = len(values)
    offsets = _offsets(values)
    lengths = np.diff(offsets).astype(np.int64)
    data = np.frombuffer(values.buffers()[2], np.uint8)[int(offsets[0]):int(offsets[-1])]
    total = 4 + 4 * n + int(lengths.sum())
    out = np.empty(total, np.uint8)
    out[:4] = np.frombuffer(struct.pack(">I", n), np.uint8)
    size_at = 4 + np.arange(n, dtype=np.int64) * 4 + np.concatenate(([0], np.cumsum(lengths)[:-1]))
    is_size = np.zeros(total, np.bool_)
    is_size[(size_at[:, None] + np.arange(4)).ravel()] = True
    is_size[:4] = True
    out[4:][~is_size[4:]] = data
    out[(size_at[:, None] + np.arange(4)).ravel()] = lengths.astype(">u4").view(np.uint8)
    return out.tobytes()
