"""The link between a worker process and the node's core: typed records, gathered into one write a turn.

A record is its length (4 bytes, big-endian, counting what follows), its
kind (1 byte) and the kind's fields: numbers big-endian, names and texts
as a 2-byte length and their bytes, message bodies as a 4-byte length and
their bytes. Records go out in the order they were sent; everything sent
during one reactor turn leaves in one gathered write on the next
(:meth:`Link.send`), so a turn that took a hundred publishes costs the
link one system call, not a hundred.

What each kind carries is written where it is made: the worker's side in
:mod:`nsqtw.workers.remote`, the core's in :mod:`nsqtw.workers.peer`.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import Any

from twisted.internet.interfaces import IDelayedCall, IReactorTime
from twisted.internet.protocol import Factory, Protocol
from twisted.python.failure import Failure

from nsqtw.log import Logger
from nsqtw.net.eager import send_pieces
from nsqtw.net.twisted_privates import may_send_now, write_buffers_understood

# -- kinds: from a worker to the core
#: a client connected to the worker: conn, its identity (JSON)
OPEN = 1
#: a client's identity changed (IDENTIFY, AUTH): conn, identity
INFO = 2
#: a client's connection closed: conn
GONE = 3
#: PUB, MPUB, DPUB: seq, conn, defer in ms, topic, bodies
PUB = 4
#: SUB: seq, conn, topic, channel
SUB = 5
#: a subscriber's RDY, whether its writes are paused, its state: conn, ready, paused, state
STATE = 6
#: FIN: conn, message IDs
FIN = 7
#: REQ: conn, (message ID, delay in ms) pairs
REQ = 8
#: TOUCH: conn, message ID
TOUCH = 9
#: a publish under a grant, answered OK by the worker already: as PUB
GRANTED_PUB = 10
#: answer (ACK) once everything before this was read: seq
SYNC = 11
#: the answer to REVOKE: the credit that was left (bytes), topic
RETURN = 12
#: the worker serves: the core may hand it connections (no fields)
READY = 13
#: a connection handed to the worker could not be served (its peer was gone): no fields
DROPPED = 14

# -- kinds: from the core to a worker
#: the answer to a PUB or SUB: seq, status (ACK_*), text
ACK = 20
#: MESSAGE frames for a subscriber: conn, the frames' bytes
DELIVER = 21
#: a FIN, REQ or TOUCH that failed: conn, command, message ID, why
FAILED = 22
#: close a client's connection (its channel was deleted, the node stops): conn
CLOSE = 23
#: stop: close every client, then exit
STOP = 24
#: more credit for publishes to a topic: bytes, topic
GRANT = 25
#: give the topic's credit back (RETURN): 0, topic
REVOKE = 26

#: an ACK's status: done; failed (the text says why); past --max-channel-consumers
ACK_OK, ACK_FAILED, ACK_TOO_MANY = 0, 1, 2

#: whether Twisted's write buffers are as :mod:`nsqtw.net.twisted_privates` expects (else every
#: write takes Twisted's path)
_EAGER = write_buffers_understood()

_HEAD = struct.Struct(">IB")
_U32 = struct.Struct(">I")
_U16 = struct.Struct(">H")
_CONN = struct.Struct(">I")
_SEQ_CONN = struct.Struct(">II")
_PUB = struct.Struct(">IIIH")
_STATE = struct.Struct(">IIBB")
_ACK = struct.Struct(">IB")
_ID_MS = struct.Struct(">16sI")
_COUNT_FIRST = struct.Struct(">II")


def record(kind: int, *pieces: bytes) -> list[bytes]:
    """One record of ``kind`` whose fields are ``pieces``, already encoded, as pieces to write."""
    return [_HEAD.pack(1 + sum(len(p) for p in pieces), kind), *pieces]


def text(value: str | bytes) -> bytes:
    """A name or text field: its length (2 bytes) and its UTF-8 bytes."""
    data = value.encode("utf-8", "surrogateescape") if isinstance(value, str) else value
    return _U16.pack(len(data)) + data


def conn_record(kind: int, conn: int, *rest: bytes) -> list[bytes]:
    """A record about one client connection: ``conn`` first, then ``rest``."""
    return record(kind, _CONN.pack(conn), *rest)


def pub_record(seq: int, conn: int, defer_ms: int, topic: bytes, bodies: list[bytes],
               kind: int = PUB) -> list[bytes]:
    """A publish (PUB or GRANTED_PUB): its bodies' count, their sizes in one array, then the
    bodies back to back, so the core reads the sizes in one call (:meth:`Reader.bodies`)."""
    count = len(bodies)
    return record(kind, _PUB.pack(seq, conn, defer_ms, len(topic)), topic, _U32.pack(count),
                  struct.pack(f">{count}I", *map(len, bodies)), bodies[0] if count == 1 else b"".join(bodies))


def topic_record(kind: int, count: int, topic: bytes) -> list[bytes]:
    """GRANT, REVOKE or RETURN: a count of bytes, and the topic's name as the rest."""
    return record(kind, _U32.pack(count), topic)


def sync_record(seq: int) -> list[bytes]:
    return record(SYNC, _U32.pack(seq))


def sub_record(seq: int, conn: int, topic: str, channel: str) -> list[bytes]:
    return record(SUB, _SEQ_CONN.pack(seq, conn), text(topic), text(channel))


def state_record(conn: int, ready: int, paused: bool, state: int) -> list[bytes]:
    return record(STATE, _STATE.pack(conn, ready, paused, state))


def ids_record(kind: int, conn: int, msg_ids: list[bytes]) -> list[bytes]:
    """FIN (or TOUCH) of these 16-byte message IDs."""
    return record(kind, _CONN.pack(conn), b"".join(msg_ids))


def req_record(conn: int, reqs: list[tuple[bytes, float]]) -> list[bytes]:
    return record(REQ, _CONN.pack(conn), b"".join(_ID_MS.pack(i, round(d * 1000)) for i, d in reqs))


def ack_record(seq: int, status: int, why: str = "") -> list[bytes]:
    return record(ACK, _ACK.pack(seq, status), text(why))


def failed_record(conn: int, cmd: str, msg_id: bytes, why: str) -> list[bytes]:
    return record(FAILED, _CONN.pack(conn), text(cmd), text(msg_id), text(why))


class Reader:
    """The fields of one record, read in order: ``data[at:end]``, read where it arrived (a read
    from the socket holds many records; each is never copied out whole, only its fields)."""

    __slots__ = ("data", "at", "end")

    def __init__(self, data: bytes, at: int = 0, end: int | None = None) -> None:
        self.data = data
        self.at = at
        self.end = len(data) if end is None else end

    def u32(self) -> int:
        (value,) = _U32.unpack_from(self.data, self.at)
        self.at += 4
        return int(value)

    def u8(self) -> int:
        value = self.data[self.at]
        self.at += 1
        return value

    def raw(self, size: int) -> bytes:
        value = self.data[self.at:self.at + size]
        self.at += size
        return value

    def text(self) -> str:
        return self.name().decode("utf-8", "surrogateescape")

    def name(self) -> bytes:
        (size,) = _U16.unpack_from(self.data, self.at)
        self.at += 2
        return self.raw(size)

    def rest(self) -> bytes:
        return self.raw(self.end - self.at)

    def pub(self) -> tuple[int, int, int, str, list[bytes]]:
        """A PUB or GRANTED_PUB whole (:func:`pub_record`): seq, conn, defer in ms, topic, bodies;
        its fixed fields in one unpack, as the core reads one for each publish."""
        data, at = self.data, self.at
        seq, conn, defer_ms, size = _PUB.unpack_from(data, at)
        at += _PUB.size
        topic = data[at:at + size].decode("utf-8", "surrogateescape")
        self.at = at + size
        return seq, conn, defer_ms, topic, self.bodies()

    def bodies(self) -> list[bytes]:
        """A publish's bodies: the count, the sizes, the bodies (:func:`pub_record`)."""
        data = self.data
        count, first = _COUNT_FIRST.unpack_from(data, self.at)
        if count == 1:  # PUB: no sizes array to walk
            at = self.at + 8
            self.at = at + first
            return [data[at:at + first]]
        count = self.u32()
        at = self.at + 4 * count
        out = []
        for size in struct.unpack_from(f">{count}I", data, self.at):
            out.append(data[at:at + size])
            at += size
        self.at = at
        return out

    def ids(self) -> list[bytes]:
        """The rest as 16-byte message IDs, each sliced once from where it arrived."""
        data, at, end = self.data, self.at, self.end
        self.at = end
        return [data[i:i + 16] for i in range(at, end, 16)]

    def reqs(self) -> list[tuple[bytes, float]]:
        data = self.rest()
        return [(i, ms / 1000.0) for i, ms in _ID_MS.iter_unpack(data)]


class Link(Protocol):
    """One end of a link: records in go to ``on_record(kind, Reader)`` (then ``on_read()``, once
    for each read that held any); :meth:`send` queues records out, written together on the next
    reactor turn; ``on_lost(reason)`` at the end."""

    log = Logger()

    def __init__(self, clock: IReactorTime, on_record: Callable[[int, Reader], None],
                 on_lost: Callable[[Failure], None], on_read: Callable[[], None] | None = None) -> None:
        self.clock = clock
        self.on_record = on_record
        self.on_lost = on_lost
        #: called after the records of one read were handled (to finish what they gathered)
        self.on_read = on_read
        #: what arrived of records not yet whole, and how many bytes that is
        self._chunks: list[bytes] = []
        self._have = 0
        #: the bytes needed before the next record can be read (its header, then all of it)
        self._need = 5
        self._out: list[bytes] = []
        self._flush_call: IDelayedCall | None = None
        self.connected_ = False

    def connectionMade(self) -> None:
        self.connected_ = True
        if self._out:
            self._schedule()

    def send(self, pieces: list[bytes]) -> None:
        """Queue a record (from :func:`record` and its kin); it leaves with the turn's others."""
        self._out.extend(pieces)
        if self._flush_call is None and self.connected_:
            self._schedule()

    def send_now(self, pieces: list[bytes]) -> bool:
        """Queue a record and write everything queued at once: :meth:`flush`'s answer."""
        self._out.extend(pieces)
        return self.flush()

    def _schedule(self) -> None:
        self._flush_call = self.clock.callLater(0, self.flush)

    def flush(self) -> bool:
        """Write what was queued now (the turn's gathered write; also before a stop).

        True when all of it is in the kernel's socket buffer, where the
        other process reads it even if this one is killed the next moment;
        False when some waits in Twisted's buffer (or nothing is connected).
        """
        if self._flush_call is not None and self._flush_call.active():
            self._flush_call.cancel()
        self._flush_call = None
        out, self._out = self._out, []
        transport: Any = self.transport
        if transport is None:
            return False
        if not out:
            return self.sends_now()
        # sent now when nothing is queued (one sendmsg, as EagerServer does for clients): through
        # Twisted's buffer the bytes would wait a turn for epoll to report the socket writable
        if self.sends_now():
            out = send_pieces(transport.socket, out)
            if not out:
                return True
        transport.writeSequence(out)
        return False

    def sends_now(self) -> bool:
        """Whether a write goes straight to the kernel: connected, nothing waiting in Twisted's buffer."""
        transport: Any = self.transport
        return bool(_EAGER and transport is not None and getattr(transport, "socket", None) is not None
                    and transport.connected and not transport.disconnecting and may_send_now(transport))

    def dataReceived(self, data: bytes) -> None:
        self._chunks.append(data)
        self._have += len(data)
        if self._have < self._need:  # a big record arriving: joined once, when whole
            return
        buf = b"".join(self._chunks) if len(self._chunks) > 1 else data
        at, end = 0, len(buf)
        on_record = self.on_record
        need = 5
        while end - at >= 5:
            size, kind = _HEAD.unpack_from(buf, at)
            if end - at - 4 < size:
                need = 4 + size
                break
            try:
                on_record(kind, Reader(buf, at + 5, at + 4 + size))
            except Exception:
                # one record's failure is logged; the link, and every other client on it, goes on
                self.log.failure("LINK: failed to handle a record of kind {kind}", kind=kind)
            at += 4 + size
        rest = buf[at:] if at < end else b""
        self._chunks = [rest] if rest else []
        self._have = len(rest)
        self._need = need
        if self.on_read is not None and at:
            try:
                self.on_read()
            except Exception:
                self.log.failure("LINK: failed to finish a read's records")

    def connectionLost(self, reason: Failure | None = None) -> None:
        self.connected_ = False
        if self._flush_call is not None and self._flush_call.active():
            self._flush_call.cancel()
        self._flush_call = None
        self.on_lost(reason if reason is not None else Failure(ConnectionError("link closed")))


class LinkFactory(Factory):
    """Makes the one :class:`Link` of an adopted socket."""

    noisy = False

    def __init__(self, link: Link) -> None:
        self.link = link

    def buildProtocol(self, addr: Any) -> Link:
        return self.link
