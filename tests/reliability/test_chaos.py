"""``nsqtw-bench chaos``: its schedule and accounting, and a short run of a real cluster under faults.

The short run is the CI version of the long runs in docs/reliability.md: three
``--durable-delivery`` nodes and nsqlookupd on loopback, publishers that fail
over, the client library's Consumer through lookupd, and kill -9 / SIGSTOP /
lookupd kill -9 (and a full tmpfs where the test may mount) every few seconds.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
import urllib.request

import pytest

from nsqtw.tools import chaos_spark
from nsqtw.tools.chaos import (
    DEFAULT_FAULTS,
    FAULTS,
    Ledger,
    Outcome,
    Publisher,
    render,
    run_chaos,
    schedule,
    tally,
    tally_sink,
)
from nsqtw.tools.chaos_cluster import TOPIC, Disk, body_for, free_ports, seq_of
from nsqtw.tools.chaos_spark import drain, last_batch
from nsqtw.tools.daemons import TWISTD, nsqtw_command
from tests.daemon import ROOT, Daemon


def test_a_seed_draws_one_schedule_of_faults_that_never_overlap() -> None:
    first = schedule(7, 300.0, 4.0, FAULTS, 3)
    assert first == schedule(7, 300.0, 4.0, FAULTS, 3)
    assert first != schedule(8, 120.0, 4.0, FAULTS, 3)
    assert {f.kind for f in first} == set(FAULTS)
    assert {f.node for f in first} == {0, 1, 2}
    for before, after in zip(first, first[1:], strict=False):
        assert after.at >= before.at + before.hold + 4.0 * 0.5 - 0.01
    assert all(f.at < 300.0 for f in first)
    assert {f.kind for f in schedule(7, 120.0, 4.0, ["stop"], 3)} == {"stop"}
    assert schedule(7, 120.0, 4.0, [], 3) == []


class SlowQuery:
    """A stand-in for the Spark query: while it runs, its backlog shrinks by one every 0.4 s, down to
    ``floor``; a stop freezes it."""

    def __init__(self, backlog: int, floor: int = 0) -> None:
        self.backlog, self.floor = backlog, floor
        self.since: float | None = time.monotonic()
        self.stops = 0

    def waiting(self) -> int:
        if self.since is None:
            return self.backlog
        return max(self.floor, self.backlog - int((time.monotonic() - self.since) / 0.4))

    def last_batch(self) -> int:
        return 7

    def stop(self) -> None:
        self.backlog, self.since = self.waiting(), None
        self.stops += 1

    def start(self) -> None:
        self.since = time.monotonic()

    def driver_pid(self) -> int:
        return 1


def test_a_spark_backlog_that_keeps_shrinking_is_waited_for_past_the_timeout(monkeypatch) -> None:
    """Slow is not wedged: a backlog that takes longer than the timeout but shrinks all along drains
    (a query restarted two dozen times in a 10-minute run still had 60,000 to go after 300 s)."""
    monkeypatch.setattr(chaos_spark, "MSG_TIMEOUT", 0.5)  # how long a stop's give-back is waited for
    query = SlowQuery(12)
    began = time.monotonic()
    assert drain(query, query.waiting, timeout=2.0)  # type: ignore[arg-type]
    assert time.monotonic() - began > 4.0 and query.stops == 1


def test_a_spark_backlog_that_stops_shrinking_is_wedged(monkeypatch) -> None:
    monkeypatch.setattr(chaos_spark, "MSG_TIMEOUT", 0.5)
    query = SlowQuery(12, floor=9)
    began = time.monotonic()
    assert not drain(query, query.waiting, timeout=2.0)  # type: ignore[arg-type]
    assert time.monotonic() - began < 8.0


def test_a_body_names_its_sequence_number() -> None:
    assert seq_of(body_for(123456, 64)) == 123456
    assert len(body_for(1, 64)) == 64
    assert len(body_for(1, 4)) == 19  # never shorter than its name
    assert seq_of(b"hello") is None
    assert seq_of(b"chaos:12345678901x:") is None


def test_the_tally_counts_lost_redelivered_republished_and_unacknowledged() -> None:
    ledger = Ledger()
    ledger.ack(ledger.take(5), 100.0)  # 0..4 acknowledged at t=100
    ledger.take(2)  # 5, 6 published, never acknowledged
    ledger.retry("timeout")
    delivered = [(0, 100.5, "a/01"), (1, 100.2, "a/02"), (1, 103.0, "a/02"), (1, 104.0, "a/02"),
                 (4, 100.1, "a/03"), (4, 100.3, "b/01"), (6, 101.0, "b/02")]
    out = tally(Outcome("x", "", 1, 1.0, {}), ledger, iter(delivered))
    assert (out.published, out.acknowledged, out.delivered) == (7, 5, 4)
    assert (out.lost, out.lost_examples) == (2, [2, 3])
    assert out.extra_copies == 2  # message a/02 twice more
    assert out.republished == 1  # body 4 taken by two nodes
    assert out.unacknowledged_delivered == 1
    assert out.max_wait == 0.5
    assert (out.retries, out.retry_reasons) == (1, {"timeout": 1})
    tally_sink(out, ledger, [(0, "a/01"), (1, "a/02"), (1, "a/02"), (4, "a/03"), (4, "b/01"), (3, "c/09")])
    assert (out.spark_rows, out.spark_lost, out.spark_extra_copies, out.spark_republished) == (6, 1, 1, 1)
    table = render([out])
    assert "| **lost** (acknowledged, never delivered) | 2 |" in table
    assert "lost, the first: [2, 3]" in table


def test_the_disk_fault_fills_its_own_tmpfs_and_nothing_else(tmp_path) -> None:
    """A tmpfs unmounted under the run (or never mounted) is not filled: the fault would fill the machine's disk."""
    path = tmp_path / "node"
    path.mkdir()
    disk = Disk(str(path), 4)
    try:
        if disk.mounted:  # root: the real tmpfs fills to the last byte and frees
            assert disk.fill()
            assert os.statvfs(path).f_bavail == 0
            assert os.path.getsize(disk.ballast) <= 4 << 20
            disk.free()
            assert os.statvfs(path).f_bavail > 0
        disk.unmount()
        assert not os.path.ismount(path)
        assert not disk.fill()
        assert not os.path.exists(disk.ballast)
    finally:
        disk.unmount()


def test_the_lose_fault_empties_the_data_directory_and_is_drawn_only_when_asked_for(tmp_path) -> None:
    """``lose`` deletes what the node wrote (files and folders) and keeps the directory itself (a tmpfs's
    mount point); the default schedule never draws it, so a seed's faults stay what they were."""
    data = tmp_path / "node"
    (data / "sub").mkdir(parents=True)
    (data / "sub" / "x.dat").write_bytes(b"x")
    (data / "nsqd.dat").write_bytes(b"{}")
    (data / "link").symlink_to(tmp_path)
    Disk(str(data), 0).wipe()
    assert data.is_dir() and list(data.iterdir()) == []
    assert tmp_path.is_dir()  # the link was removed, not followed
    assert "lose" in FAULTS and "lose" not in DEFAULT_FAULTS
    assert {f.kind for f in schedule(7, 300.0, 4.0, DEFAULT_FAULTS, 3)} == set(DEFAULT_FAULTS)


def test_the_sinks_last_batch_is_read_from_its_log_numbers_not_its_file_count(tmp_path) -> None:
    assert last_batch(str(tmp_path)) == -1
    meta = tmp_path / "_spark_metadata"
    meta.mkdir()
    assert last_batch(str(tmp_path)) == -1
    for name in ("8", "9.compact", "10", "11", ".12.crc"):  # Spark deleted 0-7 after compacting
        (meta / name).write_text("v1\n")
    assert last_batch(str(tmp_path)) == 11


def test_ports_are_chosen_below_the_ephemeral_range(tmp_path) -> None:
    """A node's port is free while the node is down: chosen in the kernel's ephemeral range, an
    outgoing connection could take it meanwhile and the node would not start again there."""
    ranges = tmp_path / "ip_local_port_range"
    ranges.write_text("40000\t60999\n")
    ports = free_ports(8, str(ranges))
    assert len(set(ports)) == 8 and all(40000 - 16384 <= p < 40000 for p in ports)
    for port in ports:
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))  # free now
    ports = free_ports(3, str(tmp_path / "missing"))  # no range known: any free ports
    assert len(set(ports)) == 3 and all(0 < p < 65536 for p in ports)


def test_a_publisher_fails_over_to_the_next_node(daemon_factory) -> None:
    node = daemon_factory()
    dead = socket.socket()
    dead.bind(("127.0.0.1", 0))  # bound, not listening: connections to it are refused
    ledger = Ledger()
    stop = threading.Event()
    pub = Publisher(0, [dead.getsockname(), node.tcp], ledger, rate=200.0, batch=5, size=32, stop=stop)
    pub.start()
    try:
        deadline = time.monotonic() + 10
        while len(ledger.acked) < 50 and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        stop.set()
        pub.join(5)
        dead.close()
    assert len(ledger.acked) >= 50
    assert ledger.errors["ConnectionRefusedError"] == 1  # the first try only: it stays on the live node
    with urllib.request.urlopen(f"http://{node.http_address}/stats?format=json&topic={TOPIC}") as r:
        taken = json.load(r)["topics"][0]["message_count"]
    # every acknowledged message, and at most the last publish, whose answer the stop cut short
    assert len(ledger.acked) <= taken <= ledger.published


@pytest.fixture
def checkout_on_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """The cluster's processes (twistd, the consumer) import this checkout's nsqtw."""
    monkeypatch.setenv("PYTHONPATH", ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))


#: messages per MPUB of the durable cluster's publishers
BATCH = 2


@pytest.mark.usefixtures("checkout_on_path")
@pytest.mark.parametrize("workers", [1, 2])
def test_a_durable_cluster_under_chaos_loses_nothing_acknowledged(tmp_path, workers: int) -> None:
    """Nodes of one process each, and nodes of a core and two workers (the shape --workers=0 gives
    from 8 CPUs): a kill -9 or SIGSTOP reaches the core, whose workers die or wait with it."""
    lookupd = [Daemon.python, "-c", TWISTD, "--pidfile=", "-n", "nsqtw-lookupd"]
    outcome = run_chaos("nsqtw", nsqtw_command(), lookupd, ["--durable-delivery", f"--workers={workers}"],
                        nodes=3, duration=35.0,
                        every=3.0, seed=11, publishers=3, rate=300.0, batch=BATCH, disk_mb=32,
                        drain_timeout=90.0, keep=str(tmp_path))
    report = render([outcome])
    assert outcome.drained, report
    assert outcome.lost == 0, report
    assert outcome.acknowledged >= 3000, report
    assert sum(outcome.faults.values()) >= 4, report
    assert {"kill", "stop", "lookupd"} <= outcome.faults.keys(), report
    # docs/reliability.md's bounds: what was in flight to the consumer at each kill (its max_in_flight,
    # 200) comes again, and a publish retried after a lost answer may be taken twice (by two nodes)
    assert outcome.extra_copies <= 200 * outcome.faults.get("kill", 0), report
    # (bodies published twice are counted per body, retries per publish: an MPUB of 2 retried after a
    # lost answer is two bodies taken twice)
    assert outcome.republished <= BATCH * outcome.retries, report
    assert not [p for p in outcome.problems if "disk fault skipped" not in p], report


@pytest.mark.usefixtures("checkout_on_path")
def test_a_replicated_cluster_loses_nothing_when_machines_are_lost(tmp_path) -> None:
    """``--replicas=2``: four machines lost (kill -9, data directory deleted, an empty node started in its
    place) among kills, pauses and lookupd restarts. Every acknowledged message is delivered, the lost
    node's by the replica that held its copies; what comes again is bounded by what the consumer held
    in flight at each kill or loss."""
    lookupd = [Daemon.python, "-c", TWISTD, "--pidfile=", "-n", "nsqtw-lookupd"]
    outcome = run_chaos("nsqtw", nsqtw_command(), lookupd, ["--durable-delivery", "--replicas=2"],
                        nodes=3, duration=35.0, every=3.0, seed=4, kinds=("lose", "kill", "stop", "lookupd"),
                        publishers=3, rate=300.0, batch=BATCH, drain_timeout=90.0, keep=str(tmp_path))
    report = render([outcome])
    assert outcome.faults.get("lose", 0) >= 3, report
    assert outcome.drained, report
    assert outcome.lost == 0, report
    assert outcome.acknowledged >= 3000, report
    assert outcome.extra_copies <= 200 * outcome.faults.get("kill", 0), report
    # a replica hands its copies in with IDs of its own: what the lost node had delivered (at most the
    # consumer's max_in_flight, 200) comes again as another message of the same body
    assert outcome.republished <= BATCH * outcome.retries + 200 * outcome.faults["lose"], report
    assert not outcome.problems, report
