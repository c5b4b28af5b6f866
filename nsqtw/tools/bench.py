"""nsqtw-bench: load generator modelled on nsq's bench_writer and bench_reader.

Works against any nsqd (Go or nsqtw). Each worker is its own process running
its own Twisted reactor with an :mod:`nsqtw.client` Producer or Consumer (one
connection), so the generator scales past one core and never shares the
daemon's reactor.

    nsqtw-bench writer --nsqd-tcp-address=127.0.0.1:4150 --size=200 --batch-size=200 --runfor=10s
    nsqtw-bench reader --nsqd-tcp-address=127.0.0.1:4150 --channel=ch --rdy=2500 --runfor=10s
    nsqtw-bench latency --rate=5000 --runfor=10s
    nsqtw-bench writer --pub --workers=8 --runfor=10s   # 8 concurrent one-message publishers (PUB)
    nsqtw-bench fanout --channels=50,500,5000 --mode=pub,mpub   # one topic, many channels (tools/fanout.py)
    nsqtw-bench chaos --duration=60s --seed=1   # a cluster under faults: what it lost (tools/chaos.py)
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import struct
import sys
import time
from typing import Any

from twisted.internet.defer import Deferred

from nsqtw._go.duration import format_duration, parse_duration
from nsqtw.client import Config, Consumer, Message, Producer
from nsqtw.tools.daemons import process_cpu
from nsqtw.tools.workers import (
    CONNECT_WAIT,
    WorkerError,
    at,
    collect,
    in_reactor,
    run_in_worker,
    run_workers,
    when_connected,
)


def _writer_worker(address: str, topic: str, size: int, batch: int, pub: bool, runfor: float,
                   start_at: float, out: Any) -> None:
    """Publish for ``runfor`` seconds, one command at a time, each waiting for its OK.

    MPUBs of ``batch`` messages, or with ``pub`` one PUB per round trip."""
    def work(reactor: Any) -> Deferred[int]:
        producer = Producer([address], Config(), reactor=reactor)
        done: Deferred[int] = Deferred()
        body = b"a" * size
        bodies = [body] * batch
        per = 1 if pub else batch
        count = 0
        end = 0.0

        def send() -> None:
            if time.monotonic() >= end:
                done.callback(count)
                return
            d = producer.publish(topic, body) if pub else producer.multi_publish(topic, bodies)
            d.addCallbacks(answered, done.errback)

        def answered(_: None) -> None:
            nonlocal count
            count += per
            send()

        def begin(_: None) -> None:
            def go() -> None:
                nonlocal end
                end = time.monotonic() + runfor
                send()
            at(reactor, start_at, go)

        when_connected(producer, reactor).addCallbacks(begin, done.errback)
        return done

    run_in_worker(out, work)


def _reader_worker(address: str, topic: str, channel: str, rdy: int, runfor: float,
                   start_at: float, out: Any) -> None:
    """Consume for ``runfor`` seconds with ``max_in_flight`` = ``rdy``, FINing every message.

    The consumer subscribes at RDY 0 and opens up at the start, so connecting is not timed."""
    def work(reactor: Any) -> Deferred[int]:
        count = 0
        counting = False

        def handle(msg: Message) -> None:  # returning FINs it
            nonlocal count
            if counting:
                count += 1

        consumer = Consumer(topic, channel, handle, Config(max_in_flight=0), nsqd_tcp_addresses=[address],
                            reactor=reactor)
        consumer.start()
        done: Deferred[int] = Deferred()

        def finish() -> None:
            nonlocal counting
            counting = False
            done.callback(count)

        def begin(_: None) -> None:
            def go() -> None:
                nonlocal counting
                counting = True
                consumer.change_max_in_flight(rdy)
                reactor.callLater(runfor, finish)
            at(reactor, start_at, go)

        when_connected(consumer, reactor).addCallbacks(begin, done.errback)
        return done

    run_in_worker(out, work)


#: latency bodies start with this and the run's own 8 random bytes, then the send time
_LATENCY_MAGIC = b"nsqtwlat"
_TIME = struct.Struct(">d")


def _latency_publisher(address: str, topic: str, rate: float, size: int, runfor: float,
                       start_at: float, sent_total: Any, tag: bytes, subscribed: Any, out: Any) -> None:
    """PUB at a fixed rate, each waiting for its OK: the run's tag, then the send time
    (CLOCK_MONOTONIC, system-wide). Starts once the subscriber is subscribed."""
    subscribed.wait(CONNECT_WAIT)
    pad = b"a" * max(0, size - len(tag) - _TIME.size)
    interval = 1.0 / rate

    def work(reactor: Any) -> Deferred[int]:
        producer = Producer([address], Config(), reactor=reactor)
        done: Deferred[int] = Deferred()
        start = 0.0
        sent = 0

        def tick() -> None:
            now = time.monotonic()
            if now >= start + runfor:
                done.callback(sent)
            elif sent < int((now - start) / interval) + 1:
                body = tag + _TIME.pack(time.monotonic()) + pad
                producer.publish(topic, body).addCallbacks(answered, done.errback)
            else:
                reactor.callLater(max(0.0, start + sent * interval - now), tick)

        def answered(_: None) -> None:
            nonlocal sent
            sent += 1
            tick()

        def begin(_: None) -> None:
            def go() -> None:
                nonlocal start
                start = time.monotonic()
                tick()
            at(reactor, start_at, go)

        when_connected(producer, reactor).addCallbacks(begin, done.errback)
        return done

    try:
        sent = in_reactor(work)
    except Exception as e:
        out.put(("error", f"latency publisher: {e!r}"))
        return
    sent_total.value = sent
    out.put(("sent", sent))


def _latency_subscriber(address: str, topic: str, channel: str, runfor: float, start_at: float,
                        sent_total: Any, tag: bytes, subscribed: Any, out: Any) -> None:
    """Receive, FIN, and note publish-to-receipt times until all the publisher sent is in.

    Messages without this run's tag (another run's, or a writer's backlog on
    the same topic) are FINed and not counted. Gives up 10 s after the
    publisher's run time (``sent_total`` is -1 until it is done)."""
    latencies: list[float] = []
    tag_end = len(tag)

    def handle(msg: Message) -> None:  # returning FINs it
        body = msg.body
        if body[:tag_end] == tag:
            latencies.append(time.monotonic() - _TIME.unpack_from(body, tag_end)[0])

    def work(reactor: Any) -> Deferred[None]:
        consumer = Consumer(topic, channel, handle, Config(max_in_flight=2500), nsqd_tcp_addresses=[address],
                            reactor=reactor)
        consumer.start()
        done: Deferred[None] = Deferred()
        end = start_at + runfor + 10.0

        def check() -> None:
            if time.time() >= end or 0 <= sent_total.value <= len(latencies):
                done.callback(None)
            else:
                reactor.callLater(0.01, check)

        def joined(_: None) -> None:
            subscribed.set()
            check()

        when_connected(consumer, reactor).addCallbacks(joined, done.errback)
        return done

    try:
        in_reactor(work)
    except Exception as e:
        subscribed.set()
        out.put(("error", f"latency subscriber: {e!r}"))
        return
    out.put(("latencies", latencies))


def _percentile(sorted_values: list[float], q: float) -> float:
    if not sorted_values:
        return float("nan")
    i = min(len(sorted_values) - 1, int(q * len(sorted_values)))
    return sorted_values[i]


def _process_cpu(pid: int | None) -> float:
    """CPU seconds (user + system) the process has used so far; 0 without one."""
    return sum(process_cpu(pid)) if pid else 0.0


def _report(kind: str, count: int, size: int, duration: float, results: list[Any],
            as_json: bool, daemon_cpu: float | None = None) -> str:
    cpu = sum(r[1].ru_utime + r[1].ru_stime for r in results)
    if count == 0:
        line = f"duration: {format_duration(duration)} - 0.000mb/s - 0.000ops/s - 0.000us/op"
    else:
        line = (f"duration: {format_duration(duration)} - "
                f"{count * size / duration / 1024 / 1024:.3f}mb/s - "
                f"{count / duration:.3f}ops/s - {duration * 1e6 / count:.3f}us/op")
    if as_json:
        return json.dumps({"mode": kind, "messages": count, "duration_s": duration,
                           "ops_per_s": count / duration if duration else 0.0,
                           "bench_cpu_s": cpu, "daemon_cpu_s": daemon_cpu, "line": line})
    text = f"{line}\n[{kind}] bench's own CPU: {cpu:.2f}s over {duration:.2f}s ({len(results)} processes)"
    if daemon_cpu is not None:
        per_msg = daemon_cpu * 1e6 / count if count else 0.0
        text += f"\n[{kind}] daemon CPU: {daemon_cpu:.2f}s - {per_msg:.3f}us/msg"
    return text


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="nsqtw-bench", description=__doc__.split("\n\n")[0])
    parser.add_argument("mode", choices=["writer", "reader", "latency", "scale", "fanout", "compare", "chaos"],
                        help="compare: Go nsqd and nsqtw side by side (nsqtw-bench compare --help); "
                             "chaos: a cluster under faults (nsqtw-bench chaos --help)")
    parser.add_argument("--nsqd-tcp-address", default="127.0.0.1:4150")
    parser.add_argument("--topic", default="sub_bench")
    parser.add_argument("--channel", default="ch")
    parser.add_argument("--size", type=int, default=200, help="message size in bytes")
    parser.add_argument("--batch-size", type=int, default=200,
                        help="messages per MPUB (writer); 1 is an MPUB of one, as bench_writer sends")
    parser.add_argument("--pub", action="store_true", help="writer: one PUB per round trip instead of MPUB")
    parser.add_argument("--rdy", type=int, default=2500, help="RDY count (reader)")
    parser.add_argument("--runfor", default="10s", help="Go duration, e.g. 10s")
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1,
                        help="processes, one connection each (default: one per core)")
    parser.add_argument("--rate", type=float, default=1000.0, help="messages/s (latency)")
    parser.add_argument("--daemon-pid", type=int, default=0,
                        help="also report the CPU this process (the nsqd under test) used per message")
    parser.add_argument("--json", action="store_true", help="one JSON object instead of the text line")
    parser.add_argument("--nsqd-http-address", default="127.0.0.1:4151", help="scale: nsqd's HTTP API")
    parser.add_argument("--topics", type=int, default=1000, help="scale: topics to create")
    parser.add_argument("--channels", default="2",
                        help="scale: channels per topic; fanout: channel counts, comma-separated (e.g. 50,500,5000)")
    parser.add_argument("--mode", default="pub,mpub", dest="fanout_modes",
                        help="fanout: pub (one message per PUB), mpub (--batch-size per MPUB), or both")
    parser.add_argument("--copies", type=int, default=1_000_000,
                        help="fanout: about this many copies (messages × channels), at most 10000 messages")
    parser.add_argument("--messages", type=int, default=0, help="fanout: messages to publish (0: from --copies)")
    parser.add_argument("--clients", type=int, default=2, help="scale: subscribers per channel")
    parser.add_argument("--idle", type=float, default=10.0, help="scale: seconds of idle CPU measured")
    # Go's flag syntax: -flag=value
    argv = list(sys.argv[1:] if argv is None else argv)
    argv = ["-" + a if a.startswith("-") and not a.startswith("--") and len(a) > 2 else a for a in argv]
    if argv[:1] == ["compare"]:
        from nsqtw.tools.compare import main as compare_main

        return compare_main(argv[1:])
    if argv[:1] == ["chaos"]:
        from nsqtw.tools.chaos import main as chaos_main

        return chaos_main(argv[1:])
    ns = parser.parse_args(argv)
    if ns.mode == "scale":
        from nsqtw.tools.scale import run_scale

        scale = run_scale(ns.nsqd_tcp_address, ns.nsqd_http_address, ns.topics, int(ns.channels), ns.clients,
                          ns.daemon_pid, ns.idle)
        print(scale.json() if ns.json else scale.text())
        return 0
    if ns.mode == "fanout":
        from nsqtw.tools.fanout import messages_for, run_fanout

        for channels in (int(c) for c in ns.channels.split(",")):
            for mode in ns.fanout_modes.split(","):
                messages = ns.messages or messages_for(channels, ns.copies)
                fan = run_fanout(ns.nsqd_tcp_address, ns.nsqd_http_address, channels, mode, messages,
                                 ns.batch_size, ns.size)
                print(fan.json() if ns.json else fan.text(), flush=True)
        return 0
    try:
        _run(ns)
    except WorkerError as e:
        print(f"nsqtw-bench: {e}", file=sys.stderr)
        return 1
    return 0


def _run(ns: argparse.Namespace) -> None:
    """writer, reader or latency: run the workers, print the result."""
    runfor = parse_duration(ns.runfor)
    start_at = time.time() + 0.2
    cpu_before = _process_cpu(ns.daemon_pid)
    if ns.mode in ("writer", "reader"):
        if ns.mode == "writer":
            results = run_workers(_writer_worker, (ns.nsqd_tcp_address, ns.topic, ns.size, ns.batch_size,
                                                    ns.pub, runfor, start_at), ns.workers)
        else:
            results = run_workers(_reader_worker, (ns.nsqd_tcp_address, ns.topic, ns.channel, ns.rdy,
                                                    runfor, start_at), ns.workers)
        daemon_cpu = _process_cpu(ns.daemon_pid) - cpu_before if ns.daemon_pid else None
        print(_report(ns.mode, sum(r[0] for r in results), ns.size, runfor, results, ns.json, daemon_cpu))
    else:
        ctx = mp.get_context("fork")
        out = ctx.Queue()
        sent_total = ctx.Value("q", -1)
        subscribed = ctx.Event()
        tag = _LATENCY_MAGIC + os.urandom(8)
        procs = [ctx.Process(target=_latency_subscriber, args=(ns.nsqd_tcp_address, ns.topic, ns.channel,
                                                               runfor, start_at, sent_total, tag, subscribed, out)),
                 ctx.Process(target=_latency_publisher, args=(ns.nsqd_tcp_address, ns.topic, ns.rate, ns.size,
                                                              runfor, start_at, sent_total, tag, subscribed, out))]
        for p in procs:
            p.start()
        got = dict(collect(procs, out))
        if "error" in got:
            raise WorkerError(got["error"])
        sent, lat = got["sent"], got["latencies"]
        lat.sort()
        p50, p99, p999 = (_percentile(lat, q) * 1e3 for q in (0.5, 0.99, 0.999))
        if ns.json:
            print(json.dumps({"mode": "latency", "sent": sent, "received": len(lat), "rate": ns.rate,
                              "p50_ms": p50, "p99_ms": p99, "p999_ms": p999}))
        else:
            print(f"latency: rate {ns.rate:.0f}/s - sent {sent} - received {len(lat)} - "
                  f"p50 {p50:.3f}ms - p99 {p99:.3f}ms - p999 {p999:.3f}ms")


if __name__ == "__main__":
    raise SystemExit(main())
