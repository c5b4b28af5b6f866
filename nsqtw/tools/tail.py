"""``nsqtw tail``: nsq_tail — print each message of one or more topics to stdout.

Each body is written followed by a newline (``topic | body`` with
``--print-topic``), then FINed. The channel defaults to a new ephemeral
``tailNNNNNN#ephemeral``. With ``-n`` it stops after showing that many
messages from one topic (a message past the count is given back, not shown).
Ctrl-C or SIGTERM stops it cleanly: whatever was printed is FINed.
"""

from __future__ import annotations

import random
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import IO, Any

from twisted.internet.defer import Deferred, DeferredList

from nsqtw import __version__
from nsqtw._go.flags import ACTIVE, FlagSet, make_flag
from nsqtw.client import Consumer, Message
from nsqtw.tools.common import GoLog, client_config, connected_or_exit, parse_flags, require, run_tool

PROGRAM = "nsq_tail"


@dataclass(frozen=True)
class TailOptions:
    channel: str = ""
    consumer_opt: tuple[str, ...] = ()
    lookupd_http_address: tuple[str, ...] = ()
    max_in_flight: int = 200
    n: int = 0
    nsqd_tcp_address: tuple[str, ...] = ()
    print_topic: bool = False
    topic: tuple[str, ...] = ()
    version: bool = False


_B = TailOptions()
FLAGS = FlagSet("nsqtw tail", (
    make_flag("channel", "string", "Channel to read from (default: a new tailNNNNNN#ephemeral).", ACTIVE, base=_B),
    make_flag("consumer-opt", "strings", "A go-nsq Config option for the consumer, as name,value (repeatable; see "
              "docs/client.md).", ACTIVE, base=_B),
    make_flag("lookupd-http-address", "strings", "nsqlookupd HTTP address to discover nsqd nodes through (repeatable).",
              ACTIVE, base=_B),
    make_flag("max-in-flight", "int", "Most messages held at once, over all nsqd connections.", ACTIVE, base=_B),
    make_flag("n", "int", "Stop after this many messages of one topic (0: never).", ACTIVE, base=_B),
    make_flag("nsqd-tcp-address", "strings", "nsqd TCP address to read from (repeatable).", ACTIVE, base=_B),
    make_flag("print-topic", "bool", "Put the topic name and ' | ' before each message.", ACTIVE, base=_B),
    make_flag("topic", "strings", "Topic to print (repeatable).", ACTIVE, base=_B),
    make_flag("version", "bool", "Print the version and exit.", ACTIVE, base=_B),
), lambda hostname: TailOptions(), lambda opts: None)


class Tail:
    """One topic's handler: write, count, and say when the count is reached."""

    def __init__(self, topic: str, opts: TailOptions, out: IO[bytes], done: Deferred[None]) -> None:
        self.prefix = (topic + " | ").encode() if opts.print_topic else b""
        self.total = opts.n
        self.shown = 0
        self.out = out
        self.done = done

    def __call__(self, msg: Message) -> None:
        if self.total and self.shown >= self.total:
            msg.requeue(0, backoff=False)  # one more than asked for: give it back untouched
            return
        try:
            self.out.write(self.prefix + msg.body + b"\n")
            self.out.flush()
        except BrokenPipeError:
            msg.requeue(0, backoff=False)
            if not self.done.called:
                self.done.callback(None)
            return
        self.shown += 1  # returning FINs it
        if self.total and self.shown >= self.total and not self.done.called:
            self.done.callback(None)


async def tail(reactor: Any, opts: TailOptions, out: IO[bytes]) -> int:
    log = GoLog()
    require(bool(opts.nsqd_tcp_address or opts.lookupd_http_address),
            "--nsqd-tcp-address or --lookupd-http-address required")
    require(not (opts.nsqd_tcp_address and opts.lookupd_http_address),
            "use --nsqd-tcp-address or --lookupd-http-address not both")
    require(bool(opts.topic), "--topic required")
    channel = opts.channel or f"tail{random.randrange(999999):06d}#ephemeral"
    max_in_flight = opts.max_in_flight
    if 0 < opts.n < max_in_flight:  # don't ask for more messages than we want
        max_in_flight = opts.n
    config = client_config(opts.consumer_opt, PROGRAM, max_in_flight=max_in_flight)
    done: Deferred[None] = Deferred()
    consumers = []
    for topic in opts.topic:
        log.printf(f"Adding consumer for topic: {topic}")
        c = Consumer(topic, channel, Tail(topic, opts, out, done), config.copy(), reactor=reactor,
                     nsqd_tcp_addresses=opts.nsqd_tcp_address, lookupd_http_addresses=opts.lookupd_http_address)
        consumers.append(c)

    def stop() -> Deferred[Any]:
        return DeferredList([c.stop() for c in consumers], consumeErrors=True)

    reactor.addSystemEventTrigger("before", "shutdown", stop)
    for c in consumers:
        c.start()
    await connected_or_exit([c.first_attempts() for c in consumers])
    await done  # -n reached (else a signal stops the reactor, draining first)
    await stop()
    return 0


def main(argv: Sequence[str]) -> int:
    opts = parse_flags("nsqtw tail", FLAGS, argv)
    if opts.version:
        print(f"nsq_tail v{__version__} (nsqtw)")
        return 0
    return run_tool(lambda reactor: tail(reactor, opts, sys.stdout.buffer))
