"""A blocking raw V2 client over a real socket, for live tests.

Not a copy of :mod:`nsqtw.client`: tests of the daemon need to send any
bytes at any moment and see every frame as it arrives. Commands are built
with the client library's wire code (:mod:`nsqtw.protocol.wire`).

It speaks the wire format byte for byte, so a test sees exactly what a client
sees: frames, their timing and the moment the daemon hangs up. Every read is
bounded by a timeout.
"""

from __future__ import annotations

import json
import select
import socket
import struct
import time
from typing import Any

from nsqtw.protocol.wire import encode_command, encode_mpub

FRAME_RESPONSE = 0
FRAME_ERROR = 1
FRAME_MESSAGE = 2

HEARTBEAT = (FRAME_RESPONSE, b"_heartbeat_")
OK = (FRAME_RESPONSE, b"OK")


class Closed(Exception):
    """The daemon closed the connection."""


class Msg:
    """A MESSAGE frame, decoded."""

    def __init__(self, payload: bytes) -> None:
        self.timestamp, self.attempts = struct.unpack_from(">qH", payload)
        self.id = payload[10:26]
        self.body = payload[26:]

    def __repr__(self) -> str:
        return f"Msg({self.id!r}, attempts={self.attempts}, body={self.body!r})"


class Client:
    """A blocking V2 client: raw bytes out, whole frames in, every read bounded."""

    def __init__(self, address: str, magic: bool = True, timeout: float = 5.0) -> None:
        host, port = address.rsplit(":", 1)
        self.sock = socket.create_connection((host, int(port)), timeout=timeout)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.timeout = timeout
        self.buf = b""
        self.closed = False
        #: set by a test after negotiating compression: bytes out / bytes in (start_decoding)
        self.encode: Any = None
        self.decode: Any = None
        if magic:
            self.send(b"  V2")

    def start_decoding(self, decode: Any) -> None:
        """Read through ``decode`` from here on, bytes already received after the last frame included.

        The daemon's first compressed bytes may arrive in the same read as
        the plain IDENTIFY answer.
        """
        self.decode = decode
        if self.buf:
            self.buf = decode(self.buf)

    def send(self, data: bytes) -> None:
        if self.encode is not None:
            data = self.encode(data)
        self.sock.sendall(data)

    def cmd(self, name: str, *args: Any, body: bytes | None = None) -> None:
        self.send(encode_command(name.encode(), *(str(a).encode() for a in args), body=body))

    def mpub(self, topic: str, bodies: list[bytes]) -> None:
        self.send(encode_mpub(topic.encode(), bodies))

    def _fill(self, deadline: float) -> None:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("no frame in time")
        self.sock.settimeout(left)
        try:
            chunk = self.sock.recv(65536)
        except ConnectionResetError:
            chunk = b""
        if not chunk:
            self.closed = True
            raise Closed()
        if self.decode is not None:
            chunk = self.decode(chunk)
        self.buf += chunk

    def frame_ready(self) -> bool:
        if len(self.buf) < 4:
            return False
        (size,) = struct.unpack_from(">i", self.buf)
        return len(self.buf) >= 4 + size

    def read_frame(self, timeout: float | None = None) -> tuple[int, bytes]:
        """The next frame ``(type, data)``; raises :class:`Closed` or ``socket.timeout``."""
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        while not self.frame_ready():
            self._fill(deadline)
        size, ftype = struct.unpack_from(">ii", self.buf)
        data = self.buf[8:4 + size]
        self.buf = self.buf[4 + size:]
        return ftype, data

    def read(self, timeout: float | None = None, nop: bool = True) -> tuple[int, bytes]:
        """The next frame that is not a heartbeat (answered with NOP unless ``nop`` is false)."""
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        while True:
            f = self.read_frame(max(0.0, deadline - time.monotonic()))
            if f != HEARTBEAT:
                return f
            if nop:
                self.cmd("NOP")

    def response(self, timeout: float | None = None) -> tuple[int, bytes]:
        return self.read(timeout)

    def message(self, timeout: float | None = None, nop: bool = True) -> Msg:
        ftype, data = self.read(timeout, nop)
        assert ftype == FRAME_MESSAGE, (ftype, data)
        return Msg(data)

    def messages(self, n: int, timeout: float | None = None, fin: bool = False) -> list[Msg]:
        """``n`` messages, FINed as they arrive when ``fin`` is true."""
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        out = []
        for _ in range(n):
            m = self.message(max(0.0, deadline - time.monotonic()))
            if fin:
                self.fin(m)
            out.append(m)
        return out

    def drain(self, quiet: float = 2.0) -> list[Msg]:
        """FIN and return every message until none arrives for ``quiet`` seconds."""
        out = []
        try:
            while True:
                out.extend(self.messages(1, timeout=quiet, fin=True))
        except (TimeoutError, Closed):
            return out

    def nothing_for(self, seconds: float) -> list[tuple[int, bytes]]:
        """Frames (heartbeats aside) that arrive within ``seconds``; [] when quiet."""
        got = []
        deadline = time.monotonic() + seconds
        while True:
            try:
                got.append(self.read(max(0.0, deadline - time.monotonic())))
            except TimeoutError:
                return got

    def wait_closed(self, timeout: float) -> list[tuple[int, bytes]]:
        """Read until the daemon hangs up; returns the frames seen before. Fails on timeout."""
        got = []
        deadline = time.monotonic() + timeout
        try:
            while True:
                got.append(self.read_frame(max(0.0, deadline - time.monotonic())))
        except Closed:
            return got
        except TimeoutError:
            raise AssertionError(f"connection still open after {timeout}s; frames {got}") from None

    def is_open(self, wait: float = 0.2) -> bool:
        """True if the connection stays open (and silent apart from heartbeats) for ``wait``."""
        try:
            extra = self.nothing_for(wait)
        except Closed:
            return False
        assert not extra, extra
        return True

    def identify(self, **settings: Any) -> tuple[int, bytes]:
        self.cmd("IDENTIFY", body=json.dumps(settings).encode())
        return self.response()

    def sub(self, topic: str, channel: str, rdy: int | None = None) -> None:
        self.cmd("SUB", topic, channel)
        assert self.response() == OK
        if rdy is not None:
            self.cmd("RDY", rdy)

    def pub(self, topic: str, body: bytes) -> None:
        self.cmd("PUB", topic, body=body)
        assert self.response() == OK

    def fin(self, msg: Msg) -> None:
        self.send(b"FIN " + msg.id + b"\n")

    def close(self) -> None:
        self.sock.close()


def collect(clients: list[Client], until: Any, timeout: float, fin: bool = True) -> dict[int, list[Msg]]:
    """Read MESSAGE frames from several clients at once (FIN each) until ``until(got)`` or timeout."""
    got: dict[int, list[Msg]] = {i: [] for i in range(len(clients))}
    deadline = time.monotonic() + timeout
    while not until(got):
        left = deadline - time.monotonic()
        if left <= 0:
            break
        waiting = [c for c in clients if not c.frame_ready()]
        if len(waiting) == len(clients):
            ready, _, _ = select.select([c.sock for c in clients], [], [], left)
        else:
            ready = []
        for i, c in enumerate(clients):
            if c.sock in ready:
                c._fill(time.monotonic() + 1)
            fins = []
            while c.frame_ready():
                ftype, data = c.read_frame(0)
                if (ftype, data) == HEARTBEAT:
                    c.cmd("NOP")
                    continue
                assert ftype == FRAME_MESSAGE, (ftype, data)
                m = Msg(data)
                got[i].append(m)
                fins.append(b"FIN " + m.id + b"\n")
            if fins and fin:
                c.send(b"".join(fins))
    return got


def pub(address: str, topic: str, *bodies: bytes) -> None:
    c = Client(address)
    for b in bodies:
        c.pub(topic, b)
    c.close()


def subscribe(address: str, topic: str, channel: str, rdy: int = 100) -> Client:
    c = Client(address)
    c.sub(topic, channel, rdy)
    return c


def read_lookupd_response(sock: socket.socket) -> bytes:
    """One nsqlookupd V1 response, its 4-byte size included, read in full from a blocking socket."""
    def exactly(n: int) -> bytes:
        buf = b""
        while len(buf) < n:
            chunk = sock.recv(n - len(buf))
            assert chunk, "connection closed early"
            buf += chunk
        return buf

    head = exactly(4)
    (size,) = struct.unpack(">i", head)
    return head + exactly(size)


def register_with_lookupd(address: str, info: dict[str, Any], topic: str, channel: str) -> socket.socket:
    """A raw V1 peer of nsqlookupd: IDENTIFY with ``info``, REGISTER ``topic`` and ``channel``.

    The socket is returned open: closing it unregisters the peer.
    """
    host, _, port = address.rpartition(":")
    sock = socket.create_connection((host, int(port)), timeout=10)
    body = json.dumps(info).encode()
    sock.sendall(b"  V1IDENTIFY\n" + struct.pack(">i", len(body)) + body)
    answer = read_lookupd_response(sock)[4:]
    assert answer.startswith(b"{"), answer
    sock.sendall(f"REGISTER {topic} {channel}\n".encode())
    assert read_lookupd_response(sock)[4:] == b"OK"
    return sock
