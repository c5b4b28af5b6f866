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
  the run; root only) filled to the last byte, then freed.

Then it clears the faults, stops publishing, waits until every node's channel
is empty and the consumer has nothing more, and reports: messages
acknowledged (a publish answered ``OK``), delivered, **lost** (acknowledged
and never delivered), duplicated (delivered more than once), delivered
without an acknowledgement (the publisher gave up on an answer that never
came, but the node had taken the message), publish retries, and the longest
time an acknowledged message waited between its ``OK`` and its first
delivery.

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
import struct
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections import Counter
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from typing import Any

from nsqtw._go.duration import parse_duration
from nsqtw.tools.daemons import TWISTD, nsqtw_command

__all__ = ["FAULTS", "Fault", "Ledger", "Outcome", "main", "render", "run_chaos", "schedule"]

#: the faults a schedule draws from, by name
FAULTS = ("kill", "stop", "lookupd", "disk")
TOPIC = "chaos"
CHANNEL = "ch"
#: how long a fault lasts (seconds, drawn uniformly): a node down, paused, lookupd down, a disk full
HOLD = {"kill": (0.5, 3.0), "stop": (1.0, 5.0), "lookupd": (0.5, 3.0), "disk": (1.0, 5.0)}
#: a publisher waits this long for an answer before it tries the next node
ANSWER_TIMEOUT = 2.0
_FRAME = struct.Struct(">ii")


@dataclass(frozen=True)
class Fault:
    """One fault of a schedule: when it starts (seconds into the run), what, on which node, for how long."""

    at: float
    kind: str
    node: int
    hold: float


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


def body_for(seq: int, size: int) -> bytes:
    """A message body that names its sequence number (what the consumer records), padded to ``size``."""
    head = b"chaos:%012d:" % seq
    return head + b"x" * max(0, size - len(head))


def seq_of(body: bytes) -> int | None:
    """The sequence number ``body`` carries, or None for a body this runner did not publish."""
    if body[:6] != b"chaos:" or body[18:19] != b":":
        return None
    try:
        return int(body[6:18])
    except ValueError:
        return None


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
        if len(bodies) == 1:
            return b"PUB " + topic + b"\n" + struct.pack(">i", len(bodies[0])) + bodies[0]
        payload = struct.pack(">i", len(bodies)) + b"".join(struct.pack(">i", len(b)) + b for b in bodies)
        return b"MPUB " + topic + b"\n" + struct.pack(">i", len(payload)) + payload

    def _publish(self, command: bytes) -> str | None:
        """Send one PUB/MPUB and read its answer: None on ``OK``, otherwise why not."""
        try:
            if self.sock is None:
                self.sock = socket.create_connection(self.addresses[self.node], timeout=ANSWER_TIMEOUT)
                self.sock.sendall(b"  V2")
            self.sock.sendall(command)
            while True:
                kind, data = self._frame()
                if kind == 0 and data == b"_heartbeat_":
                    self.sock.sendall(b"NOP\n")
                    continue
                if kind == 0 and data == b"OK":
                    return None
                return data.split(b" ", 1)[0].decode("ascii", "replace") or "error"
        except TimeoutError:
            return "timeout"
        except OSError as e:
            return type(e).__name__

    def _frame(self) -> tuple[int, bytes]:
        head = self._exactly(_FRAME.size)
        size, kind = _FRAME.unpack(head)
        return kind, self._exactly(size - 4)

    def _exactly(self, n: int) -> bytes:
        assert self.sock is not None
        chunks = []
        while n:
            chunk = self.sock.recv(n)
            if not chunk:
                raise ConnectionResetError("closed by the node")
            chunks.append(chunk)
            n -= len(chunk)
        return b"".join(chunks)

    def _drop(self) -> None:
        if self.sock is not None:
            self.sock.close()
            self.sock = None


def free_ports(count: int) -> list[int]:
    """``count`` loopback ports free now, chosen once so that a restarted daemon listens where it did."""
    socks = []
    try:
        for _ in range(count):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


@dataclass
class Daemon:
    """One process of the cluster: how to start it, where it listens, its log."""

    name: str
    cmd: list[str]
    tcp: int
    http: int
    log: str
    proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 30.0) -> None:
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(self.cmd, stdout=log, stderr=log, stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited ({self.proc.returncode}) at start-up; see {self.log}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.http}/ping", timeout=1.0):
                    pass
                socket.create_connection(("127.0.0.1", self.tcp), timeout=1.0).close()
                return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError(f"{self.name} did not listen within {timeout:.0f} s; see {self.log}")

    def signal(self, sig: int) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(sig)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)
            self.proc.kill()
            self.proc.wait()


class Disk:
    """A node's data directory on a tmpfs of its own, which a fault fills and then frees."""

    def __init__(self, path: str, megabytes: int) -> None:
        self.path = path
        self.ballast = os.path.join(path, "chaos-ballast")
        result = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={megabytes}m", "tmpfs", path],
                                capture_output=True)
        self.mounted = result.returncode == 0

    def fill(self) -> None:
        st = os.statvfs(self.path)
        fd = os.open(self.ballast, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            try:
                os.posix_fallocate(fd, 0, st.f_bavail * st.f_frsize)
            except OSError:
                pass
            try:  # whatever fallocate left (the daemon's own writes meanwhile): write until ENOSPC
                while os.write(fd, bytes(4096)):
                    pass
            except OSError:
                pass
        finally:
            os.close(fd)

    def free(self) -> None:
        try:
            os.unlink(self.ballast)
        except FileNotFoundError:
            pass

    def unmount(self) -> None:
        if self.mounted:
            subprocess.run(["umount", "-l", self.path], capture_output=True)


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
    duplicated: int = 0
    extra_copies: int = 0
    unacknowledged_delivered: int = 0
    retries: int = 0
    retry_reasons: dict[str, int] = field(default_factory=dict)
    max_wait: float = 0.0
    drained: bool = False
    drain_seconds: float = 0.0
    left_on_nodes: int = 0
    lost_examples: list[int] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)


def tally(outcome: Outcome, ledger: Ledger, deliveries: Iterator[tuple[int, float]]) -> Outcome:
    """Fill ``outcome``'s counts from what was acknowledged and what the consumer recorded."""
    first: dict[int, float] = {}
    copies: Counter[int] = Counter()
    for seq, when in deliveries:
        copies[seq] += 1
        if seq not in first:
            first[seq] = when
    acked = ledger.acked
    outcome.published = ledger.published
    outcome.acknowledged = len(acked)
    outcome.delivered = len(first)
    lost = sorted(seq for seq in acked if seq not in first)
    outcome.lost = len(lost)
    outcome.lost_examples = lost[:20]
    outcome.duplicated = sum(1 for n in copies.values() if n > 1)
    outcome.extra_copies = sum(n - 1 for n in copies.values())
    outcome.unacknowledged_delivered = sum(1 for seq in first if seq not in acked)
    outcome.retries = ledger.retries
    outcome.retry_reasons = dict(ledger.errors)
    waits = [first[seq] - t for seq, t in acked.items() if seq in first]
    outcome.max_wait = round(max(waits, default=0.0), 3)
    return outcome


def read_deliveries(path: str) -> Iterator[tuple[int, float]]:
    """The consumer's record: one ``SEQ TIME`` line per message it was handed."""
    with open(path) as f:
        for line in f:
            parts = line.split()
            if len(parts) == 2 and parts[0].isdigit():
                yield int(parts[0]), float(parts[1])


class Cluster:
    """``nodes`` nsqd processes and one nsqlookupd on loopback, with the faults of a schedule."""

    def __init__(self, work: str, nsqd: list[str], lookupd: list[str], nodes: int, flags: list[str],
                 disk_mb: int) -> None:
        ports = free_ports(2 + 2 * nodes)
        self.lookupd = Daemon("nsqlookupd", lookupd + [f"--tcp-address=127.0.0.1:{ports[0]}",
                                                       f"--http-address=127.0.0.1:{ports[1]}",
                                                       "--broadcast-address=127.0.0.1"],
                              ports[0], ports[1], os.path.join(work, "nsqlookupd.log"))
        self.nodes: list[Daemon] = []
        self.disks: list[Disk] = []
        for i in range(nodes):
            data = os.path.join(work, f"node{i}")
            os.makedirs(data)
            self.disks.append(Disk(data, disk_mb) if disk_mb else _NoDisk(data))
            tcp, http = ports[2 + 2 * i], ports[3 + 2 * i]
            cmd = nsqd + [f"--tcp-address=127.0.0.1:{tcp}", f"--http-address=127.0.0.1:{http}",
                          f"--data-path={data}", "--broadcast-address=127.0.0.1",
                          f"--lookupd-tcp-address=127.0.0.1:{ports[0]}", *flags]
            self.nodes.append(Daemon(f"node{i}", cmd, tcp, http, os.path.join(work, f"node{i}.log")))

    @property
    def can_fill_disks(self) -> bool:
        return all(d.mounted for d in self.disks)

    def start(self) -> None:
        self.lookupd.start()
        for node in self.nodes:
            node.start()
            for path in (f"/topic/create?topic={TOPIC}", f"/channel/create?topic={TOPIC}&channel={CHANNEL}"):
                req = urllib.request.Request(f"http://127.0.0.1:{node.http}{path}", method="POST", data=b"")
                urllib.request.urlopen(req, timeout=5.0).close()

    def inject(self, fault: Fault, halt: threading.Event) -> None:
        """Apply ``fault``, hold it (or until ``halt``), then undo it."""
        node = self.nodes[fault.node]
        if fault.kind == "kill":
            node.kill()
            halt.wait(fault.hold)
            node.start()
        elif fault.kind == "stop":
            node.signal(signal.SIGSTOP)
            halt.wait(fault.hold)
            node.signal(signal.SIGCONT)
        elif fault.kind == "lookupd":
            self.lookupd.kill()
            halt.wait(fault.hold)
            self.lookupd.start()
        elif fault.kind == "disk":
            disk = self.disks[fault.node]
            disk.fill()
            halt.wait(fault.hold)
            disk.free()

    def left(self) -> int:
        """Messages the nodes still hold for the channel (topic and channel depth, in flight, deferred)."""
        total = 0
        for node in self.nodes:
            url = f"http://127.0.0.1:{node.http}/stats?format=json&topic={TOPIC}&channel={CHANNEL}"
            with urllib.request.urlopen(url, timeout=5.0) as r:
                stats = json.load(r)
            for topic in stats.get("topics") or ():
                total += topic.get("depth", 0)
                for ch in topic.get("channels") or ():
                    total += ch.get("depth", 0) + ch.get("in_flight_count", 0) + ch.get("deferred_count", 0)
        return total

    def stop(self) -> None:
        for node in self.nodes:
            node.signal(signal.SIGCONT)
            node.signal(signal.SIGTERM)
        self.lookupd.signal(signal.SIGTERM)
        for d in [*self.nodes, self.lookupd]:
            if d.proc is not None:
                try:
                    d.proc.wait(15)
                except subprocess.TimeoutExpired:
                    d.kill()
        for disk in self.disks:
            disk.free()
            disk.unmount()


class _NoDisk(Disk):
    """A data directory with no tmpfs under it (``--disk-mb=0``, or not root): the disk fault is not drawn."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.ballast = os.path.join(path, "chaos-ballast")
        self.mounted = False


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
              duration: float = 60.0, every: float = 5.0, seed: int = 1, kinds: Sequence[str] = FAULTS,
              publishers: int = 3, rate: float = 300.0, batch: int = 1, size: int = 64, disk_mb: int = 64,
              drain_timeout: float = 120.0, keep: str = "", log: Any = None) -> Outcome:
    """One run: start the cluster, publish and consume through the schedule's faults, drain, count."""
    def say(text: str) -> None:
        if log is not None:
            print(f"[{daemon}] {text}", file=log, flush=True)

    with _workdir(keep) as work:
        cluster = Cluster(work, nsqd, lookupd, nodes, flags, disk_mb if "disk" in kinds else 0)
        usable = [k for k in kinds if k != "disk" or cluster.can_fill_disks]
        faults = schedule(seed, duration, every, usable, nodes)
        outcome = Outcome(daemon, " ".join(flags), seed, duration, dict(Counter(f.kind for f in faults)))
        if len(usable) < len(kinds):
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
            addresses = [("127.0.0.1", n.tcp) for n in cluster.nodes]
            pubs = [Publisher(i, addresses, ledger, rate / publishers, batch, size, halt)
                    for i in range(publishers)]
            began = time.monotonic()
            for p in pubs:
                p.start()
            for fault in faults:
                halt.wait(max(0.0, began + fault.at - time.monotonic()))
                say(f"{fault.at:7.2f}s {fault.kind} node{fault.node} for {fault.hold:.2f}s")
                cluster.inject(fault, threading.Event())
            halt.wait(max(0.0, began + duration - time.monotonic()))
            halt.set()
            for p in pubs:
                p.join(ANSWER_TIMEOUT * 2)
            say(f"published {ledger.published}, acknowledged {len(ledger.acked)}; draining")
            outcome.drained, outcome.drain_seconds, outcome.left_on_nodes = _drain(cluster, out, drain_timeout)
        except RuntimeError as e:
            outcome.problems.append(str(e))
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
        tally(outcome, ledger, read_deliveries(out) if os.path.exists(out) else iter(()))
        if not outcome.drained:
            outcome.problems.append(f"wedged: {outcome.left_on_nodes} messages still on the nodes after"
                                    f" {drain_timeout:.0f} s")
        say(f"lost {outcome.lost}, duplicated {outcome.duplicated}")
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
        ("lost", "**lost** (acknowledged, never delivered)"), ("duplicated", "delivered more than once"),
        ("extra_copies", "extra copies delivered"),
        ("unacknowledged_delivered", "delivered, never acknowledged"), ("retries", "publish retries"),
        ("max_wait", "longest wait, OK to delivery (s)"), ("drain_seconds", "drain (s)"))


def render(outcomes: Sequence[Outcome]) -> str:
    """A Markdown table: one column per run."""
    head = "| | " + " | ".join(f"{o.daemon} {o.flags}".strip() for o in outcomes) + " |"
    lines = [head, "|---" * (len(outcomes) + 1) + "|"]
    faults = ", ".join(f"{n} {k}" for k, n in sorted(outcomes[0].faults.items())) if outcomes else ""
    for key, label in ROWS:
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
    parser.add_argument("--faults", default=",".join(FAULTS), help=f"comma-separated, of {', '.join(FAULTS)}")
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
    failed = False
    for seed in (int(s) for s in ns.seed.split(",")):
        outcomes = []
        for name, nsqd, lookupd, daemon_flags in clusters:
            outcome = run_chaos(name, nsqd, lookupd, daemon_flags, nodes=ns.nodes,
                                duration=parse_duration(ns.duration), every=parse_duration(ns.fault_every),
                                seed=seed, kinds=kinds, publishers=ns.publishers, rate=ns.rate,
                                batch=ns.batch_size, size=ns.size, disk_mb=ns.disk_mb,
                                drain_timeout=parse_duration(ns.drain_timeout), keep=ns.keep, log=sys.stderr)
            outcomes.append(outcome)
            failed = failed or not outcome.drained
            if ns.json:
                print(json.dumps(asdict(outcome)), flush=True)
        if not ns.json:
            print(render(outcomes), flush=True)
    return 1 if failed else 0
