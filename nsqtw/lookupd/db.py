"""The registration database: which nsqd nodes produce which topics and channels.

Shaped like nsqlookupd's ``RegistrationDB``: a map from a registration
(``category``, ``key``, ``subkey``) to the producers registered under it, one
producer per nsqd connection. Categories are ``client`` (every identified
node), ``topic`` (key = topic) and ``channel`` (key = topic, subkey =
channel). Like nsqlookupd, removing the last producer leaves the
registration in place (``/topics`` still lists the topic); only the HTTP
delete routes and ephemeral channels remove registrations.

Producers are never dropped for inactivity: readers filter them out with
:func:`active` (``--inactive-producer-timeout``, ``--tombstone-lifetime``),
as nsqlookupd does. Time comes from an injected clock.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from twisted.internet.interfaces import IReactorTime

__all__ = ["PeerInfo", "Producer", "Registration", "RegistrationDB", "active"]

_NS = 1_000_000_000
#: Go's zero ``time.Time`` as ``UnixNano()`` (what /debug shows for "never tombstoned")
GO_ZERO_TIME_NS = -6795364578871345152


class Registration(NamedTuple):
    category: str
    key: str
    subkey: str

    def matches(self, category: str, key: str, subkey: str) -> bool:
        """nsqlookupd's IsMatch: ``*`` in key or subkey matches anything."""
        return (self.category == category and (key == "*" or self.key == key)
                and (subkey == "*" or self.subkey == subkey))


@dataclass
class PeerInfo:
    """One identified nsqd connection; ``id`` is its remote address."""

    id: str
    remote_address: str = ""
    hostname: str = ""
    broadcast_address: str = ""
    tcp_port: int = 0
    http_port: int = 0
    version: str = ""
    #: nanoseconds since the epoch of the IDENTIFY or last PING
    last_update: int = 0

    def json(self) -> dict[str, Any]:
        """The shape of a producer in ``/lookup`` (Go's PeerInfo field order)."""
        return {"remote_address": self.remote_address, "hostname": self.hostname,
                "broadcast_address": self.broadcast_address, "tcp_port": self.tcp_port,
                "http_port": self.http_port, "version": self.version}


@dataclass(eq=False, slots=True)
class Producer:
    """A peer under one registration; tombstones are per registration, as in nsqlookupd."""

    peer: PeerInfo
    tombstoned: bool = False
    tombstoned_at: int = field(default=GO_ZERO_TIME_NS)

    def tombstone(self, now_ns: int) -> None:
        self.tombstoned = True
        self.tombstoned_at = now_ns

    def is_tombstoned(self, now_ns: int, lifetime: float) -> bool:
        return self.tombstoned and now_ns - self.tombstoned_at < round(lifetime * _NS)


def active(producers: Iterable[Producer], now_ns: int, inactivity_timeout: float,
           tombstone_lifetime: float) -> list[Producer]:
    """nsqlookupd's FilterByActive: pinged recently enough and not tombstoned."""
    timeout_ns = round(inactivity_timeout * _NS)
    return [p for p in producers
            if now_ns - p.peer.last_update <= timeout_ns
            and not p.is_tombstoned(now_ns, tombstone_lifetime)]


class RegistrationDB:
    """Registrations and their producers, keyed by peer id, in insertion order.

    Two indexes keep the questions asked per request or per command cheap
    however many registrations there are (a node may register 100,000
    topics): each topic's channel registrations (``/lookup``), and the
    registrations each peer is a producer under (its disconnection).
    """

    def __init__(self, clock: IReactorTime) -> None:
        self.clock = clock
        self.registrations: dict[Registration, dict[str, Producer]] = {}
        #: topic -> its channels' registrations
        self._channels: dict[str, dict[Registration, None]] = {}
        #: peer id -> the registrations it is a producer under
        self._by_peer: dict[str, dict[Registration, None]] = {}

    def now_ns(self) -> int:
        return int(self.clock.seconds() * _NS)

    def _producers(self, k: Registration) -> dict[str, Producer]:
        producers = self.registrations.get(k)
        if producers is None:
            producers = self.registrations[k] = {}
            if k.category == "channel":
                self._channels.setdefault(k.key, {})[k] = None
        return producers

    def add_registration(self, k: Registration) -> None:
        self._producers(k)

    def add_producer(self, k: Registration, peer: PeerInfo) -> bool:
        """Register ``peer`` under ``k``; False when it already was (its producer is kept)."""
        producers = self._producers(k)
        if peer.id in producers:
            return False
        producers[peer.id] = Producer(peer)
        self._by_peer.setdefault(peer.id, {})[k] = None
        return True

    def remove_producer(self, k: Registration, peer_id: str) -> tuple[bool, int]:
        """Remove ``peer_id`` from ``k``: (was it there, producers left). Keeps ``k``."""
        producers = self.registrations.get(k)
        if producers is None:
            return False, 0
        removed = producers.pop(peer_id, None) is not None
        if removed:
            self._forget_peer(peer_id, k)
        return removed, len(producers)

    def _forget_peer(self, peer_id: str, k: Registration) -> None:
        mine = self._by_peer.get(peer_id)
        if mine is not None:
            mine.pop(k, None)
            if not mine:
                del self._by_peer[peer_id]

    def remove_registration(self, k: Registration) -> None:
        producers = self.registrations.pop(k, None)
        if producers is None:
            return
        for peer_id in producers:
            self._forget_peer(peer_id, k)
        if k.category == "channel":
            channels = self._channels[k.key]
            del channels[k]
            if not channels:
                del self._channels[k.key]

    def find_registrations(self, category: str, key: str, subkey: str) -> list[Registration]:
        if key != "*" and subkey != "*":
            k = Registration(category, key, subkey)
            return [k] if k in self.registrations else []
        if category == "channel" and key != "*":
            return [k for k in self._channels.get(key, ()) if k.matches(category, key, subkey)]
        return [k for k in self.registrations if k.matches(category, key, subkey)]

    def find_producers(self, category: str, key: str, subkey: str) -> list[Producer]:
        """Producers under every matching registration, one per peer."""
        seen: dict[str, Producer] = {}
        for k in self.find_registrations(category, key, subkey):
            for peer_id, producer in self.registrations[k].items():
                seen.setdefault(peer_id, producer)
        return list(seen.values())

    def lookup_registrations(self, peer_id: str) -> list[Registration]:
        """Every registration ``peer_id`` is a producer under, in the order it became one."""
        return list(self._by_peer.get(peer_id, ()))
