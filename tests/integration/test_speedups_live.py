"""The consume path of a real daemon with and without the compiled speed-ups.

The same load goes to a daemon that uses ``_nsqtw_speedups`` where it is
built and to one told not to (``NSQTW_NO_SPEEDUPS=1``), and a raw-socket
client checks the same things of both: every message once, from memory and
from the disk queue (``--mem-queue-size=50``), its ID and timestamp as
published, attempts counted up by a REQ and a timeout, and each daemon's
start-up line saying which path it runs.
"""

from __future__ import annotations

import time

import pytest

from nsqtw.core import message
from tests.rawclient import OK, Client, Msg

COUNT = 3000


@pytest.mark.parametrize("pure", [False, True], ids=["as-installed", "pure-python"])
def test_consume_path(daemon_factory, pure: bool) -> None:
    env = {"NSQTW_NO_SPEEDUPS": "1"} if pure else {}
    d = daemon_factory("--mem-queue-size=50", "--msg-timeout=2s", env=env)
    note = "off (NSQTW_NO_SPEEDUPS is set)" if pure else ("in use" if message.SPEEDUPS else "not built")
    assert any(f"compiled speed-ups: {note}" in line for line in d.output), d.output[:10]

    bodies = [b"%05d" % i + b"x" * (i % 300) for i in range(COUNT)]
    p = Client(d.tcp_address)
    before = time.time_ns()
    for i in range(0, COUNT, 500):
        p.mpub("sp", bodies[i:i + 500])
        assert p.response() == OK
    after = time.time_ns()

    c = Client(d.tcp_address)
    c.sub("sp", "ch", rdy=250)
    first: dict[bytes, Msg] = {}
    again: dict[bytes, Msg] = {}
    requeued: set[bytes] = set()
    kept = b""
    expected_again = len(range(1, COUNT + 1, 500)) + 1  # the REQed ones and the one left to time out
    while len(first) < COUNT or len(again) < expected_again:
        m = c.message(timeout=10)
        if m.attempts == 2:  # a REQed or timed-out one, back
            assert m.id not in again and m.id in requeued | {kept}, m
            again[m.id] = m
            c.fin(m)
            continue
        assert m.attempts == 1 and m.id not in first, m
        assert before <= m.timestamp <= after, m
        first[m.id] = m
        n = len(first)
        if n % 500 == 1:
            c.cmd("REQ", m.id.decode(), 0)
            requeued.add(m.id)
        elif n == 7:
            kept = m.id  # never answered
        else:
            c.fin(m)
    assert sorted(m.body for m in first.values()) == bodies
    assert set(again) == requeued | {kept}
    assert all(again[i].body == first[i].body and again[i].timestamp == first[i].timestamp for i in again)
    assert c.nothing_for(0.5) == []
