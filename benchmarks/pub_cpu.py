"""CPU of the publish path per command, in-process (no sockets, no disk threads).

Usage: PYTHONPATH=TREE python benchmarks/pub_cpu.py   (N, REPS and DISK in the environment)

A V2 connection is fed ``N`` (default 100,000) one-message commands of 200
B, each as its own read, as a publisher waiting for every ``OK`` sends
them: ``MPUB`` of one (what ``bench_writer -batch-size=1`` sends) and
``PUB``. What runs is the daemon's own code from ``dataReceived`` to the
``OK``: the parse, the checks, new IDs, the topic's memory queue. Then
MPUBs of 200 such messages (``bench_writer``'s default), ``N / 200`` of
them, reported per message. The collector runs with the thresholds the
daemon sets. Prints the best of
``REPS`` (default 5) runs, process CPU per command: a steadier A/B than a
live run on a shared two-core machine (docs/performance.md).

``DISK=1``: the topic keeps nothing in memory (``--mem-queue-size=0``) and
writes to a real disk queue in a scratch directory, whose jobs run at once
on the calling thread (``SynchronousDiskExecutor``); the flush timer is
advanced as 25,000 messages a second would see it. The
write system calls count too.

``REPLICAS=2``: the owner's side of ``--replicas=2`` too (its own log on a
disk lane that runs each job at once). Its link to one replica is up on an
in-memory transport; after each command the turn ends (its record goes to
the link) and the replica's ACK for it is fed back, which answers the OK.
What the replica does is not counted, nor the link's system calls (a live
replicated publish makes three more: ``benchmarks/replica_cpu.py``).
``NO_OWN=1`` leaves the own log out (what it costs is the difference).
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import struct
import tempfile
import time
from collections.abc import Callable
from typing import Any, cast

from twisted.internet.task import Clock
from twisted.internet.testing import MemoryReactorClock, StringTransport
from zope.interface import implementer

from nsqtw.core.nsqd import NSQD
from nsqtw.heap import keep_long_lived_old
from nsqtw.net.turn import ITurnEnd
from nsqtw.nsqd.options import defaults
from nsqtw.protocol.v2 import V2Factory
from nsqtw.replica.choice import Candidate, Choice
from nsqtw.replica.disklog import StandbyLog
from nsqtw.replica.link import OwnerLink
from nsqtw.replica.owner import OwnerSide
from nsqtw.replica.records import encode_ack
from nsqtw.replica.standby import Standby
from nsqtw.storage.diskqueue import DiskQueue
from nsqtw.storage.executor import SynchronousDiskExecutor
from nsqtw.storage.segments import nsqd_msg_size_limits

BODY = b"x" * 200
MPUB_OF_ONE = b"MPUB rt\n" + struct.pack(">iii", 4 + 4 + len(BODY), 1, len(BODY)) + BODY
PUB = b"PUB rt\n" + struct.pack(">i", len(BODY)) + BODY
#: what ``bench_writer`` sends by default: MPUBs of 200 messages
MPUB_OF_200 = (b"MPUB rt\n" + struct.pack(">ii", 4 + 200 * (4 + len(BODY)), 200)
               + (struct.pack(">i", len(BODY)) + BODY) * 200)


def inline_disk_queues(options: Any, clock: Clock, data_path: str) -> Callable[[str], DiskQueue]:
    """A backend factory of real disk queues under ``data_path``, as nsqd makes them from ``options``,
    whose jobs run at once on the calling thread, so their file work counts in the process's CPU."""
    lo, hi = nsqd_msg_size_limits(options.max_msg_size)

    def backend(name: str) -> DiskQueue:
        return DiskQueue(name, data_path, options.max_bytes_per_file, lo, hi, options.sync_every,
                         options.sync_timeout, clock, SynchronousDiskExecutor())

    return backend


@implementer(ITurnEnd)
class _TurnClock(MemoryReactorClock):
    """A clock whose turn ends when asked (:meth:`end_turn`), as nsqtw's reactor runs the calls
    asked for a turn's end: the owner's records closed, then its links' writes."""

    def __init__(self) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self._at_end: list[Callable[[], object]] = []

    def callAtTurnEnd(self, f: Callable[[], object]) -> None:
        self._at_end.append(f)

    def end_turn(self) -> None:
        while self._at_end:
            calls, self._at_end = self._at_end, []
            for f in calls:
                f()


class _Replication:
    """The core's replication calls, to an :class:`OwnerSide` (what ``ReplicationService`` passes on)."""

    def __init__(self, owner: OwnerSide) -> None:
        self.owner = owner

    def published(self, topic: str, values: Any, bodies: list[bytes], timestamp: int, delay: float) -> Any:
        return self.owner.published(topic, values, bodies, timestamp, delay)


def replicate(nsqd: NSQD, clock: _TurnClock, log_path: str) -> Callable[[], None]:
    """``nsqd`` as a ``--replicas=2`` owner whose one replica's link is up on an in-memory
    transport; returns the replica's answer: an ACK of every record sent so far."""
    peer = Candidate("10.0.0.2:4151", "10.0.0.2", 4151, "peer-inc")
    choice = Choice(clock, lambda: "10.0.0.1:4151", "own-inc", lambda: [])
    choice.candidates = {peer.address: peer}

    def own_log(topic: str) -> Standby:
        log = StandbyLog(log_path, f"own.{topic}", SynchronousDiskExecutor(), False, clock, journal=False,
                         unwritten=nsqd.unwritten)
        return Standby("self", topic, log)

    owner = OwnerSide(clock, choice, lambda: "10.0.0.1:4151", lambda: {"node": "10.0.0.1:4151"},
                      lambda topic: [], 9.0, 5.0, None if os.environ.get("NO_OWN") else own_log)
    nsqd.replication = _Replication(owner)  # type: ignore[assignment]
    owner.peer_for("rt")
    _, _, factory, _, _ = clock.tcpClients[0]
    link = cast(OwnerLink, factory.buildProtocol(None))
    wire = StringTransport()
    link.makeConnection(wire)  # type: ignore[no-untyped-call]
    link.dataReceived(b"HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\n"
                      b"Upgrade: nsqtw-replication/1\r\n\r\n")
    clock.end_turn()

    def ack() -> None:
        clock.end_turn()  # its record goes on the link
        wire.clear()
        link.dataReceived(encode_ack(link.sent))

    return ack


def run(command: bytes, n: int, data_path: str | None = None, per_command: int = 1, replicas: int = 1) -> float:
    turns = _TurnClock() if replicas > 1 else None
    clock = Clock() if turns is None else turns
    clock.advance(1795341386.0)
    options = dataclasses.replace(defaults(), mem_queue_size=0 if data_path else 2 * n * per_command)
    nsqd = NSQD(options, clock, None if data_path is None else inline_disk_queues(options, clock, data_path))
    logs = tempfile.mkdtemp()  # (the own log's files, with --replicas=2)
    ack = None if turns is None else replicate(nsqd, turns, logs)
    proto = V2Factory(nsqd, clock).buildProtocol(None)
    transport = StringTransport()
    proto.makeConnection(transport)  # type: ignore[no-untyped-call]
    proto.dataReceived(b"  V2")
    feed = proto.dataReceived
    started = time.process_time()
    # the disk queue's flush timer (and the own log's) runs as 25,000 messages a second would see it
    every = max(1, 125 // per_command)
    timed = data_path is not None or ack is not None
    for i in range(n):
        feed(command)
        if ack is not None:
            ack()
        if timed and i % every == every - 1:
            clock.advance(every * per_command / 25000)
    spent = time.process_time() - started
    shutil.rmtree(logs)
    answers = transport.value()
    if answers.count(b"OK") != n:
        raise SystemExit(f"expected {n} OKs, got: {answers[:200]!r}")
    return spent / n / per_command * 1e6


def main() -> None:
    keep_long_lived_old()  # as the daemon sets it (NSQDService.startService)
    n = int(os.environ.get("N", "100000"))
    reps = int(os.environ.get("REPS", "5"))
    disk = bool(os.environ.get("DISK"))
    replicas = int(os.environ.get("REPLICAS", "1"))
    for name, command, count in (("MPUB of one", MPUB_OF_ONE, 1), ("PUB", PUB, 1),
                                 ("MPUB of 200", MPUB_OF_200, 200)):
        spent = []
        commands = max(1, n // count)
        for _ in range(reps):
            with tempfile.TemporaryDirectory() as d:
                spent.append(run(command, commands, d if disk else None, count, replicas))
        what = "a command" if count == 1 else "a message"
        how = (" to disk" if disk else "") + (f", --replicas={replicas}" if replicas > 1 else "")
        print(f"{name}{how}: {min(spent):.2f} µs CPU {what}")


if __name__ == "__main__":
    main()
