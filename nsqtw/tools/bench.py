"""nsqtw-bench: load generator modelled on nsq's bench_writer and bench_reader.

Works against any nsqd (Go or nsqtw). Each worker is its own process with
one connection and a plain blocking socket, so the generator scales past one
core and never shares the daemon's reactor.

    nsqtw-bench writer --nsqd-tcp-address=127.0.0.1:4150 --size=200 --batch-size=200 --runfor=10s
    nsqtw-bench reader --nsqd-tcp-address=127.0.0.1:4150 --channel=ch --rdy=2500 --runfor=10s
    nsqtw-bench latency --rate=5000 --runfor=10s
    nsqtw-bench writer --pub --workers=8 --runfor=10s   # 8 concurrent one-message publishers (PUB)
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import resource
import socket
import struct
import sys
import time
from typing import Any

from nsqtw._go.duration import format_duration, parse_duration
from nsqtw.protocol.wire import encode_mpub, split_frames

_INT = struct.Struct(">i")


def _connect(address: str) -> socket.socket:
    host, _, port = address.rpartition(":")
    s = socket.create_connection((host.strip("[]") or "127.0.0.1", int(port)))
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    s.sendall(b"  V2")
    return s


class FrameReader:
    """Reads V2 frames from a blocking socket with one buffer."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buf = bytearray()

    def frames(self) -> list[tuple[int, bytes]]:
        """At least one complete frame (blocks until one is there)."""
        out: list[tuple[int, bytes]] = []
        while not out:
            chunk = self.sock.recv(1 << 20)
            if not chunk:
                raise ConnectionError("connection closed")
            self.buf += chunk
            out = split_frames(self.buf)
        return out


def _answer(sock: socket.socket, frames: list[tuple[int, bytes]]) -> list[bytes]:
    """FIN every message and NOP every heartbeat in one send; returns the message payloads."""
    msgs = [data for ftype, data in frames if ftype == 2]
    replies = [b"FIN " + data[10:26] + b"\n" for data in msgs]
    replies.extend(b"NOP\n" for ftype, data in frames if data == b"_heartbeat_")
    if replies:
        sock.sendall(b"".join(replies))
    return msgs


def _expect_ok(reader: FrameReader, pending: list[tuple[int, bytes]]) -> None:
    while True:
        if not pending:
            pending.extend(reader.frames())
        ftype, data = pending.pop(0)
        if data == b"_heartbeat_":
            reader.sock.sendall(b"NOP\n")
            continue
        if ftype != 0 or data != b"OK":
            raise RuntimeError(f"unexpected response: {data!r}")
        return


def _writer_worker(address: str, topic: str, size: int, batch: int, pub: bool, runfor: float,
                   start_at: float, out: Any) -> None:
    sock = _connect(address)
    reader = FrameReader(sock)
    pending: list[tuple[int, bytes]] = []
    body = b"a" * size
    if pub:  # one message per command, as a one-at-a-time publisher sends it
        batch = 1
        cmd = b"PUB " + topic.encode() + b"\n" + _INT.pack(size) + body
    else:
        cmd = encode_mpub(topic.encode(), [body] * batch)
    while time.time() < start_at:
        time.sleep(0.001)
    count = 0
    end = time.monotonic() + runfor
    while time.monotonic() < end:
        sock.sendall(cmd)
        _expect_ok(reader, pending)
        count += batch
    sock.close()
    out.put((count, resource.getrusage(resource.RUSAGE_SELF)))


def _reader_worker(address: str, topic: str, channel: str, rdy: int, runfor: float,
                   start_at: float, out: Any) -> None:
    sock = _connect(address)
    reader = FrameReader(sock)
    sock.sendall(f"SUB {topic} {channel}\nRDY {rdy}\n".encode())
    while time.time() < start_at:
        time.sleep(0.001)
    count = 0
    end = time.monotonic() + runfor
    sock.settimeout(0.5)
    while time.monotonic() < end:
        try:
            frames = reader.frames()
        except TimeoutError:
            continue
        count += len(_answer(sock, frames))
    sock.close()
    out.put((count, resource.getrusage(resource.RUSAGE_SELF)))


#: latency bodies start with this and the run's own 8 random bytes, then the send time
_LATENCY_MAGIC = b"nsqtwlat"
_TIME = struct.Struct(">d")


def _latency_publisher(address: str, topic: str, rate: float, size: int, runfor: float,
                       start_at: float, sent_total: Any, tag: bytes, out: Any) -> None:
    """PUB at a fixed rate: the run's tag, then the send time (CLOCK_MONOTONIC, system-wide)."""
    pub = _connect(address)
    reader = FrameReader(pub)
    pending: list[tuple[int, bytes]] = []
    pad = b"a" * max(0, size - len(tag) - _TIME.size)
    prefix = b"PUB " + topic.encode() + b"\n"
    while time.time() < start_at:
        time.sleep(0.001)
    interval = 1.0 / rate
    start = time.monotonic()
    sent = 0
    while (now := time.monotonic()) < start + runfor:
        due = int((now - start) / interval) + 1
        while sent < due:
            body = tag + _TIME.pack(time.monotonic()) + pad
            pub.sendall(prefix + _INT.pack(len(body)) + body)
            _expect_ok(reader, pending)
            sent += 1
        time.sleep(max(0.0, start + sent * interval - time.monotonic()))
    pub.close()
    sent_total.value = sent
    out.put(("sent", sent))


def _latency_subscriber(address: str, topic: str, channel: str, runfor: float, start_at: float,
                        sent_total: Any, tag: bytes, out: Any) -> None:
    """Receive, FIN, and note publish-to-receipt times until all the publisher sent is in.

    Messages without this run's tag (another run's, or a writer's backlog on
    the same topic) are FINed and not counted. Gives up 10 s after the
    publisher's run time (``sent_total`` is -1 until it is done)."""
    sub = _connect(address)
    reader = FrameReader(sub)
    sub.sendall(f"SUB {topic} {channel}\nRDY 2500\n".encode())
    if reader.frames()[0][1] != b"OK":
        raise RuntimeError("SUB failed")
    latencies: list[float] = []
    end = start_at + runfor + 10.0
    sub.settimeout(0.1)
    while time.time() < end and not (0 <= sent_total.value <= len(latencies)):
        try:
            frames = reader.frames()
        except TimeoutError:
            continue
        t = time.monotonic()
        body_at = 26  # a MESSAGE frame's data: timestamp, attempts, ID, then the body
        latencies.extend(t - _TIME.unpack_from(data, body_at + len(tag))[0] for data in _answer(sub, frames)
                         if data[body_at:body_at + len(tag)] == tag)
    sub.close()
    out.put(("latencies", latencies))


def _percentile(sorted_values: list[float], q: float) -> float:
    if not sorted_values:
        return float("nan")
    i = min(len(sorted_values) - 1, int(q * len(sorted_values)))
    return sorted_values[i]


def _run_workers(target: Any, args: tuple[Any, ...], workers: int) -> list[Any]:
    ctx = mp.get_context("fork")
    out = ctx.Queue()
    procs = [ctx.Process(target=target, args=args + (out,)) for _ in range(workers)]
    for p in procs:
        p.start()
    results = [out.get() for _ in procs]
    for p in procs:
        p.join()
    return results


def _process_cpu(pid: int | None) -> float:
    """CPU seconds (user + system) the process has used so far, from /proc (Linux)."""
    if not pid:
        return 0.0
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


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
    parser.add_argument("mode", choices=["writer", "reader", "latency", "scale", "compare"],
                        help="compare: Go nsqd and nsqtw side by side (nsqtw-bench compare --help)")
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
    parser.add_argument("--channels", type=int, default=2, help="scale: channels per topic")
    parser.add_argument("--clients", type=int, default=2, help="scale: subscribers per channel")
    parser.add_argument("--idle", type=float, default=10.0, help="scale: seconds of idle CPU measured")
    # Go's flag syntax: -flag=value
    argv = list(sys.argv[1:] if argv is None else argv)
    argv = ["-" + a if a.startswith("-") and not a.startswith("--") and len(a) > 2 else a for a in argv]
    if argv[:1] == ["compare"]:
        from nsqtw.tools.compare import main as compare_main

        return compare_main(argv[1:])
    ns = parser.parse_args(argv)
    if ns.mode == "scale":
        from nsqtw.tools.scale import run_scale

        scale = run_scale(ns.nsqd_tcp_address, ns.nsqd_http_address, ns.topics, ns.channels, ns.clients,
                          ns.daemon_pid, ns.idle)
        print(scale.json() if ns.json else scale.text())
        return 0
    runfor = parse_duration(ns.runfor)
    start_at = time.time() + 0.2
    cpu_before = _process_cpu(ns.daemon_pid)
    if ns.mode in ("writer", "reader"):
        if ns.mode == "writer":
            results = _run_workers(_writer_worker, (ns.nsqd_tcp_address, ns.topic, ns.size, ns.batch_size,
                                                    ns.pub, runfor, start_at), ns.workers)
        else:
            results = _run_workers(_reader_worker, (ns.nsqd_tcp_address, ns.topic, ns.channel, ns.rdy,
                                                    runfor, start_at), ns.workers)
        daemon_cpu = _process_cpu(ns.daemon_pid) - cpu_before if ns.daemon_pid else None
        print(_report(ns.mode, sum(r[0] for r in results), ns.size, runfor, results, ns.json, daemon_cpu))
    else:
        ctx = mp.get_context("fork")
        out = ctx.Queue()
        sent_total = ctx.Value("q", -1)
        tag = _LATENCY_MAGIC + os.urandom(8)
        procs = [ctx.Process(target=_latency_subscriber, args=(ns.nsqd_tcp_address, ns.topic, ns.channel,
                                                               runfor, start_at, sent_total, tag, out)),
                 ctx.Process(target=_latency_publisher, args=(ns.nsqd_tcp_address, ns.topic, ns.rate,
                                                              ns.size, runfor, start_at, sent_total, tag, out))]
        for p in procs:
            p.start()
        got = dict(out.get() for _ in procs)
        for p in procs:
            p.join()
        sent, lat = got["sent"], got["latencies"]
        lat.sort()
        p50, p99, p999 = (_percentile(lat, q) * 1e3 for q in (0.5, 0.99, 0.999))
        if ns.json:
            print(json.dumps({"mode": "latency", "sent": sent, "received": len(lat), "rate": ns.rate,
                              "p50_ms": p50, "p99_ms": p99, "p999_ms": p999}))
        else:
            print(f"latency: rate {ns.rate:.0f}/s - sent {sent} - received {len(lat)} - "
                  f"p50 {p50:.3f}ms - p99 {p99:.3f}ms - p999 {p999:.3f}ms")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
