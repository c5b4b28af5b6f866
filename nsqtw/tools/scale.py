"""``nsqtw-bench scale``: many topics, channels and clients on one nsqd, and what they cost it.

Creates N topics x M channels through the HTTP API, connects K subscribers
to every channel (they answer heartbeats, nothing else), then reports the
daemon's threads, open files, RSS and idle CPU (from ``/proc`` when given
``--daemon-pid``), the time ``/stats?format=json`` takes, and the create and
delete rates; after deleting everything it reports threads, files and RSS
again (what was left behind). Works against any nsqd: Go's or nsqtw.
"""

from __future__ import annotations

import http.client
import json
import os
import resource
import selectors
import socket
import statistics
import struct
import threading
import time
from dataclasses import asdict, dataclass, field
from typing import Any

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


def _cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class _Subscribers:
    """K idle subscribers per channel, answering heartbeats from one thread."""

    def __init__(self, tcp: str) -> None:
        host, port = tcp.rsplit(":", 1)
        self.address = (host, int(port))
        self.socks: list[socket.socket] = []
        self.selector = selectors.DefaultSelector()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)

    def connect(self, topic: str, channel: str) -> None:
        sock = socket.create_connection(self.address, timeout=30)
        sock.sendall(b"  V2" + f"SUB {topic} {channel}\n".encode())
        self.socks.append(sock)

    def confirm(self) -> None:
        """Read every SUB's answer, then serve heartbeats in the background."""
        for sock in self.socks:
            head = sock.recv(8, socket.MSG_WAITALL)
            size, kind = struct.unpack(">ii", head)
            body = sock.recv(size - 4, socket.MSG_WAITALL)
            if kind != 0 or body != b"OK":
                raise RuntimeError(f"SUB answered {kind} {body!r}")
            sock.setblocking(False)
            self.selector.register(sock, selectors.EVENT_READ)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            for key, _ in self.selector.select(0.5):
                sock: socket.socket = key.fileobj  # type: ignore[assignment]
                try:
                    data = sock.recv(65536)
                except BlockingIOError:
                    continue
                except OSError:
                    data = b""
                if not data:
                    self.selector.unregister(sock)
                elif b"_heartbeat_" in data:
                    try:
                        sock.sendall(b"NOP\n")
                    except OSError:
                        pass

    def close(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(5)
        for sock in self.socks:
            sock.close()
        self.socks.clear()


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
    if subs.socks:
        result.connect_per_s = len(subs.socks) / (time.monotonic() - started)
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
        before = _cpu_seconds(daemon_pid)
        time.sleep(idle_seconds)
        result.idle_cpu_percent = round((_cpu_seconds(daemon_pid) - before) / idle_seconds * 100, 2)
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
