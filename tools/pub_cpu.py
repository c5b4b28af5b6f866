"""CPU of the publish path per command, in-process (no sockets, no disk threads).

Usage: PYTHONPATH=TREE python tools/pub_cpu.py   (N and REPS in the environment)

A V2 connection is fed ``N`` (default 100,000) one-message commands of 200
B, each as its own read, as a publisher waiting for every ``OK`` sends
them: ``MPUB`` of one (what ``bench_writer -batch-size=1`` sends) and
``PUB``. What runs is the daemon's own code from ``dataReceived`` to the
``OK``: the parse, the checks, new IDs, the topic's memory queue. The
collector runs with the thresholds the daemon sets. Prints the best of
``REPS`` (default 5) runs, process CPU per command: a steadier A/B than a
live run on a shared two-core machine (docs/performance.md).
"""

from __future__ import annotations

import dataclasses
import gc
import os
import struct
import time

from twisted.internet.task import Clock
from twisted.internet.testing import StringTransport

from nsqtw.core.nsqd import NSQD
from nsqtw.nsqd.options import defaults
from nsqtw.protocol.v2 import V2Factory

BODY = b"x" * 200
MPUB_OF_ONE = b"MPUB rt\n" + struct.pack(">iii", 4 + 4 + len(BODY), 1, len(BODY)) + BODY
PUB = b"PUB rt\n" + struct.pack(">i", len(BODY)) + BODY


def run(command: bytes, n: int) -> float:
    clock = Clock()
    clock.advance(1795341386.0)
    nsqd = NSQD(dataclasses.replace(defaults(), mem_queue_size=2 * n), clock)
    proto = V2Factory(nsqd, clock).buildProtocol(None)
    transport = StringTransport()
    proto.makeConnection(transport)
    proto.dataReceived(b"  V2")
    feed = proto.dataReceived
    started = time.process_time()
    for _ in range(n):
        feed(command)
    spent = time.process_time() - started
    answers = transport.value()
    if answers.count(b"OK") != n:
        raise SystemExit(f"expected {n} OKs, got: {answers[:200]!r}")
    return spent / n * 1e6


def main() -> None:
    gc.set_threshold(50000, 20, 100)  # as the daemon sets it (NSQDService.startService)
    n = int(os.environ.get("N", "100000"))
    reps = int(os.environ.get("REPS", "5"))
    for name, command in (("MPUB of one", MPUB_OF_ONE), ("PUB", PUB)):
        best = min(run(command, n) for _ in range(reps))
        print(f"{name}: {best:.2f} µs CPU a command")


if __name__ == "__main__":
    main()
