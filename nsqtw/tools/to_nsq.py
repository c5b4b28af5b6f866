"""``nsqtw to-nsq``: nsq_to_nsq — copy messages of topics/channel to other nsqd nodes.

Each message is published (PUB) to one ``--destination-nsqd-tcp-address``
chosen by ``--mode`` (``round-robin``, or ``hostpool``/``epsilon-greedy``:
in turn, skipping a destination that failed recently) on
``--destination-topic`` (default: the topic it came from), and FINed only
once that nsqd answered OK; a failed publish REQueues it with backoff.

For JSON messages, as nsq_to_nsq: ``--require-json-field`` passes only
objects with that field (and ``--require-json-value``: with that string,
or number, value; a missing field then backs off), and
``--whitelist-json-field`` keeps only those fields (re-encoded with sorted
keys, numbers as Go's float64). A body that is not JSON is logged and
dropped (FINed). Ctrl-C/SIGTERM: stop taking messages, wait for the
publishes under way, FIN or REQ each, exit.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from twisted.internet.defer import Deferred, DeferredList

from nsqtw import __version__
from nsqtw._go.flags import ACTIVE, FlagSet, make_flag
from nsqtw._go.json import go_json
from nsqtw._go.strconv import NumError, parse_float
from nsqtw.client import Consumer, Message, Producer
from nsqtw.names import is_valid_name
from nsqtw.tools.common import GoLog, client_config, connected_or_exit, parse_flags, require, run_tool
from nsqtw.tools.forward import Destinations, TimerMetrics

PROGRAM = "nsq_to_nsq"


@dataclass(frozen=True)
class ToNSQOptions:
    channel: str = "nsq_to_nsq"
    consumer_opt: tuple[str, ...] = ()
    destination_nsqd_tcp_address: tuple[str, ...] = ()
    destination_topic: str = ""
    lookupd_http_address: tuple[str, ...] = ()
    max_in_flight: int = 200
    mode: str = "hostpool"
    nsqd_tcp_address: tuple[str, ...] = ()
    producer_opt: tuple[str, ...] = ()
    require_json_field: str = ""
    require_json_value: str = ""
    status_every: int = 250
    topic: tuple[str, ...] = ()
    version: bool = False
    whitelist_json_field: tuple[str, ...] = ()


_B = ToNSQOptions()
FLAGS = FlagSet("nsqtw to-nsq", (
    make_flag("channel", "string", "Channel to read from.", ACTIVE, base=_B),
    make_flag("consumer-opt", "strings", "A go-nsq Config option for the consumer, as name,value (repeatable; see "
              "docs/client.md).", ACTIVE, base=_B),
    make_flag("destination-nsqd-tcp-address", "strings", "nsqd TCP address to publish to (repeatable).",
              ACTIVE, base=_B),
    make_flag("destination-topic", "string", "Topic to publish to (default: the topic each message came from).",
              ACTIVE, base=_B),
    make_flag("lookupd-http-address", "strings", "nsqlookupd HTTP address to discover nsqd nodes through (repeatable).",
              ACTIVE, base=_B),
    make_flag("max-in-flight", "int", "Most messages held at once, over all nsqd connections.", ACTIVE, base=_B),
    make_flag("mode", "string", "How to pick a destination: round-robin, hostpool or epsilon-greedy.", ACTIVE, base=_B),
    make_flag("nsqd-tcp-address", "strings", "nsqd TCP address to read from (repeatable).", ACTIVE, base=_B),
    make_flag("producer-opt", "strings", "A go-nsq Config option for the producer, as name,value (repeatable; see "
              "docs/client.md).", ACTIVE, base=_B),
    make_flag("require-json-field", "string", "Pass only JSON objects that have this field.", ACTIVE, base=_B),
    make_flag("require-json-value", "string", "With --require-json-field: pass only messages where the field has this "
              "value.", ACTIVE, base=_B),
    make_flag("status-every", "int", "Log a timing line every this many publishes (0: never).", ACTIVE, base=_B),
    make_flag("topic", "strings", "Topic to read (repeatable).", ACTIVE, base=_B),
    make_flag("version", "bool", "Print the version and exit.", ACTIVE, base=_B),
    make_flag("whitelist-json-field", "strings", "Keep only these fields of a JSON object (repeatable).",
              ACTIVE, base=_B),
), lambda hostname: ToNSQOptions(), lambda opts: None)


class Backoff(Exception):
    """Fail the message so it is REQueued with backoff (nsq_to_nsq's ``errors.New("backoff")``)."""


def go_marshal(value: Any) -> str:
    """Go's json.Marshal of what simplejson decoded: map keys sorted, every number a float64."""
    if isinstance(value, dict):
        return "{" + ",".join(go_json(k).decode() + ":" + go_marshal(value[k]) for k in sorted(value)) + "}"
    if isinstance(value, list):
        return "[" + ",".join(go_marshal(v) for v in value) + "]"
    return go_json(value).decode()


class JSONFilter:
    """nsq_to_nsq's --require-json-field/--require-json-value/--whitelist-json-field."""

    def __init__(self, opts: ToNSQOptions, log: GoLog) -> None:
        self.field = opts.require_json_field
        self.value = opts.require_json_value
        self.whitelist = opts.whitelist_json_field
        self.log = log
        self.number: float | None = None
        if self.value:
            try:
                self.number = parse_float(self.value)
            except NumError:
                self.number = None

    @property
    def active(self) -> bool:
        return bool(self.field or self.whitelist)

    def apply(self, body: bytes) -> bytes | None:
        """The body to forward, None to drop it (FIN), or raise to REQ it with backoff."""
        try:
            data = json.loads(body, parse_int=float)
        except ValueError:
            self.log.printf(f"ERROR: Unable to decode json: {body.decode('utf-8', 'replace')}")
            return None
        if self.field:
            if not isinstance(data, dict) or self.field not in data:
                if self.value:
                    self.log.printf("ERROR: missing field to check required value")
                    raise Backoff("backoff")
                return None
            if self.value:
                got = data[self.field]
                if isinstance(got, str):
                    if got != self.value:
                        return None
                elif self.number is None or isinstance(got, bool) or not isinstance(got, float) \
                        or got != self.number:
                    return None
        if not self.whitelist:
            return body
        if not isinstance(data, dict):
            self.log.printf("ERROR: filterMessage() failed: json is not an object")
            raise Backoff("json is not an object")
        return go_marshal({k: data[k] for k in self.whitelist if k in data}).encode()


class Copier:
    """The handler for one source topic: filter, publish to a destination, FIN on its OK."""

    def __init__(self, reactor: Any, topic: str, producers: dict[str, Producer], destinations: Destinations,
                 jsonf: JSONFilter, per_address: dict[str, TimerMetrics], aggregate: TimerMetrics) -> None:
        self.reactor = reactor
        self.topic = topic
        self.producers = producers
        self.destinations = destinations
        self.jsonf = jsonf
        self.per_address = per_address
        self.aggregate = aggregate

    def __call__(self, msg: Message) -> Deferred[None] | None:
        body = msg.body
        if self.jsonf.active:
            filtered = self.jsonf.apply(msg.body)
            if filtered is None:
                return None
            body = filtered
        started = self.reactor.seconds()
        address = self.destinations.pick()
        d = self.producers[address].publish(self.topic, body)

        def ok(_: Any) -> None:
            self.destinations.mark(address, True)
            now = self.reactor.seconds()
            self.per_address[address].status(started, now)
            self.aggregate.status(started, now)

        def failed(f: Any) -> Any:
            self.destinations.mark(address, False)
            return f

        return d.addCallbacks(ok, failed)


async def to_nsq(reactor: Any, opts: ToNSQOptions) -> int:
    log = GoLog()
    require(bool(opts.topic and opts.channel), "--topic and --channel are required")
    for topic in opts.topic:
        require(is_valid_name(topic), "--topic is invalid")
    require(not opts.destination_topic or is_valid_name(opts.destination_topic), "--destination-topic is invalid")
    require(is_valid_name(opts.channel), "--channel is invalid")
    require(bool(opts.nsqd_tcp_address or opts.lookupd_http_address),
            "--nsqd-tcp-address or --lookupd-http-address required")
    require(not (opts.nsqd_tcp_address and opts.lookupd_http_address),
            "use --nsqd-tcp-address or --lookupd-http-address not both")
    require(bool(opts.destination_nsqd_tcp_address), "--destination-nsqd-tcp-address required")
    consumer_config = client_config(opts.consumer_opt, PROGRAM, max_in_flight=opts.max_in_flight)
    producer_config = client_config(opts.producer_opt, PROGRAM)
    addresses = list(dict.fromkeys(opts.destination_nsqd_tcp_address))
    producers = {a: Producer(a, producer_config.copy(), reactor=reactor) for a in addresses}
    one = len(addresses) == 1
    per_address = {a: TimerMetrics(0 if one else opts.status_every, f"[{a}]:", log) for a in addresses}
    aggregate = TimerMetrics(opts.status_every, "[aggregate]:", log)
    destinations = Destinations(addresses, opts.mode, reactor)
    jsonf = JSONFilter(opts, log)
    consumers = [Consumer(topic, opts.channel,
                          Copier(reactor, opts.destination_topic or topic, producers, destinations, jsonf,
                                 per_address, aggregate),
                          consumer_config.copy(), reactor=reactor, nsqd_tcp_addresses=opts.nsqd_tcp_address,
                          lookupd_http_addresses=opts.lookupd_http_address)
                 for topic in opts.topic]
    done: Deferred[None] = Deferred()

    async def drain() -> None:
        await DeferredList([c.stop() for c in consumers], consumeErrors=True)  # publishes answered: FIN/REQ
        await DeferredList([p.stop() for p in producers.values()], consumeErrors=True)
        if not done.called:
            done.callback(None)

    stopping: list[Deferred[None]] = []

    def stop() -> Deferred[None]:
        if not stopping:
            stopping.append(Deferred.fromCoroutine(drain()))
        return stopping[0]

    reactor.addSystemEventTrigger("before", "shutdown", stop)
    for p in producers.values():
        p.start()
    for c in consumers:
        c.start()
    await connected_or_exit([c.first_attempts() for c in consumers])
    await done
    return 0


def main(argv: Sequence[str]) -> int:
    opts = parse_flags("nsqtw to-nsq", FLAGS, argv)
    if opts.version:
        print(f"nsq_to_nsq v{__version__} (nsqtw)")
        return 0
    return run_tool(lambda reactor: to_nsq(reactor, opts))
