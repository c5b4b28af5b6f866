"""Sans-IO parser for the V2 TCP protocol.

Bytes go in with :meth:`V2Parser.feed`; complete commands come out of
:meth:`V2Parser.next_command`. Every length read from the wire is checked
against its limit *before* the bytes it announces are buffered, with the
exact error texts nsqd sends, so a lying size prefix never makes the daemon
allocate past ``--max-body-size``.
"""

from __future__ import annotations

import re
import struct
from collections.abc import Callable
from typing import NamedTuple

from nsqtw.errors import NSQError, fatal
from nsqtw.names import MAX_NAME_LENGTH
from nsqtw.speedups import COMPILED

MAGIC_V2 = b"  V2"
#: nsqd reads commands through a 16 KiB buffer; a longer line ends the connection.
MAX_LINE_LENGTH = 16 * 1024

BODY_COMMANDS = frozenset((b"PUB", b"DPUB", b"MPUB", b"IDENTIFY", b"AUTH"))

_INT32 = struct.Struct(">i")

(_MAGIC, _LINE, _SIZE, _BODY, _MPUB_COUNT, _MPUB_SIZE, _MPUB_BODY) = range(7)


class Command(NamedTuple):
    """A parsed command: its name, its space-separated arguments and its body.

    ``body`` is the single body of PUB, DPUB, IDENTIFY and AUTH; ``messages``
    the list of bodies of an MPUB.
    """

    name: bytes
    args: list[bytes]
    body: bytes | None = None
    messages: list[bytes] | None = None


class LineTooLong(Exception):
    """A command line exceeded :data:`MAX_LINE_LENGTH` (nsqd just hangs up)."""


HeaderCheck = Callable[[bytes, list[bytes]], None]


def _no_check(name: bytes, args: list[bytes]) -> None:
    return None


class V2Parser:
    """Incremental parser; feed it bytes in any chunking.

    ``check_header(name, args)`` is called when the line of a command that
    carries a body is complete, before its size is read: nsqd validates the
    state, the parameters and the topic name first, so their errors win.
    """

    def __init__(self, max_msg_size: int, max_body_size: int,
                 check_header: HeaderCheck = _no_check, expect_magic: bool = True) -> None:
        self.max_msg_size = max_msg_size
        self.max_body_size = max_body_size
        self._check_header = check_header
        self._buf = bytearray()
        self._pos = 0
        self._state = _MAGIC if expect_magic else _LINE
        self._name = b""
        self._args: list[bytes] = []
        self._need = 0
        self._messages: list[bytes] = []
        self._mpub_left = 0
        self._mpub_total = 0
        #: the body size an MPUB declared (its messages may read past it, as in nsqd)
        self._mpub_declared = 0

    def feed(self, data: bytes) -> None:
        self._buf += data

    def buffered(self) -> int:
        """Bytes received and not yet parsed into a command."""
        return len(self._buf) - self._pos

    def take_buffered(self) -> bytes:
        """Hand over the bytes not parsed yet and forget them.

        After IDENTIFY negotiates TLS or compression the rest of the stream
        is in the new encoding; what already arrived belongs to that layer.
        """
        data = bytes(self._buf[self._pos:])
        self._buf.clear()
        self._pos = 0
        return data

    def in_command(self) -> bool:
        """True while part of a command has been read (a frame is incomplete)."""
        return self._state != _LINE or self._pos < len(self._buf)

    def next_command(self) -> Command | None:
        """The next complete command, or None until more bytes arrive.

        Raises :class:`NSQError` (always fatal) for malformed input and
        :class:`LineTooLong` for an over-long line.
        """
        buf = self._buf
        while True:
            state = self._state
            avail = len(buf) - self._pos
            if state == _LINE:
                nl = buf.find(b"\n", self._pos)
                if nl < 0:
                    if avail > MAX_LINE_LENGTH:
                        raise LineTooLong()
                    self._compact()
                    return None
                if nl - self._pos >= MAX_LINE_LENGTH:
                    raise LineTooLong()
                end = nl
                if end > self._pos and buf[end - 1] == 13:  # optional \r
                    end -= 1
                params = bytes(buf[self._pos:end]).split(b" ")
                self._pos = nl + 1
                name = params[0]
                if name not in BODY_COMMANDS:
                    return Command(name, params[1:])
                self._name = name
                self._args = params[1:]
                self._check_header(name, self._args)
                if name == b"PUB" or name == b"MPUB":
                    bodies = self._take_whole_publish(name)
                    if bodies is not None:
                        if name == b"PUB":
                            return Command(name, self._args, body=bodies[0])
                        return Command(name, self._args, messages=bodies)
                self._state = _SIZE
            elif state == _MPUB_SIZE and self._take_mpub_run():
                messages, self._messages = self._messages, []
                self._state = _LINE
                return Command(self._name, self._args, messages=messages)
            elif state == _SIZE or state == _MPUB_COUNT or state == _MPUB_SIZE:
                if len(buf) - self._pos < 4:  # not ``avail``: the run above may have taken some
                    self._compact()
                    return None
                (size,) = _INT32.unpack_from(buf, self._pos)
                self._pos += 4
                if state == _SIZE:
                    self._check_size(size)
                elif state == _MPUB_COUNT:
                    self._check_count(size)
                else:
                    self._check_mpub_message(size)
            elif state == _BODY or state == _MPUB_BODY:
                need = self._need
                if avail < need:
                    self._compact()
                    return None
                body = bytes(buf[self._pos:self._pos + need])
                self._pos += need
                if state == _BODY:
                    self._state = _LINE
                    return Command(self._name, self._args, body=body)
                self._messages.append(body)
                self._mpub_left -= 1
                if self._mpub_left == 0:
                    messages, self._messages = self._messages, []
                    self._state = _LINE
                    return Command(self._name, self._args, messages=messages)
                self._state = _MPUB_SIZE
            else:  # _MAGIC
                if avail < 4:
                    self._compact()
                    return None
                magic = bytes(buf[self._pos:self._pos + 4])
                self._pos += 4
                if magic != MAGIC_V2:
                    raise NSQError("E_BAD_PROTOCOL")
                self._state = _LINE

    def release(self) -> None:
        """The connection is gone: drop the input and the header check.

        The check is usually a bound method of the protocol that owns this
        parser, a reference cycle; left in place, every closed connection
        would wait for the cyclic garbage collector, whose collections of
        tens of thousands of such objects stalled the reactor for tens of
        milliseconds under connection churn.
        """
        self._check_header = _no_check
        self._buf = bytearray()
        self._pos = 0
        self._messages = []

    def take_publish(self, known: dict[bytes, str]) -> tuple[bytes, str, list[bytes]] | None:
        """The next command when it is a whole, valid PUB or MPUB of a topic in ``known``:
        (name, topic, bodies). None leaves the input to :meth:`next_command`, untouched.

        ``known`` maps topic arguments the connection already checked to
        their names. A publisher sends the same command for the same topic
        again and again, so taking it here, in one step, skips the generic
        line parse, the header check and the Command. Only what the generic
        path would take the same way is taken (:func:`take_publish`).
        """
        if self._state != _LINE:
            return None
        found = take_publish(self._buf, self._pos, known, self.max_msg_size, self.max_body_size)
        if found is None:
            return None
        pos, name, topic, bodies = found
        if pos == len(self._buf):
            self._buf.clear()  # the usual case: the read held this one command
            self._pos = 0
        else:
            self._pos = pos
        return name, topic, bodies

    def take_fins(self) -> list[bytes]:
        """Message IDs of the plain ``FIN <16-byte id>\n`` lines at the head of the input.

        A consumer answers every message with one, so they arrive back to back;
        taking a run of them at once skips the generic line parse per message.
        Anything else (a malformed FIN too) is left for :meth:`next_command`.
        """
        if self._state != _LINE:
            return []
        ids = fin_run(self._buf, self._pos)
        self._pos += _FIN_LINE * len(ids)
        return ids

    def take_reqs(self, limit: int = 128) -> list[tuple[bytes, int]]:
        """(ID, timeout in ms) of the plain ``REQ <16-byte id> <digits>\n`` lines at the head of the input.

        A consumer that retries everything sends them back to back, as others
        send FINs; at most ``limit`` are taken at once, so the protocol's
        slice of reactor time is checked between runs. Anything else (a
        malformed or unusual REQ too) is left for :meth:`next_command`.
        """
        if self._state != _LINE:
            return []
        reqs, self._pos = req_run(self._buf, self._pos, limit)
        return reqs

    def _compact(self) -> None:
        if self._pos:
            del self._buf[:self._pos]
            self._pos = 0
        return None

    def _check_size(self, size: int) -> None:
        name = self._name
        cmd = name.decode()
        if name == b"PUB" or name == b"DPUB":
            if size <= 0:
                raise fatal("E_BAD_MESSAGE", f"{cmd} invalid message body size {size}")
            if size > self.max_msg_size:
                raise fatal("E_BAD_MESSAGE", f"{cmd} message too big {size} > {self.max_msg_size}")
        elif name == b"MPUB":
            if size <= 0:
                raise fatal("E_BAD_BODY", f"MPUB invalid body size {size}")
            if size > self.max_body_size:
                raise fatal("E_BAD_BODY", f"MPUB body too big {size} > {self.max_body_size}")
            self._mpub_declared = size
            self._state = _MPUB_COUNT
            return
        else:  # IDENTIFY, AUTH
            if size > self.max_body_size:
                raise fatal("E_BAD_BODY", f"{cmd} body too big {size} > {self.max_body_size}")
            if size <= 0:
                raise fatal("E_BAD_BODY", f"{cmd} invalid body size {size}")
        self._need = size
        self._state = _BODY

    def _check_count(self, count: int) -> None:
        # _whole_publish_body (and take_publish's compiled twin) takes only what passes these
        # checks and _check_size's; a change here or there goes into them too
        # each message takes at least 5 bytes (size + one byte of body)
        if count <= 0 or count > (self.max_body_size - 4) // 5:
            raise fatal("E_BAD_BODY", f"MPUB invalid message count {count}")
        self._mpub_left = count
        self._mpub_total = 4
        self._state = _MPUB_SIZE

    def _take_whole_publish(self, name: bytes) -> list[bytes] | None:
        """The bodies of a PUB or MPUB whose line was just read, when all of it has arrived
        and is valid: taken in one go. None leaves it to the generic path, untouched.

        A publisher's command usually arrives whole; the generic state
        machine would take it in three (PUB) or four (MPUB) trips round
        :meth:`next_command`. Only input that every check of the generic
        path passes is taken here (an MPUB's count and messages within its
        declared size, as :meth:`_take_mpub_run` takes them); anything else
        goes the generic way, which gives nsqd's errors and waits for more.
        """
        found = _whole_publish_body(self._buf, self._pos, name == b"MPUB", self.max_msg_size,
                                    self.max_body_size)
        if found is None:
            return None
        self._pos, bodies = found
        return bodies

    def _take_mpub_run(self) -> bool:
        """Take the MPUB messages already buffered whole, in one tight loop; True when
        that was the last one.

        The generic state machine costs two trips round :meth:`next_command`
        per message. Here a message whose size is valid and whose body has
        fully arrived is taken at once; anything else (an invalid size, a body
        still on its way) is left to the generic path, which gives nsqd's
        errors and waits, so both paths take the same input the same way.
        """
        base = self._pos
        # one copy of what has arrived of the declared body, sliced from (a bytearray
        # slice is a copy too); messages past the declared size go the generic way
        data = bytes(self._buf[base:base + max(0, self._mpub_declared - self._mpub_total)])
        pos, left, total = _split_mpub(data, self._mpub_left, self._mpub_total, self.max_msg_size,
                                       self.max_body_size, self._messages)
        self._pos = base + pos
        self._mpub_left = left
        self._mpub_total = total
        return left == 0

    def _check_mpub_message(self, size: int) -> None:
        # _take_mpub_run takes only what passes these checks; a change here goes there too
        index = len(self._messages)
        if size <= 0:
            raise fatal("E_BAD_MESSAGE", f"MPUB invalid message({index}) body size {size}")
        if size > self.max_msg_size:
            raise fatal("E_BAD_MESSAGE", f"MPUB message too big {size} > {self.max_msg_size}")
        # nsqd reads the messages straight from the stream, past the declared
        # body size if the count says so; we follow it but never buffer more
        # than --max-body-size for one MPUB.
        self._mpub_total += 4 + size
        if self._mpub_total > self.max_body_size:
            raise fatal("E_BAD_BODY", f"MPUB body too big {self._mpub_total} > {self.max_body_size}")
        self._need = size
        self._state = _MPUB_BODY


def _split_mpub(data: bytes, left: int, total: int, max_msg: int, max_body: int,
                out: list[bytes]) -> tuple[int, int, int]:
    """Append to ``out`` up to ``left`` MPUB messages lying whole in ``data``, each valid.

    ``total`` is the MPUB's size so far (count and earlier messages); a
    message stops the run if its size is out of range, would take the MPUB
    past ``max_body``, or has not fully arrived. Returns the bytes used,
    the messages still to take and the new total.
    """
    end = len(data)
    pos = 0
    append = out.append
    unpack = _INT32.unpack_from
    while left and end - pos >= 4:
        (size,) = unpack(data, pos)
        start = pos + 4
        if size <= 0 or size > max_msg or total + 4 + size > max_body or end - start < size:
            break
        append(data[start:start + size])
        pos = start + size
        total += 4 + size
        left -= 1
    return pos, left, total


#: the longest topic argument a publish line can have that ``known`` may hold, with its newline
_TOPIC_SEARCH = MAX_NAME_LENGTH + 1


def take_publish(buf: bytearray, pos: int, known: dict[bytes, str], max_msg: int,
                 max_body: int) -> tuple[int, bytes, str, list[bytes]] | None:
    """A whole, valid ``PUB <topic>\n`` or ``MPUB <topic>\n`` at ``pos`` whose topic
    argument is a key of ``known``: (position past it, name, topic, bodies); else None.

    The body's checks are :func:`_whole_publish_body`'s; a topic
    argument in ``known`` passed the header check already, and holds no
    space or ``\r`` (a line the generic parse would split or trim differently
    is never a key). A compiled twin is in nsqtw.speedups.
    """
    if buf.startswith(b"PUB ", pos):
        name = b"PUB"
        start = pos + 4
    elif buf.startswith(b"MPUB ", pos):
        name = b"MPUB"
        start = pos + 5
    else:
        return None
    nl = buf.find(b"\n", start, start + _TOPIC_SEARCH)
    if nl < 0:
        return None
    topic = known.get(bytes(buf[start:nl]))
    if topic is None:
        return None
    found = _whole_publish_body(buf, nl + 1, name == b"MPUB", max_msg, max_body)
    if found is None:
        return None
    past, bodies = found
    return past, name, topic, bodies


def _whole_publish_body(buf: bytearray, at: int, mpub: bool, max_msg: int,
                        max_body: int) -> tuple[int, list[bytes]] | None:
    """The bodies of a PUB (or MPUB) whose size starts at ``at``, when all of it has
    arrived and passes every check of the generic path: (position past it, bodies);
    else None (:meth:`V2Parser._take_whole_publish`, :func:`take_publish`)."""
    have = len(buf) - at - 4
    if have < 0:
        return None
    (size,) = _INT32.unpack_from(buf, at)
    if not mpub:
        if size <= 0 or size > max_msg or have < size:
            return None
        return at + 4 + size, [bytes(buf[at + 4:at + 4 + size])]
    if size < 4 or size > max_body or have < size:
        return None
    (count,) = _INT32.unpack_from(buf, at + 4)
    if count <= 0 or count > (max_body - 4) // 5:
        return None
    bodies: list[bytes] = []
    used, left, _ = _split_mpub(bytes(buf[at + 8:at + 4 + size]), count, 4, max_msg, max_body, bodies)
    if left:
        return None
    return at + 8 + used, bodies


#: ``FIN `` + a 16-byte message ID + newline
_FIN_LINE = 21
#: a run of ``FIN <id>\n`` lines whose 16-byte ID nsqd would take as one argument: no
#: space or newline in it, and not ending in the ``\r`` of a ``\r\n`` line end
_FIN_RUN = re.compile(rb"(?:FIN [^ \n]{15}[^ \r\n]\n)+")


def fin_run(buf: bytes | bytearray, pos: int) -> list[bytes]:
    """The IDs of the run of plain FIN lines at ``pos``: found by one regular
    expression, sliced from one copy of it (a compiled twin in nsqtw.speedups)."""
    run = _FIN_RUN.match(buf, pos)
    if run is None:
        return []
    end = run.end()
    lines = bytes(buf[pos:end])
    return [lines[i:i + 16] for i in range(4, end - pos, _FIN_LINE)]


#: one ``REQ <id> <timeout>\n`` line nsqd would take as two arguments: an ID of 16 bytes
#: without space or newline, a timeout of plain decimal digits that fits any int, a bare ``\n``
_REQ_LINE = re.compile(rb"REQ ([^ \n]{16}) ([0-9]{1,9})\n")


def req_run(buf: bytes | bytearray, pos: int, limit: int) -> tuple[list[tuple[bytes, int]], int]:
    """The (ID, timeout) of up to ``limit`` plain REQ lines at ``pos``, and where they end."""
    match = _REQ_LINE.match
    reqs: list[tuple[bytes, int]] = []
    found = match(buf, pos)
    while found is not None:
        reqs.append((found.group(1), int(found.group(2))))
        pos = found.end()
        if len(reqs) == limit:
            break
        found = match(buf, pos)
    return reqs, pos


#: the pure-Python definitions, kept whichever are in use (tests compare the two)
PURE_FIN_RUN = fin_run
PURE_SPLIT_MPUB = _split_mpub
PURE_TAKE_PUBLISH = take_publish
if COMPILED is not None:
    fin_run = COMPILED.fin_run
    _split_mpub = COMPILED.split_mpub
    take_publish = COMPILED.take_publish


def encode_command(name: bytes, *args: bytes, body: bytes | None = None) -> bytes:
    """Client-side encoding of a command (the client library, nsqtw-bench, the Spark client, tests)."""
    line = b" ".join((name,) + args) + b"\n"
    if body is None:
        return line
    return line + _INT32.pack(len(body)) + body


def encode_mpub(topic: bytes, bodies: list[bytes]) -> bytes:
    parts = [_INT32.pack(len(bodies))]
    for b in bodies:
        parts.append(_INT32.pack(len(b)))
        parts.append(b)
    payload = b"".join(parts)
    return b"MPUB " + topic + b"\n" + _INT32.pack(len(payload)) + payload


def encode_pub(topic: bytes, body: bytes) -> bytes:
    return b"PUB " + topic + b"\n" + _INT32.pack(len(body)) + body


def encode_dpub(topic: bytes, delay_ms: int, body: bytes) -> bytes:
    return b"DPUB " + topic + b" " + str(delay_ms).encode() + b"\n" + _INT32.pack(len(body)) + body


def rdy(count: int) -> bytes:
    return b"RDY " + str(count).encode() + b"\n"


def fin(msg_id: bytes) -> bytes:
    return b"FIN " + msg_id + b"\n"


def touch(msg_id: bytes) -> bytes:
    return b"TOUCH " + msg_id + b"\n"


def req(msg_id: bytes, delay_ms: int = 0) -> bytes:
    return b"REQ " + msg_id + b" " + str(delay_ms).encode() + b"\n"


NOP = b"NOP\n"
CLS = b"CLS\n"

_FRAME_HEADER = struct.Struct(">ii")


def split_frames(buf: bytearray) -> list[tuple[int, bytes]]:
    """Client side: remove every complete frame from ``buf`` as ``(type, data)``.

    A partial frame stays in ``buf`` for the next read.
    """
    frames: list[tuple[int, bytes]] = []
    pos = 0
    n = len(buf)
    while n - pos >= 8:
        size, ftype = _FRAME_HEADER.unpack_from(buf, pos)
        if size < 4:
            raise ValueError(f"invalid frame size {size}")
        if n - pos < 4 + size:
            break
        frames.append((ftype, bytes(buf[pos + 8:pos + 4 + size])))
        pos += 4 + size
    if pos:
        del buf[:pos]
    return frames


class FrameTooLarge(ValueError):
    """A frame announced more bytes than the client accepts, or fewer than a header."""


class FrameParser:
    """Client side, sans-IO: nsqd's frames out of bytes fed in any chunking.

    Frames come out one at a time so a client can switch the rest of the
    stream to TLS or compression right after the frame that agreed to it
    (:meth:`take_buffered` hands over what arrived past it). A size is
    checked against ``max_size`` before its bytes are waited for.
    """

    def __init__(self, max_size: int = 64 * 1024 * 1024) -> None:
        self.max_size = max_size
        self._buf = bytearray()
        self._pos = 0

    def feed(self, data: bytes) -> None:
        self._buf += data

    def next_frame(self) -> tuple[int, bytes] | None:
        """The next complete ``(frame_type, data)``, or None until more bytes arrive."""
        buf = self._buf
        pos = self._pos
        if len(buf) - pos < 8:
            self._compact()
            return None
        size, ftype = _FRAME_HEADER.unpack_from(buf, pos)
        if size < 4 or size > self.max_size:
            raise FrameTooLarge(f"invalid frame size {size}")
        if len(buf) - pos < 4 + size:
            self._compact()
            return None
        self._pos = pos + 4 + size
        return ftype, bytes(buf[pos + 8:pos + 4 + size])

    def frames(self) -> list[tuple[int, bytes]]:
        """Every complete frame there is, in order (:meth:`next_frame` until None, in one call)."""
        buf = self._buf
        pos = self._pos
        n = len(buf)
        max_size = self.max_size
        unpack = _FRAME_HEADER.unpack_from
        out: list[tuple[int, bytes]] = []
        while n - pos >= 8:
            size, ftype = unpack(buf, pos)
            if size < 4 or size > max_size:
                self._pos = pos
                raise FrameTooLarge(f"invalid frame size {size}")
            end = pos + 4 + size
            if end > n:
                break
            out.append((ftype, bytes(buf[pos + 8:end])))
            pos = end
        self._pos = pos
        self._compact()
        return out

    def take_buffered(self) -> bytes:
        """The bytes received past the last frame returned, removed from the parser."""
        data = bytes(self._buf[self._pos:])
        self._buf.clear()
        self._pos = 0
        return data

    def _compact(self) -> None:
        if self._pos:
            del self._buf[:self._pos]
            self._pos = 0
