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
"""

from __future__ import annotations

import dataclasses
import os
import time

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


def run() -> float:
    clock = Clock()
    clock.advance(1795341386.0)
    nsqd = NSQD(dataclasses.replace(defaults(), mem_queue_size=0), clock)
    nsqd.publish("t", [b"x" * SIZE] * BACKLOG)
    proto: V2Protocol = V2Factory(nsqd, clock).buildProtocol(None)
    transport = StringTransport()
    proto.makeConnection(transport)
    proto.dataReceived(b"  V2SUB t c\nRDY %d\n" % RDY)
    transport.clear()
    got = 0
    started = time.process_time()
    while got < BACKLOG:
        clock.advance(0)  # the pumps' turns
        data = transport.value()
        transport.clear()
        ids = [data[i + 18:i + 34] for i in range(0, len(data), FRAME)]
        got += len(ids)
        if ids:
            proto.dataReceived(b"".join([b"FIN " + i + b"\n" for i in ids]))
    return (time.process_time() - started) / BACKLOG * 1e6


def main() -> None:
    reps = int(os.environ.get("REPS", "5"))
    best = min(run() for _ in range(reps))
    print(f"consume path: {best:.2f} µs CPU a message (compiled speed-ups: {getattr(message, 'SPEEDUPS', False)})")


if __name__ == "__main__":
    main()
