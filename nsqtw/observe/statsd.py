"""Pushing stats to statsd every ``--statsd-interval``, with nsqd's metric names and types.

Each push takes one stats snapshot (the one ``/stats`` shows) and sends,
prefixed by ``--statsd-prefix`` (``%s`` becomes this node's
``broadcast-address_http-port`` with dots and colons as underscores):

- counters (``|c``, the change since the last push): ``topic.T.message_count``,
  ``topic.T.message_bytes``, ``topic.T.channel.C.message_count``,
  ``...requeue_count``, ``...timeout_count``, ``mem.gc_runs``;
- gauges (``|g``): ``topic.T.depth``, ``topic.T.backend_depth``,
  ``topic.T.channel.C.depth``, ``...backend_depth``, ``...in_flight_count``,
  ``...deferred_count``, ``...clients``, ``...e2e_processing_latency_NN``
  (and the topic's), and the ``mem.*`` figures with ``--statsd-mem-stats``.

Lines are packed into UDP packets of at most ``--statsd-udp-packet-size``
bytes, and the packets are spread over the interval minus one second, as
nsqd's spread writer does (all at once for a 1s interval, where Go nsqd
v1.3 crashes).
"""

from __future__ import annotations

import ipaddress
from typing import Any

from twisted.application.service import Service
from twisted.internet.defer import Deferred, ensureDeferred
from twisted.internet.interfaces import IDelayedCall
from twisted.internet.protocol import DatagramProtocol
from twisted.internet.task import LoopingCall

from nsqtw.log import Logger
from nsqtw.observe.stats import memory_stats, snapshot

__all__ = ["StatsdService", "format_prefix", "metrics", "packets"]

_EPHEMERAL = "#ephemeral"


def format_prefix(prefix: str, broadcast_address: str, http_port: int) -> str:
    """nsqd's prefix: ``%s`` becomes the host key, and a dot ends it."""
    if not prefix:
        return ""
    host = f"[{broadcast_address}]" if ":" in broadcast_address else broadcast_address
    key = f"{host}:{http_port}".replace(".", "_").replace(":", "_")
    out = prefix.replace("%s", key)
    return out if out.endswith(".") else out + "."


def _percent(quantile: float) -> str:
    return f"{quantile * 100.0:.0f}"


def metrics(snap: dict[str, Any], last: dict[str, Any] | None, exclude_ephemeral: bool,
            mem: dict[str, int] | None, last_mem: dict[str, int] | None) -> list[tuple[str, int, str]]:
    """``(name, value, type)`` for one push; counters are differences from ``last``."""
    out: list[tuple[str, int, str]] = []
    last_topics = {t["topic_name"]: t for t in (last or {}).get("topics") or []}
    for topic in snap.get("topics") or []:
        name = topic["topic_name"]
        if exclude_ephemeral and name.endswith(_EPHEMERAL):
            continue
        prev = last_topics.get(name, {})
        base = f"topic.{name}"
        out.append((f"{base}.message_count", topic["message_count"] - prev.get("message_count", 0), "c"))
        out.append((f"{base}.message_bytes", topic["message_bytes"] - prev.get("message_bytes", 0), "c"))
        out.append((f"{base}.depth", topic["depth"], "g"))
        out.append((f"{base}.backend_depth", topic["backend_depth"], "g"))
        for p in topic["e2e_processing_latency"].get("percentiles") or []:
            out.append((f"{base}.e2e_processing_latency_{_percent(p['quantile'])}", int(p["value"]), "g"))
        prev_channels = {c["channel_name"]: c for c in prev.get("channels") or []}
        for channel in topic["channels"]:
            cname = channel["channel_name"]
            if exclude_ephemeral and cname.endswith(_EPHEMERAL):
                continue
            cprev = prev_channels.get(cname, {})
            cbase = f"{base}.channel.{cname}"
            out.append((f"{cbase}.message_count",
                        channel["message_count"] - cprev.get("message_count", 0), "c"))
            out.append((f"{cbase}.depth", channel["depth"], "g"))
            out.append((f"{cbase}.backend_depth", channel["backend_depth"], "g"))
            out.append((f"{cbase}.in_flight_count", channel["in_flight_count"], "g"))
            out.append((f"{cbase}.deferred_count", channel["deferred_count"], "g"))
            out.append((f"{cbase}.requeue_count",
                        channel["requeue_count"] - cprev.get("requeue_count", 0), "c"))
            out.append((f"{cbase}.timeout_count",
                        channel["timeout_count"] - cprev.get("timeout_count", 0), "c"))
            out.append((f"{cbase}.clients", channel["client_count"], "g"))
            for p in channel["e2e_processing_latency"].get("percentiles") or []:
                out.append((f"{cbase}.e2e_processing_latency_{_percent(p['quantile'])}",
                            int(p["value"]), "g"))
    if mem is not None:
        for key in ("heap_objects", "heap_idle_bytes", "heap_in_use_bytes", "heap_released_bytes",
                    "gc_pause_usec_100", "gc_pause_usec_99", "gc_pause_usec_95", "next_gc_bytes"):
            out.append((f"mem.{key}", mem[key], "g"))
        out.append(("mem.gc_runs", mem["gc_total_runs"] - (last_mem or {}).get("gc_total_runs", 0), "c"))
    return out


def packets(prefix: str, items: list[tuple[str, int, str]], size: int) -> list[bytes]:
    """``prefix+name:value|type\\n`` lines packed into datagrams of at most ``size`` bytes.

    A line is never split; one longer than ``size`` travels alone (nsqd's
    boundary-buffered writer).
    """
    out: list[bytes] = []
    current = bytearray()
    for name, value, kind in items:
        line = f"{prefix}{name}:{value}|{kind}\n".encode("utf-8", "surrogateescape")
        if current and len(current) + len(line) > size:
            out.append(bytes(current))
            current.clear()
        current += line
    if current:
        out.append(bytes(current))
    return out


class StatsdService(Service):
    """Every ``--statsd-interval``, one snapshot to the ``--statsd-address`` server over UDP."""

    log = Logger()

    def __init__(self, nsqd: Any, reactor: Any) -> None:
        o = nsqd.options
        self.nsqd = nsqd
        self.reactor = reactor
        self.address = o.statsd_address
        self.interval = o.statsd_interval
        self.packet_size = o.statsd_udp_packet_size
        self.mem_stats = o.statsd_mem_stats
        self.exclude_ephemeral = o.statsd_exclude_ephemeral
        self._loop: LoopingCall | None = None
        self._last: dict[str, Any] | None = None
        self._last_mem: dict[str, int] | None = None
        self._pending: list[IDelayedCall] = []
        self._ports: dict[int, Any] = {}

    def startService(self) -> None:
        super().startService()  # type: ignore[no-untyped-call]
        loop = self._loop = LoopingCall(self._tick)
        loop.clock = self.reactor
        loop.start(self.interval, now=False).addErrback(
            lambda f: self.log.failure("STATSD: push loop failed", f))

    def stopService(self) -> Deferred[None] | None:
        super().stopService()  # type: ignore[no-untyped-call]
        if self._loop is not None and self._loop.running:
            self._loop.stop()
        self._loop = None
        for call in self._pending:
            if call.active():
                call.cancel()
        self._pending = []
        ports, self._ports = list(self._ports.values()), {}
        for port in ports:
            port.stopListening()
        return None

    def _tick(self) -> None:
        ensureDeferred(self.push()).addErrback(
            lambda f: self.log.failure("STATSD: push failed", f))

    async def push(self) -> None:
        """One push: resolve the address, take the snapshot, send it spread over the interval."""
        host, _, port_text = self.address.rpartition(":")
        host = host.strip("[]")
        try:
            port = int(port_text)
            try:
                ip = str(ipaddress.ip_address(host))
            except ValueError:
                ip = await self.reactor.resolve(host)
            transport = self._transport(ip)
        except Exception:  # noqa: BLE001 - nsqd logs and tries again next interval
            self.log.error("failed to create UDP socket to statsd({address})", address=self.address)
            return
        if not self.running:
            return
        self.log.info("STATSD: pushing stats to {address}", address=self.address)
        o = self.nsqd.options
        prefix = format_prefix(o.statsd_prefix, o.broadcast_address,
                               o.broadcast_http_port or self.nsqd.http_port)
        snap = snapshot(self.nsqd, include_clients=False, include_mem=False)
        mem = memory_stats() if self.mem_stats else None
        items = metrics(snap, self._last, self.exclude_ephemeral, mem, self._last_mem)
        self._last = snap
        if mem is not None:
            self._last_mem = mem
        self._send(transport, (ip, port), packets(prefix, items, self.packet_size))

    def _transport(self, ip: str) -> Any:
        family = ipaddress.ip_address(ip).version
        transport = self._ports.get(family)
        if transport is None:
            interface = "::" if family == 6 else ""
            transport = self.reactor.listenUDP(0, DatagramProtocol(), interface=interface)
            self._ports[family] = transport
        return transport

    def _send(self, transport: Any, to: tuple[str, int], datagrams: list[bytes]) -> None:
        """Send the first datagram now and the rest evenly over (interval - 1s)."""
        self._pending = [c for c in self._pending if c.active()]
        if not datagrams:
            return
        spread = self.interval - 1.0
        step = spread / len(datagrams) if spread > 0 else 0.0
        for i, datagram in enumerate(datagrams):
            if i == 0 or step == 0.0:
                self._write(transport, datagram, to)
            else:
                self._pending.append(self.reactor.callLater(i * step, self._write, transport,
                                                            datagram, to))

    def _write(self, transport: Any, datagram: bytes, to: tuple[str, int]) -> None:
        try:
            transport.write(datagram, to)
        except OSError as e:
            self.log.error("STATSD: failed to send to {address} - {error}", address=self.address,
                           error=e)
