"""The consume and publish paths of a real daemon with and without the compiled speed-ups.

The same load goes to a daemon that uses the mypyc build of the modules
nsqtw.speedups lists where it is built (``python setup.py build_ext
--inplace`` in a checkout) and to one told not to (``NSQTW_NO_SPEEDUPS=1``),
and a raw-socket
client checks the same things of both: every message once, from memory and
from the disk queue (``--mem-queue-size=50``), its ID and timestamp as
published, attempts counted up by a REQ and a timeout, and each daemon's
start-up line saying which path it runs. A publisher's repeated PUBs and
MPUBs, each taken in the call that read its line (``V2Parser.next_command``),
whole, pipelined or cut between reads, get the answers and the errors nsqd
gives, and their messages arrive once, in order.
"""

from __future__ import annotations

import struct
import time

import pytest

from nsqtw import speedups
from nsqtw.protocol.wire import encode_command, encode_mpub
from tests.rawclient import OK, Client, Msg

COUNT = 3000


@pytest.mark.parametrize("pure", [False, True], ids=["as-installed", "pure-python"])
def test_consume_path(daemon_factory, pure: bool) -> None:
    env = {"NSQTW_NO_SPEEDUPS": "1"} if pure else {}
    d = daemon_factory("--mem-queue-size=50", "--msg-timeout=2s", env=env)
    note = "compiled speed-ups: off (NSQTW_NO_SPEEDUPS is set)" if pure else speedups.NOTE
    assert any(note in line for line in d.output), d.output[:10]

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


@pytest.mark.parametrize("pure", [False, True], ids=["as-installed", "pure-python"])
def test_publish_path(daemon_factory, pure: bool) -> None:
    env = {"NSQTW_NO_SPEEDUPS": "1"} if pure else {}
    d = daemon_factory("--max-msg-size=1000", env=env)
    p = Client(d.tcp_address)
    p.pub("t", b"a")  # the first of a topic: checked the generic way, then known (pub waits for OK)
    p.pub("u", b"b")
    # pipelined in one write
    p.send(encode_command(b"PUB", b"t", body=b"c") + encode_mpub(b"t", [b"d", b"e"])
           + encode_command(b"PUB", b"u", body=b"f") + encode_mpub(b"u", [b"g"]))
    assert [p.response() for _ in range(4)] == [OK] * 4
    # cut between reads: in the size or the body of a PUB; in the size, the count or a message of an MPUB
    for data, cuts in ((encode_command(b"PUB", b"t", body=b"hh"), (8, 11)),
                       (encode_mpub(b"t", [b"i", b"j"]), (9, 13, 20, 24))):
        for cut in cuts:
            p.send(data[:cut])
            assert p.nothing_for(0.1) == []
            p.send(data[cut:])
            assert p.response() == OK
    for i in range(200):  # one at a time, as bench_writer -batch-size=1 sends them
        p.mpub("u", [b"%03d" % i])
        assert p.response() == OK
    # a known topic does not spare the size checks: nsqd's error, and the connection ends
    p.send(b"PUB t\n" + struct.pack(">i", 1001) + b"x" * 1001)
    assert p.wait_closed(5) == [(1, b"E_BAD_MESSAGE PUB message too big 1001 > 1000")]

    c = Client(d.tcp_address)
    c.sub("t", "ch", rdy=100)
    want = [b"a", b"c", b"d", b"e"] + [b"hh"] * 2 + [b"i", b"j"] * 4
    assert [m.body for m in c.messages(len(want), fin=True)] == want
    assert c.nothing_for(0.3) == []
    c = Client(d.tcp_address)
    c.sub("u", "ch", rdy=300)
    want = [b"b", b"f", b"g"] + [b"%03d" % i for i in range(200)]
    assert [m.body for m in c.messages(len(want), fin=True)] == want
    assert c.nothing_for(0.3) == []
