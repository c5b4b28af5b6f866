"""``nsqtw-bench chaos``: a cluster under faults, and what it lost or duplicated.

Starts a cluster on loopback (``--nodes`` nsqd nodes registered with one
nsqlookupd, each on addresses chosen once, so a restarted node keeps them),
publishes to it from ``--publishers`` threads that fail over between the
nodes, consumes through lookupd with the :mod:`nsqtw.client` Consumer (in a
process of its own, recording every body it is handed), and meanwhile injects
faults on a schedule drawn from ``--seed``, one at a time:

- ``kill``: kill -9 of a node, restarted after a moment on the same data;
- ``stop``: SIGSTOP of a node (a long pause), SIGCONT after a moment;
- ``lookupd``: kill -9 of nsqlookupd, restarted after a moment (empty, as a
  restarted lookupd is: the nodes register again);
- ``disk``: one node's data directory (a tmpfs of ``--disk-mb``, mounted for
  the run; root only) filled to the last byte, then freed;
- ``spark`` (with ``--spark``): kill -9 of a Spark streaming query's
  spark-submit process group (:mod:`nsqtw.tools.chaos_spark`), submitted
  again from its checkpoint after a moment;
- ``lose`` (only when ``--faults`` names it): the machine lost, kill -9 of a
  node and its data directory deleted; after a moment a new, empty node
  starts on its addresses and is given the topic and channels again.

Then it clears the faults, stops publishing, waits until every node's channel
is empty and the consumer has nothing more, and reports: messages
acknowledged (a publish answered ``OK``), delivered, **lost** (acknowledged
and never delivered), delivered again (the same message, its node and id,
more than once), published twice (a retry taken by two nodes, or a copy a
replica took over of a message the lost node had delivered), delivered
without an acknowledgement (the publisher gave up on an answer that never
came, but the node had taken the message), publish retries, and the longest
time an acknowledged message waited between its ``OK`` and its first
delivery.
With ``--spark``, the same for the query's Parquet sink, read as Spark
reads it after the query has taken everything and stopped cleanly.

``--go-nsqd=PATH`` runs the same schedule, seed and load against Go's nsqd
and the nsqlookupd next to it, after nsqtw's run, and prints both side by
side. ``--flags`` go to both daemons (``--mem-queue-size=0 --sync-every=1``),
``--nsqtw-flags`` to nsqtw's only (``--durable-delivery``).

    nsqtw-bench chaos --duration=10m --seed=1 --nsqtw-flags=--durable-delivery --go-nsqd=bin/nsqd
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter, deque
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from typing import Any

from nsqtw._go.duration import parse_duration
from nsqtw.protocol.wire import MAGIC_V2, NOP, encode_mpub, encode_pub, split_frames
from nsqtw.tools.chaos_cluster import CHANNEL, SPARK_CHANNEL, TOPIC, Cluster, Fault, body_for
from nsqtw.tools.chaos_spark import DEFAULT_APP, SparkQuery, read_sink
from nsqtw.tools.chaos_spark import drain as spark_drain
from nsqtw.tools.daemons import TWISTD, nsqtw_command

__all__ = ["DEFAULT_FAULTS", "FAULTS", "Fault", "Ledger", "Outcome", "main", "render", "run_chaos", "schedule"]

#: the faults a schedule may draw from, by name (``disk`` where a tmpfs can be mounted, ``spark`` with a query)
FAULTS = ("kill", "stop", "lookupd", "disk", "spark", "lose")
#: those drawn when ``--faults`` is not given: ``lose`` destroys data by design, so it is asked for by name
#: (and the default schedule of a seed stays what it was)
DEFAULT_FAULTS = ("kill", "stop", "lookupd", "disk", "spark")
#: how long a fault lasts (seconds, drawn uniformly): a node down, paused, lookupd down, a disk full, a
#: machine gone before its empty replacement starts
HOLD = {"kill": (0.5, 3.0), "stop": (1.0, 5.0), "lookupd": (0.5, 3.0), "disk": (1.0, 5.0), "spark": (0.5, 2.0),
        "lose": (0.5, 3.0)}
#: a publisher waits this long for an answer before it tries the next node
ANSWER_TIMEOUT = 2.0


def schedule(seed: int, duration: float, every: float, kinds: Sequence[str], nodes: int) -> list[Fault]:
    """The faults of a run: one about every ``every`` seconds (±50%), never two at once.

    Drawn from ``seed`` alone, so Go's cluster and nsqtw's face the same ones.
    """
    rng = random.Random(seed)
    faults: list[Fault] = []
    t = every * rng.uniform(0.5, 1.5)
    while kinds and t < duration:
        kind = rng.choice(list(kinds))
        low, high = HOLD[kind]
        hold = rng.uniform(low, high)
        faults.append(Fault(round(t, 3), kind, rng.randrange(nodes), round(hold, 3)))
        t += hold + every * rng.uniform(0.5, 1.5)
    return faults


class Ledger:
    """What the publishers were told: each acknowledged sequence number and when, and the retries."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._next = 0
        self.acked: dict[int, float] = {}
        self.retries = 0
        self.errors: Counter[str] = Counter()

    def take(self, count: int) -> range:
        with self._lock:
            first = self._next
            self._next += count
        return range(first, first + count)

    @property
    def published(self) -> int:
        return self._next

    def ack(self, seqs: range, when: float) -> None:
        with self._lock:
            for seq in seqs:
                self.acked[seq] = when

    def retry(self, why: str) -> None:
        with self._lock:
            self.retries += 1
            self.errors[why] += 1


class Publisher(threading.Thread):
    """Publishes at a steady rate over the V2 protocol, failing over to the next node on any failure.

    A publish that gets no ``OK`` (an error frame, a closed or refused
    connection, no answer within :data:`ANSWER_TIMEOUT`) is sent again, the
    same bodies, to the next node: the node that failed may still have taken
    it, which is how a publisher's retry becomes a duplicate.
    """

    def __init__(self, index: int, addresses: Sequence[tuple[str, int]], ledger: Ledger, rate: float,
                 batch: int, size: int, stop: threading.Event) -> None:
        super().__init__(name=f"publisher-{index}", daemon=True)
        self.addresses = addresses
        self.node = index % len(addresses)
        self.ledger = ledger
        self.interval = batch / rate
        self.batch = batch
        self.size = size
        self.halt = stop
        self.sock: socket.socket | None = None
        #: what the node sent that is not yet a whole frame, and whole frames not yet read
        self.buf = bytearray()
        self.frames: deque[tuple[int, bytes]] = deque()

    def run(self) -> None:
        due = time.monotonic()
        while not self.halt.is_set():
            seqs = self.ledger.take(self.batch)
            command = self._command([body_for(s, self.size) for s in seqs])
            while not self.halt.is_set():
                why = self._publish(command)
                if why is None:
                    self.ledger.ack(seqs, time.time())
                    break
                self.ledger.retry(why)
                self._drop()
                self.node = (self.node + 1) % len(self.addresses)
                self.halt.wait(0.05)
            due += self.interval
            self.halt.wait(max(0.0, due - time.monotonic()))
        self._drop()

    def _command(self, bodies: list[bytes]) -> bytes:
        topic = TOPIC.encode()
        return encode_pub(topic, bodies[0]) if len(bodies) == 1 else encode_mpub(topic, bodies)

    def _publish(self, command: bytes) -> str | None:
        """Send one PUB/MPUB and read its answer: None on ``OK``, otherwise why not."""
        try:
            if self.sock is None:
                self.sock = socket.create_connection(self.addresses[self.node], timeout=ANSWER_TIMEOUT)
                self.sock.sendall(MAGIC_V2)
            self.sock.sendall(command)
            while True:
                kind, data = self._frame()
                if kind == 0 and data == b"_heartbeat_":
                    self.sock.sendall(NOP)
                    continue
                if kind == 0 and data == b"OK":
                    return None
                return data.split(b" ", 1)[0].decode("ascii", "replace") or "error"
        except TimeoutError:
            return "timeout"
        except OSError as e:
            return type(e).__name__

    def _frame(self) -> tuple[int, bytes]:
        """The next frame from the node: ``(type, data)``."""
        assert self.sock is not None
        while not self.frames:
            chunk = self.sock.recv(65536)
            if not chunk:
                raise ConnectionResetError("closed by the node")
            self.buf += chunk
            self.frames.extend(split_frames(self.buf))
        return self.frames.popleft()

    def _drop(self) -> None:
        if self.sock is not None:
            self.sock.close()
            self.sock = None
        self.buf.clear()
        self.frames.clear()


@dataclass
class Outcome:
    """What one run published, delivered, lost and duplicated."""

    daemon: str
    flags: str
    seed: int
    duration: float
    faults: dict[str, int]
    published: int = 0
    acknowledged: int = 0
    delivered: int = 0
    lost: int = 0
    #: deliveries of a message beyond its first (the same node and id again)
    extra_copies: int = 0
    #: bodies the cluster took as two messages or more (a publisher's retry after a lost answer, or a
    #: replica's copy, with an ID of its own, of a message the lost node had delivered)
    republished: int = 0
    unacknowledged_delivered: int = 0
    retries: int = 0
    retry_reasons: dict[str, int] = field(default_factory=dict)
    max_wait: float = 0.0
    drained: bool = False
    drain_seconds: float = 0.0
    left_on_nodes: int = 0
    lost_examples: list[int] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    #: with a Spark query: how often it was submitted, and its sink's rows, lost and extra copies
    spark_submits: int = 0
    spark_rows: int = 0
    spark_lost: int = 0
    spark_extra_copies: int = 0
    spark_republished: int = 0


def _copies(seen: Iterator[tuple[int, str]]) -> tuple[int, int, int]:
    """Bodies seen, extra copies of one NSQ message (its node and id), bodies taken as several messages."""
    copies: Counter[str] = Counter()
    messages: dict[int, set[str]] = {}
    for seq, message in seen:
        copies[message] += 1
        messages.setdefault(seq, set()).add(message)
    return len(messages), sum(n - 1 for n in copies.values()), sum(1 for m in messages.values() if len(m) > 1)


def tally_sink(outcome: Outcome, ledger: Ledger, rows: list[tuple[int, str]]) -> None:
    """The Spark sink's counts: acknowledged messages missing from it, and rows beyond one per message."""
    outcome.spark_rows = len(rows)
    present = {seq for seq, _ in rows}
    outcome.spark_lost = sum(1 for seq in ledger.acked if seq not in present)
    _, outcome.spark_extra_copies, outcome.spark_republished = _copies(iter(rows))


def tally(outcome: Outcome, ledger: Ledger, deliveries: Iterator[tuple[int, float, str]]) -> Outcome:
    """Fill ``outcome``'s counts from what was acknowledged and what the consumer recorded.

    A body can reach the consumer twice in two ways: the same NSQ message
    delivered again (a redelivery: its node and id repeat), or the body
    published twice, when a publisher retried on another node after an
    answer that never came, or when a replica took over (with IDs of its
    own) messages its lost node had already delivered (two messages). They
    are counted apart.
    """
    first: dict[int, float] = {}
    seen: list[tuple[int, str]] = []
    for seq, when, message in deliveries:
        seen.append((seq, message))
        if seq not in first:
            first[seq] = when
    acked = ledger.acked
    outcome.published = ledger.published
    outcome.acknowledged = len(acked)
    outcome.delivered = len(first)
    lost = sorted(seq for seq in acked if seq not in first)
    outcome.lost = len(lost)
    outcome.lost_examples = lost[:20]
    _, outcome.extra_copies, outcome.republished = _copies(iter(seen))
    outcome.unacknowledged_delivered = sum(1 for seq in first if seq not in acked)
    outcome.retries = ledger.retries
    outcome.retry_reasons = dict(ledger.errors)
    waits = [first[seq] - t for seq, t in acked.items() if seq in first]
    outcome.max_wait = round(max(waits, default=0.0), 3)
    return outcome


def read_deliveries(path: str) -> Iterator[tuple[int, float, str]]:
    """The consumer's record: one ``SEQ TIME NODE/ID`` line per message it was handed."""
    with open(path) as f:
        for line in f:
            parts = line.split()
            if len(parts) == 3 and parts[0].isdigit():
                yield int(parts[0]), float(parts[1]), parts[2]


def _consumer_command(lookupd_http: int, out: str) -> list[str]:
    return [sys.executable, "-m", "nsqtw.tools.chaos_consumer", f"127.0.0.1:{lookupd_http}", TOPIC, CHANNEL, out]


@contextmanager
def _workdir(keep: str) -> Iterator[str]:
    if keep:
        os.makedirs(keep, exist_ok=True)
        yield tempfile.mkdtemp(prefix="chaos-", dir=keep)
        return
    path = tempfile.mkdtemp(prefix="nsqtw-chaos-")
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def run_chaos(daemon: str, nsqd: list[str], lookupd: list[str], flags: list[str], *, nodes: int = 3,
              duration: float = 60.0, every: float = 5.0, seed: int = 1, kinds: Sequence[str] = DEFAULT_FAULTS,
              publishers: int = 3, rate: float = 300.0, batch: int = 1, size: int = 64, disk_mb: int = 64,
              drain_timeout: float = 120.0, keep: str = "", spark_app: str = "", log: Any = None) -> Outcome:
    """One run: start the cluster, publish and consume through the schedule's faults, drain, count."""
    def say(text: str) -> None:
        if log is not None:
            print(f"[{daemon}] {text}", file=log, flush=True)

    with _workdir(keep) as work:
        cluster = Cluster(work, nsqd, lookupd, nodes, flags, disk_mb if "disk" in kinds else 0, bool(spark_app))
        query: SparkQuery | None = None
        if spark_app:
            query = cluster.spark = SparkQuery(spark_app, work, f"127.0.0.1:{cluster.lookupd.http}", TOPIC)
        usable = [k for k in kinds if (k != "disk" or cluster.can_fill_disks) and (k != "spark" or spark_app)]
        faults = schedule(seed, duration, every, usable, nodes)
        outcome = Outcome(daemon, " ".join(flags), seed, duration, dict(Counter(f.kind for f in faults)))
        if "disk" in kinds and "disk" not in usable:
            outcome.problems.append("disk fault skipped: a tmpfs could not be mounted (needs root)")
        ledger = Ledger()
        halt = threading.Event()
        out = os.path.join(work, "delivered.txt")
        consumer: subprocess.Popen[bytes] | None = None
        try:
            cluster.start()
            with open(os.path.join(work, "consumer.log"), "ab") as clog:
                consumer = subprocess.Popen(_consumer_command(cluster.lookupd.http, out), stdout=clog,
                                            stderr=clog, stdin=subprocess.DEVNULL)
            if query is not None:
                query.start()
                say(f"Spark query's driver: pid {query.driver_pid()}")
            addresses = [("127.0.0.1", n.tcp) for n in cluster.nodes]
            pubs = [Publisher(i, addresses, ledger, rate / publishers, batch, size, halt)
                    for i in range(publishers)]
            began = time.monotonic()
            for p in pubs:
                p.start()
            for fault in faults:
                halt.wait(max(0.0, began + fault.at - time.monotonic()))
                say(f"{fault.at:7.2f}s {fault.kind} node{fault.node} for {fault.hold:.2f}s")
                cluster.inject(fault)
            halt.wait(max(0.0, began + duration - time.monotonic()))
            halt.set()
            for p in pubs:
                p.join(ANSWER_TIMEOUT * 2)
            say(f"published {ledger.published}, acknowledged {len(ledger.acked)}; draining")
            outcome.drained, outcome.drain_seconds, outcome.left_on_nodes = _drain(cluster, out, drain_timeout)
            if query is not None:
                # a query that was killed late resubmits (tens of seconds) and catches up first
                spark_timeout = drain_timeout + 180
                if not spark_drain(query, lambda: cluster.left(SPARK_CHANNEL, held=False), spark_timeout):
                    outcome.problems.append("wedged: the Spark query's backlog did not shrink for"
                                            f" {spark_timeout:.0f} s")
                outcome.spark_submits = query.submits
                tally_sink(outcome, ledger, read_sink(query.output, work))
        except RuntimeError as e:  # a process that would not start: the run ends here, undrained
            outcome.problems.append(f"run ended early: {e}")
        finally:
            halt.set()
            if consumer is not None:
                consumer.send_signal(signal.SIGTERM)
                try:
                    consumer.wait(30)
                except subprocess.TimeoutExpired:
                    consumer.kill()
                    outcome.problems.append("the consumer did not stop within 30 s")
            cluster.stop()
            outcome.problems.extend(cluster.problems)
        tally(outcome, ledger, read_deliveries(out) if os.path.exists(out) else iter(()))
        if not outcome.drained and not any(p.startswith("run ended early") for p in outcome.problems):
            outcome.problems.append(f"wedged: {outcome.left_on_nodes} messages still on the nodes after"
                                    f" {drain_timeout:.0f} s")
        say(f"lost {outcome.lost}, delivered again {outcome.extra_copies}"
            + (f"; Spark sink lost {outcome.spark_lost}, extra {outcome.spark_extra_copies}" if spark_app else ""))
        return outcome


def _drain(cluster: Cluster, out: str, timeout: float) -> tuple[bool, float, int]:
    """Wait until the nodes hold nothing for the channel and the consumer has been quiet for 2 s."""
    began = time.monotonic()
    last_size, quiet_since = -1, time.monotonic()
    left = -1
    while time.monotonic() - began < timeout:
        size = os.path.getsize(out) if os.path.exists(out) else 0
        if size != last_size:
            last_size, quiet_since = size, time.monotonic()
        try:
            left = cluster.left()
        except OSError:
            left = -1
        if left == 0 and time.monotonic() - quiet_since >= 2.0:
            return True, round(time.monotonic() - began, 1), 0
        time.sleep(0.5)
    return False, round(time.monotonic() - began, 1), left


ROWS = (("acknowledged", "acknowledged (OK)"), ("delivered", "delivered (distinct)"),
        ("lost", "**lost** (acknowledged, never delivered)"),
        ("extra_copies", "delivered again (the same message)"),
        ("republished", "published twice (a retry after a lost answer)"),
        ("unacknowledged_delivered", "delivered, never acknowledged"), ("retries", "publish retries"),
        ("max_wait", "longest wait, OK to delivery (s)"), ("drain_seconds", "drain (s)"))
SPARK_ROWS = (("spark_submits", "Spark query submitted"), ("spark_rows", "Spark sink rows"),
              ("spark_lost", "**Spark sink lost** (acknowledged, not in the sink)"),
              ("spark_extra_copies", "Spark sink: the same message twice"),
              ("spark_republished", "Spark sink: published twice"))


def render(outcomes: Sequence[Outcome]) -> str:
    """A Markdown table: one column per run."""
    head = "| | " + " | ".join(f"{o.daemon} {o.flags}".strip() for o in outcomes) + " |"
    lines = [head, "|---" * (len(outcomes) + 1) + "|"]
    faults = ", ".join(f"{n} {k}" for k, n in sorted(outcomes[0].faults.items())) if outcomes else ""
    for key, label in ROWS + (SPARK_ROWS if any(o.spark_submits for o in outcomes) else ()):
        lines.append(f"| {label} | " + " | ".join(str(getattr(o, key)) for o in outcomes) + " |")
    lines.append(f"\nseed {outcomes[0].seed}, {outcomes[0].duration:.0f} s, faults: {faults or 'none'}"
                 if outcomes else "")
    for o in outcomes:
        for p in o.problems:
            lines.append(f"{o.daemon}: {p}")
        if o.lost_examples:
            lines.append(f"{o.daemon}: lost, the first: {o.lost_examples}")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="nsqtw-bench chaos", description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=3)
    parser.add_argument("--duration", default="60s", help="how long publishers run and faults come (Go duration)")
    parser.add_argument("--fault-every", default="5s", help="about this long between faults (±50%%)")
    parser.add_argument("--faults", default=",".join(DEFAULT_FAULTS),
                        help=f"comma-separated, of {', '.join(FAULTS)} (lose only when named)")
    parser.add_argument("--seed", default="1", help="one seed, or several comma-separated (one run each)")
    parser.add_argument("--publishers", type=int, default=3)
    parser.add_argument("--rate", type=float, default=300.0, help="messages/s, all publishers together")
    parser.add_argument("--batch-size", type=int, default=1, help="messages per publish (1: PUB, more: MPUB)")
    parser.add_argument("--size", type=int, default=64, help="message size in bytes")
    parser.add_argument("--disk-mb", type=int, default=64, help="each node's tmpfs for the disk fault (0: none)")
    parser.add_argument("--drain-timeout", default="120s")
    parser.add_argument("--flags", default="", help="flags for every nsqd (Go's and nsqtw's)")
    parser.add_argument("--nsqtw-flags", default="", help="flags for nsqtw's nsqd only, e.g. --durable-delivery")
    parser.add_argument("--go-nsqd", default="", help="Go nsqd to run side by side (nsqlookupd beside it)")
    parser.add_argument("--spark", nargs="?", const=DEFAULT_APP, default="", metavar="APP",
                        help="also run a Spark streaming query (spark-submit APP; default: the checkout's "
                             "examples/spark/nsq_to_parquet.py) and its kill -9 fault")
    parser.add_argument("--keep", default="", help="keep each run's data and logs under this directory")
    parser.add_argument("--json", action="store_true", help="one JSON object per run instead of the table")
    ns = parser.parse_args(argv)
    kinds = [k for k in ns.faults.split(",") if k]
    unknown = set(kinds) - set(FAULTS)
    if unknown:
        parser.error(f"unknown faults: {', '.join(sorted(unknown))}")
    flags = shlex.split(ns.flags)
    clusters = [("nsqtw", nsqtw_command(), [sys.executable, "-c", TWISTD, "--pidfile=", "-n", "nsqtw-lookupd"],
                 flags + shlex.split(ns.nsqtw_flags))]
    if ns.go_nsqd:
        go = shlex.split(ns.go_nsqd)
        clusters.append(("go", go, [os.path.join(os.path.dirname(go[0]), "nsqlookupd")], flags))
    # SIGTERM (a timeout, a CI job cancelled) unwinds like Ctrl-C, so the cluster's processes are
    # killed and its tmpfs mounts undone instead of outliving the runner
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    failed = False
    for seed in (int(s) for s in ns.seed.split(",")):
        outcomes = []
        for name, nsqd, lookupd, daemon_flags in clusters:
            outcome = run_chaos(name, nsqd, lookupd, daemon_flags, nodes=ns.nodes,
                                duration=parse_duration(ns.duration), every=parse_duration(ns.fault_every),
                                seed=seed, kinds=kinds, publishers=ns.publishers, rate=ns.rate,
                                batch=ns.batch_size, size=ns.size, disk_mb=ns.disk_mb,
                                drain_timeout=parse_duration(ns.drain_timeout), keep=ns.keep, spark_app=ns.spark,
                                log=sys.stderr)
            outcomes.append(outcome)
            failed = failed or not outcome.drained or bool(outcome.problems and "wedged" in " ".join(outcome.problems))
            if ns.json:
                print(json.dumps(asdict(outcome)), flush=True)
        if not ns.json:
            print(render(outcomes), flush=True)
    return 1 if failed else 0
