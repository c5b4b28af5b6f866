"""--durable-delivery against a real daemon: kill -9 loses nothing unfinished, brings back nothing finished."""

from __future__ import annotations

import glob
import json
import os
import random
import threading
import time
import urllib.request

import pytest

from tests.daemon import WORKERS
from tests.helpers import wait_for
from tests.rawclient import OK, Client, Closed, subscribe


@pytest.fixture(scope="module", params=WORKERS, ids=lambda n: f"workers={n}")
def workers(request) -> int:
    """Every test here runs against one process and against ``--workers=2`` (tests/conftest.py)."""
    return int(request.param)

DURABLE = "--durable-delivery"


def channel_stats(daemon, topic: str, channel: str) -> dict:
    with urllib.request.urlopen(f"http://{daemon.http_address}/stats?format=json") as r:
        stats = json.load(r)
    for t in stats["topics"]:
        if t["topic_name"] == topic:
            for c in t["channels"]:
                if c["channel_name"] == channel:
                    return c
    return {}


def journals(path: str) -> list[str]:
    return sorted(os.path.basename(p) for p in glob.glob(os.path.join(path, "*.nsqtw.journal")))


def test_kill9_brings_back_exactly_the_unfinished(tmp_path, daemon_factory) -> None:
    """After kill -9: in-flight, requeued, deferred and queued messages return (attempts kept,
    deferred ones not before their due time); FINed ones never do."""
    data = str(tmp_path / "d")
    d = daemon_factory(DURABLE, data_path=data)
    consumer = subscribe(d.tcp_address, "t", "c", rdy=0)
    pub = Client(d.tcp_address)
    bodies = [b"m%02d" % i for i in range(30)]
    pub.mpub("t", bodies)
    assert pub.response() == OK
    consumer.cmd("RDY", 30)
    got = {m.body: m for m in consumer.messages(30, timeout=20)}
    assert set(got) == set(bodies) and {m.attempts for m in got.values()} == {1}
    consumer.cmd("RDY", 0)
    finished = bodies[:10]
    requeued = bodies[10:15]
    in_flight = bodies[15:]
    for b in finished:
        consumer.fin(got[b])
    due_at = time.time() + 4.0
    for b in requeued:
        consumer.send(b"REQ " + got[b].id + b" 4000\n")
    pub.cmd("DPUB", "t", 4000, body=b"deferred")
    assert pub.response() == OK
    queued = [b"q%d" % i for i in range(5)]  # published, never delivered (RDY 0)
    pub.mpub("t", queued)
    assert pub.response() == OK
    wait_for(lambda: channel_stats(d, "t", "c").get("in_flight_count") == len(in_flight)
             and channel_stats(d, "t", "c").get("deferred_count") == len(requeued) + 1)
    time.sleep(0.5)  # the FIN -> journal window (docs/durability.md): a group fsync, a few ms
    d.kill()
    consumer.close()
    assert journals(data) == ["t.nsqtw.journal", "t:c.nsqtw.journal"]

    d2 = daemon_factory(DURABLE, data_path=data)
    c2 = subscribe(d2.tcp_address, "t", "c", rdy=100)
    first = c2.messages(len(in_flight) + len(queued), timeout=20, fin=True)
    assert sorted(m.body for m in first) == sorted(in_flight + queued)
    attempts = {m.body: m.attempts for m in first}
    assert all(attempts[b] == 2 for b in in_flight), attempts
    assert all(attempts[b] == 1 for b in queued), attempts
    late = c2.messages(len(requeued) + 1, timeout=20, fin=True)
    arrived = time.time()
    assert sorted(m.body for m in late) == sorted(requeued + [b"deferred"])
    assert arrived >= due_at - 0.5  # not before their due time (clock granularity aside)
    attempts = {m.body: m.attempts for m in late}
    assert all(attempts[b] == 2 for b in requeued) and attempts[b"deferred"] == 1, attempts
    assert c2.nothing_for(1.5) == []  # no FINed message, no duplicate


def test_repeated_kill9_under_publish_load(tmp_path, daemon_factory) -> None:
    """Kill -9 at random moments while publishers and a consumer run: every PUB answered OK
    is delivered in the end."""
    data = str(tmp_path / "load")
    acked: list[bytes] = []
    received: set[bytes] = set()
    rng = random.Random(10)
    counter = [0]
    lock = threading.Lock()

    def publisher(address: str, stop: threading.Event) -> None:
        try:
            c = Client(address)
            while not stop.is_set():
                with lock:
                    counter[0] += 1
                    body = b"p%07d" % counter[0]
                c.pub("t", body)
                acked.append(body)
        except (Closed, OSError, AssertionError, TimeoutError):
            pass

    def consumer(address: str, stop: threading.Event) -> None:
        try:
            c = subscribe(address, "t", "c", rdy=50)
            while not stop.is_set():
                try:
                    received.update(m.body for m in c.messages(1, timeout=0.2, fin=True))
                except TimeoutError:
                    pass
        except (Closed, OSError, AssertionError):
            pass

    for _ in range(4):
        d = daemon_factory(DURABLE, data_path=data)
        stop = threading.Event()
        threads = [threading.Thread(target=publisher, args=(d.tcp_address, stop)) for _ in range(4)]
        threads.append(threading.Thread(target=consumer, args=(d.tcp_address, stop)))
        for t in threads:
            t.start()
        time.sleep(rng.uniform(0.5, 2.0))  # the moment of the crash
        d.kill()
        stop.set()
        for t in threads:
            t.join(10)
    assert len(acked) > 100
    d = daemon_factory(DURABLE, data_path=data)
    c = subscribe(d.tcp_address, "t", "c", rdy=500)
    received.update(m.body for m in c.drain(quiet=3.0))
    missing = set(acked) - received
    assert not missing, f"{len(missing)} of {len(acked)} acknowledged messages lost"


def test_graceful_stop_leaves_a_plain_data_dir(tmp_path, daemon_factory) -> None:
    """SIGTERM with --durable-delivery leaves no journal: nsqtw without the flag delivers
    everything, deferred messages at their time."""
    data = str(tmp_path / "g")
    d = daemon_factory(DURABLE, data_path=data)
    consumer = subscribe(d.tcp_address, "t", "c", rdy=5)
    pub = Client(d.tcp_address)
    pub.mpub("t", [b"a%d" % i for i in range(20)])
    assert pub.response() == OK
    pub.cmd("DPUB", "t", 3000, body=b"later")
    assert pub.response() == OK
    held = consumer.messages(5, timeout=20)
    wait_for(lambda: channel_stats(d, "t", "c").get("deferred_count") == 1)
    assert d.stop() == 0
    consumer.close()
    assert journals(data) == []
    d2 = daemon_factory(data_path=data)  # without the flag
    c2 = subscribe(d2.tcp_address, "t", "c", rdy=50)
    got = c2.messages(20, timeout=20, fin=True)
    assert sorted(m.body for m in got) == sorted(b"a%d" % i for i in range(20))
    assert {m.attempts for m in got if m.body in {h.body for h in held}} == {2}
    [late] = c2.messages(1, timeout=20, fin=True)
    assert late.body == b"later"


def test_plain_data_dir_opens_with_the_flag(tmp_path, daemon_factory) -> None:
    """A data dir written without the flag (memory queue and all) is delivered with it."""
    data = str(tmp_path / "p")
    d = daemon_factory(data_path=data)
    pub = Client(d.tcp_address)
    subscribe(d.tcp_address, "t", "c", rdy=0).close()
    pub.mpub("t", [b"x%d" % i for i in range(50)])
    assert pub.response() == OK
    assert d.stop() == 0
    d2 = daemon_factory(DURABLE, data_path=data)
    got = subscribe(d2.tcp_address, "t", "c", rdy=100).messages(50, timeout=20, fin=True)
    assert sorted(m.body for m in got) == sorted(b"x%d" % i for i in range(50))


def test_crash_journal_needs_the_flag(tmp_path, daemon_factory) -> None:
    """After a crash with --durable-delivery, starting without it fails with a clear error
    (its journal holds messages); with the flag they are delivered."""
    data = str(tmp_path / "j")
    d = daemon_factory(DURABLE, data_path=data)
    consumer = subscribe(d.tcp_address, "t", "c", rdy=1)
    Client(d.tcp_address).pub("t", b"in-flight")
    consumer.messages(1, timeout=20)
    time.sleep(0.3)  # let the delivery reach the journal
    d.kill()
    with pytest.raises(RuntimeError) as err:
        daemon_factory(data_path=data)
    assert "start with --durable-delivery" in str(err.value)
    d3 = daemon_factory(DURABLE, data_path=data)
    [m] = subscribe(d3.tcp_address, "t", "c").messages(1, timeout=20, fin=True)
    assert (m.body, m.attempts) == (b"in-flight", 2)


def test_ephemeral_unaffected(tmp_path, daemon_factory) -> None:
    """Ephemeral topics and channels keep no files and work as without the flag."""
    data = str(tmp_path / "e")
    d = daemon_factory(DURABLE, data_path=data)
    c = subscribe(d.tcp_address, "e#ephemeral", "c", rdy=10)
    c2 = subscribe(d.tcp_address, "t", "c#ephemeral", rdy=10)
    pub = Client(d.tcp_address)
    pub.pub("e#ephemeral", b"one")
    pub.pub("t", b"two")
    assert c.messages(1, timeout=20, fin=True)[0].body == b"one"
    assert c2.messages(1, timeout=20, fin=True)[0].body == b"two"
    names = os.listdir(data)
    assert not [n for n in names if "ephemeral" in n], names
