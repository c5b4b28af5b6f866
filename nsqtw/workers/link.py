"""The link between a worker process and the node's core: typed records, gathered into one write a turn.

A record is its length (4 bytes, big-endian, counting what follows), its
kind (1 byte) and the kind's fields: numbers big-endian, names and texts
as a 2-byte length and their bytes, message bodies as a 4-byte length and
their bytes. Records go out in the order they were sent; everything sent
during one reactor turn leaves in one gathered write on the next
(:meth:`Link.send`), so a turn that took a hundred publishes costs the
link one system call, not a hundred.

What each kind carries is one table, :data:`KINDS`: its number, name,
sender and fields. Both sides write records from it (:func:`encode`) and
read them through it (:class:`Dispatch`, which hands each record's fields
to the handler its side names for the kind, checked against the table when
the side is made). A new kind is one table entry and its handler.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Mapping
from typing import Any

from twisted.internet.interfaces import IDelayedCall, IReactorTime
from twisted.internet.protocol import Factory, Protocol
from twisted.python.failure import Failure

from nsqtw.log import Logger
from nsqtw.net.eager import send_pieces
from nsqtw.net.twisted_privates import may_send_now, write_buffers_understood

#: which process sends a kind
WORKER, CORE = "worker", "core"

# -- kinds: from a worker to the core (their fields: :data:`KINDS`)
OPEN = 1
INFO = 2
GONE = 3
PUB = 4
SUB = 5
STATE = 6
FIN = 7
REQ = 8
TOUCH = 9
GRANTED_PUB = 10
SYNC = 11
RETURN = 12
READY = 13
DROPPED = 14

# -- kinds: from the core to a worker
ACK = 20
DELIVER = 21
FAILED = 22
CLOSE = 23
STOP = 24
GRANT = 25
REVOKE = 26

#: an ACK's status: done; failed (the text says why); past --max-channel-consumers
ACK_OK, ACK_FAILED, ACK_TOO_MANY, ACK_NO_REPLICA = 0, 1, 2, 3  # (the last: --replicas=2's non-fatal refusal)

#: whether Twisted's write buffers are as :mod:`nsqtw.net.twisted_privates` expects (else every
#: write takes Twisted's path)
_EAGER = write_buffers_understood()

_HEAD = struct.Struct(">IB")
_U32 = struct.Struct(">I")
_U16 = struct.Struct(">H")
_ID_MS = struct.Struct(">16sI")
_COUNT_FIRST = struct.Struct(">II")


def text(value: str | bytes) -> bytes:
    """A name or text field: its length (2 bytes) and its UTF-8 bytes."""
    data = value.encode("utf-8", "surrogateescape") if isinstance(value, str) else value
    return _U16.pack(len(data)) + data


def _rest(value: bytes | list[bytes]) -> list[bytes]:
    return [value] if isinstance(value, bytes) else list(value)


def _rest_text(value: str | bytes) -> list[bytes]:
    return [value.encode("utf-8", "surrogateescape") if isinstance(value, str) else value]


def _bodies(bodies: list[bytes]) -> list[bytes]:
    count = len(bodies)
    return [_U32.pack(count), struct.pack(f">{count}I", *map(len, bodies)),
            bodies[0] if count == 1 else b"".join(bodies)]


class Codec:
    """How one kind of field is written and read: a fixed-size number (``fmt``, a ``struct``
    letter; the neighbouring ones of a record are packed and unpacked in one call), or a
    variable field, written by ``encode`` (to pieces) and read by ``read``: the lines of Python
    that read it from ``data`` at ``at`` (the record ends at ``end``) into ``{v}`` and move
    ``at`` past it (names starting ``{v}_`` are theirs), placed in each record's decoder
    (:func:`_compile`). Every publish and subscription is read this way, without a call a field."""

    __slots__ = ("name", "fmt", "encode", "read", "conn")

    def __init__(self, name: str, fmt: str = "", encode: Callable[[Any], list[bytes]] | None = None,
                 read: str = "", conn: bool = False) -> None:
        self.name = name
        self.fmt = fmt
        self.encode = encode
        self.read = read
        #: a connection the receiver knows by this ID (:class:`Dispatch` looks it up)
        self.conn = conn

    def __repr__(self) -> str:
        return self.name


_READ_NAME = """\
({v}_n,) = _U16.unpack_from(data, at)
{v} = data[at + 2:at + 2 + {v}_n]
at += 2 + {v}_n
"""

#: numbers
U8 = Codec("u8", "B")
U32 = Codec("u32", "I")
#: a client connection's ID (4 bytes), which the receiver turns into that connection
CONN = Codec("conn", "I", conn=True)
#: a name or text (2-byte length, UTF-8): written from str or bytes, read as str
TEXT = Codec("text", encode=lambda v: [text(v)], read=_READ_NAME + '{v} = {v}.decode("utf-8", "surrogateescape")\n')
#: the same, read as bytes
NAME = Codec("name", encode=lambda v: [text(v)], read=_READ_NAME)
#: the rest of the record, as it is: written from bytes or pieces (not joined), read as bytes
REST = Codec("rest", encode=_rest, read="{v} = data[at:end]\nat = end\n")
#: the rest of the record as a text: written from str or bytes, read as str
REST_TEXT = Codec("rest_text", encode=_rest_text,
                  read='{v} = data[at:end].decode("utf-8", "surrogateescape")\nat = end\n')
#: a publish's bodies: their count, their sizes in one array, then the bodies back to back
#: (the sizes read in one call; a PUB's one body without walking them)
BODIES = Codec("bodies", encode=_bodies, read="""\
{v}_count, {v}_first = _COUNT_FIRST.unpack_from(data, at)
if {v}_count == 1:
    {v} = [data[at + 8:at + 8 + {v}_first]]
    at += 8 + {v}_first
else:
    {v} = []
    {v}_at = at + 4 + 4 * {v}_count
    for {v}_size in struct.unpack_from(f">{{{v}_count}}I", data, at + 4):
        {v}.append(data[{v}_at:{v}_at + {v}_size])
        {v}_at += {v}_size
    at = {v}_at
""")
#: the rest as 16-byte message IDs, each sliced once from where it arrived
IDS = Codec("ids", encode=lambda v: [b"".join(v)],
            read="{v} = [data[{v}_i:{v}_i + 16] for {v}_i in range(at, end, 16)]\nat = end\n")
#: the rest as (message ID, delay) pairs, the delay in ms on the wire, in seconds here
REQS = Codec("reqs", encode=lambda v: [b"".join(_ID_MS.pack(i, round(d * 1000)) for i, d in v)],
             read="{v} = [({v}_i, {v}_ms / 1000.0) for {v}_i, {v}_ms in _ID_MS.iter_unpack(data[at:end])]\n"
                  "at = end\n")


class Kind:
    """One kind of record: its number, name, sender and fields (name and :class:`Codec`), and
    the encoder and decoder made from them (``encode``, ``decode``)."""

    __slots__ = ("code", "name", "sender", "fields", "doc", "conn_at", "run_unknown", "encode", "decode")

    def __init__(self, code: int, name: str, sender: str, fields: tuple[tuple[str, Codec], ...],
                 doc: str, run_unknown: bool = False) -> None:
        self.code = code
        self.name = name
        self.sender = sender
        self.fields = fields
        self.doc = doc
        conns = [i for i, (_, c) in enumerate(fields) if c.conn]
        #: where the connection the record is about is among its fields (None: no connection)
        self.conn_at: int | None = conns[0] if conns else None
        #: handled even when its connection is unknown (None in its place): it is answered (a
        #: PUB, a SUB), or it changes more than the connection (GONE: the worker holds one less)
        self.run_unknown = run_unknown
        #: ``encode(*values)``: the record with these field values, in the table's order, as pieces
        #: to write; ``decode(data, at, end)``: the field values of the record in ``data[at:end]``
        #: (its kind's byte excluded), in that order
        self.encode, self.decode = _compile(code, name, fields)


def _compile(code: int, name: str, fields: tuple[tuple[str, Codec], ...]
             ) -> tuple[Callable[..., list[bytes]], Callable[[bytes, int, int], list[Any]]]:
    """A kind's encoder and decoder, made from its fields as straight-line Python, the way
    :mod:`dataclasses` makes ``__init__``: a record is written and read for every publish,
    and a loop over the layout, or a call a field, would cost the core's one-message publish
    a large share of its time. A run of fixed-size numbers is one ``struct`` call either way."""
    env: dict[str, Any] = {"_HEAD": _HEAD, "_U16": _U16, "_COUNT_FIRST": _COUNT_FIRST, "_ID_MS": _ID_MS,
                           "struct": struct}
    names = [f"{field}_" for field, _ in fields]
    enc: list[str] = []
    dec: list[str] = []
    out: list[str] = []
    run: list[str] = []
    fmt = ""

    def close_run() -> None:
        nonlocal fmt
        if not run:
            return
        key = f"_S{len(out)}"
        env[key] = st = struct.Struct(">" + fmt)
        enc.append(f"{key}.pack({', '.join(run)})")
        dec.append(f"    {', '.join(run)}, = {key}.unpack_from(data, at)")
        dec.append(f"    at += {st.size}")
        out.extend(run)
        run.clear()
        fmt = ""

    for (_, codec), value in zip(fields, names, strict=True):
        if codec.fmt:
            run.append(value)
            fmt += codec.fmt
            continue
        close_run()
        env[f"_E_{value}"] = codec.encode
        enc.append(f"*_E_{value}({value})")
        dec.extend("    " + line for line in codec.read.format(v=value).splitlines())
        out.append(value)
    close_run()
    src = (f"def encode({', '.join(names)}):\n"
           f"    pieces = [{', '.join(enc)}]\n"
           f"    return [_HEAD.pack(1 + sum(map(len, pieces)), {code}), *pieces]\n"
           f"def decode(data, at, end):\n" + "".join(line + "\n" for line in dec)
           + f"    return [{', '.join(out)}]\n")
    exec(compile(src, f"<link record {name}>", "exec"), env)  # noqa: S102 - made from the table only
    return env["encode"], env["decode"]


#: every kind of record, the one table both sides read: what each carries, in order
KINDS: dict[int, Kind] = {k.code: k for k in (
    Kind(OPEN, "OPEN", WORKER, (("conn", U32), ("identity", REST)),
         "a client connected to the worker (its identity: JSON)"),
    Kind(INFO, "INFO", WORKER, (("conn", CONN), ("identity", REST)),
         "a client's identity changed (IDENTIFY, AUTH)"),
    Kind(GONE, "GONE", WORKER, (("conn", CONN),), "a client's connection closed", run_unknown=True),
    Kind(PUB, "PUB", WORKER,
         (("seq", U32), ("conn", CONN), ("defer_ms", U32), ("topic", TEXT), ("bodies", BODIES)),
         "PUB, MPUB, DPUB, answered by an ACK (conn 0: no client)", run_unknown=True),
    Kind(SUB, "SUB", WORKER, (("seq", U32), ("conn", CONN), ("topic", TEXT), ("channel", TEXT)),
         "SUB, answered by an ACK", run_unknown=True),
    Kind(STATE, "STATE", WORKER, (("conn", CONN), ("ready", U32), ("paused", U8), ("state", U8)),
         "a subscriber's RDY, whether its writes are paused, its state"),
    Kind(FIN, "FIN", WORKER, (("conn", CONN), ("ids", IDS)), "FIN of these message IDs"),
    Kind(REQ, "REQ", WORKER, (("conn", CONN), ("reqs", REQS)), "REQ of these (ID, delay) pairs"),
    Kind(TOUCH, "TOUCH", WORKER, (("conn", CONN), ("msg_id", REST)), "TOUCH of one message ID"),
    Kind(GRANTED_PUB, "GRANTED_PUB", WORKER,
         (("seq", U32), ("conn", CONN), ("defer_ms", U32), ("topic", TEXT), ("bodies", BODIES)),
         "a publish under a grant, answered OK by the worker already", run_unknown=True),
    Kind(SYNC, "SYNC", WORKER, (("seq", U32),), "answer (ACK) once everything before this was read"),
    Kind(RETURN, "RETURN", WORKER, (("left", U32), ("topic", REST_TEXT)),
         "the answer to REVOKE: the credit (bytes) that was left"),
    Kind(READY, "READY", WORKER, (), "the worker serves: the core may hand it connections"),
    Kind(DROPPED, "DROPPED", WORKER, (), "a connection handed to the worker could not be served"),
    Kind(ACK, "ACK", CORE, (("seq", U32), ("status", U8), ("why", TEXT)),
         "the answer to a PUB, SUB or SYNC: ACK_* and why"),
    Kind(DELIVER, "DELIVER", CORE, (("conn", CONN), ("frames", REST)),
         "MESSAGE frames for a subscriber, encoded once in the core"),
    Kind(FAILED, "FAILED", CORE, (("conn", CONN), ("cmd", TEXT), ("msg_id", NAME), ("why", TEXT)),
         "a FIN, REQ or TOUCH that failed"),
    Kind(CLOSE, "CLOSE", CORE, (("conn", CONN),),
         "close a client's connection (its channel was deleted, the node stops)"),
    Kind(STOP, "STOP", CORE, (), "stop: close every client, then exit"),
    Kind(GRANT, "GRANT", CORE, (("nbytes", U32), ("topic", REST_TEXT)),
         "more credit for publishes to a topic"),
    Kind(REVOKE, "REVOKE", CORE, (("nbytes", U32), ("topic", REST_TEXT)),
         "give the topic's credit back (RETURN); nbytes is 0"),
)}


def encode(kind: int, *values: Any) -> list[bytes]:
    """A record of ``kind`` with its fields' values in the table's order (:data:`KINDS`)."""
    return KINDS[kind].encode(*values)


class Dispatch:
    """The records one side receives, each decoded by the table and handed to its handler.

    ``handlers`` names, for every kind the other side sends (and no other),
    the method of ``owner`` that runs it; checked against :data:`KINDS` when
    the side is made, so a kind without a handler fails at start-up, not
    when its first record arrives. A handler gets the record's fields in the
    table's order, a connection's ID (:data:`CONN`) already turned into the
    connection from ``conns``. A record naming a connection this side does
    not know (closed meanwhile, or a bug) is counted in
    :attr:`unknown_conns` and logged; it never raises. It is dropped, unless
    its kind says to run it anyway (:attr:`Kind.run_unknown`: a PUB or SUB,
    whose sender waits for the answer, a publish the worker answered already,
    a GONE): then its handler gets None for the connection. Connection 0 is
    a publish's "no client", not an unknown one.
    """

    log = Logger()

    def __init__(self, side: str, who: str, owner: object, handlers: Mapping[int, str],
                 conns: Mapping[int, object]) -> None:
        receives = {code for code, kind in KINDS.items() if kind.sender != side}
        if set(handlers) != receives:
            missing = sorted(KINDS[c].name for c in receives - set(handlers))
            extra = sorted(map(str, set(handlers) - receives))
            raise ValueError(f"{who}: the handlers do not match the link's table: missing {missing}, "
                             f"not received here {extra}")
        self.who = who
        #: per kind: its decoder, where its connection is (None: none), its handler, the kind
        self._table: dict[int, tuple[Callable[[bytes, int, int], list[Any]], int | None, Callable[..., None], Kind]] = {
            code: (KINDS[code].decode, KINDS[code].conn_at, getattr(owner, name), KINDS[code])
            for code, name in handlers.items()}
        #: the connections this side knows, by their IDs (the owner's dict, never replaced)
        self.conns = conns
        #: records that named a connection this side does not know
        self.unknown_conns = 0

    def __call__(self, code: int, data: bytes, start: int, end: int) -> None:
        """The record of kind ``code`` in ``data[start:end]`` (after its kind's byte), handled."""
        entry = self._table.get(code)
        if entry is None:
            self.log.error("{who}: unknown record {kind}", who=self.who, kind=code)
            return
        decode, at, handler, kind = entry
        values = decode(data, start, end)
        if at is not None:
            conn = values[at]
            found = self.conns.get(conn)
            if found is None and (conn or not kind.run_unknown):
                self.unknown_conns += 1
                self.log.warn("{who}: {kind} for unknown connection {conn} - {what}",  # noqa: G010 - twisted Logger
                              who=self.who, kind=kind.name, conn=conn,
                              what="handled without it" if kind.run_unknown else "ignored")
                if not kind.run_unknown:
                    return
            values[at] = found
        handler(*values)


class Link(Protocol):
    """One end of a link: records in go to ``on_record(kind, data, start, end)``, the record's
    fields being ``data[start:end]`` (then ``on_read()``, once
    for each read that held any); :meth:`send` queues records out, written together on the next
    reactor turn; ``on_lost(reason)`` at the end."""

    log = Logger()

    def __init__(self, clock: IReactorTime, on_record: Callable[[int, bytes, int, int], None],
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
                on_record(kind, buf, at + 5, at + 4 + size)
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
