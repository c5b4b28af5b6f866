"""The V2 TCP protocol against a real nsqtw daemon over loopback sockets.

A small raw-socket client (tests/rawclient.py) speaks the wire format byte for byte so
the tests see exactly what a client sees: frames, their timing and the
moment the daemon hangs up.  Every wait is bounded by a socket timeout.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

from tests.daemon import WORKERS, Daemon, workers_args
from tests.helpers import reference
from tests.integration.pynsq_driver import consume, publish
from tests.rawclient import FRAME_ERROR, FRAME_MESSAGE, FRAME_RESPONSE, HEARTBEAT, OK, Client, Closed, Msg, collect, pub


@pytest.fixture(scope="module", params=WORKERS, ids=lambda n: f"workers={n}")
def workers(request) -> int:
    """Every test here runs against one process and against ``--workers=2`` (conftest.py)."""
    return int(request.param)


def stats(daemon: Daemon) -> dict[str, Any]:
    url = f"http://{daemon.http_address}/stats?format=json"
    with urllib.request.urlopen(url, timeout=5) as r:
        return json.load(r)


@pytest.fixture(scope="module")
def nsqd(tmp_path_factory, workers) -> Iterator[Daemon]:
    """One daemon with default flags shared by this module's tests (each uses its own topics)."""
    d = Daemon(str(tmp_path_factory.mktemp("shared")), *workers_args(workers))
    d.start()
    yield d
    d.stop()


# --- publish and consume ------------------------------------------------------


def test_pub_mpub_dpub_consume(nsqd) -> None:
    """PUB, MPUB and DPUB (0 ms) messages all reach a subscriber once, with attempts 1 and distinct IDs."""
    p = Client(nsqd.tcp_address)
    p.pub("pc", b"one")
    p.mpub("pc", [b"two", b"three"])
    assert p.response() == OK
    p.cmd("DPUB", "pc", 0, body=b"four")
    assert p.response() == OK
    c = Client(nsqd.tcp_address)
    c.sub("pc", "ch", rdy=10)
    got = c.messages(4)
    for m in got:
        c.fin(m)
    assert sorted(m.body for m in got) == [b"four", b"one", b"three", b"two"]
    assert {m.attempts for m in got} == {1}
    assert len({m.id for m in got}) == 4
    assert all(len(m.id) == 16 and int(m.id, 16) >= 0 for m in got)
    now = time.time_ns()
    assert all(abs(now - m.timestamp) < 30 * 10**9 for m in got)
    assert c.is_open(0.3)  # FIN answers nothing and nothing is redelivered


def test_pynsq_writer_to_raw_consumer(nsqd) -> None:
    """Messages published with pynsq's Writer arrive intact at a raw consumer."""
    assert publish(nsqd.tcp_address, "pw", [b"a", b"b"], mpub=True) == [b"OK"]
    c = Client(nsqd.tcp_address)
    c.sub("pw", "ch", rdy=5)
    assert sorted(m.body for m in c.messages(2)) == [b"a", b"b"]


def test_fan_out_to_two_channels(nsqd) -> None:
    """Every channel of a topic gets its own copy of every message."""
    a = Client(nsqd.tcp_address)
    a.sub("fan", "a", rdy=50)
    b = Client(nsqd.tcp_address)
    b.sub("fan", "b", rdy=50)
    p = Client(nsqd.tcp_address)
    p.mpub("fan", [b"%d" % i for i in range(30)])
    assert p.response() == OK
    got = collect([a, b], lambda g: len(g[0]) >= 30 and len(g[1]) >= 30, 10)
    assert sorted(int(m.body) for m in got[0]) == list(range(30))
    assert sorted(int(m.body) for m in got[1]) == list(range(30))
    assert a.is_open(0.2) and b.is_open(0.2)


def test_two_consumers_share_a_channel(nsqd) -> None:
    """Two consumers of one channel split its messages: each gets some, none gets a duplicate."""
    a = Client(nsqd.tcp_address)
    a.sub("share", "ch", rdy=5)
    b = Client(nsqd.tcp_address)
    b.sub("share", "ch", rdy=5)
    p = Client(nsqd.tcp_address)
    p.mpub("share", [b"%d" % i for i in range(100)])
    assert p.response() == OK
    got = collect([a, b], lambda g: len(g[0]) + len(g[1]) >= 100, 10)
    bodies = [int(m.body) for m in got[0] + got[1]]
    assert sorted(bodies) == list(range(100))
    assert got[0] and got[1]
    assert a.nothing_for(0.3) == [] and b.nothing_for(0.01) == []


def test_pynsq_two_readers_share_a_channel(nsqd) -> None:
    """pynsq readers on one channel, one after the other, together consume each message once."""
    publish(nsqd.tcp_address, "pshare", [b"%d" % i for i in range(40)], mpub=True)
    first = consume(nsqd.tcp_address, "pshare", "ch", 15, max_in_flight=1)
    rest = consume(nsqd.tcp_address, "pshare", "ch", 40 - len(first), max_in_flight=10)
    assert sorted(int(m.body) for m in first + rest) == list(range(40))


# --- REQ, timeouts, TOUCH, DPUB ------------------------------------------------


def test_req_immediate_and_delayed(nsqd) -> None:
    """REQ with 0 ms redelivers at once with attempts+1; REQ with 1000 ms waits about a second."""
    c = Client(nsqd.tcp_address)
    c.sub("req", "ch", rdy=1)
    pub(nsqd.tcp_address, "req", b"x")
    m1 = c.message()
    assert m1.attempts == 1
    c.send(b"REQ " + m1.id + b" 0\n")
    t0 = time.monotonic()
    m2 = c.message(2)
    assert time.monotonic() - t0 < 0.5
    assert (m2.id, m2.attempts, m2.body) == (m1.id, 2, b"x")
    c.send(b"REQ " + m2.id + b" 1000\n")
    t0 = time.monotonic()
    assert c.nothing_for(0.7) == []
    m3 = c.message(3)
    elapsed = time.monotonic() - t0
    assert 0.9 <= elapsed < 2.5, elapsed
    assert (m3.id, m3.attempts) == (m1.id, 3)
    c.fin(m3)
    assert c.is_open(0.3)


def test_msg_timeout_redelivers_with_attempts_plus_one(daemon_factory) -> None:
    """A message not finished within --msg-timeout is delivered again, same ID, attempts+1."""
    d = daemon_factory("--msg-timeout=1s")
    c = Client(d.tcp_address)
    c.sub("to", "ch", rdy=1)
    pub(d.tcp_address, "to", b"slow")
    m1 = c.message()
    t0 = time.monotonic()
    m2 = c.message(4)
    elapsed = time.monotonic() - t0
    assert 0.8 <= elapsed < 3.0, elapsed
    assert (m2.id, m2.attempts, m2.body) == (m1.id, 2, b"slow")
    # the timed-out delivery's FIN is now the live one's: it succeeds once
    c.fin(m2)
    assert c.is_open(1.5)


def test_touch_keeps_message_in_flight(daemon_factory) -> None:
    """TOUCH resets the in-flight timer: a message touched every 0.4 s outlives a 1 s msg_timeout."""
    d = daemon_factory("--msg-timeout=1s")
    c = Client(d.tcp_address)
    c.sub("touch", "ch", rdy=5)
    pub(d.tcp_address, "touch", b"kept")
    m = c.message()
    deadline = time.monotonic() + 2.2
    while time.monotonic() < deadline:
        assert c.nothing_for(0.4) == []
        c.send(b"TOUCH " + m.id + b"\n")
    c.fin(m)
    assert c.nothing_for(1.2) == []  # FIN succeeded: no error, no redelivery
    c2 = Client(d.tcp_address)
    c2.sub("touch", "ch", rdy=5)
    assert c2.nothing_for(0.3) == []


def test_dpub_delivered_after_delay_not_before(nsqd) -> None:
    """A DPUB message reaches subscribers only once its delay has passed."""
    c = Client(nsqd.tcp_address)
    c.sub("dpub", "ch", rdy=5)
    p = Client(nsqd.tcp_address)
    p.cmd("PUB", "dpub", body=b"now")
    assert p.response() == OK
    assert c.message().body == b"now"
    t0 = time.monotonic()
    p.cmd("DPUB", "dpub", 1500, body=b"later")
    assert p.response() == OK
    assert c.nothing_for(1.2) == []
    m = c.message(3)
    elapsed = time.monotonic() - t0
    assert m.body == b"later" and m.attempts == 1
    assert 1.4 <= elapsed < 3.5, elapsed


def test_deferred_req_survives_consumer_disconnect(nsqd) -> None:
    """A message REQ'd with a delay belongs to the channel: after its client leaves it still comes back on time."""
    a = Client(nsqd.tcp_address)
    a.sub("rqd", "ch", rdy=1)
    pub(nsqd.tcp_address, "rqd", b"x")
    m = a.message()
    a.send(b"REQ " + m.id + b" 1000\n")
    t0 = time.monotonic()
    assert a.nothing_for(0.1) == []
    a.close()
    b = Client(nsqd.tcp_address)
    b.sub("rqd", "ch", rdy=1)
    m2 = b.message(3)
    assert 0.8 <= time.monotonic() - t0 < 2.5
    assert (m2.id, m2.attempts) == (m.id, 2)


def test_fin_by_another_client_refused(nsqd) -> None:
    """Only the client a message was delivered to may FIN it; others get E_FIN_FAILED (not fatal)."""
    owner = Client(nsqd.tcp_address)
    owner.sub("own", "ch", rdy=1)
    other = Client(nsqd.tcp_address)
    other.sub("own", "ch", rdy=0)
    pub(nsqd.tcp_address, "own", b"x")
    m = owner.message()
    other.fin(m)
    assert other.read() == (FRAME_ERROR, b"E_FIN_FAILED FIN " + m.id + b" failed client does not own message")
    assert other.is_open(0.1)
    owner.fin(m)
    assert owner.nothing_for(0.2) == []
    owner.fin(m)
    assert owner.read() == (FRAME_ERROR, b"E_FIN_FAILED FIN " + m.id + b" failed ID not in flight")
    assert owner.is_open(0.1)


def test_identify_msg_timeout_applies_per_client(nsqd) -> None:
    """IDENTIFY msg_timeout 1000 makes this client's messages time out after 1 s (daemon default 60 s)."""
    c = Client(nsqd.tcp_address)
    ftype, data = c.identify(msg_timeout=1000, feature_negotiation=True)
    assert ftype == FRAME_RESPONSE and json.loads(data)["msg_timeout"] == 1000
    c.sub("pmt", "ch", rdy=1)
    pub(nsqd.tcp_address, "pmt", b"y")
    m = c.message()
    t0 = time.monotonic()
    m2 = c.message(4)
    assert 0.8 <= time.monotonic() - t0 < 3.0
    assert (m2.id, m2.attempts) == (m.id, 2)


def test_max_size_message_round_trip(nsqd) -> None:
    """A message of exactly the default --max-msg-size (1 MiB) is published and delivered byte for byte."""
    big = bytes(range(256)) * 4096
    c = Client(nsqd.tcp_address)
    c.sub("big", "ch", rdy=1)
    pub(nsqd.tcp_address, "big", big)
    assert c.message().body == big


# --- ephemeral topics and channels ----------------------------------------------


def test_ephemeral_channel_deleted_with_last_client(nsqd) -> None:
    """An ephemeral channel goes away when its last client leaves, taking its queued messages."""
    c = Client(nsqd.tcp_address)
    c.sub("eph#ephemeral", "c#ephemeral", rdy=0)
    pub(nsqd.tcp_address, "eph#ephemeral", b"old")
    time.sleep(0.2)  # let it reach the channel
    c.close()
    time.sleep(0.3)
    c2 = Client(nsqd.tcp_address)
    c2.sub("eph#ephemeral", "c#ephemeral", rdy=10)
    pub(nsqd.tcp_address, "eph#ephemeral", b"new")
    got = [c2.message().body]
    got += [Msg(d).body for _, d in c2.nothing_for(0.5)]
    assert got == [b"new"]


def test_durable_channel_keeps_messages_without_clients(nsqd) -> None:
    """The contrast case: a normal channel keeps its queued messages after its client leaves."""
    c = Client(nsqd.tcp_address)
    c.sub("durable", "c", rdy=0)
    pub(nsqd.tcp_address, "durable", b"old")
    time.sleep(0.2)
    c.close()
    time.sleep(0.3)
    c2 = Client(nsqd.tcp_address)
    c2.sub("durable", "c", rdy=10)
    assert c2.message().body == b"old"


def test_ephemeral_channel_of_durable_topic_removed(nsqd) -> None:
    """An ephemeral channel of a normal topic is removed with its last client; the topic stays (seen in /stats)."""
    c = Client(nsqd.tcp_address)
    c.sub("dur", "e#ephemeral", rdy=1)
    c.close()
    deadline = time.monotonic() + 3
    while True:
        [topic] = [t for t in stats(nsqd)["topics"] if t["topic_name"] == "dur"]
        if not topic["channels"] or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert topic["channels"] == []


def test_ephemeral_topic_gone_from_stats(nsqd) -> None:
    """An ephemeral topic is deleted once its last (ephemeral) channel is gone (seen in /stats)."""
    c = Client(nsqd.tcp_address)
    c.sub("gone#ephemeral", "c#ephemeral", rdy=1)
    names = [t["topic_name"] for t in stats(nsqd)["topics"]]
    assert "gone#ephemeral" in names
    c.close()
    deadline = time.monotonic() + 3
    while time.monotonic() < deadline:
        names = [t["topic_name"] for t in stats(nsqd)["topics"]]
        if "gone#ephemeral" not in names:
            break
        time.sleep(0.05)
    assert "gone#ephemeral" not in names


# --- CLS ---------------------------------------------------------------------------


def test_cls_close_wait_then_fin_accepted(nsqd) -> None:
    """CLS answers CLOSE_WAIT, stops deliveries, and FIN of an in-flight message still works."""
    c = Client(nsqd.tcp_address)
    c.sub("cls", "ch", rdy=5)
    pub(nsqd.tcp_address, "cls", b"first")
    m = c.message()
    c.cmd("CLS")
    assert c.response() == (FRAME_RESPONSE, b"CLOSE_WAIT")
    pub(nsqd.tcp_address, "cls", b"second")
    c.fin(m)
    assert c.nothing_for(0.5) == []  # no error for the FIN, no new delivery
    c.close()
    c2 = Client(nsqd.tcp_address)
    c2.sub("cls", "ch", rdy=5)
    got = [c2.message().body] + [Msg(d).body for _, d in c2.nothing_for(0.4)]
    assert got == [b"second"]  # "first" was finished, not requeued by the disconnect


# --- heartbeats and read deadlines ---------------------------------------------------


def test_heartbeats_arrive_every_interval(nsqd) -> None:
    """With heartbeat_interval 1000 the daemon sends _heartbeat_ about once a second; NOP keeps it alive."""
    c = Client(nsqd.tcp_address)
    assert c.identify(heartbeat_interval=1000) == OK
    t0 = time.monotonic()
    times = []
    while len(times) < 3:
        assert c.read_frame(2.5) == HEARTBEAT
        times.append(time.monotonic() - t0)
        c.cmd("NOP")
    gaps = [b - a for a, b in zip([0.0, *times[:-1]], times, strict=True)]
    assert all(0.6 < g < 1.6 for g in gaps), gaps
    assert c.is_open(0.2)


def test_silent_client_disconnected_after_two_intervals(nsqd) -> None:
    """A client that never answers heartbeats is hung up on after two heartbeat intervals."""
    c = Client(nsqd.tcp_address)
    assert c.identify(heartbeat_interval=1000) == OK
    t0 = time.monotonic()
    frames = c.wait_closed(5)
    elapsed = time.monotonic() - t0
    assert 1.5 <= elapsed < 3.5, elapsed
    assert set(frames) <= {HEARTBEAT}


def test_subscriber_that_stops_answering_is_disconnected(nsqd) -> None:
    """A subscribed consumer that goes silent is dropped and its in-flight message goes to another.

    The quick redelivery relies on nsqtw requeueing at disconnect (Go waits for msg_timeout).
    """
    c = Client(nsqd.tcp_address)
    assert c.identify(heartbeat_interval=1000) == OK
    c.sub("silent", "ch", rdy=1)
    other = Client(nsqd.tcp_address)
    other.sub("silent", "ch", rdy=0)
    pub(nsqd.tcp_address, "silent", b"x")
    m = c.message(nop=False)
    other.cmd("RDY", 1)
    c.wait_closed(4)
    m2 = other.message(3)
    assert (m2.id, m2.attempts) == (m.id, 2)


def test_consumer_disconnect_requeues_in_flight_at_once(nsqd) -> None:
    """When a consumer leaves, its in-flight messages go to another consumer right away, not after msg_timeout.

    Go nsqd leaves them in flight until they time out; requeueing at once is
    nsqtw's documented difference (docs/compatibility.md).
    """
    a = Client(nsqd.tcp_address)
    a.sub("dc", "ch", rdy=10)
    p = Client(nsqd.tcp_address)
    p.mpub("dc", [b"1", b"2", b"3"])
    assert p.response() == OK
    held = a.messages(3)
    b = Client(nsqd.tcp_address)
    b.sub("dc", "ch", rdy=10)
    assert b.nothing_for(0.2) == []
    t0 = time.monotonic()
    a.close()
    got = b.messages(3, timeout=3)
    assert time.monotonic() - t0 < 2  # msg_timeout is 60 s
    assert sorted(m.body for m in got) == [b"1", b"2", b"3"]
    assert {m.id for m in got} == {m.id for m in held}
    assert {m.attempts for m in got} == {2}


# --- the reference answers of Go nsqd, replayed ---------------------------------------------

_REFERENCE_TCP = reference("nsqd-1.3.0-responses.json")["tcp"]


@pytest.fixture(scope="module")
def reference_nsqd(tmp_path_factory, workers) -> Iterator[Daemon]:
    d = Daemon(str(tmp_path_factory.mktemp("refdata")), *workers_args(workers), "--msg-timeout=2s")
    d.start()
    yield d
    d.stop()


@pytest.mark.parametrize("case", _REFERENCE_TCP, ids=[c["case"] for c in _REFERENCE_TCP])
def test_reference_tcp_case(reference_nsqd, case) -> None:
    """Each recorded request gets exactly Go nsqd v1.3.0's frames (and hang-up, when it hung up)."""
    received = case["received"]
    closes = any(r.get("trailing_bytes") == "<connection closed>" for r in received)
    expected = [r for r in received if "frame_type" in r]
    c = Client(reference_nsqd.tcp_address, magic=False)
    if "sent" not in case:
        # a message frame as delivered: fields vary per run, their shape must not
        pub(reference_nsqd.tcp_address, "ref_msg", b"payload")
        c.send(b"  V2SUB ref_msg ch\nRDY 1\n")
        assert c.read() == OK
        ftype, data = c.read()
        [want] = expected
        assert ftype == want["frame_type"] == FRAME_MESSAGE
        m = Msg(data)
        assert m.body == want["data"]["body"].encode()
        assert m.attempts == want["data"]["attempts"]
        assert len(m.id) == len(want["data"]["id"]) and int(m.id, 16) >= 0
        assert abs(m.timestamp - time.time_ns()) < 30 * 10**9
        assert len(data) == 26 + len(b"payload")
        return
    c.send(case["sent"].encode("latin-1"))
    got = []
    for _ in expected:
        try:
            got.append(c.read_frame(3))
        except (TimeoutError, Closed):
            break
    assert got == [(r["frame_type"], r["data"].encode()) for r in expected]
    if closes:
        assert c.wait_closed(3) == []
    else:
        assert c.is_open(0.3)
    c.close()


# --- isolation and volume ------------------------------------------------------------


@pytest.mark.parametrize("flags", [(), ("--mem-queue-size=100",)], ids=["memory", "spill-to-disk"])
def test_10k_mpub_consumed_exactly_once_by_two_consumers(daemon_factory, flags) -> None:
    """10,000 messages published by MPUB in batches are consumed exactly once across two consumers."""
    nsqd = daemon_factory(*flags)
    total, batch = 10_000, 500
    a = Client(nsqd.tcp_address)
    a.sub("bulk", "ch", rdy=200)
    b = Client(nsqd.tcp_address)
    b.sub("bulk", "ch", rdy=200)
    p = Client(nsqd.tcp_address, timeout=10)
    for start in range(0, total, batch):
        p.mpub("bulk", [b"%d" % i for i in range(start, start + batch)])
    for _ in range(total // batch):
        assert p.response() == OK
    got = collect([a, b], lambda g: len(g[0]) + len(g[1]) >= total, 30)
    bodies = [int(m.body) for m in got[0] + got[1]]
    assert len(bodies) == total
    assert sorted(bodies) == list(range(total))
    assert got[0] and got[1]
    assert len({m.id for m in got[0] + got[1]}) == total
    late = collect([a, b], lambda g: False, 0.3)
    assert late == {0: [], 1: []}
