"""``nsqtw pub``: to_nsq — publish stdin to a topic, one message per delimited record.

Every record goes to every ``--nsqd-tcp-address`` (as to_nsq does); empty
records are skipped. Unlike Go's to_nsq, a last record with no delimiter
after it is published whole (to_nsq drops its last byte). Publishes are
pipelined (at most :data:`WINDOW` records unanswered) and the exit waits
for nsqd's answer to every one: status 0 means nsqd acknowledged them all.
Ctrl-C/SIGTERM stops reading and waits for the answers to what was sent.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import IO, Any

from twisted.internet import task
from twisted.internet.defer import Deferred, DeferredList, gatherResults

from nsqtw import __version__
from nsqtw._go.flags import ACTIVE, FlagSet, make_flag
from nsqtw.client import Producer
from nsqtw.tools import common
from nsqtw.tools.common import GoLog, StdinReader, ToolError, client_config, parse_flags, require, run_tool

PROGRAM = "to_nsq"
#: records sent and not yet answered before reading more of stdin
WINDOW = 256


@dataclass(frozen=True)
class PubOptions:
    delimiter: str = "\n"
    nsqd_tcp_address: tuple[str, ...] = ()
    producer_opt: tuple[str, ...] = ()
    rate: int = 0
    topic: str = ""
    version: bool = False


_B = PubOptions()
FLAGS = FlagSet("nsqtw pub", (
    make_flag("delimiter", "string", "The single byte that ends each message read from stdin.", ACTIVE, base=_B),
    make_flag("nsqd-tcp-address", "strings", "nsqd TCP address to publish to; each gets every message (repeatable).",
              ACTIVE, base=_B),
    make_flag("producer-opt", "strings", "A go-nsq Config option for the producer, as name,value (repeatable; see "
              "docs/client.md).", ACTIVE, base=_B),
    make_flag("rate", "int", "Publish at most this many messages per second (0: no limit).", ACTIVE, base=_B),
    make_flag("topic", "string", "Topic to publish to.", ACTIVE, base=_B),
    make_flag("version", "bool", "Print the version and exit.", ACTIVE, base=_B),
), lambda hostname: PubOptions(), lambda opts: None)


class Throttle:
    """to_nsq's --rate: one token per 1/rate seconds, at most a second's worth saved up."""

    def __init__(self, reactor: Any, rate: int) -> None:
        self.reactor = reactor
        self.rate = rate
        self.tokens = 1.0
        self.last = reactor.seconds()

    async def take(self) -> None:
        while True:
            now = self.reactor.seconds()
            self.tokens = min(float(self.rate), self.tokens + (now - self.last) * self.rate)
            self.last = now
            if self.tokens >= 1:
                self.tokens -= 1
                return
            await task.deferLater(self.reactor, (1 - self.tokens) / self.rate)


async def pub(reactor: Any, opts: PubOptions, stdin: IO[bytes]) -> int:
    log = GoLog()
    require(bool(opts.topic), "--topic required")
    require(len(opts.delimiter.encode()) == 1, "--delimiter must be a single byte")
    require(bool(opts.nsqd_tcp_address), "--nsqd-tcp-address required")
    config = client_config(opts.producer_opt, PROGRAM)
    producers = [Producer(a, config.copy(), reactor=reactor) for a in dict.fromkeys(opts.nsqd_tcp_address)]
    for p in producers:
        p.start()
    delim = opts.delimiter.encode()
    throttle = Throttle(reactor, opts.rate) if opts.rate >= 1 else None
    if throttle is not None:
        log.printf(f"Throttling messages rate to max:{opts.rate}/second")
    stopping = [False]
    unanswered: list[Deferred[Any]] = []
    failures: list[str] = []
    connected: list[bool] = []

    def stop() -> Deferred[Any]:
        stopping[0] = True
        return DeferredList([p.stop() for p in producers], consumeErrors=True)

    reactor.addSystemEventTrigger("before", "shutdown", stop)

    def failed(f: Any) -> None:
        failures.append(f.getErrorMessage())

    async def send(record: bytes) -> None:
        if not unanswered and not connected:  # as Go's producer, connect at the first publish
            await common.connected_or_exit([p.first_attempts() for p in producers])
            connected.append(True)
        if throttle is not None:
            await throttle.take()
        d = gatherResults([p.publish(opts.topic, record) for p in producers], consumeErrors=True)
        d.addErrback(failed)
        unanswered.append(d)
        if len(unanswered) >= WINDOW:
            await DeferredList(list(unanswered))
            unanswered.clear()

    reader = StdinReader(reactor, stdin)
    buffer = b""
    eof = False
    while not eof and not stopping[0] and not failures:
        chunk = await reader.read()
        eof = not chunk
        buffer += chunk
        *records, buffer = buffer.split(delim)
        if eof and buffer:
            records.append(buffer)
        for record in records:
            if record and not failures and not stopping[0]:
                await send(record)
    await DeferredList(list(unanswered))
    await stop()
    if failures:
        raise ToolError(failures[0])
    return 0


def main(argv: Sequence[str]) -> int:
    opts = parse_flags("nsqtw pub", FLAGS, argv)
    if opts.version:
        print(f"to_nsq v{__version__} (nsqtw)")
        return 0
    return run_tool(lambda reactor: pub(reactor, opts, sys.stdin.buffer))
