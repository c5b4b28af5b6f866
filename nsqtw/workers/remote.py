"""A worker's side of the node: the :class:`~nsqtw.protocol.node.Node` its connections serve,
a proxy for the core over the link.

A worker runs the V2 protocol of the connections it accepted, all of it:
TLS, snappy and deflate, IDENTIFY, AUTH, heartbeats, output buffering,
parsing and checking each command. What touches a topic or a channel goes to
the core as a record (:mod:`nsqtw.workers.link`); what the core answers
comes back the same way. A publish is answered once the core has queued
it, as one process answers once its own topic has; the connection reads
nothing meanwhile, so its order is kept. A publish that the core's grant
for its topic covers is answered here, once its record is in the kernel's
socket buffer on its way to the core (docs/architecture.md, "Publishes
answered by the worker").
"""

from __future__ import annotations

import itertools
import json
from typing import Any

from twisted.internet.defer import Deferred
from twisted.internet.interfaces import IReactorTime
from twisted.python.failure import Failure

from nsqtw.core.commands import ClientState
from nsqtw.core.message import frame_ids
from nsqtw.errors import ExitingError, ReplicaError
from nsqtw.log import Logger
from nsqtw.protocol.node import Subscription
from nsqtw.protocol.v2 import V2Protocol
from nsqtw.workers import link
from nsqtw.workers.link import Link


class PublishFailed(Exception):
    """The core could not take a publish; the text is why (``E_PUB_FAILED PUB failed <why>``)."""


class RemoteChannel:
    """The channel one connection subscribed to, in the core: its commands become records."""

    def __init__(self, node: RemoteNode, conn: int) -> None:
        self.node = node
        self.conn = conn

    def remove_client(self, client: Any) -> None:
        """Nothing to send: the connection's GONE record unsubscribes it in the core."""

    def wake(self) -> None:
        """RDY, CLS, or writes paused or resumed: the core learns the client's capacity."""
        proto = self.node.conns.get(self.conn)
        if proto is not None:
            ready = proto.ready_count
            self.node.send(link.encode(link.STATE, self.conn, ready, ready > 0 and proto.ready_capacity() == 0,
                                       int(proto.state)))

    def finish_many(self, client: Any, msg_ids: list[bytes]) -> list[tuple[bytes, object]]:
        self.node.send(link.encode(link.FIN, self.conn, msg_ids))
        return []

    def requeue_many(self, client: Any, reqs: list[tuple[bytes, float]]) -> list[tuple[bytes, object]]:
        self.node.send(link.encode(link.REQ, self.conn, reqs))
        return []

    def touch(self, client: Any, msg_id: bytes, timeout: float) -> None:
        self.node.send(link.encode(link.TOUCH, self.conn, msg_id))


class RemoteNode:
    """The node as a worker's connections see it: everything but the topics, which are the core's."""

    log = Logger()

    def __init__(self, options: Any, clock: IReactorTime, index: int) -> None:
        self.options = options
        self.tls: Any = None
        self.auth: Any = None
        self.index = index
        self.clock = clock
        #: waiting for the last client to go (:meth:`idle`)
        self._idle: list[Deferred[None]] = []
        self._client_ids = itertools.count(1)
        self._seqs = itertools.count(1)
        #: this worker's connections, by the ID the core knows them by
        self.conns: dict[int, V2Protocol] = {}
        #: each record to its handler (:data:`HANDLERS`), through the link's table
        self.dispatch = link.Dispatch(link.WORKER, f"WORKER({index})", self, self.HANDLERS, self.conns)
        self.link = Link(clock, self.dispatch, self.lost)
        #: each connection's identity as last sent (:meth:`ClientStats.identity_key`)
        self._sent: dict[int, tuple[Any, ...]] = {}
        #: the PUBs and SUBs waiting for the core's answer
        self._waiting: dict[int, tuple[Deferred[Any], Any]] = {}
        #: bytes of publishes to each topic the core promised to take unasked (its grants), unused
        self.credit: dict[str, int] = {}
        self.exiting = False
        #: called once the core asked this worker to stop, or is gone
        self.on_stop: Any = None

    def send(self, pieces: list[bytes]) -> None:
        self.link.send(pieces)

    # -- Node -------------------------------------------------------------

    def new_client_id(self) -> int:
        return next(self._client_ids)

    def add_client(self, client_id: int, client: V2Protocol) -> None:
        self.conns[client_id] = client
        self._sent[client_id] = client.identity_key()
        self.send(link.encode(link.OPEN, client_id, json.dumps(client.identity()).encode()))

    def remove_client(self, client_id: int) -> None:
        if self.conns.pop(client_id, None) is not None:
            self._sent.pop(client_id, None)
            self.send(link.encode(link.GONE, client_id))
            if not self.conns and self._idle:
                waiters, self._idle = self._idle, []
                for d in waiters:
                    d.callback(None)

    def idle(self, timeout: float) -> Deferred[None]:
        """Fires once no client is connected, or after ``timeout`` seconds."""
        d: Deferred[None] = Deferred()
        if not self.conns:
            d.callback(None)
            return d
        self._idle.append(d)
        def give_up() -> None:
            if not d.called:
                d.callback(None)

        timer = self.clock.callLater(timeout, give_up)

        def cancel(result: object) -> object:
            if timer.active():
                timer.cancel()
            return result

        return d.addBoth(cancel)

    def _sync(self, client: V2Protocol) -> None:
        """Send the client's identity again if IDENTIFY or AUTH changed it."""
        key = client.identity_key()
        if self._sent.get(client.client_id) != key:
            self._sent[client.client_id] = key
            self.send(link.encode(link.INFO, client.client_id, json.dumps(client.identity()).encode()))

    def subscribe(self, topic: str, channel: str, client: V2Protocol) -> Deferred[Subscription]:
        self._sync(client)
        seq = next(self._seqs)
        d: Deferred[Subscription] = Deferred()
        self._waiting[seq] = (d, RemoteChannel(self, client.client_id))
        self.send(link.encode(link.SUB, seq, client.client_id, topic, channel))
        return d

    def wait_for_room(self, topic: str) -> Deferred[None] | None:
        """None: the core applies the node's bounds, and answers the publish when there is room."""
        if self.exiting:
            raise ExitingError()
        return None

    def publish(self, topic: str, bodies: list[bytes], defer: float = 0.0,
                client: V2Protocol | None = None) -> Deferred[None] | None:
        """Send the publish to the core; None when it is answered now (under a grant), else
        a Deferred that fires with the core's answer."""
        conn = 0
        if client is not None:
            self._sync(client)
            conn = client.client_id
        seq = next(self._seqs)
        name = topic.encode("utf-8", "surrogateescape")
        nbytes = len(bodies[0]) if len(bodies) == 1 else sum(map(len, bodies))
        credit = self.credit.get(topic, 0)
        if credit >= nbytes and self.link.sends_now():
            self.credit[topic] = credit - nbytes
            if self.link.send_now(link.encode(link.GRANTED_PUB, seq, conn, round(defer * 1000), name, bodies)):
                return None  # in the kernel: the core gets it even if this process dies now
            # the link is backed up: answered once the core says it has read this far
            self.send(link.encode(link.SYNC, seq))
        else:
            self.send(link.encode(link.PUB, seq, conn, round(defer * 1000), name, bodies))
        d: Deferred[None] = Deferred()
        self._waiting[seq] = (d, None)
        return d

    # -- records from the core ---------------------------------------------

    #: the method that runs each kind of record from the core (checked against the link's table)
    HANDLERS: dict[int, str] = {
        link.GRANT: "_on_grant", link.REVOKE: "_on_revoke", link.ACK: "_on_ack",
        link.DELIVER: "_on_deliver", link.FAILED: "_on_failed", link.CLOSE: "_on_close",
        link.STOP: "_stop",
    }

    @property
    def unknown_conns(self) -> int:
        """Records from the core that named a connection this worker does not know (closed meanwhile)."""
        return self.dispatch.unknown_conns

    def _on_grant(self, nbytes: int, topic: str) -> None:
        self.credit[topic] = self.credit.get(topic, 0) + nbytes

    def _on_revoke(self, _: int, topic: str) -> None:
        left = self.credit.pop(topic, 0)
        self.send(link.encode(link.RETURN, left, topic))

    def _on_ack(self, seq: int, status: int, why: str) -> None:
        entry = self._waiting.pop(seq, None)
        if entry is None:  # a publish answered here already: the core took it, or failed to
            if status != link.ACK_OK:
                self.log.error("WORKER({index}): a publish answered under a grant was lost in the core "
                               "- {why}", index=self.index, why=why)
            return
        d, result = entry
        if status == link.ACK_OK:
            d.callback(result)
        elif status == link.ACK_TOO_MANY:
            d.errback(ValueError())
        elif status == link.ACK_NO_REPLICA:
            d.errback(ReplicaError(why))
        else:
            d.errback(PublishFailed(why))

    def _on_deliver(self, proto: V2Protocol, data: bytes) -> None:
        if proto.state is ClientState.CLOSING and proto.channel is not None:
            # CLS was answered CLOSE_WAIT here before the core heard of it, and the core
            # sent these meanwhile: none is written after CLOSE_WAIT, each goes back at once
            proto.channel.requeue_many(proto, [(msg_id, 0.0) for msg_id in frame_ids(data)])
            return
        proto.deliver_frames(data)

    def _on_failed(self, proto: V2Protocol, cmd: str, msg_id: bytes, why: str) -> None:
        proto.report_failed(cmd, msg_id, why)

    def _on_close(self, proto: V2Protocol) -> None:
        proto.close()

    def _stop(self) -> None:
        """Close every client, as nsqd does on its way out, and hand over to ``on_stop``."""
        if self.exiting:
            return
        self.exiting = True
        for proto in list(self.conns.values()):
            proto.close()
        if self.on_stop is not None:
            self.on_stop()

    def lost(self, reason: Failure) -> None:
        """The core is gone: nothing here can be served any more."""
        for d, _ in self._waiting.values():
            d.errback(PublishFailed("exiting"))
        self._waiting.clear()
        self._stop()
