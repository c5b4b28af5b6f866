"""A small blocking V2 client for the Spark connector's driver and executor processes.

Spark runs the connector in plain Python worker processes, not under a
reactor, so this client uses ordinary sockets. It speaks the V2 protocol as
any NSQ client does (IDENTIFY with feature negotiation, optional TLS and AUTH,
SUB, RDY, FIN, TOUCH, REQ, MPUB, NOP) and works against Go nsqd and nsqtw
alike. Encoding goes through :mod:`nsqtw.protocol.wire` and :mod:`nsqtw.core.message`.

One thread reads a connection (:meth:`NSQConnection.read_frames`); any
thread may send (sends are serialised by a lock), which lets the driver's I/O
thread answer heartbeats and TOUCH while Spark's thread FINs.
"""

from __future__ import annotations

import json
import socket
import ssl
import struct
import threading
import time
from dataclasses import dataclass
from typing import Any

from nsqtw import __version__
from nsqtw.core.message import FRAME_TYPE_ERROR, FRAME_TYPE_MESSAGE, FRAME_TYPE_RESPONSE
from nsqtw.protocol.wire import MAGIC_V2, encode_command, encode_mpub, fin, rdy, req, split_frames, touch
from nsqtw.spark.blocks import scan_frames

#: the command encoders the consumer uses, shared with the Twisted client through protocol.wire
__all__ = ["ConnectSettings", "HEARTBEAT", "NSQClientError", "NSQConnection", "fin", "rdy", "req",
           "split_address", "touch"]

HEARTBEAT = b"_heartbeat_"
USER_AGENT = f"nsqtw-spark/{__version__}"


class NSQClientError(Exception):
    """nsqd answered with an error frame, or the connection failed."""


@dataclass(frozen=True)
class ConnectSettings:
    """What every connection sends in IDENTIFY and how it secures itself."""

    client_id: str = ""
    msg_timeout_ms: int = 0          # 0: nsqd's --msg-timeout
    heartbeat_interval_ms: int = 0   # 0: nsqd's default (--client-timeout/2)
    connect_timeout: float = 10.0
    tls: bool = False
    tls_ca_file: str | None = None
    tls_cert_file: str | None = None
    tls_key_file: str | None = None
    tls_insecure_skip_verify: bool = False
    auth_secret: str | None = None

    def identify_body(self) -> bytes:
        data: dict[str, Any] = {
            "client_id": self.client_id or socket.gethostname(),
            "hostname": socket.gethostname(),
            "user_agent": USER_AGENT,
            "feature_negotiation": True,
            "tls_v1": self.tls,
        }
        if self.msg_timeout_ms:
            data["msg_timeout"] = self.msg_timeout_ms
        if self.heartbeat_interval_ms:
            data["heartbeat_interval"] = self.heartbeat_interval_ms
        return json.dumps(data).encode()

    def ssl_context(self) -> ssl.SSLContext:
        ctx = ssl.create_default_context(cafile=self.tls_ca_file)
        if self.tls_cert_file:
            ctx.load_cert_chain(self.tls_cert_file, self.tls_key_file)
        if self.tls_insecure_skip_verify:
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
        return ctx


def split_address(address: str) -> tuple[str, int]:
    """``host:port`` (IPv6 hosts in brackets) as a tuple; ValueError when malformed."""
    host, sep, port = address.strip().rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"invalid address {address!r}: want HOST:PORT")
    return host, int(port)


class NSQConnection:
    """One V2 connection to one nsqd.

    After :meth:`connect`, ``settings`` holds nsqd's IDENTIFY answer
    (``max_rdy_count``, ``msg_timeout``, ``max_msg_timeout``...).
    """

    def __init__(self, address: str, settings: ConnectSettings = ConnectSettings()) -> None:
        self.address = address
        self.config = settings
        self.settings: dict[str, Any] = {}
        self.sock: socket.socket | None = None
        self._buf = bytearray()
        self._frames: list[tuple[int, bytes]] = []
        self._send_lock = threading.Lock()
        self.closed = False

    # -- setup -------------------------------------------------------------

    def connect(self) -> NSQConnection:
        """Connect, IDENTIFY, and upgrade to TLS and AUTH as negotiated; blocks."""
        host, port = split_address(self.address)
        timeout = self.config.connect_timeout
        try:
            sock = socket.create_connection((host, port), timeout=timeout)
        except OSError as e:
            raise NSQClientError(f"{self.address}: cannot connect: {e}") from e
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.sock = sock
        try:
            sock.sendall(MAGIC_V2 + encode_command(b"IDENTIFY", body=self.config.identify_body()))
            answer = self.expect_response(timeout)
            if answer != b"OK":
                self.settings = json.loads(answer)
            if self.settings.get("tls_v1"):
                self._upgrade_tls(host)
            elif self.config.tls:
                raise NSQClientError(f"{self.address}: TLS requested but nsqd did not enable it")
            if self.settings.get("auth_required"):
                self._auth()
            self.sock.settimeout(None)
        except (OSError, ValueError) as e:  # ssl.SSLError, resets, a garbled IDENTIFY answer
            self.close()
            raise NSQClientError(f"{self.address}: handshake failed: {e}") from e
        except BaseException:
            self.close()
            raise
        return self

    def _upgrade_tls(self, host: str) -> None:
        assert self.sock is not None
        self.sock = self.config.ssl_context().wrap_socket(self.sock, server_hostname=host)
        self.sock.settimeout(self.config.connect_timeout)
        if self.expect_response(self.config.connect_timeout) != b"OK":
            raise NSQClientError(f"{self.address}: TLS upgrade was not acknowledged")

    def _auth(self) -> None:
        if not self.config.auth_secret:
            raise NSQClientError(f"{self.address}: nsqd requires AUTH; set the auth_secret option")
        self.send(encode_command(b"AUTH", body=self.config.auth_secret.encode()))
        self.expect_response(self.config.connect_timeout)

    def subscribe(self, topic: str, channel: str) -> None:
        self.send(encode_command(b"SUB", topic.encode(), channel.encode()))
        self.expect_response(self.config.connect_timeout)

    # -- I/O ---------------------------------------------------------------

    def send(self, data: bytes) -> None:
        if self.sock is None or self.closed:
            raise NSQClientError(f"{self.address}: connection closed")
        with self._send_lock:
            try:
                self.sock.sendall(data)
            except OSError as e:
                self.closed = True
                raise NSQClientError(f"{self.address}: send failed: {e}") from e

    def fileno(self) -> int:
        return self.sock.fileno() if self.sock is not None else -1

    def pending(self) -> bool:
        """True when frames or TLS bytes are buffered where select() cannot see them."""
        return bool(self._frames) or (isinstance(self.sock, ssl.SSLSocket) and self.sock.pending() > 0)

    def _recv(self) -> None:
        """One recv() into the buffer; raises NSQClientError when the connection is gone."""
        assert self.sock is not None
        try:
            if isinstance(self.sock, ssl.SSLSocket):
                # one OpenSSL connection must not read and write in two threads at once
                with self._send_lock:
                    chunk = self.sock.recv(1 << 18)
            else:
                chunk = self.sock.recv(1 << 18)
        except (ssl.SSLWantReadError, BlockingIOError):
            return
        except TimeoutError:
            raise
        except OSError as e:
            self.closed = True
            raise NSQClientError(f"{self.address}: connection lost: {e}") from e
        if not chunk:
            self.closed = True
            raise NSQClientError(f"{self.address}: connection closed by nsqd")
        self._buf += chunk

    def _fill(self) -> None:
        self._recv()
        self._frames.extend(split_frames(self._buf))

    def read_frames(self) -> list[tuple[int, bytes]]:
        """The complete frames buffered or readable now (call when select() says readable).

        Raises :class:`NSQClientError` when nsqd has closed the connection.
        """
        if not self._frames:
            self._fill()
        frames, self._frames = self._frames, []
        return frames

    def read_messages(self) -> tuple[bytes, list[int], list[tuple[int, bytes]]]:
        """What one read brings (call when select() says readable), for the consumer's I/O thread.

        Returns the bytes of the complete frames, where the message frames
        start in them, and the other frames as ``(type, data)``; no per-frame
        objects are made for messages (see :mod:`nsqtw.spark.blocks`).
        Raises :class:`NSQClientError` when nsqd has closed the connection.
        """
        if self._frames:
            # frames split off while setting up: put them back in front, in wire form
            self._buf[:0] = b"".join(struct.pack(">ii", len(d) + 4, t) + d for t, d in self._frames)
            self._frames = []
        else:
            self._recv()
        starts, others, used = scan_frames(self._buf)
        data = bytes(self._buf[:used])
        del self._buf[:used]
        return data, starts, others

    def expect_response(self, timeout: float) -> bytes:
        """The next response frame, answering heartbeats; raises on an error frame.

        For request/response use only (set-up and publishing), where no
        other thread reads the connection.
        """
        assert self.sock is not None
        deadline = time.monotonic() + timeout
        while True:
            while not self._frames:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise NSQClientError(f"{self.address}: no response within {timeout}s")
                self.sock.settimeout(left)
                try:
                    self._fill()
                except TimeoutError:
                    continue
            ftype, data = self._frames.pop(0)
            if ftype == FRAME_TYPE_RESPONSE and data == HEARTBEAT:
                self.send(b"NOP\n")
            elif ftype == FRAME_TYPE_ERROR:
                raise NSQClientError(f"{self.address}: {data.decode('utf-8', 'replace')}")
            elif ftype == FRAME_TYPE_MESSAGE:
                raise NSQClientError(f"{self.address}: unexpected message while waiting for a response")
            else:
                return data

    # -- commands ------------------------------------------------------------

    def publish(self, topic: str, bodies: list[bytes], timeout: float = 30.0) -> None:
        """MPUB ``bodies`` and wait for OK (the caller keeps them under nsqd's limits)."""
        self.send(encode_mpub(topic.encode(), bodies))
        self.expect_response(timeout)

    def close(self) -> None:
        self.closed = True
        if self.sock is not None:
            try:
                self.sock.close()
            except OSError:
                pass

