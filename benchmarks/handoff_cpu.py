"""CPU of the topic → channel hand-off per message, in-process (no sockets, no disk threads).

Usage: PYTHONPATH=TREE python benchmarks/handoff_cpu.py [CASE ...]   (default: every case)

A topic holds 210,000 messages of 200 B (10,000 in memory, the rest in an
in-memory backend); its pump's ``distribute()`` runs until they all reached
the channels. Cases:

- ``drained``: one channel whose memory queue is emptied after each turn (a
  consumer that keeps up: every message decoded, none overflows);
- ``full``: one channel whose memory queue is full (nobody reads it);
- ``two-drained``: a drained channel and a full one.

Prints the best of ``REPS`` (environment, default 5) runs per case, process
CPU per message. Point ``PYTHONPATH`` at another checkout to compare
(docs/performance.md quotes it).
"""

from __future__ import annotations

import dataclasses
import os
import sys
import time

from twisted.internet.task import Clock

from nsqtw.core.message import Message
from nsqtw.core.nsqd import NSQD
from nsqtw.nsqd.options import defaults

CASES = ("drained", "full", "two-drained")
BACKLOG = 200_000
MEMORY = 10_000


def run(case: str) -> float:
    clock = Clock()
    clock.advance(1795341386.0)
    nsqd = NSQD(dataclasses.replace(defaults(), mem_queue_size=MEMORY), clock)
    topic = nsqd.get_topic("t")
    body = b"x" * 200
    published = nsqd.publish("t", [body] * (BACKLOG + MEMORY))
    while not published.called:  # a big publish is taken a slice a reactor turn
        clock.advance(0)
    fast = topic.get_channel("c")
    if case == "full":
        full = fast
    elif case == "two-drained":
        full = topic.get_channel("idle")
    if case != "drained":
        full.memory.extend(Message(b"%016d" % i + body, 1) for i in range(MEMORY))
    started = time.process_time()
    while topic.depth():
        topic.distribute()
        if case != "full":
            fast.memory.clear()
    return (time.process_time() - started) / (BACKLOG + MEMORY) * 1e6


def main(argv: list[str]) -> None:
    reps = int(os.environ.get("REPS", "5"))
    for case in argv or CASES:
        best = min(run(case) for _ in range(reps))
        print(f"{case}: {best:.2f} µs/msg")


if __name__ == "__main__":
    main(sys.argv[1:])
