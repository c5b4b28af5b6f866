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
"""

from __future__ import annotations

import dataclasses
import os
import struct
import tempfile
import time
from collections.abc import Callable
from typing import Any

from twisted.internet.task import Clock
from twisted.internet.testing import StringTransport

from nsqtw.core.nsqd import NSQD
from nsqtw.heap import keep_long_lived_old
from nsqtw.nsqd.options import defaults
from nsqtw.protocol.v2 import V2Factory
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


def run(command: bytes, n: int, data_path: str | None = None, per_command: int = 1) -> float:
    clock = Clock()
    clock.advance(1795341386.0)
    options = dataclasses.replace(defaults(), mem_queue_size=0 if data_path else 2 * n * per_command)
    nsqd = NSQD(options, clock, None if data_path is None else inline_disk_queues(options, clock, data_path))
    proto = V2Factory(nsqd, clock).buildProtocol(None)
    transport = StringTransport()
    proto.makeConnection(transport)
    proto.dataReceived(b"  V2")
    feed = proto.dataReceived
    started = time.process_time()
    # the disk queue's flush timer runs as 25,000 messages a second would see it
    every = max(1, 125 // per_command)
    for i in range(n):
        feed(command)
        if data_path is not None and i % every == every - 1:
            clock.advance(every * per_command / 25000)
    spent = time.process_time() - started
    answers = transport.value()
    if answers.count(b"OK") != n:
        raise SystemExit(f"expected {n} OKs, got: {answers[:200]!r}")
    return spent / n / per_command * 1e6


def main() -> None:
    keep_long_lived_old()  # as the daemon sets it (NSQDService.startService)
    n = int(os.environ.get("N", "100000"))
    reps = int(os.environ.get("REPS", "5"))
    disk = bool(os.environ.get("DISK"))
    for name, command, count in (("MPUB of one", MPUB_OF_ONE, 1), ("PUB", PUB, 1),
                                 ("MPUB of 200", MPUB_OF_200, 200)):
        spent = []
        commands = max(1, n // count)
        for _ in range(reps):
            with tempfile.TemporaryDirectory() as d:
                spent.append(run(command, commands, d if disk else None, count))
        what = "a command" if count == 1 else "a message"
        print(f"{name}{' to disk' if disk else ''}: {min(spent):.2f} µs CPU {what}")


if __name__ == "__main__":
    main()
