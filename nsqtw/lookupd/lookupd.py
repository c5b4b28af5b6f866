"""NSQLookupd: the registration rules shared by the V1 TCP protocol and the HTTP API.

The protocol and the HTTP routes only translate bytes and queries into the
calls here; what a REGISTER, an UNREGISTER, a closed connection or a
tombstone does to the :class:`~nsqtw.lookupd.db.RegistrationDB` is decided
in one place, the way nsqlookupd v1.3 decides it.
"""

from __future__ import annotations

import socket
from typing import Any

from twisted.internet.interfaces import IReactorTime

from nsqtw import NSQD_VERSION
from nsqtw.log import Logger
from nsqtw.lookupd.db import PeerInfo, Registration, RegistrationDB, active
from nsqtw.names import is_ephemeral

__all__ = ["NSQLookupd"]

_CLIENT = Registration("client", "", "")
#: registrations a closed connection leaves per reactor turn
UNREGISTER_SLICE = 512


class NSQLookupd:
    """One nsqlookupd: options, the registration DB, and the bound ports."""

    log = Logger()

    def __init__(self, options: Any, clock: IReactorTime, hostname: str | None = None) -> None:
        self.options = options
        self.clock = clock
        #: when this nsqlookupd started, seconds since the epoch (``/metrics``' uptime)
        self.start_time = clock.seconds()
        self.db = RegistrationDB(clock)
        self.hostname = socket.gethostname() if hostname is None else hostname
        #: the bound ports, filled in by the listeners (port 0 means "pick one")
        self.tcp_port = 0
        self.http_port = 0

    def now_ns(self) -> int:
        return self.db.now_ns()

    # -- the V1 protocol's commands ------------------------------------------------

    def identify(self, peer: PeerInfo) -> dict[str, Any]:
        """Record an identified node; returns nsqlookupd's IDENTIFY answer (keys sorted, as Go)."""
        peer.last_update = self.now_ns()
        self.log.info("CLIENT({client}): IDENTIFY Address:{address} TCP:{tcp} HTTP:{http} Version:{version}",
                      client=peer.id, address=peer.broadcast_address, tcp=peer.tcp_port,
                      http=peer.http_port, version=peer.version)
        if self.db.add_producer(_CLIENT, peer):
            self._logged("REGISTER", peer, _CLIENT)
        return {"broadcast_address": self.options.broadcast_address, "hostname": self.hostname,
                "http_port": self.http_port, "tcp_port": self.tcp_port, "version": NSQD_VERSION}

    def ping(self, peer: PeerInfo | None) -> None:
        """A PING keeps an identified node active (before IDENTIFY it is just answered)."""
        if peer is not None:
            now = self.now_ns()
            self.log.debug("CLIENT({client}): pinged (last ping {ago:.3f}s)", client=peer.id,
                           ago=(now - peer.last_update) / 1e9)
            peer.last_update = now

    def register(self, peer: PeerInfo, topic: str, channel: str) -> None:
        """REGISTER: the channel (if any) and always the topic."""
        keys = [Registration("channel", topic, channel)] if channel else []
        keys.append(Registration("topic", topic, ""))
        for k in keys:
            if self.db.add_producer(k, peer):
                self._logged("REGISTER", peer, k)

    def unregister(self, peer: PeerInfo, topic: str, channel: str) -> None:
        """UNREGISTER a channel (dropping an ephemeral one nobody has left) or a whole topic."""
        db = self.db
        if channel:
            k = Registration("channel", topic, channel)
            removed, left = db.remove_producer(k, peer.id)
            if removed:
                self._logged("UNREGISTER", peer, k)
            if left == 0 and is_ephemeral(channel):
                db.remove_registration(k)
            return
        # a topic unregistration takes this node's channels of the topic with it;
        # nsqd unregisters them first, so anything removed here is unexpected
        for k in db.find_registrations("channel", topic, "*"):
            removed, _ = db.remove_producer(k, peer.id)
            if removed:
                self.log.warn("client({client}) unexpected UNREGISTER category:{category} "
                              "key:{key} subkey:{subkey}", client=peer.id, category=k.category,
                              key=k.key, subkey=k.subkey)
        k = Registration("topic", topic, "")
        removed, _ = db.remove_producer(k, peer.id)
        if removed:
            self._logged("UNREGISTER", peer, k)

    def disconnected(self, peer: PeerInfo) -> None:
        """A node's connection closed: it is no longer a producer of anything.

        A node that registered a great many topics leaves them
        :data:`UNREGISTER_SLICE` per reactor turn (its ``client``
        registration, the first it made, goes in the first), so nobody else
        waits for the whole of it.
        """
        self._leave(peer, self.db.lookup_registrations(peer.id), 0)

    def _leave(self, peer: PeerInfo, left: list[Registration], start: int) -> None:
        db = self.db
        end = start + UNREGISTER_SLICE
        for k in left[start:end]:
            removed, _ = db.remove_producer(k, peer.id)
            if removed:
                self._logged("UNREGISTER", peer, k)
        if end < len(left):
            self.clock.callLater(0, self._leave, peer, left, end)

    def _logged(self, action: str, peer: PeerInfo, k: Registration) -> None:
        self.log.info("DB: client({client}) {action} category:{category} key:{key} subkey:{subkey}",
                      client=peer.id, action=action, category=k.category, key=k.key, subkey=k.subkey)

    # -- the HTTP API's queries and changes ----------------------------------------------

    def active(self, producers: list[Any], tombstone_lifetime: float | None = None) -> list[Any]:
        o = self.options
        lifetime = o.tombstone_lifetime if tombstone_lifetime is None else tombstone_lifetime
        return active(producers, self.now_ns(), o.inactive_producer_timeout, lifetime)

    def create_topic(self, topic: str) -> None:
        self.log.info("DB: adding topic({topic})", topic=topic)
        self.db.add_registration(Registration("topic", topic, ""))

    def create_channel(self, topic: str, channel: str) -> None:
        self.log.info("DB: adding channel({channel}) in topic({topic})", channel=channel, topic=topic)
        self.db.add_registration(Registration("channel", topic, channel))
        self.create_topic(topic)

    def delete_topic(self, topic: str) -> None:
        """Forget the topic and its channels, whoever produces them."""
        db = self.db
        for k in db.find_registrations("channel", topic, "*"):
            self.log.info("DB: removing channel({channel}) from topic({topic})", channel=k.subkey,
                          topic=topic)
            db.remove_registration(k)
        for k in db.find_registrations("topic", topic, ""):
            self.log.info("DB: removing topic({topic})", topic=topic)
            db.remove_registration(k)

    def delete_channel(self, topic: str, channel: str) -> bool:
        """Forget one channel; False when it was not registered."""
        found = self.db.find_registrations("channel", topic, channel)
        if not found:
            return False
        self.log.info("DB: removing channel({channel}) from topic({topic})", channel=channel,
                      topic=topic)
        for k in found:
            self.db.remove_registration(k)
        return True

    def tombstone(self, topic: str, node: str) -> None:
        """Hide ``node`` (``broadcast_address:http_port``) from /lookup of ``topic`` for a while."""
        self.log.info("DB: setting tombstone for producer@{node} of topic({topic})", node=node,
                      topic=topic)
        now = self.now_ns()
        for p in self.db.find_producers("topic", topic, ""):
            if f"{p.peer.broadcast_address}:{p.peer.http_port}" == node:
                p.tombstone(now)
