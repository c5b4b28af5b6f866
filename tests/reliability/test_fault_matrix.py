"""What each fault costs in each delivery mode: the tables of docs/storage.md, durability.md and
reliability.md, one test per row and mode (issue #15).

The modes are nsqd's defaults (memory queues of 10,000, fsync every 2,500
records or 2 s), ``--mem-queue-size=0 --sync-every=1`` (every message
through the disk, fsync per record) and ``--durable-delivery``. The faults
are a kill -9, a disk that fills (writes fail with ENOSPC) and gets space
back, an fsync that fails and works again, and a corrupt segment. Each test
states exactly what the mode may lose and checks that nothing else is lost:
every message answered OK that the mode promises to keep is delivered.

The disk faults are injected in the disk layer (:mod:`tests.reliability.faults`)
so they run everywhere; ``test_disk_faults.py`` fills a real tmpfs where it
may mount.
"""

from __future__ import annotations

import json
import os
import signal
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.daemon import Daemon
from tests.rawclient import Client, subscribe
from tests.reliability.conftest import assert_no_traceback, ping, wait_for
from tests.reliability.faults import faulty_daemon_code
from tests.reliability.test_disk_faults import http_post

MODES = {
    "default": (),
    "sync-every-1": ("--mem-queue-size=0", "--sync-every=1"),
    "durable": ("--durable-delivery",),
}


@pytest.fixture(params=sorted(MODES))
def mode(request) -> str:
    return str(request.param)


class Node:
    """A daemon of one mode on a data path, with the disk faults ready to switch on."""

    def __init__(self, tmp_path: Path, mode: str, *extra: str) -> None:
        self.path = tmp_path / "data"
        self.path.mkdir(exist_ok=True)
        self.full_flag = str(tmp_path / "disk-is-full")
        self.fsync_flag = str(tmp_path / "fsync-fails")
        self.args = (*MODES[mode], *extra)
        self.daemon = self._start()

    def _start(self) -> Daemon:
        d = Daemon(str(self.path), *self.args, code=faulty_daemon_code(),
                   env={"NSQTW_TEST_DISK_FULL_FLAG": self.full_flag,
                        "NSQTW_TEST_FSYNC_FAIL_FLAG": self.fsync_flag})
        d.start()
        return d

    def restart(self, sig: int) -> None:
        if sig == signal.SIGKILL:
            self.daemon.kill()
        else:
            assert self.daemon.stop(sig) == 0
        self.daemon = self._start()

    def stats(self) -> dict:
        with urllib.request.urlopen(f"http://{self.daemon.http_address}/stats?format=json") as r:
            return json.load(r)

    def channel_stats(self, topic: str, channel: str) -> dict:
        for t in self.stats()["topics"]:
            if t["topic_name"] == topic:
                for c in t["channels"]:
                    if c["channel_name"] == channel:
                        return c
        raise AssertionError(f"no channel {topic}/{channel}")

    def drain(self, topic: str = "t", channel: str = "c") -> list[bytes]:
        consumer = subscribe(self.daemon.tcp_address, topic, channel, rdy=500)
        got = [m.body for m in consumer.drain()]
        consumer.close()
        return got


@pytest.fixture
def node_factory(tmp_path) -> Iterator:
    nodes: list[Node] = []

    def make(mode: str, *extra: str) -> Node:
        node = Node(tmp_path, mode, *extra)
        nodes.append(node)
        return node

    yield make
    for node in nodes:
        for flag in (node.full_flag, node.fsync_flag):
            if os.path.exists(flag):
                os.unlink(flag)
        if node.daemon.proc.poll() is None:
            node.daemon.stop()


def mpub_all(node: Node, bodies: list[bytes], batch: int = 200) -> None:
    c = Client(node.daemon.tcp_address)
    for i in range(0, len(bodies), batch):
        c.mpub("t", bodies[i:i + batch])
        assert c.response(timeout=30) == (0, b"OK")
    c.close()


def create(node: Node) -> None:
    assert http_post(node.daemon, "/topic/create?topic=t") == 200
    assert http_post(node.daemon, "/channel/create?topic=t&channel=c") == 200


def test_kill9(mode: str, node_factory) -> None:
    """kill -9 with 12,000 acknowledged messages queued and 50 in flight, then a restart.

    default: what was in memory is lost (the channel's 10,000-message memory queue, and the in
    flight), what had overflowed to its disk queue is delivered. --sync-every=1: every queued
    message is delivered, the 50 in flight are lost (they live in memory, as in Go). durable:
    everything acknowledged and not FINed is delivered, the in-flight ones too."""
    node = node_factory(mode)
    create(node)
    bodies = [b"m-%05d" % i for i in range(12_000)]
    mpub_all(node, bodies)
    consumer = subscribe(node.daemon.tcp_address, "t", "c", rdy=50)
    held = {m.body for m in consumer.messages(50, timeout=10)}
    # the daemon has written what it handed to the disk (5 ms) and put 50 in flight
    assert wait_for(lambda: node.channel_stats("t", "c")["in_flight_count"] == 50, 10)
    time.sleep(0.5)
    on_disk = node.channel_stats("t", "c")["backend_depth"]
    node.restart(signal.SIGKILL)
    got = node.drain()
    assert len(got) == len(set(got)) or mode != "durable" or set(got) <= set(bodies)
    got_set = set(got)
    assert got_set <= set(bodies)
    if mode == "default":
        # the overflow on disk survives, the memory queue and the in flight do not
        # (the consumer's 50 may have come from either; one read from the disk queue can come
        # back, its read position not yet synced: at-least-once)
        assert 1_950 <= on_disk <= 2_000, on_disk
        assert on_disk <= len(got_set) <= on_disk + len(held), (len(got_set), on_disk)
    elif mode == "sync-every-1":
        assert set(bodies) - held <= got_set, len(set(bodies) - held - got_set)
    else:
        assert got_set == set(bodies), len(set(bodies) - got_set)
    assert_no_traceback(node.daemon)


def test_full_disk(mode: str, node_factory) -> None:
    """The disk fills while publishers publish and a consumer consumes, then gets space back.

    Every mode: nothing answered OK is lost; /ping says NOK with the error while writes fail and OK
    once they succeed. With --sync-every=1 a publish whose own write fails is refused
    (E_PUB_FAILED), as in Go; by default and with --durable-delivery publishes wait in bounded
    memory (default) or unanswered (durable: OK only after fsync) and are answered once written."""
    node = node_factory(mode)
    create(node)
    before = [b"a-%05d" % i for i in range(11_000)]  # past the memory queue: the disk is used
    mpub_all(node, before)
    open(node.full_flag, "w").close()
    acked: list[bytes] = []
    refused = 0
    for i in range(40):
        c = Client(node.daemon.tcp_address, timeout=3)
        body = b"b-%05d" % i
        c.cmd("PUB", "t", body=body)
        try:
            ftype, data = c.response(timeout=3)
        except TimeoutError:
            ftype, data = -1, b""  # held: not answered while the disk is full
        if (ftype, data) == (0, b"OK"):
            acked.append(body)
        else:
            refused += 1
            assert ftype in (-1, 1), (ftype, data)  # held, or E_PUB_FAILED
        c.close()
    # the memory queue fills from disk once consumed: a consumer makes the channel write too
    assert wait_for(lambda: ping(node.daemon)[0] == 500, 15), node.daemon.read_output()[-2000:]
    status, text = ping(node.daemon)
    assert text.startswith(b"NOK") and b"no space left on device" in text.lower(), text
    if mode == "sync-every-1":
        assert refused > 0 and not acked  # every write fails: E_PUB_FAILED
    elif mode == "default":
        assert len(acked) == 40  # into memory (the disk queue's backlog, bounded)
    else:
        assert not acked  # durable: OK waits for the fsync
    os.unlink(node.full_flag)
    assert wait_for(lambda: ping(node.daemon) == (200, b"OK"), 15)
    got = set(node.drain())
    assert set(before) | set(acked) <= got, len(set(before) | set(acked) - got)
    assert_no_traceback(node.daemon)


def test_failing_fsync(mode: str, node_factory) -> None:
    """fsync fails (EIO) for a while under publish and consume, then works again; then kill -9.

    Every mode: nothing answered OK is lost, /ping says NOK while fsync fails and OK after. A
    failed fsync leaves the data in the page cache, so a kill -9 after the fault costs what it
    always costs in that mode; only a power loss inside the fault could lose more (not
    testable here). durable: publishes are answered only once an fsync succeeds."""
    node = node_factory(mode)
    create(node)
    # by default past the channel's 10,000-message memory queue, so the disk queue is used
    first = [b"a-%05d" % i for i in range(11_000 if mode == "default" else 1_000)]
    mpub_all(node, first)
    open(node.fsync_flag, "w").close()
    late = Client(node.daemon.tcp_address, timeout=30)
    second = [b"b-%05d" % i for i in range(1_000)]
    late.mpub("t", second)
    assert wait_for(lambda: ping(node.daemon)[0] == 500, 15), node.daemon.read_output()[-2000:]
    assert b"input/output error" in ping(node.daemon)[1].lower()
    os.unlink(node.fsync_flag)
    answer = late.response(timeout=30)
    if mode == "durable" and answer != (0, b"OK"):
        # OK only after fsync: a publish whose fsync failed is refused (it may still be
        # delivered: at-least-once); one that reached the disk after the fault is answered OK
        assert answer[0] == 1 and answer[1].startswith(b"E_MPUB_FAILED"), answer
        acked = set(first)
    else:
        assert answer == (0, b"OK")  # after the write(); the fsync is not waited for
        acked = set(first) | set(second)
    assert wait_for(lambda: ping(node.daemon) == (200, b"OK"), 15)
    time.sleep(0.5)
    c = node.channel_stats("t", "c")
    in_memory = c["depth"] - c["backend_depth"]  # lost to a kill -9 by default, as in Go
    assert (in_memory == 10_000) if mode == "default" else (in_memory == 0), c
    node.restart(signal.SIGKILL)
    got = set(node.drain())
    assert got <= set(first) | set(second)
    assert len(acked - got) == in_memory, (len(acked - got), in_memory)
    assert_no_traceback(node.daemon)


def test_corrupt_segment(mode: str, node_factory) -> None:
    """A segment of the channel's queue is corrupt at the next start (an impossible record size).

    Every mode, as Go: the segment is set aside as .bad with an ERROR, its records are lost, every
    later record is delivered, /ping stays 200 and /stats counts the segment set aside."""
    node = node_factory(mode, "--max-bytes-per-file=1000")
    create(node)
    bodies = [b"m-%04d" % i for i in range(300)]
    mpub_all(node, bodies, batch=50)
    node.daemon.stop()  # graceful: memory queues go to disk in every mode
    segments = sorted(node.path.glob("t:c.diskqueue.*.dat"))
    assert len(segments) > 3, segments
    raw = bytearray(segments[1].read_bytes())
    raw[0:4] = b"\x7f\xff\xff\xff"
    segments[1].write_bytes(bytes(raw))
    node.daemon = node._start()
    got = node.drain()
    lost = set(bodies) - set(got)
    assert 0 < len(lost) <= 1000 // 30 + 1, len(lost)  # one segment's records at most
    assert set(got) <= set(bodies)
    assert got[-1] == bodies[-1]
    assert Path(str(segments[1]) + ".bad").exists()
    assert ping(node.daemon) == (200, b"OK")
    assert node.stats()["segments_set_aside"] == 1
    assert "saving bad file as" in node.daemon.read_output()
