"""Shared test helpers: options, an in-memory NSQD, frame reading."""

from __future__ import annotations

import dataclasses
import json
import os
import socket
import struct
import time
from collections.abc import Callable
from typing import Any

from twisted.internet import tcp
from twisted.internet.defer import Deferred
from twisted.internet.task import Clock
from twisted.internet.testing import StringTransport
from zope.interface import implementer

from nsqtw.core.nsqd import NSQD
from nsqtw.interfaces import IDiskExecutor
from nsqtw.lookupd.lookupd import NSQLookupd
from nsqtw.lookupd.options import defaults as lookupd_defaults
from nsqtw.nsqd.options import defaults
from nsqtw.protocol.v2 import V2Factory, V2Protocol
from nsqtw.storage.executor import run_job

#: facts recorded from Go nsqd/nsqlookupd v1.3.0 (copied from the project workspace)
REFERENCE_DIR = os.path.join(os.path.dirname(__file__), "reference")
#: a fixed "now" so stats and IDs are reproducible
EPOCH = 1795341386.0


def reference(name: str) -> Any:
    with open(os.path.join(REFERENCE_DIR, name)) as f:
        return json.load(f)


def make_options(**overrides: Any) -> Any:
    return dataclasses.replace(defaults(), **overrides)


def make_nsqd(**overrides: Any) -> tuple[NSQD, Clock]:
    clock = Clock()
    clock.advance(EPOCH)
    return NSQD(make_options(**overrides), clock), clock


def make_lookupd(**overrides: Any) -> tuple[NSQLookupd, Clock]:
    """An NSQLookupd shaped like the one the reference answers were recorded from."""
    clock = Clock()
    clock.advance(EPOCH)
    options = dataclasses.replace(lookupd_defaults("vm"), broadcast_address="127.0.0.1", **overrides)
    lookupd = NSQLookupd(options, clock, hostname="vm")
    lookupd.tcp_port, lookupd.http_port = 38645, 39703
    return lookupd, clock


def connect(nsqd: NSQD, clock: Clock, magic: bool = True) -> tuple[V2Protocol, StringTransport]:
    proto = V2Factory(nsqd, clock).buildProtocol(None)
    transport = StringTransport()
    proto.makeConnection(transport)
    if magic:
        proto.dataReceived(b"  V2")
    return proto, transport


def read_frames(data: bytes) -> list[tuple[int, bytes]]:
    """Split a byte string into (frame_type, payload) pairs."""
    frames = []
    pos = 0
    while pos + 8 <= len(data):
        size, ftype = struct.unpack_from(">ii", data, pos)
        frames.append((ftype, data[pos + 8:pos + 4 + size]))
        pos += 4 + size
    assert pos == len(data), "trailing partial frame"
    return frames


def take_frames(transport: StringTransport) -> list[tuple[int, bytes]]:
    frames = read_frames(transport.value())
    transport.clear()
    return frames


def decode_message_frame(payload: bytes) -> tuple[int, int, bytes, bytes]:
    ts, attempts = struct.unpack_from(">qH", payload)
    return ts, attempts, payload[10:26], payload[26:]


def body(data: bytes) -> bytes:
    return struct.pack(">i", len(data)) + data


def wait_for(check: Callable[[], Any], timeout: float = 20.0, what: str = "condition") -> Any:
    """Poll ``check`` until it returns something true and return that; fail after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}: last {value!r}")
        time.sleep(0.05)


def one_turn(clock) -> None:
    """Run the calls due now, not those they schedule: one reactor turn (task.Clock runs both)."""
    due = [c for c in clock.calls if c.getTime() <= clock.seconds()]
    for call in due:
        if call.active():
            clock.calls.remove(call)
            call.called = 1
            call.func(*call.args, **call.kw)


def link_records(transport: StringTransport) -> list[tuple[int, list[Any]]]:
    """The worker-link records written to ``transport`` since it was last cleared, as
    (kind, fields) decoded by the link's own table; the transport is cleared."""
    from nsqtw.workers.link import KINDS

    data = transport.value()
    transport.clear()
    out = []
    at = 0
    while at < len(data):
        end = at + 4 + int.from_bytes(data[at:at + 4], "big")
        kind = data[at + 4]
        out.append((kind, KINDS[kind].decode(data, at + 5, end)))
        at = end
    return out


@implementer(IDiskExecutor)
class PlainTCP(tcp.Connection):
    """A plain TCP transport on ``sock`` without a reactor: only what a direct send looks at
    (:func:`nsqtw.net.eager.direct_sender`); what Twisted's write would queue lands in ``queued``."""

    def __init__(self, sock: socket.socket) -> None:
        self.socket = sock
        self.connected = 1
        self._tempDataLen = 0
        self.queued: list[bytes] = []

    def write(self, data: bytes) -> None:
        self.queued.append(data)

    def writeSequence(self, seq: list[bytes]) -> None:
        self.queued.extend(seq)


class ManualExecutor:
    """A disk lane whose jobs wait, in order, until the test runs them (a disk thread busy elsewhere)."""

    def __init__(self) -> None:
        self.jobs: list[tuple[Deferred[Any], Callable[..., Any], tuple[Any, ...]]] = []

    def submit(self, fn: Callable[..., Any], *args: Any) -> Deferred[Any]:
        d: Deferred[Any] = Deferred()
        self.jobs.append((d, fn, args))
        return d

    def run(self) -> None:
        while self.jobs:
            d, fn, args = self.jobs.pop(0)
            run_job(d, fn, *args)  # as the real lane finishes a job (a Reply's value, then its after())

    def stop(self) -> None:
        pass
