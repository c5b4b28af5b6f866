"""``nsqtw-bench scale``: many topics, channels and clients on one nsqd, and what they cost it.

Creates N topics x M channels through the HTTP API, connects K subscribers
to every channel (``nsqtw.client`` Consumers that ask for no message and
answer heartbeats), then reports the daemon's threads, open files, RSS and
idle CPU (from ``/proc`` when given ``--daemon-pid``), the time
``/stats?format=json`` takes, and the create and delete rates; after
deleting everything it reports threads, files and RSS again (what was left
behind). Works against any nsqd: Go's or nsqtw.
"""

from __future__ import annotations

import http.client
import json
import os
import resource
import statistics
import threading
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from twisted.internet.defer import Deferred, DeferredSemaphore, gatherResults
from twisted.internet.threads import blockingCallFromThread

from nsqtw.client import Config, Consumer, Message
from nsqtw.tools.daemons import process_cpu
from nsqtw.tools.workers import new_reactor

__all__ = ["ScaleResult", "run_scale"]


@dataclass
class ScaleResult:
    """What one scale run measured (``None`` where no ``--daemon-pid`` was given)."""

    topics: int
    channels_per_topic: int
    clients_per_channel: int
    create_per_s: float = 0.0
    connect_per_s: float = 0.0
    threads: int | None = None
    open_files: int | None = None
    rss_mb: float | None = None
    idle_cpu_percent: float | None = None
    stats_ms: list[float] = field(default_factory=list)
    stats_bytes: int = 0
    delete_per_s: float = 0.0
    #: the daemon's own count of live heap objects (``/stats`` memory): before creating, with
    #: everything in place, after deleting everything
    heap_objects: list[int] = field(default_factory=list)
    after_delete: dict[str, Any] = field(default_factory=dict)

    def text(self) -> str:
        med = statistics.median(self.stats_ms) if self.stats_ms else float("nan")
        lines = [
            f"scale: {self.topics} topics x {self.channels_per_topic} channels x "
            f"{self.clients_per_channel} clients",
            f"  create {self.create_per_s:,.0f}/s, connect {self.connect_per_s:,.0f}/s, "
            f"delete {self.delete_per_s:,.0f}/s",
            f"  threads {self.threads}, open files {self.open_files}, RSS {self.rss_mb} MB, "
            f"idle CPU {self.idle_cpu_percent}%",
            f"  /stats?format=json: median {med:.0f} ms, max {max(self.stats_ms, default=0):.0f} ms "
            f"({self.stats_bytes:,} bytes)",
            f"  heap objects before / loaded / after deleting: {self.heap_objects}",
            f"  after deleting everything: {self.after_delete}",
        ]
        return "\n".join(lines)

    def json(self) -> str:
        return json.dumps(asdict(self))


def _proc(pid: int) -> dict[str, Any]:
    if not pid:
        return {}
    with open(f"/proc/{pid}/status") as f:
        status = dict(line.split(":", 1) for line in f if ":" in line)
    return {"threads": len(os.listdir(f"/proc/{pid}/task")), "open_files": len(os.listdir(f"/proc/{pid}/fd")),
            "rss_mb": round(int(status["VmRSS"].split()[0]) / 1024, 1)}


class _Subscribers:
    """K idle subscribers per channel: :mod:`nsqtw.client` Consumers at ``max_in_flight`` 0 (they
    ask for no message; their connections answer heartbeats) in a reactor of their own, on a thread."""

    #: connections being set up at once (more would overflow the daemon's listen backlog)
    CONCURRENCY = 64

    def __init__(self, tcp: str) -> None:
        self.address = tcp
        self.wanted: list[tuple[str, str]] = []
        self.consumers: list[Consumer] = []
        self.reactor = new_reactor()
        self._thread = threading.Thread(target=self.reactor.run, kwargs={"installSignalHandlers": False},
                                        daemon=True)

    @property
    def count(self) -> int:
        """Subscribers connected."""
        return len(self.consumers)

    def connect(self, topic: str, channel: str) -> None:
        self.wanted.append((topic, channel))

    def confirm(self) -> None:
        """Connect and subscribe every one asked for; returns once all are subscribed."""
        self._thread.start()
        blockingCallFromThread(self.reactor, self._subscribe_all)

    def _subscribe_all(self) -> Deferred[Any]:
        limit = DeferredSemaphore(self.CONCURRENCY)

        def one(topic: str, channel: str) -> Deferred[None]:
            consumer = Consumer(topic, channel, _no_handler, Config(max_in_flight=0),
                                nsqd_tcp_addresses=[self.address], reactor=self.reactor)
            self.consumers.append(consumer)
            consumer.start()
            d = consumer.when_connected()
            d.addTimeout(60, self.reactor)
            return d

        return gatherResults([limit.run(one, topic, channel) for topic, channel in self.wanted],
                             consumeErrors=True)

    def _stop_all(self) -> Deferred[Any]:
        return gatherResults([c.stop() for c in self.consumers], consumeErrors=True)

    def close(self) -> None:
        """Stop every subscriber cleanly (CLS, then close), then the reactor."""
        if not self._thread.is_alive():
            return
        blockingCallFromThread(self.reactor, self._stop_all)
        self.reactor.callFromThread(self.reactor.stop)
        self._thread.join(30)
        self.consumers.clear()


def _no_handler(message: Message) -> None:
    raise RuntimeError("a scale subscriber asks for no message")


def _heap_objects(conn: http.client.HTTPConnection) -> int:
    conn.request("GET", "/stats?format=json&include_clients=false")
    response = conn.getresponse()
    return int(json.loads(response.read())["memory"]["heap_objects"])


def _post(conn: http.client.HTTPConnection, path: str) -> None:
    conn.request("POST", path, body=b"")
    response = conn.getresponse()
    body = response.read()
    if response.status != 200:
        raise RuntimeError(f"POST {path}: {response.status} {body[:200]!r}")


def run_scale(tcp: str, http_address: str, topics: int, channels: int, clients: int,
              daemon_pid: int = 0, idle_seconds: float = 10.0, stats_samples: int = 5) -> ScaleResult:
    """Create, connect, measure, delete, measure again; see the module's text."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    needed = topics * channels * clients + 256
    if soft < needed:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(max(needed, soft), hard), hard))
    result = ScaleResult(topics, channels, clients)
    host, port = http_address.rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=120)
    result.heap_objects.append(_heap_objects(conn))
    started = time.monotonic()
    for t in range(topics):
        _post(conn, f"/topic/create?topic=scale{t}")
        for c in range(channels):
            _post(conn, f"/channel/create?topic=scale{t}&channel=c{c}")
    result.create_per_s = topics * (channels + 1) / (time.monotonic() - started)
    subs = _Subscribers(tcp)
    started = time.monotonic()
    for t in range(topics):
        for c in range(channels):
            for _ in range(clients):
                subs.connect(f"scale{t}", f"c{c}")
    subs.confirm()
    if subs.count:
        result.connect_per_s = subs.count / (time.monotonic() - started)
    time.sleep(2)
    for _ in range(stats_samples):
        started = time.monotonic()
        conn.request("GET", "/stats?format=json")
        response = conn.getresponse()
        result.stats_bytes = len(response.read())
        result.stats_ms.append(round((time.monotonic() - started) * 1000, 1))
    result.heap_objects.append(_heap_objects(conn))
    if daemon_pid:
        proc = _proc(daemon_pid)
        result.threads, result.open_files, result.rss_mb = proc["threads"], proc["open_files"], proc["rss_mb"]
        before = sum(process_cpu(daemon_pid))
        time.sleep(idle_seconds)
        result.idle_cpu_percent = round((sum(process_cpu(daemon_pid)) - before) / idle_seconds * 100, 2)
    subs.close()
    time.sleep(1)
    started = time.monotonic()
    for t in range(topics):
        for c in range(channels):
            _post(conn, f"/channel/delete?topic=scale{t}&channel=c{c}")
        _post(conn, f"/topic/delete?topic=scale{t}")
    result.delete_per_s = topics * (channels + 1) / (time.monotonic() - started)
    time.sleep(2)
    result.heap_objects.append(_heap_objects(conn))
    conn.close()
    result.after_delete = _proc(daemon_pid)
    return result
