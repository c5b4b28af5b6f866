"""Connection floods: a thousand clients at once are all served; idle ones are cut by the heartbeat rules."""

from __future__ import annotations

import resource
import selectors
import struct
import time
from collections.abc import Iterator

import pytest

from tests.rawclient import FRAME_MESSAGE, HEARTBEAT, OK, Client, Closed, Msg
from tests.reliability.conftest import assert_no_traceback, ping

TOPICS = 15
CHANNELS = 30  # consumers: one per (topic, channel)
PUBLISHERS = 450
IDLE = 100


@pytest.fixture
def many_fds() -> Iterator[None]:
    """Raise this process's open-file limit (the daemon subprocess inherits it)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = 4096 if hard == resource.RLIM_INFINITY else min(hard, 4096)
    if want < 2600:
        pytest.skip(f"RLIMIT_NOFILE hard limit {hard} is too low for the flood")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, want), hard))
    yield
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def _frames(c: Client) -> list[tuple[int, bytes]]:
    """The whole frames already received on ``c`` (reads once, without blocking)."""
    try:
        c._fill(time.monotonic() + 1)
    except Closed:
        pass
    out = []
    while c.frame_ready():
        out.append(c.read_frame(0))
    return out


def test_thousand_connections_all_served_idle_cut(many_fds, daemon_factory) -> None:
    """1,000 concurrent connections: every publisher is answered, every consumer gets its messages,
    and the idle ones (heartbeat 1 s, never answering) are hung up on within a few seconds."""
    d = daemon_factory()
    consumers = []
    for i in range(TOPICS * CHANNELS):
        c = Client(d.tcp_address, timeout=30)
        c.cmd("SUB", f"flood{i % TOPICS}", f"c{i // TOPICS}")
        c.cmd("RDY", 100)
        consumers.append(c)
    idle = []
    for _ in range(IDLE):
        c = Client(d.tcp_address, timeout=30)
        c.cmd("IDENTIFY", body=b'{"heartbeat_interval": 1000}')
        idle.append(c)
    publishers = [Client(d.tcp_address, timeout=30) for _ in range(PUBLISHERS)]
    assert len(consumers) + len(idle) + len(publishers) == 1000
    for c in consumers:
        assert c.read_frame() == OK
    for c in idle:
        assert c.read_frame() == OK
    t_idle = time.monotonic()

    # every publisher publishes at once (pipelined across the sockets), then reads its answer
    for j, p in enumerate(publishers):
        body = b"m%03d" % j
        p.send(f"PUB flood{j % TOPICS}\n".encode() + struct.pack(">i", len(body)) + body)
    for p in publishers:
        assert p.read() == OK
    want = {f"flood{t}": {b"m%03d" % j for j in range(PUBLISHERS) if j % TOPICS == t} for t in range(TOPICS)}

    # every consumer receives every message of its topic (FINing as it goes)
    got: dict[int, set[bytes]] = {i: set() for i in range(len(consumers))}
    sel = selectors.DefaultSelector()  # epoll: more than FD_SETSIZE sockets
    for i, c in enumerate(consumers):
        sel.register(c.sock, selectors.EVENT_READ, i)
    pending = set(range(len(consumers)))
    deadline = time.monotonic() + 60
    while pending and time.monotonic() < deadline:
        for key, _ in sel.select(timeout=1):
            i = key.data
            c = consumers[i]
            fins = []
            for ftype, data in _frames(c):
                if (ftype, data) == HEARTBEAT:
                    c.cmd("NOP")
                    continue
                assert ftype == FRAME_MESSAGE, (ftype, data)
                m = Msg(data)
                got[i].add(m.body)
                fins.append(b"FIN " + m.id + b"\n")
            if fins:
                c.send(b"".join(fins))
            if got[i] == want[f"flood{i % TOPICS}"]:
                pending.discard(i)
    sel.close()
    assert not pending, f"{len(pending)} consumers not served"

    # the idle clients are hung up on after two heartbeat intervals (2 s), publishers and consumers are not
    for c in idle:
        frames = c.wait_closed(max(1.0, t_idle + 15 - time.monotonic()))
        assert frames and set(frames) == {HEARTBEAT}, frames  # warned, then cut
    assert time.monotonic() - t_idle < 15
    for c in publishers[:20] + consumers[:20]:
        assert c.is_open(0)
    assert ping(d) == (200, b"OK")
    for c in consumers + publishers:
        c.close()
    assert_no_traceback(d)
