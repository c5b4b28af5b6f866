"""The core's side of a link to one worker: its clients as the core's own, their commands run here.

The core owns every topic and channel (docs/architecture.md, "One node on
several processes"). A client connected to a worker is a
:class:`RemoteClient` here: a consumer the channel delivers to and counts
for, and the entry ``/stats`` shows, from the identity its worker sent.
Its connection, TLS, compression, heartbeats and parsing stay in the
worker; the core sees only what changes a queue.
"""

from __future__ import annotations

import json
from typing import Any

from twisted.internet.defer import Deferred
from twisted.internet.interfaces import IReactorTime
from twisted.python.failure import Failure
from zope.interface import implementer

from nsqtw.core.message import Message, frames
from nsqtw.core.nsqd import NSQD, PUBLISH_SLICE
from nsqtw.core.topic import Topic
from nsqtw.errors import BackendError, ExitingError, NotInFlightError
from nsqtw.interfaces import IConsumer
from nsqtw.log import Logger
from nsqtw.protocol.client_stats import ClientStats, ConsumerCounts
from nsqtw.protocol.node import Subscription
from nsqtw.protocol.states import ClientState
from nsqtw.workers import link
from nsqtw.workers.link import Link, Reader

_SUBSCRIBED = ClientState.SUBSCRIBED


@implementer(IConsumer)
class RemoteClient(ClientStats, ConsumerCounts):
    """A worker's client, as the core's channel and ``/stats`` see it."""

    def __init__(self, peer: WorkerPeer, conn: int, client_id: int, identity: dict[str, Any]) -> None:
        self.peer = peer
        self.conn = conn
        self.client_id = client_id
        self.state = ClientState.CONNECTED
        self.channel: Subscription | None = None
        self.ready_count = 0
        self.paused = False
        self.in_flight_count = 0
        self.message_count = 0
        self.finish_count = 0
        self.requeue_count = 0
        self.pub_counts: dict[str, int] = {}
        self.adopt(identity)

    def __str__(self) -> str:
        return self.remote_address

    def close(self) -> None:
        """The node stops: its worker closes the connection."""
        self.peer.send(link.conn_record(link.CLOSE, self.conn))

    # -- IConsumer --------------------------------------------------------

    def ready_capacity(self) -> int:
        if self.paused or self.state != _SUBSCRIBED:
            return 0
        return self.ready_count - self.in_flight_count

    def deliver(self, messages: list[Message]) -> None:
        self.count_delivered(len(messages))
        self.peer.send(link.conn_record(link.DELIVER, self.conn, *frames(messages)))

    def channel_deleted(self) -> None:
        self.channel = None
        self.close()


class Grant:
    """The memory one topic promised a worker (:meth:`Topic.reserve`), as much as is unused."""

    __slots__ = ("topic", "count")

    def __init__(self, topic: Topic) -> None:
        #: the topic that promised it (a topic deleted and made again promised nothing)
        self.topic = topic
        self.count = 0


class WorkerPeer:
    """One worker's link, seen from the core: runs what its clients ask of topics and channels."""

    log = Logger()

    def __init__(self, nsqd: NSQD, clock: IReactorTime, index: int) -> None:
        self.nsqd = nsqd
        self.index = index
        self.link = Link(clock, self.record, self._link_lost)
        self.clients: dict[int, RemoteClient] = {}
        #: each topic's grant to this worker: the topic it was promised by, and how many messages
        #: of the promise are unused (docs/architecture.md, "Publishes answered by the worker")
        self.grants: dict[str, Grant] = {}
        #: the most a worker holds of one topic: a share of its memory, so the workers together
        #: hold at most half of it and other publishers find room
        workers = max(1, int(getattr(nsqd.options, "workers", 1)))
        self.share = min(PUBLISH_SLICE, int(nsqd.options.mem_queue_size) // (2 * workers))
        #: no more grants: the worker is gone (what is left on its link is still read)
        self.closed = False
        #: fires once the link ended and everything on it was read
        self.done: Deferred[None] = Deferred()

    def send(self, pieces: list[bytes]) -> None:
        self.link.send(pieces)

    def stop(self) -> None:
        """Ask the worker to close its clients and exit."""
        self.send(link.record(link.STOP))
        self.link.flush()

    # -- records from the worker -------------------------------------------

    def record(self, kind: int, r: Reader) -> None:
        if kind == link.PUB:
            self._pub(r)
        elif kind == link.GRANTED_PUB:
            self._granted_pub(r)
        elif kind == link.SYNC:
            self.send(link.ack_record(r.u32(), link.ACK_OK))
        elif kind == link.FIN:
            client = self.clients[r.u32()]
            if client.channel is not None:
                for msg_id, e in client.channel.finish_many(client, r.ids()):
                    self.send(link.failed_record(client.conn, "FIN", msg_id, str(e)))
        elif kind == link.STATE:
            client = self.clients[r.u32()]
            client.ready_count = r.u32()
            client.paused = bool(r.u8())
            client.state = ClientState(r.u8())
            if client.channel is not None:
                client.channel.wake()
        elif kind == link.REQ:
            self._req(self.clients[r.u32()], r.reqs())
        elif kind == link.TOUCH:
            client = self.clients[r.u32()]
            msg_id = r.rest()
            if client.channel is not None:
                try:
                    client.channel.touch(client, msg_id, client.msg_timeout)
                except NotInFlightError as e:
                    self.send(link.failed_record(client.conn, "TOUCH", msg_id, str(e)))
        elif kind == link.SUB:
            self._sub(r)
        elif kind == link.OPEN:
            conn = r.u32()
            client = RemoteClient(self, conn, self.nsqd.new_client_id(), json.loads(r.rest()))
            self.clients[conn] = client
            self.nsqd.add_client(client.client_id, client)
        elif kind == link.INFO:
            conn = r.u32()
            self.clients[conn].adopt(json.loads(r.rest()))
        elif kind == link.GONE:
            self._gone(self.clients.pop(r.u32()))
        else:
            self.log.error("WORKER({index}): unknown record {kind}", index=self.index, kind=kind)

    def _gone(self, client: RemoteClient) -> None:
        if client.channel is not None:
            client.channel.remove_client(client)
            client.channel = None
        self.nsqd.remove_client(client.client_id)

    def _sub(self, r: Reader) -> None:
        seq, conn = r.u32(), r.u32()
        topic, channel = r.text(), r.text()
        client = self.clients[conn]
        try:
            client.channel = self.nsqd.subscribe(topic, channel, client)
        except ValueError:
            self.send(link.ack_record(seq, link.ACK_TOO_MANY))
            return
        except Exception as e:  # the node is stopping
            self.send(link.ack_record(seq, link.ACK_FAILED, str(e)))
            return
        client.state = _SUBSCRIBED
        self.send(link.ack_record(seq, link.ACK_OK))

    def _req(self, client: RemoteClient, reqs: list[tuple[bytes, float]]) -> None:
        if client.channel is None:
            return
        try:
            failed: Any = client.channel.requeue_many(client, reqs)
        except BackendError as e:
            failed = [(reqs[-1][0], e)]
        for msg_id, why in failed:
            self.send(link.failed_record(client.conn, "REQ", msg_id, str(why)))

    def _pub(self, r: Reader) -> None:
        seq, conn, defer_ms = r.u32(), r.u32(), r.u32()
        topic = r.text()
        self._publish(seq, self.clients.get(conn), topic, r.bodies(), defer_ms / 1000.0)

    def _publish(self, seq: int, client: RemoteClient | None, topic: str, bodies: list[bytes],
                 defer: float) -> None:
        """nsqd's publish for a worker's client: the same admission and answers as
        :meth:`V2Protocol._publish`, the answer an ACK record."""
        try:
            room = self.nsqd.wait_for_room(topic)
            if room is not None:
                room.addCallbacks(lambda _: self._publish(seq, client, topic, bodies, defer),
                                  lambda f: self._answer(f, seq))
                return
            written = self.nsqd.publish(topic, bodies, defer)
        except (ExitingError, BackendError) as e:
            self.send(link.ack_record(seq, link.ACK_FAILED, str(e)))
            return
        if client is not None:
            client.pub_counts[topic] = client.pub_counts.get(topic, 0) + len(bodies)
        if written is None:
            self._grant(topic)  # first, so the worker's next publish finds it
            self.send(link.ack_record(seq, link.ACK_OK))
        else:
            written.addBoth(self._answer, seq)

    def _granted_pub(self, r: Reader) -> None:
        """A publish the worker answered already, under this topic's grant: into the memory held
        for it. No answer: more credit once half the grant is used (one record for many)."""
        seq, conn, defer_ms = r.u32(), r.u32(), r.u32()
        name = r.text()
        bodies = r.bodies()
        count = len(bodies)
        grant = self.grants.get(name)
        if grant is not None:
            if grant.topic is self.nsqd.topics.get(name):  # (else its promise went with a deleted topic)
                grant.topic.unreserve(min(count, grant.count))
            grant.count = max(0, grant.count - count)
            low = 2 * grant.count <= self.share
        else:
            low = True
        try:
            self.nsqd.publish(name, bodies, defer_ms / 1000.0, reserved=True)
        except (ExitingError, BackendError) as e:
            self.log.error("WORKER({index}): {count} message(s) answered under a grant to topic {topic} "
                           "could not be queued - {error}", index=self.index, count=count, topic=name, error=e)
            self.send(link.ack_record(seq, link.ACK_FAILED, str(e)))
            return
        client = self.clients.get(conn)
        if client is not None:
            client.pub_counts[name] = client.pub_counts.get(name, 0) + count
        if low:
            self._grant(name)

    def _grant(self, name: str) -> None:
        """Top up this worker's grant for the topic as far as the topic promises, and send it."""
        give = 0
        topic = self.nsqd.topics.get(name)
        if topic is not None and not self.closed:
            grant = self.grants.get(name)
            if grant is None or grant.topic is not topic:
                grant = self.grants[name] = Grant(topic)
            want = self.share - grant.count
            if want > 0:
                give = topic.reserve(want)
                grant.count += give
        if give:
            self.send(link.grant_record(give, name.encode("utf-8", "surrogateescape")))

    def _answer(self, result: object, seq: int) -> None:
        if isinstance(result, Failure):
            self.send(link.ack_record(seq, link.ACK_FAILED, result.getErrorMessage()))
        else:
            self.send(link.ack_record(seq, link.ACK_OK))

    def lost(self, reason: Failure) -> None:
        """The worker is gone (exited, killed): its clients are too; what they held in flight
        goes back to their channels, and the memory its grants held is free again."""
        self.closed = True
        clients, self.clients = self.clients, {}
        for client in clients.values():
            self._gone(client)
        grants, self.grants = self.grants, {}
        for name, grant in grants.items():
            if grant.topic is self.nsqd.topics.get(name):
                grant.topic.unreserve(grant.count)

    def _link_lost(self, reason: Failure) -> None:
        self.lost(reason)
        if not self.done.called:
            self.done.callback(None)
