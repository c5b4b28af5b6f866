"""The replication link's records, their kinds and encodings in one table.

A record on the wire is a 4-byte big-endian length (of what follows), a
kind byte, then its payload. Control records carry a small JSON object;
the two that carry messages or IDs (``PUB``, ``FIN``) are packed binary,
as they are most of the link's bytes. Records are numbered implicitly per
direction (the first one a side sends is 1): an ``ACK`` names the highest
number its sender has taken in.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from enum import IntEnum
from typing import Any, Final

__all__ = ["MESSAGE_HEADER", "Kind", "PubMessage", "decode_ack", "decode_fin", "decode_json", "decode_pub",
           "decode_need", "decode_snap", "decode_snap_ids", "encode_ack", "encode_fin", "encode_json", "encode_need",
           "encode_pub", "encode_snap", "encode_snap_ids", "encode_taken", "frame", "select_messages",
           "frame_pub", "index_messages", "pub_messages", "read_messages", "split_pub", "split_records"]

_LEN: Final = struct.Struct(">I")
_U16: Final = struct.Struct(">H")
_ACK: Final = struct.Struct(">Q")
#: a PUB record's head: its length, its kind and its topic name's length (:func:`frame_pub`)
_PUB_HEAD: Final = struct.Struct(">IBH")
#: per message of a PUB: ID value, timestamp (ns), DPUB delay (ms), body length
_MSG: Final = struct.Struct(">QqII")
#: the same header's ID value and body length alone (what indexing needs: two ints made, not four)
_VALUE_SIZE: Final = struct.Struct(">Q12xI")
#: bytes before each body in a PUB record (and a standby's log)
MESSAGE_HEADER: Final = _MSG.size
#: the largest record either side accepts (a PUB of a 5 MB MPUB and its headers fits)
MAX_RECORD: Final = 64 * 1024 * 1024


class Kind(IntEnum):
    """Every record kind, with who sends it."""

    HELLO = 1         # both: {"node", "incarnation", "http_port", "version"}
    PUB = 2           # owner: topic and messages (:func:`encode_pub`)
    FIN = 3           # owner: topic, channel, IDs finished there (:func:`encode_fin`)
    CHANNEL = 4       # owner: {"topic", "channel", "backlog"}: made; owes the topic's backlog or not
    CHANNEL_GONE = 5  # owner: {"topic", "channel"}
    EMPTY = 6         # owner: {"topic", "channel"}: every message so far done there (channel None: the topic)
    TOPIC_GONE = 7    # owner: {"topic"}
    ACK = 8           # replica: the highest record number taken in (:func:`encode_ack`)
    BEAT = 9          # both: nothing; sent after a second without another record
    BYE = 10          # owner: nothing; it stops gracefully (its queues go to its disk)
    SNAP = 11         # owner: topic, the channels owing them, unfinished messages a new replica lacks
    SYNCED = 12       # owner: {"topic", "complete"}: every unfinished message of the topic went as a SNAP
    TAKEN = 13        # replica, on a notice link: topic, channel, the owner's IDs delivered by the replica
    SNAP_IDS = 14     # owner (to a replica of version 2): a SNAP's topic and owing channels, ID values only
    NEED = 15         # replica: topic, the ID values of a SNAP_IDS it does not hold (sent as SNAPs then)
    PROOF = 16        # both, first, with --replica-secret-file: the HMAC of nsqtw.replica.proof


#: the kinds whose payload is a JSON object
JSON_KINDS: Final = frozenset({Kind.HELLO, Kind.CHANNEL, Kind.CHANNEL_GONE, Kind.EMPTY, Kind.TOPIC_GONE,
                               Kind.SYNCED})


def frame(kind: Kind, payload: bytes = b"") -> bytes:
    """One record as it goes on the wire."""
    return _LEN.pack(len(payload) + 1) + bytes((kind,)) + payload


def split_records(buf: bytes) -> tuple[list[tuple[int, bytes]], bytes]:
    """The whole records at the start of ``buf`` as (kind, payload), and the bytes left over.
    ValueError for a record longer than :data:`MAX_RECORD` or of length 0."""
    out: list[tuple[int, bytes]] = []
    pos = 0
    size = len(buf)
    while size - pos >= 4:
        (n,) = _LEN.unpack_from(buf, pos)
        if n == 0 or n > MAX_RECORD:
            raise ValueError(f"record of {n} bytes")
        if size - pos - 4 < n:
            break
        out.append((buf[pos + 4], buf[pos + 5:pos + 4 + n]))
        pos += 4 + n
    return out, buf[pos:]


def encode_json(kind: Kind, value: dict[str, Any]) -> bytes:
    return frame(kind, json.dumps(value, separators=(",", ":")).encode())


def decode_json(payload: bytes) -> dict[str, Any]:
    value = json.loads(payload)
    if not isinstance(value, dict):
        raise ValueError("not a JSON object")
    return value


def encode_ack(number: int) -> bytes:
    return frame(Kind.ACK, _ACK.pack(number))


def decode_ack(payload: bytes) -> int:
    (number,) = _ACK.unpack(payload)
    return int(number)


def _name(value: str) -> bytes:
    raw = value.encode()
    return _U16.pack(len(raw)) + raw


def _read_name(payload: bytes, pos: int) -> tuple[str, int]:
    (n,) = _U16.unpack_from(payload, pos)
    pos += 2
    if pos + n > len(payload):
        raise ValueError("name past the record's end")
    return payload[pos:pos + n].decode(), pos + n


@dataclass(frozen=True, slots=True)
class PubMessage:
    """One message of a PUB record: its ID (16 hex digits), timestamp (ns), delay (ms), body."""

    id: bytes
    timestamp: int
    delay_ms: int
    body: bytes


def encode_pub(topic: str, values: Sequence[int], bodies: Sequence[bytes], timestamp: int,
               delay: float) -> bytes:
    """A PUB record of freshly published messages (their ID values, as the topic got them)."""
    return frame_pub(topic, len(bodies), pub_messages(values, bodies, timestamp, delay))


def decode_pub(payload: bytes) -> tuple[str, list[PubMessage]]:
    """A PUB record's topic and messages."""
    topic, data, _, _ = split_pub(payload)
    return topic, [PubMessage(b"%016x" % value, timestamp, delay_ms, body)
                   for value, timestamp, delay_ms, body in read_messages(data)]


def split_pub(payload: bytes) -> tuple[str, bytes, list[int], list[int]]:
    """A PUB record's topic; its messages as they are in the record (a standby writes them to
    its log so, :func:`read_messages` reads them back); each message's ID value and body size.
    ValueError when a body runs past the record or bytes are left over."""
    topic, pos = _read_name(payload, 0)
    (count,) = _LEN.unpack_from(payload, pos)
    data = payload[pos + 4:]
    values, sizes = index_messages(data)
    if len(values) != count:
        raise ValueError(f"{len(values)} messages in a record of {count}")
    return topic, data, values, sizes


def index_messages(data: bytes, torn_ok: bool = False) -> tuple[list[int], list[int]]:
    """Each message's ID value and body size, of messages back to back as a PUB or SNAP record (and
    a log's segment) holds them. A message cut short is a ValueError, or with ``torn_ok`` (a
    segment's end torn by a crash or a failed write) the end of what is read."""
    values: list[int] = []
    sizes: list[int] = []
    pos = 0
    size = len(data)
    unpack = _VALUE_SIZE.unpack_from
    while pos < size:
        if pos + MESSAGE_HEADER > size:
            if torn_ok:
                break
            raise ValueError("message header past the record's end")
        value, n = unpack(data, pos)
        pos += MESSAGE_HEADER + n
        if pos > size:
            if torn_ok:
                break
            raise ValueError("body past the record's end")
        values.append(value)
        sizes.append(n)
    return values, sizes


def read_messages(data: bytes) -> list[tuple[int, int, int, bytes]]:
    """Messages back to back as a PUB record holds them: (ID value, timestamp, delay ms, body)
    each; a torn last one is left out."""
    out: list[tuple[int, int, int, bytes]] = []
    pos = 0
    size = len(data)
    while pos + _MSG.size <= size:
        value, timestamp, delay_ms, n = _MSG.unpack_from(data, pos)
        pos += _MSG.size
        if pos + n > size:
            break
        out.append((value, timestamp, delay_ms, data[pos:pos + n]))
        pos += n
    return out


def select_messages(data: bytes, values: set[int]) -> bytes:
    """Of messages back to back as a PUB or SNAP record holds them, those whose ID value is in ``values``."""
    parts: list[bytes] = []
    pos = 0
    size = len(data)
    unpack = _VALUE_SIZE.unpack_from
    while pos + MESSAGE_HEADER <= size:
        value, n = unpack(data, pos)
        end = pos + MESSAGE_HEADER + n
        if value in values:
            parts.append(data[pos:end])
        pos = end
    return b"".join(parts)


def pub_messages(values: Sequence[int], bodies: Sequence[bytes], timestamp: int, delay: float) -> bytes:
    """Messages back to back as a PUB record (and a standby's log) holds them."""
    delay_ms = round(delay * 1000) if delay else 0  # (int() would make 1001 ms 1000: 1.001 * 1000 < 1001)
    if len(values) != len(bodies):
        raise ValueError(f"{len(values)} ID values for {len(bodies)} bodies")
    pack = _MSG.pack
    if len(bodies) == 1:  # a PUB, the commonest: no list to join (and no zip: strict=True costs 0.4 us a call)
        body = bodies[0]
        return pack(values[0], timestamp, delay_ms, len(body)) + body
    parts: list[bytes] = []
    for value, body in zip(values, bodies, strict=True):
        parts.append(pack(value, timestamp, delay_ms, len(body)))
        parts.append(body)
    return b"".join(parts)


def frame_pub(topic: str, count: int, messages: bytes) -> bytes:
    """A PUB record of ``count`` messages made by :func:`pub_messages`: :func:`frame` of the
    topic's :func:`_name`, the count and the messages, its head packed at once (one a turn)."""
    name = topic.encode()
    return _PUB_HEAD.pack(len(name) + len(messages) + 7, Kind.PUB, len(name)) + name + _LEN.pack(count) + messages


def encode_snap(topic: str, owing: Sequence[str], messages: bytes) -> bytes:
    """A SNAP record: messages a new replica lacks, each owed by exactly the channels ``owing``."""
    return frame(Kind.SNAP, _topic_owing(topic, owing) + messages)


def decode_snap(payload: bytes) -> tuple[str, list[str], bytes, list[int], list[int]]:
    """A SNAP record's topic, owing channels, messages, their ID values and body sizes."""
    topic, owing, pos = _read_topic_owing(payload)
    data = payload[pos:]
    values, sizes = index_messages(data)
    return topic, owing, data, values, sizes


def _topic_owing(topic: str, owing: Sequence[str]) -> bytes:
    return _name(topic) + _U16.pack(len(owing)) + b"".join(_name(c) for c in owing)


def _read_topic_owing(payload: bytes) -> tuple[str, list[str], int]:
    topic, pos = _read_name(payload, 0)
    (n,) = _U16.unpack_from(payload, pos)
    pos += 2
    owing = []
    for _ in range(n):
        name, pos = _read_name(payload, pos)
        owing.append(name)
    return topic, owing, pos


def encode_snap_ids(topic: str, owing: Sequence[str], values: Sequence[int]) -> bytes:
    """A SNAP_IDS record: unfinished messages as a SNAP names them, without their bodies (a replica
    that holds them confirms them; it asks for the others with a NEED record)."""
    return frame(Kind.SNAP_IDS, _topic_owing(topic, owing) + _values(values))


def decode_snap_ids(payload: bytes) -> tuple[str, list[str], list[int]]:
    topic, owing, pos = _read_topic_owing(payload)
    return topic, owing, _read_values(payload[pos:])


def encode_need(topic: str, values: Sequence[int]) -> bytes:
    return frame(Kind.NEED, _name(topic) + _values(values))


def decode_need(payload: bytes) -> tuple[str, list[int]]:
    topic, pos = _read_name(payload, 0)
    return topic, _read_values(payload[pos:])


def _values(values: Sequence[int]) -> bytes:
    return struct.pack(f">{len(values)}Q", *values)


def _read_values(raw: bytes) -> list[int]:
    if len(raw) % 8:
        raise ValueError("ID values not a multiple of 8 bytes")
    return list(struct.unpack(f">{len(raw) // 8}Q", raw))


def encode_fin(topic: str, channel: str, ids: Sequence[bytes]) -> bytes:
    """A FIN record: 16-byte IDs back to back."""
    return frame(Kind.FIN, _name(topic) + _name(channel) + b"".join(ids))


def encode_taken(topic: str, channel: str, ids: Sequence[bytes]) -> bytes:
    """A TAKEN record (a FIN's layout, read by :func:`decode_fin`): the owner's messages of
    ``channel`` (empty: its topic's, given no channel yet) that a takeover delivered elsewhere."""
    return frame(Kind.TAKEN, _name(topic) + _name(channel) + b"".join(ids))


def decode_fin(payload: bytes) -> tuple[str, str, list[bytes]]:
    """A FIN (or TAKEN) record's topic, channel and IDs."""
    topic, pos = _read_name(payload, 0)
    channel, pos = _read_name(payload, pos)
    rest = payload[pos:]
    if len(rest) % 16:
        raise ValueError("FIN IDs not a multiple of 16 bytes")
    return topic, channel, [rest[i:i + 16] for i in range(0, len(rest), 16)]
