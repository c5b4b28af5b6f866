"""The consumer of ``nsqtw-bench chaos``, a process of its own: every body it is handed, and when.

    python -m nsqtw.tools.chaos_consumer LOOKUPD_HTTP TOPIC CHANNEL OUT

Finds the nodes through nsqlookupd (polled every second) with the
:mod:`nsqtw.client` Consumer, as an application would, and appends ``SEQ
TIME NODE/ID`` to ``OUT`` for each message before it is FINed (so a message the
consumer saw counts as delivered even if its FIN is lost with a node). The
file is flushed every 100 ms and when SIGTERM stops the process.
"""

from __future__ import annotations

import sys
import time
from typing import IO

from twisted.internet.task import LoopingCall

from nsqtw.client import Config, Consumer, Message
from nsqtw.tools.chaos_cluster import seq_of


class Recorder:
    """The handler: one line per message handed to it (``?`` for a body the runner did not publish)."""

    def __init__(self, out: IO[str]) -> None:
        self.out = out

    def __call__(self, msg: Message) -> None:
        seq = seq_of(msg.body)
        self.out.write(f"{'?' if seq is None else seq} {time.time():.6f} {msg.nsqd_address}/{msg.id.decode()}\n")


def main(argv: list[str]) -> int:
    from twisted.internet import reactor

    lookupd, topic, channel, path = argv
    out = open(path, "a", buffering=1 << 16)
    config = Config(max_in_flight=200, lookupd_poll_interval=1.0, lookupd_poll_jitter=0.1, max_attempts=0)
    consumer = Consumer(topic, channel, Recorder(out), config, lookupd_http_addresses=[lookupd])
    flusher = LoopingCall(out.flush)
    flusher.start(0.1)
    reactor.addSystemEventTrigger("after", "shutdown", out.close)
    consumer.start()
    reactor.run()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
