"""CPU of the consume path per message, in-process (no sockets, no disk threads).

Usage: PYTHONPATH=TREE python benchmarks/read_cpu.py   (NSQTW_NO_SPEEDUPS=1 for the pure-Python path)

A topic holds 200,000 messages of 200 B, read back from an in-memory
backend as a disk queue's records would be; a V2 connection subscribes
with RDY 2500 and answers every MESSAGE frame with a FIN, all the FINs of
one write in one read, as ``bench_reader`` does. What runs is the daemon's
own code from the topic's pump to the FIN: decoding, the channel's
hand-out, framing, the in-flight queue and the FINs; the client's side is a
slice and a join per message. Prints the best of ``REPS`` (environment,
default 5) runs, process CPU per message: a steadier A/B than a live
``bench_reader`` run on a shared two-core machine (docs/performance.md).

``DISK=1``: the backlog is in real disk queues in a scratch directory, as
a live ``read`` figure has it (``--mem-queue-size`` at its default, 10,000:
the topic's disk queue, then the full channel's, then the channel's reads
back). Their jobs run at once on the calling thread
(``pub_cpu.inline_disk_queues``), so the file work counts too; the flush and
sync timers are advanced 0.2 ms a turn.
"""

from __future__ import annotations

import dataclasses
import os
import tempfile
import time

# a script beside it (python benchmarks/read_cpu.py puts benchmarks/ on sys.path)
from pub_cpu import inline_disk_queues
from twisted.internet.task import Clock
from twisted.internet.testing import StringTransport

from nsqtw.core import message
from nsqtw.core.nsqd import NSQD
from nsqtw.nsqd.options import defaults
from nsqtw.protocol.v2 import V2Factory, V2Protocol

BACKLOG = 200_000
SIZE = 200
RDY = 2500
#: a MESSAGE frame: size, type, timestamp, attempts, ID, body
FRAME = 4 + 4 + 8 + 2 + 16 + SIZE


def run(data_path: str | None = None) -> float:
    clock = Clock()
    clock.advance(1795341386.0)
    options = defaults() if data_path else dataclasses.replace(defaults(), mem_queue_size=0)
    nsqd = NSQD(options, clock, None if data_path is None else inline_disk_queues(options, clock, data_path))
    for _ in range(0, BACKLOG, 1000):
        nsqd.publish("t", [b"x" * SIZE] * 1000)
        clock.advance(0.01)  # the disk queue's flush timer
    proto: V2Protocol = V2Factory(nsqd, clock).buildProtocol(None)
    transport = StringTransport()
    proto.makeConnection(transport)
    proto.dataReceived(b"  V2SUB t c\nRDY %d\n" % RDY)
    transport.clear()
    got = 0
    started = time.process_time()
    while got < BACKLOG:
        clock.advance(0.0002 if data_path else 0)  # the pumps' turns (and the disk queues' timers)
        data = transport.value()
        transport.clear()
        ids = [data[i + 18:i + 34] for i in range(0, len(data), FRAME)]
        got += len(ids)
        if ids:
            proto.dataReceived(b"".join([b"FIN " + i + b"\n" for i in ids]))
    return (time.process_time() - started) / BACKLOG * 1e6


def main() -> None:
    reps = int(os.environ.get("REPS", "5"))
    disk = bool(os.environ.get("DISK"))
    spent = []
    for _ in range(reps):
        with tempfile.TemporaryDirectory() as d:
            spent.append(run(d if disk else None))
    print(f"consume path{' from disk' if disk else ''}: {min(spent):.2f} µs CPU a message "
          f"(compiled speed-ups: {getattr(message, 'SPEEDUPS', False)})")


if __name__ == "__main__":
    main()
