"""The cluster ``nsqtw-bench chaos`` runs and breaks: nsqd nodes, nsqlookupd, their disks, a Spark query.

Every process listens on loopback addresses chosen once (:func:`free_ports`),
so a node restarted after a kill -9 is where its clients and nsqlookupd
expect it. Each node's data directory is a tmpfs of its own where the runner
may mount one (root), which the ``disk`` fault fills to the last byte and the
``lose`` fault empties (the machine lost: a new empty node takes its place).
Messages carry their sequence number (:func:`body_for`), which is all the
runner needs to count what was lost or delivered twice.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import socket
import subprocess
import time
import urllib.request
from dataclasses import dataclass
from typing import Protocol

__all__ = ["CHANNEL", "SPARK_CHANNEL", "TOPIC", "Cluster", "Daemon", "Disk", "Fault", "Query", "body_for",
           "free_ports", "seq_of"]

TOPIC = "chaos"
CHANNEL = "ch"
#: the channel of the Spark query (:mod:`nsqtw.tools.chaos_spark`)
SPARK_CHANNEL = "spark"


class Query(Protocol):
    """What the ``spark`` fault needs of a streaming query (:class:`nsqtw.tools.chaos_spark.SparkQuery`)."""

    def kill(self) -> None: ...

    def start(self) -> None: ...

    def driver_pid(self, timeout: float = ...) -> int: ...


@dataclass(frozen=True)
class Fault:
    """One fault of a schedule: when it starts (seconds into the run), what, on which node, for how long."""

    at: float
    kind: str
    node: int
    hold: float


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


#: where Linux says its outgoing connections take their local ports
PORT_RANGE_FILE = "/proc/sys/net/ipv4/ip_local_port_range"


def free_ports(count: int, range_file: str = PORT_RANGE_FILE) -> list[int]:
    """``count`` loopback ports free now, chosen once so that a restarted daemon listens where it did.

    They are taken below the kernel's ephemeral range: while a node is down
    its port is free, and a port in that range can go to any outgoing
    connection meanwhile (the runner's own ``/stats`` polls, a client
    reconnecting to the very port, which then connects to itself), so the
    node could not listen there again. Where the range cannot be read, any
    free port is taken.
    """
    try:
        with open(range_file) as f:
            low = int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        low = 0
    candidates = random.sample(range(max(1024, low - 16384), low), min(count * 8, low - 1024)) if low > 2048 else []
    ports: list[int] = []
    for port in candidates:
        if len(ports) == count:
            break
        s = socket.socket()
        try:
            s.bind(("127.0.0.1", port))
            ports.append(port)
        except OSError:
            continue
        finally:
            s.close()
    socks = []
    try:
        while len(ports) < count:  # no range to keep out of, or not enough free below it
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
            ports.append(s.getsockname()[1])
        return ports
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
    """A node's data directory on a tmpfs of its own, which a fault fills and then frees.

    :meth:`fill` fills only that tmpfs: it checks that the directory is still
    a mount point no bigger than the size mounted, and writes at most that
    size, so a tmpfs unmounted under a running cluster (or never mounted)
    never turns the fault into filling the machine's own disk.
    """

    def __init__(self, path: str, megabytes: int) -> None:
        """Mount a tmpfs of ``megabytes`` on ``path``; with 0, or where mounting fails (not root), none."""
        self.path = path
        self.ballast = os.path.join(path, "chaos-ballast")
        self.size = megabytes << 20
        self.mounted = bool(megabytes) and subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={megabytes}m", "tmpfs", path], capture_output=True).returncode == 0

    def fill(self) -> bool:
        """Take every free byte of the tmpfs; False (and nothing written) if it is not there any more."""
        st = os.statvfs(self.path)
        if not (self.mounted and os.path.ismount(self.path) and st.f_blocks * st.f_frsize <= self.size):
            return False
        fd = os.open(self.ballast, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            try:
                os.posix_fallocate(fd, 0, min(st.f_bavail * st.f_frsize, self.size))
            except OSError:
                pass
            try:  # whatever fallocate left (the daemon's own writes meanwhile): write until ENOSPC
                while os.fstat(fd).st_size < self.size and os.write(fd, bytes(4096)):
                    pass
            except OSError:
                pass
        finally:
            os.close(fd)
        return True

    def free(self) -> None:
        try:
            os.unlink(self.ballast)
        except FileNotFoundError:
            pass

    def wipe(self) -> None:
        """Delete everything in the data directory (the directory, or its tmpfs, stays)."""
        for name in os.listdir(self.path):
            path = os.path.join(self.path, name)
            if os.path.isdir(path) and not os.path.islink(path):
                shutil.rmtree(path)
            else:
                os.unlink(path)

    def unmount(self) -> None:
        if self.mounted and os.path.ismount(self.path):
            subprocess.run(["umount", self.path], capture_output=True)


class Cluster:
    """``nodes`` nsqd processes and one nsqlookupd on loopback, with the faults of a schedule."""

    def __init__(self, work: str, nsqd: list[str], lookupd: list[str], nodes: int, flags: list[str],
                 disk_mb: int, spark: bool = False) -> None:
        ports = free_ports(2 + 2 * nodes)
        self.channels = [CHANNEL, SPARK_CHANNEL] if spark else [CHANNEL]
        #: what went wrong with a fault (reported with the run's outcome)
        self.problems: list[str] = []
        #: the Spark query the ``spark`` fault kills, once the runner has attached one
        self.spark: Query | None = None
        self.lookupd = Daemon("nsqlookupd", lookupd + [f"--tcp-address=127.0.0.1:{ports[0]}",
                                                       f"--http-address=127.0.0.1:{ports[1]}",
                                                       "--broadcast-address=127.0.0.1"],
                              ports[0], ports[1], os.path.join(work, "nsqlookupd.log"))
        self.nodes: list[Daemon] = []
        self.disks: list[Disk] = []
        for i in range(nodes):
            data = os.path.join(work, f"node{i}")
            os.makedirs(data)
            self.disks.append(Disk(data, disk_mb))
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
            self._provision(node)

    def _provision(self, node: Daemon) -> None:
        """Create the topic and its channels on ``node``, as an operator's provisioning does for a new node."""
        paths = [f"/topic/create?topic={TOPIC}"]
        paths += [f"/channel/create?topic={TOPIC}&channel={c}" for c in self.channels]
        for path in paths:
            req = urllib.request.Request(f"http://127.0.0.1:{node.http}{path}", method="POST", data=b"")
            urllib.request.urlopen(req, timeout=5.0).close()

    def inject(self, fault: Fault) -> None:
        """Apply ``fault``, hold it, then undo it."""
        node = self.nodes[fault.node]
        if fault.kind == "kill":
            node.kill()
            time.sleep(fault.hold)
            node.start()
        elif fault.kind == "lose":
            # the machine is lost: the process killed and its disk gone; a new empty node takes its place
            node.kill()
            self.disks[fault.node].wipe()
            time.sleep(fault.hold)
            node.start()
            self._provision(node)
        elif fault.kind == "stop":
            node.signal(signal.SIGSTOP)
            time.sleep(fault.hold)
            node.signal(signal.SIGCONT)
        elif fault.kind == "lookupd":
            self.lookupd.kill()
            time.sleep(fault.hold)
            self.lookupd.start()
        elif fault.kind == "disk":
            disk = self.disks[fault.node]
            if not disk.fill():
                self.problems.append(f"disk fault at {fault.at:.2f}s skipped: {disk.path} is no longer its tmpfs")
                return
            time.sleep(fault.hold)
            disk.free()
        elif fault.kind == "spark" and self.spark is not None:
            self.spark.kill()
            time.sleep(fault.hold)
            self.spark.start()
            # the next fault may come while it replays its last batch: only its start is waited for
            self.spark.driver_pid()

    def left(self, channel: str = CHANNEL, held: bool = True) -> int:
        """Messages the nodes still have for ``channel``: the topic's and channel's depth, deferred, in flight.

        ``held=False`` leaves out those in flight to a connected client (a Spark
        query holds its batch until the next one is planned).
        """
        total = 0
        for node in self.nodes:
            url = f"http://127.0.0.1:{node.http}/stats?format=json&topic={TOPIC}&channel={channel}"
            with urllib.request.urlopen(url, timeout=5.0) as r:
                stats = json.load(r)
            for topic in stats.get("topics") or ():
                total += topic.get("depth", 0)
                for ch in topic.get("channels") or ():
                    total += ch.get("depth", 0) + ch.get("in_flight_count", 0) + ch.get("deferred_count", 0)
                    if not held:
                        total -= sum(c.get("in_flight_count", 0) for c in ch.get("clients") or ())
        return total

    def stop(self) -> None:
        if self.spark is not None:
            self.spark.kill()
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
