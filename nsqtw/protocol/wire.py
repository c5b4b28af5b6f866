"""Sans-IO parser for the V2 TCP protocol.

Bytes go in with :meth:`V2Parser.feed`; complete commands come out of
:meth:`V2Parser.next_command`, one state machine and the only way in. Every
length read from the wire is checked against its limit *before* the bytes
it announces are buffered, with the exact error texts nsqd sends, so a
lying size prefix never makes the daemon allocate past ``--max-body-size``.

What arrives together leaves together: a run of plain FINs (or REQs) comes
out as one command carrying every ID, and a PUB or MPUB whose body has
fully arrived is taken in the same call that read its line. The module is
plain typed Python (ints, bytes, bytearray, lists) so that it can be
compiled as it is.
"""

from __future__ import annotations

import re
import struct
from collections.abc import Callable
from typing import Final

from librt.strings import read_i32_be
from mypy_extensions import i64

from nsqtw.errors import NSQError, fatal

MAGIC_V2: Final = b"  V2"
#: nsqd reads commands through a 16 KiB buffer; a longer line ends the connection.
MAX_LINE_LENGTH: Final = 16 * 1024
#: the most REQ lines one command carries unless the caller asks for fewer
REQS_PER_RUN: Final = 128

BODY_COMMANDS: Final = frozenset((b"PUB", b"DPUB", b"MPUB", b"IDENTIFY", b"AUTH"))

_INT32: Final = struct.Struct(">i")

_MAGIC: Final = 0
_LINE: Final = 1
_SIZE: Final = 2
_BODY: Final = 3
_MPUB_COUNT: Final = 4
_MPUB_SIZE: Final = 5
_MPUB_BODY: Final = 6

#: ``FIN `` + a 16-byte message ID + newline
_FIN_LINE: Final = 21
#: a run of ``FIN <id>\n`` lines whose 16-byte ID nsqd would take as one argument: no
#: space or newline in it, and not ending in the ``\r`` of a ``\r\n`` line end
_FIN_RUN: Final = re.compile(rb"(?:FIN [^ \n]{15}[^ \r\n]\n)+")
#: the ID of one plain FIN line, and of 64 in a row
_FIN_ID: Final = struct.Struct("4x16sx")
_FIN_IDS: Final = struct.Struct("4x16sx" * 64)
#: one ``REQ <id> <timeout>\n`` line nsqd would take as two arguments: an ID of 16 bytes
#: without space or newline, a timeout of plain decimal digits that fits any int, a bare ``\n``
_REQ_LINE: Final = re.compile(rb"REQ ([^ \n]{16}) ([0-9]{1,9})\n")



def _plain_fins(lines: bytes, count: int) -> bool:
    """Whether ``lines`` is ``count`` plain FIN lines (see :meth:`V2Parser._take_fins`):
    each column of the 21-byte lines checked at once, and the spaces and newlines counted."""
    n = _FIN_LINE
    return (lines[0::n] == b"F" * count and lines[1::n] == b"I" * count and lines[2::n] == b"N" * count
            and lines[3::n] == b" " * count and lines[20::n] == b"\n" * count
            and lines.count(b" ") == count and lines.count(b"\n") == count and b"\r" not in lines[19::n])


def _split_fins(lines: bytes, count: int, ids: list[bytes]) -> None:
    """Append the IDs of ``count`` plain FIN lines to ``ids``: 64 lines per ``struct`` call."""
    whole = count - count % 64
    for group in _FIN_IDS.iter_unpack(lines[:whole * _FIN_LINE]):
        ids.extend(group)
    for (msg_id,) in _FIN_ID.iter_unpack(lines[whole * _FIN_LINE:]):
        ids.append(msg_id)

class Command:
    """A parsed command: its name, its space-separated arguments and its body.

    ``body`` is the single body of PUB, DPUB, IDENTIFY and AUTH; ``messages``
    the list of bodies of an MPUB. A run of plain FIN lines is one command
    named FIN with no arguments and ``ids`` (in order); a run of plain REQ
    lines one named REQ with ``reqs``, each (ID, timeout in ms).

    A plain class with its own ``__init__`` rather than a NamedTuple or a
    dataclass: compiled, it is a native class that compiled code makes with
    one C call, where those two run a generated Python ``__init__`` or
    ``__new__`` for every command. Compared by value.
    """

    __slots__ = ("name", "args", "body", "messages", "ids", "reqs")

    def __init__(self, name: bytes, args: list[bytes], body: bytes | None = None,
                 messages: list[bytes] | None = None, ids: list[bytes] | None = None,
                 reqs: list[tuple[bytes, int]] | None = None) -> None:
        self.name = name
        self.args = args
        self.body = body
        self.messages = messages
        self.ids = ids
        self.reqs = reqs

    def _fields(self) -> tuple[object, ...]:
        return (self.name, self.args, self.body, self.messages, self.ids, self.reqs)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Command):
            return NotImplemented
        return self._fields() == other._fields()

    def __hash__(self) -> int:
        raise TypeError("unhashable type: 'Command'")

    def __repr__(self) -> str:
        shown = ", ".join(f"{k}={v!r}" for k, v in zip(self.__slots__, self._fields(), strict=True) if v is not None)
        return f"Command({shown})"


class LineTooLong(Exception):
    """A command line exceeded :data:`MAX_LINE_LENGTH` (nsqd just hangs up)."""


HeaderCheck = Callable[[bytes, list[bytes]], None]


def _no_check(name: bytes, args: list[bytes]) -> None:
    return None


class V2Parser:
    """Incremental parser; feed it bytes in any chunking.

    ``check_header(name, args)`` is called for every command once its line
    is read, before anything after the line: before a body's size is read
    (nsqd validates the state, the parameters and the topic name first, so
    their errors win) and before a command is handed out. For a run of FINs
    or REQs it is called once, with no arguments.

    The input is kept as ``bytes``, not a growing ``bytearray``: a read that
    finds everything before it parsed becomes the buffer as it is, with no
    copy, and compiled, every slice, byte and size read of ``bytes`` is a
    direct C operation. Reads that arrive while a command waits for more
    are held aside and joined once the command can go on (its body or
    size has arrived, or its line has ended), so a large body arriving in
    many reads is copied once, not once per read.
    """

    def __init__(self, max_msg_size: int, max_body_size: int,
                 check_header: HeaderCheck = _no_check, expect_magic: bool = True) -> None:
        self.max_msg_size = max_msg_size
        self.max_body_size = max_body_size
        self._check_header = check_header
        #: the input; from ``_pos`` on, not parsed yet
        self._buf = b""
        self._pos = 0
        #: reads that arrived while the command under way waits for more (see :meth:`feed`)
        self._chunks: list[bytes] = []
        self._chunk_bytes = 0
        #: the bytes past ``_pos`` the command under way needs before parsing can go on
        self._want = 0
        self._state = _MAGIC if expect_magic else _LINE
        self._name = b""
        self._args: list[bytes] = []
        self._need = 0
        self._messages: list[bytes] = []
        self._mpub_left = 0
        #: the MPUB's size so far: its count and the messages read
        self._mpub_total = 0
        #: where the body an MPUB declared ends in ``_buf`` (its messages may read past it, as in nsqd)
        self._mpub_end = 0

    def feed(self, data: bytes) -> None:
        pos = self._pos
        if pos == len(self._buf) and not self._chunks:
            # everything before was parsed (the usual case): this read is the input
            self._mpub_end -= pos
            self._buf = data
            self._pos = 0
            return
        self._chunks.append(data)
        self._chunk_bytes += len(data)
        have = len(self._buf) - pos + self._chunk_bytes
        # a command line waits for its newline (or for being too long to wait any more)
        if have >= self._want or (self._state == _LINE and b"\n" in data):
            self._join()

    def _join(self) -> None:
        """Make the unparsed input and the reads held aside one buffer."""
        pos = self._pos
        self._buf = b"".join([self._buf[pos:], *self._chunks])
        self._mpub_end -= pos
        self._pos = 0
        self._chunks = []
        self._chunk_bytes = 0

    def buffered(self) -> int:
        """Bytes received and not yet parsed into a command."""
        return len(self._buf) - self._pos + self._chunk_bytes

    def take_buffered(self) -> bytes:
        """Hand over the bytes not parsed yet and forget them.

        After IDENTIFY negotiates TLS or compression the rest of the stream
        is in the new encoding; what already arrived belongs to that layer.
        """
        self._join()
        data = self._buf
        self._buf = b""
        return data

    def in_command(self) -> bool:
        """True while part of a command has been read (a frame is incomplete)."""
        return self._state != _LINE or self.buffered() > 0

    def release(self) -> None:
        """The connection is gone: drop the input and the header check.

        The check is usually a bound method of the protocol that owns this
        parser, a reference cycle; left in place, every closed connection
        would wait for the cyclic garbage collector, whose collections of
        tens of thousands of such objects stalled the reactor for tens of
        milliseconds under connection churn.
        """
        self._check_header = _no_check
        self._buf = b""
        self._pos = 0
        self._chunks = []
        self._chunk_bytes = 0
        self._messages = []

    def next_command(self, max_reqs: int = REQS_PER_RUN) -> Command | None:
        """The next complete command, or None until more bytes arrive.

        The states follow each other within one call as far as the input
        goes, so a command that arrived whole comes out of the call that
        read its line. A run of REQ lines carries at most ``max_reqs`` of
        them (the caller's budget for this turn). Raises :class:`NSQError`
        (always fatal: the parser is not used after one) for malformed input
        and :class:`LineTooLong` for an over-long line.
        """
        buf = self._buf
        state = self._state
        pos = self._pos
        # what a read held aside must bring before it is joined (see feed); meaningful
        # only when this call stops for lack of input, else any read is joined
        self._want = 0
        want = 4
        while True:
            if state == _LINE:
                nl = buf.find(b"\n", pos)
                if nl < 0:
                    if len(buf) - pos > MAX_LINE_LENGTH:
                        raise LineTooLong()
                    want = MAX_LINE_LENGTH + 1
                    break
                length = nl - pos
                if length >= MAX_LINE_LENGTH:
                    raise LineTooLong()
                if length == _FIN_LINE - 1 and buf[pos] == 70 and buf[pos + 1] == 73 and buf[pos + 2] == 78:
                    ids = self._take_fins(pos)  # "FIN"
                    if ids:
                        self._check_header(b"FIN", [])
                        return Command(b"FIN", [], None, None, ids)
                elif 21 < length < 31 and max_reqs > 0 and buf[pos] == 82 and buf[pos + 1] == 69:
                    reqs = self._take_reqs(pos, max_reqs)  # "RE"
                    if reqs:
                        self._check_header(b"REQ", [])
                        return Command(b"REQ", [], None, None, None, reqs)
                end = nl
                if length and buf[end - 1] == 13:  # optional \r
                    end -= 1
                args = buf[pos:end].split(b" ")
                name = args.pop(0)
                pos = self._pos = nl + 1
                self._check_header(name, args)
                if name not in BODY_COMMANDS:
                    return Command(name, args)
                self._name = name
                self._args = args
                state = _SIZE
            if state == _SIZE:
                if len(buf) - pos < 4:
                    break
                size = read_i32_be(buf, pos)
                pos += 4
                name = self._name
                if name == b"MPUB":
                    if size <= 0 or size > self.max_body_size:
                        raise self._bad_size(size)
                    self._mpub_end = pos + size
                    state = _MPUB_COUNT
                else:
                    limit = self.max_msg_size if name == b"PUB" or name == b"DPUB" else self.max_body_size
                    if size <= 0 or size > limit:
                        raise self._bad_size(size)
                    self._need = size
                    state = _BODY
            if state == _BODY:
                end = pos + self._need
                if len(buf) < end:
                    want = self._need
                    break
                self._state = _LINE
                self._pos = end
                return Command(self._name, self._args, buf[pos:end])
            if state == _MPUB_COUNT:
                if len(buf) - pos < 4:
                    break
                count = read_i32_be(buf, pos)
                pos += 4
                # each message takes at least 5 bytes (size + one byte of body)
                if count <= 0 or count > (self.max_body_size - 4) // 5:
                    raise fatal("E_BAD_BODY", f"MPUB invalid message count {count}")
                self._mpub_left = count
                self._mpub_total = 4
                state = _MPUB_SIZE
            if state == _MPUB_SIZE:
                pos = self._take_mpub_messages(pos)
                if not self._mpub_left:
                    messages = self._messages
                    self._messages = []
                    self._state = _LINE
                    self._pos = pos
                    return Command(self._name, self._args, None, messages)
                if len(buf) - pos < 4:
                    break
                size = read_i32_be(buf, pos)
                pos += 4
                self._check_mpub_message(size)
                state = _MPUB_BODY
            if state == _MPUB_BODY:
                need = self._need
                if len(buf) - pos < need:
                    want = need
                    break
                self._messages.append(buf[pos:pos + need])
                pos += need
                self._mpub_left -= 1
                state = _MPUB_SIZE
            elif state == _MAGIC:
                if len(buf) - pos < 4:
                    break
                if buf[pos:pos + 4] != MAGIC_V2:
                    raise NSQError("E_BAD_PROTOCOL")
                pos += 4
                state = self._state = _LINE
        self._state = state
        self._pos = pos
        self._want = want
        return None

    def _take_fins(self, pos: int) -> list[bytes]:
        """The IDs of the run of plain FIN lines at ``pos``, consumed; [] leaves the line
        to the generic parse (whose errors are nsqd's).

        A plain line is ``FIN `` and a 16-byte ID nsqd would take as one
        argument (no space or newline in it, not ending in the ``\r`` of a
        ``\r\n`` line end), then ``\n``. The lines are looked at a piece at a
        time (growing, so a lone FIN before a large body copies little); a
        piece of nothing but plain lines is checked and split in a few bulk
        operations (:func:`_plain_fins`, ``struct``), anything else by
        :data:`_FIN_RUN`, which finds where the run ends.
        """
        buf = self._buf
        ids: list[bytes] = []
        lines_wanted = 64
        while True:
            count = min(lines_wanted, (len(buf) - pos) // _FIN_LINE)
            if count == 0:
                break
            lines = buf[pos:pos + count * _FIN_LINE]
            if not _plain_fins(lines, count):
                run = _FIN_RUN.match(lines)
                count = 0 if run is None else run.end() // _FIN_LINE
                lines = lines[:count * _FIN_LINE]
            _split_fins(lines, count, ids)
            pos += count * _FIN_LINE
            if count < lines_wanted:
                break
            lines_wanted *= 4
        self._pos = pos
        return ids

    def _take_reqs(self, pos: int, limit: int) -> list[tuple[bytes, int]]:
        """(ID, timeout in ms) of up to ``limit`` plain REQ lines at ``pos``, consumed."""
        match = _REQ_LINE.match
        buf = self._buf
        reqs: list[tuple[bytes, int]] = []
        found = match(buf, pos)
        while found is not None:
            reqs.append((found.group(1), int(found.group(2))))
            pos = found.end()
            if len(reqs) == limit:
                break
            found = match(buf, pos)
        self._pos = pos
        return reqs

    def _take_mpub_messages(self, pos: int) -> int:
        """Take the MPUB messages lying whole in the input at ``pos``, each valid, in one
        loop; where they end.

        A message whose size is out of range, would take the MPUB past
        ``--max-body-size``, lies past the declared body or has not fully
        arrived stops the loop: :meth:`next_command` then reads its size the
        one-by-one way, which gives nsqd's error or waits for more.
        """
        left = self._mpub_left
        if not left or self._mpub_end <= pos:
            return pos
        buf = self._buf
        total: i64 = self._mpub_total
        # messages past the declared size go one by one
        end: i64 = min(len(buf), self._mpub_end)
        max_msg: i64 = self.max_msg_size
        max_body: i64 = self.max_body_size
        messages = self._messages
        at: i64 = pos
        # machine integers and librt's reader when compiled: no Python int or tuple per message
        while left and end - at >= 4:
            size = i64(read_i32_be(buf, at))
            start = at + 4
            if size <= 0 or size > max_msg or total + 4 + size > max_body or end - start < size:
                break
            messages.append(buf[start:start + size])
            at = start + size
            total += 4 + size
            left -= 1
        self._mpub_left = left
        self._mpub_total = total
        return at

    def _bad_size(self, size: int) -> NSQError:
        """nsqd's error for a body size out of range (the caller found it so)."""
        name = self._name
        cmd = name.decode()
        if name == b"PUB" or name == b"DPUB":
            if size <= 0:
                return fatal("E_BAD_MESSAGE", f"{cmd} invalid message body size {size}")
            return fatal("E_BAD_MESSAGE", f"{cmd} message too big {size} > {self.max_msg_size}")
        if size > self.max_body_size:  # checked first for IDENTIFY and AUTH, as nsqd does
            return fatal("E_BAD_BODY", f"{cmd} body too big {size} > {self.max_body_size}")
        return fatal("E_BAD_BODY", f"{cmd} invalid body size {size}")

    def _check_mpub_message(self, size: int) -> None:
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


NOP: Final = b"NOP\n"
CLS: Final = b"CLS\n"

_FRAME_HEADER: Final = struct.Struct(">ii")


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
