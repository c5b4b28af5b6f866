"""A minimal blocking V2 client over a real socket, for live tests."""

from __future__ import annotations

import socket
import struct
import time

FRAME_RESPONSE, FRAME_ERROR, FRAME_MESSAGE = 0, 1, 2


class Closed(Exception):
    """The daemon closed the connection."""


class RawClient:
    def __init__(self, address: tuple[str, int] | str, timeout: float = 5.0, magic: bool = True) -> None:
        if isinstance(address, str):
            host, port = address.rsplit(":", 1)
            address = (host, int(port))
        self.sock = socket.create_connection(address, timeout=timeout)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buf = b""
        if magic:
            self.sock.sendall(b"  V2")

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def command(self, line: str, body: bytes | None = None) -> None:
        data = line.encode() + b"\n"
        if body is not None:
            data += struct.pack(">i", len(body)) + body
        self.sock.sendall(data)

    def mpub(self, topic: str, bodies: list[bytes]) -> None:
        payload = struct.pack(">i", len(bodies)) + b"".join(struct.pack(">i", len(b)) + b for b in bodies)
        self.sock.sendall(f"MPUB {topic}\n".encode() + struct.pack(">i", len(payload)) + payload)

    def read_frame(self, timeout: float | None = None) -> tuple[int, bytes]:
        """The next frame, answering heartbeats on the way."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            if len(self.buf) >= 8:
                size, ftype = struct.unpack_from(">ii", self.buf)
                if len(self.buf) >= 4 + size:
                    data = self.buf[8:4 + size]
                    self.buf = self.buf[4 + size:]
                    if ftype == FRAME_RESPONSE and data == b"_heartbeat_":
                        self.sock.sendall(b"NOP\n")
                        continue
                    return ftype, data
            if deadline is not None:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError()
                self.sock.settimeout(left)
            chunk = self.sock.recv(1 << 16)
            if not chunk:
                raise Closed()
            self.buf += chunk

    def expect_ok(self) -> None:
        ftype, data = self.read_frame()
        assert (ftype, data) == (FRAME_RESPONSE, b"OK"), (ftype, data)

    def messages(self, count: int, timeout: float = 10.0, fin: bool = True) -> list[tuple[int, bytes, bytes]]:
        """``count`` messages as (attempts, id, body), FINed unless told not to."""
        out = []
        deadline = time.monotonic() + timeout
        while len(out) < count:
            ftype, data = self.read_frame(max(0.01, deadline - time.monotonic()))
            if ftype != FRAME_MESSAGE:
                continue
            attempts = struct.unpack_from(">H", data, 8)[0]
            msg_id, body = data[10:26], data[26:]
            out.append((attempts, msg_id, body))
            if fin:
                self.sock.sendall(b"FIN " + msg_id + b"\n")
        return out

    def close(self) -> None:
        self.sock.close()


def subscribe(address: str, topic: str, channel: str, rdy: int = 100) -> RawClient:
    c = RawClient(address)
    c.command(f"SUB {topic} {channel}")
    c.expect_ok()
    c.command(f"RDY {rdy}")
    return c
