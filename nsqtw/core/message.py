"""One NSQ message, its wire frame and nsqd's disk encoding.

The batch functions here run for every message published, delivered and
finished, so setup.py compiles this module with mypyc where it can
(nsqtw/speedups.py): compiled, :class:`Message` is a native class whose
fields the functions here read and write in place, and the big-endian
fields go through librt's ``BytesWriter`` and readers without a Python
call. The same source runs as plain Python where it is not compiled
(``.ci/run`` runs tests/unit/test_message.py against both).
"""

from __future__ import annotations

import binascii
import struct
from collections.abc import Callable, Sequence
from typing import Any, Final

from librt.strings import BytesWriter, read_i64_be, write_i32_be, write_i64_be

from nsqtw import speedups

MSG_ID_LENGTH: Final = 16
#: timestamp (8) + attempts (2) + id (16): the smallest valid encoded message.
MIN_VALID_MSG_LENGTH: Final = 8 + 2 + MSG_ID_LENGTH

FRAME_TYPE_RESPONSE: Final = 0
FRAME_TYPE_ERROR: Final = 1
FRAME_TYPE_MESSAGE: Final = 2

_HEADER: Final = struct.Struct(">qH")
_FRAME_HEADER: Final = struct.Struct(">ii")
_ID: Final = struct.Struct(">Q")
#: an ID value is below this (64 bits)
_ID_LIMIT: Final = 1 << 64
#: where a MESSAGE frame's ID starts: after its size (4), its type (4), the timestamp (8), the attempts (2)
_FRAME_ID_START: Final = 4 + 4 + 8 + 2
_FRAME_ID_END: Final = _FRAME_ID_START + MSG_ID_LENGTH
#: about how many bytes of MESSAGE frames :func:`frames` puts in one piece (a write)
WIRE_PIECE: Final = 16 * 1024


class Message:
    """A message as a topic or channel holds it.

    Its ID and body are kept as one ``bytes``, ``data`` (the 16-byte ID, then
    the body), laid out as in nsqd's encoding and MESSAGE frame, so neither
    needs more than one concatenation, and a queued message costs one bytes
    object instead of two: a million held 200-byte messages take about 60 MB
    less (docs/performance.md, "Memory"). ``id`` is sliced out only when
    something asks for it: the channel sets it as it hands messages out
    (``Channel._deliver``); anything else that reads ``m.id`` first
    gets it through ``__getattr__``, which caches it.

    Only atoms hang off a queued message (ints, floats and bytes), and the
    delivery fields are reset when it leaves flight, so queues hold no
    reference cycles for the garbage collector to chase. Six slots keep the
    object at 80 bytes with the collector's header (seven or eight would
    take 96); compiled, a native class has a pointer more (88).
    """

    __slots__ = ("data", "id", "timestamp", "attempts", "client", "deadline")

    data: bytes
    id: bytes
    timestamp: int
    attempts: int
    client: Any
    deadline: float

    def __init__(self, data: bytes, timestamp: int, attempts: int = 0, deadline: float = 0.0) -> None:
        self.data = data
        #: nanoseconds since the Unix epoch when it was published
        self.timestamp = timestamp
        self.attempts = attempts
        #: while in flight: the consumer it was sent to
        self.client = None
        #: While in flight or deferred: when that ends (reactor seconds). Before a
        #: channel has queued it: the DPUB delay in seconds (0 for none), which the
        #: channel turns into a due time as it takes the message.
        self.deadline = deadline

    def __getattr__(self, name: str) -> bytes:
        # only reached while the ``id`` slot is unset
        if name == "id":
            mid = self.id = self.data[:MSG_ID_LENGTH]
            return mid
        raise AttributeError(name)

    @property
    def body(self) -> bytes:
        """The body (a copy: for the rare reader, the hot paths use ``data``)."""
        return self.data[MSG_ID_LENGTH:]

    def copy(self) -> Message:
        """A copy for another channel: same id, body, timestamp and DPUB delay."""
        return Message(self.data, self.timestamp, self.attempts, self.deadline)

    def encode(self) -> bytes:
        """nsqd's encoding, used on disk and inside a MESSAGE frame."""
        return _HEADER.pack(self.timestamp, self.attempts) + self.data

    def frame(self) -> bytes:
        """The complete MESSAGE frame (size, type, encoded message)."""
        return frames([self])[0]

    def __repr__(self) -> str:
        return f"<Message {self.id.decode('ascii', 'replace')} attempts={self.attempts}>"


def decode_message(data: bytes) -> Message:
    """Parse nsqd's encoding; raises ValueError when it is too short."""
    if len(data) < MIN_VALID_MSG_LENGTH:
        raise ValueError(f"invalid message buffer size ({len(data)})")
    timestamp, attempts = _HEADER.unpack_from(data)
    return Message(bytes(data[10:]), timestamp, attempts)


def decode_messages(records: list[bytes], bad: Callable[[ValueError], object]) -> list[Message]:
    """Parse a run of records read from a disk queue; a bad one is reported to ``bad`` and skipped.

    This runs for every message a topic or channel reads back from disk: a
    run of good records is decoded in one go (:func:`_decode_run`); only a
    run with a bad record in it goes one record at a time.
    """
    run = _decode_run(records)
    if run is not None:
        return run
    out = []
    for data in records:
        try:
            out.append(decode_message(data))
        except ValueError as e:
            bad(e)
    return out


def _decode_run(records: list[bytes]) -> list[Message] | None:
    """Every record decoded, or None when one is too short: one length check, one comprehension."""
    if records and min(map(len, records)) < MIN_VALID_MSG_LENGTH:
        return None
    return [Message(data[10:], read_i64_be(data, 0), data[8] << 8 | data[9]) for data in records]


def new_messages(values: Sequence[int], bodies: list[bytes], timestamp: int, delay: float = 0.0,
                 ) -> list[Message]:
    """Freshly published messages from their ID values (``b"%016x" % value``) and bodies.

    Each message's data is its ID then its body, formatted in one step.
    ``delay`` is a DPUB's delay in seconds (see :attr:`Message.deadline`).
    """
    if len(bodies) == 1 and len(values) == 1 and 0 <= values[0] < _ID_LIMIT:
        # a PUB: one format, without the batch's pack and hexlify (checked as they would be)
        return [Message(b"%016x%b" % (values[0], bodies[0]), timestamp, 0, delay)]
    ids = _hex_ids(values, bodies)
    out: list[Message] = []
    i = 0
    for body in bodies:  # (compiled, an index stepped by hand beats enumerate's tuples)
        out.append(Message(ids[i:i + 16] + body, timestamp, 0, delay))
        i += 16
    return out


def encode_new(timestamp: int, values: Sequence[int], bodies: list[bytes]) -> list[bytes]:
    """nsqd's encoding of freshly published messages, made straight from their ID values and bodies.

    What ``Message(b"%016x%b" % (value, body), timestamp).encode()`` gives for
    each, without the Message: a topic writes every message past its
    ``--mem-queue-size`` to its backend so (:meth:`Topic.publish`). A fresh
    message's attempts are 0, so the ten-byte header is the same for the
    whole batch, and so is the part of the IDs :func:`_id_digits` finds
    shared: each record is that start, the rest of its ID and its body.
    The bodies are a list, not any sequence: compiled, a list's items are
    read without a Python call.
    """
    if len(bodies) == 1:  # a PUB: nothing to share, the batch's work is the message's
        return [_HEADER.pack(timestamp, 0) + _hex_ids(values, bodies) + bodies[0]]
    prefix, rest, width = _id_digits(values, bodies)
    start = _HEADER.pack(timestamp, 0) + prefix  # attempts 0
    out: list[bytes] = []
    i = 0
    for body in bodies:  # (compiled, an index stepped by hand beats enumerate's tuples: 67 against 116 ns)
        out.append(start + rest[i:i + width] + body)
        i += width
    return out


#: ``000`` to ``fff`` back to back: the last three hex digits of the IDs of one millisecond
_HEX3: Final = b"".join(b"%03x" % i for i in range(4096))


def _id_digits(values: Sequence[int], bodies: list[bytes]) -> tuple[bytes, bytes, int]:
    """The 16 hex digits of every ID value as a prefix they all share, then the rest of each,
    back to back, each ``width`` long.

    The IDs of one publish are usually one ``range`` within one millisecond
    (:meth:`nsqtw.core.guid.GUIDFactory.new_values`): they differ only in
    the last three digits, which are a slice of :data:`_HEX3`, so the batch
    needs one format for its prefix and nothing per message. Any other
    values get all 16 digits each (:func:`_hex_ids`). Errors as
    :func:`_hex_ids` gives them.
    """
    n = len(values)
    if isinstance(values, range) and n and n == len(bodies) and values.step == 1:
        first = values.start
        low = first & 0xFFF
        if first >= 0 and values.stop <= _ID_LIMIT and low + n <= 4096:
            return b"%013x" % (first >> 12), _HEX3[3 * low:3 * (low + n)], 3
    return b"", _hex_ids(values, bodies), 16


def _hex_ids(values: Sequence[int], bodies: list[bytes]) -> bytes:
    """The 16 hex digits (``b"%016x"``) of every ID value, back to back: one ``struct`` pack and
    one hexlify for the batch, where formatting each ID on its own cost more than the rest of
    a message's encoding. ValueError unless there is one value per body; OverflowError for
    a value outside 64 bits."""
    if len(values) != len(bodies):  # as zip(..., strict=True) would say
        raise ValueError(f"{len(values)} ID values for {len(bodies)} bodies")
    try:
        # one message (a PUB) needs no format made for its count
        packed = _ID.pack(values[0]) if len(values) == 1 else struct.pack(f">{len(values)}Q", *values)
    except struct.error:
        bad = next(v for v in values if not 0 <= v < _ID_LIMIT)
        raise OverflowError(f"message ID value out of range ({bad})") from None
    return binascii.hexlify(packed)


def record_id(data: bytes) -> bytes:
    """The message ID inside nsqd's encoding, without decoding the rest."""
    return data[10:10 + MSG_ID_LENGTH]


def frames(messages: list[Message]) -> list[bytes]:
    """The MESSAGE frames of a batch, back to back, in pieces to write in turn (none for no messages).

    Each frame is its size, its type, the timestamp, the attempts and the
    data; the numbers are big-endian as ``struct``'s ``>iiqH`` writes them,
    and one out of its field's range raises (OverflowError or ValueError).

    A piece ends with the frame that takes it to :data:`WIRE_PIECE` bytes or
    past (a frame is never split); the pieces go out in one gathered send
    (``EagerServer.writeSequence``). A consumer at RDY 2500 is handed half a
    megabyte at once, and nsqd keeps glibc's mmap threshold at 128 KiB
    (:func:`nsqtw.heap.return_big_blocks`): as one buffer it got pages of
    its own, faulted in one by one as it filled (about 300,000 faults in
    six seconds of ``bench_reader``, a tenth of the read path's CPU).
    Pieces this size come from the heap and are used again.
    """
    pieces: list[bytes] = []
    out = _FRAMES_OUT
    out.truncate(0)
    for m in messages:
        data = m.data
        write_i32_be(out, 14 + len(data))
        write_i32_be(out, FRAME_TYPE_MESSAGE)
        write_i64_be(out, m.timestamp)
        attempts = m.attempts
        if not 0 <= attempts <= 0xFFFF:
            raise OverflowError(f"attempts out of range ({attempts})")
        out.append(attempts >> 8)
        out.append(attempts & 0xFF)
        if len(data) > WIRE_PIECE:  # joined outside the buffer, whose size stays under 2 pieces
            pieces.append(out.getvalue() + data)
            out.truncate(0)
            continue
        out.write(data)
        if len(out) >= WIRE_PIECE:
            pieces.append(out.getvalue())
            out.truncate(0)
    if len(out):
        pieces.append(out.getvalue())
    out.truncate(0)
    return pieces


def frame_ids(data: bytes) -> list[bytes]:
    """The message IDs in MESSAGE frames written back to back (:func:`frames`' pieces, joined)."""
    ids: list[bytes] = []
    pos = 0
    while pos + _FRAME_ID_END <= len(data):
        ids.append(data[pos + _FRAME_ID_START:pos + _FRAME_ID_END])
        pos += 4 + int.from_bytes(data[pos:pos + 4], "big")
    return ids


#: :func:`frames`' buffer, used again by every call (the reactor's thread alone writes frames;
#: it never holds two pieces): a fresh one grew by doubling for each piece, and those copies were
#: a third of the read path's ``memcpy``
_FRAMES_OUT: Final = BytesWriter()


def copy_messages(messages: list[Message]) -> list[Message]:
    """Each message copied (:meth:`Message.copy`): a channel's own, from ones its topic shared."""
    return [Message(m.data, m.timestamp, m.attempts, m.deadline) for m in messages]


def message_ids(messages: list[Message]) -> list[bytes]:
    """Each message's ID, sliced out of its data: a channel does it once per delivery."""
    return [m.data[:MSG_ID_LENGTH] for m in messages]


def start_flight(messages: list[Message], ids: list[bytes], client: Any, deadline: float) -> None:
    """A batch handed to ``client``: each message's ID set, attempts + 1, client and deadline.

    nsqd counts an attempt as it sends a message, and its uint16 wraps.
    """
    for m, mid in zip(messages, ids, strict=True):
        m.id = mid
        m.attempts = (m.attempts + 1) & 0xFFFF
        m.client = client
        m.deadline = deadline


def end_flight(live: dict[bytes, Message], client: Any, ids: list[bytes],
               timestamps: list[int] | None) -> list[tuple[bytes, str]]:
    """A run of FINs from ``client``: each message out of ``live``, its client cleared.

    The finished messages' timestamps are appended to ``timestamps`` unless
    it is None (for the end-to-end latency). Returns the IDs that could not
    be finished, each with nsqd's reason. A consumer FINs every message it
    gets, so this runs once per message delivered; the counting is left to
    the caller, once per run.
    """
    failed = []
    for msg_id in ids:
        msg = live.get(msg_id)
        if msg is None or msg.client is not client:
            failed.append((msg_id, "ID not in flight" if msg is None else "client does not own message"))
            continue
        del live[msg_id]
        msg.client = None
        if timestamps is not None:
            timestamps.append(msg.timestamp)
    return failed


#: whether this module is the compiled build (``nsqtw-bench compare`` prints it)
SPEEDUPS: Final = speedups.IN_USE


def frame(frame_type: int, data: bytes) -> bytes:
    """A response or error frame."""
    return _FRAME_HEADER.pack(len(data) + 4, frame_type) + data
