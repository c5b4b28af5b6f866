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

from nsqtw.core import commands
from nsqtw.core.admission import PUBLISHED, Failed, WaitForRoom, Written, admit, settled
from nsqtw.core.commands import SUBSCRIBED, TOO_MANY, ClientState, Consumer, Failures
from nsqtw.core.message import Message, frames
from nsqtw.core.nsqd import NSQD
from nsqtw.errors import BackendError, ExitingError
from nsqtw.interfaces import IConsumer
from nsqtw.log import Logger
from nsqtw.protocol.client_stats import ClientStats
from nsqtw.workers import link
from nsqtw.workers.link import Link

_SUBSCRIBED = ClientState.SUBSCRIBED

#: the most bytes one grant holds
GRANT_MAX = 1024 * 1024


@implementer(IConsumer)
class RemoteClient(ClientStats, Consumer):
    """A worker's client, as the core's channel and ``/stats`` see it."""

    def __init__(self, peer: WorkerPeer, conn: int, client_id: int, identity: dict[str, Any]) -> None:
        self.peer = peer
        self.conn = conn
        self.client_id = client_id
        #: state, channel, ready count and counters, as a V2 connection keeps them (its
        #: ``msg_timeout`` is the worker's, from ``identity``)
        self.init_consumer(ClientState.CONNECTED, 0.0)
        #: its connection's writes are paused (a slow reader): nothing is sent meanwhile
        self.paused = False
        self.adopt(identity)

    def __str__(self) -> str:
        return self.remote_address

    def close(self) -> None:
        """The node stops: its worker closes the connection."""
        self.peer.send(link.encode(link.CLOSE, self.conn))

    # -- IConsumer --------------------------------------------------------

    def ready_capacity(self) -> int:
        if self.paused or self.state != _SUBSCRIBED:
            return 0
        return self.ready_count - self.in_flight_count

    def deliver(self, messages: list[Message]) -> None:
        self.count_delivered(len(messages))
        self.peer.send(link.encode(link.DELIVER, self.conn, frames(messages)))

    def channel_deleted(self) -> None:
        self.channel = None
        self.close()


#: the most topics a worker holds grants for at once; past it, the least recently used is taken back
GRANTED_TOPICS = 64


class Grant:
    """Bytes of publishes to one topic promised to a worker (:meth:`NSQD.promise`), unused."""

    __slots__ = ("nbytes", "revoked")

    def __init__(self) -> None:
        self.nbytes = 0
        #: REVOKE sent: the worker's RETURN will end it
        self.revoked = False


class WorkerPeer:
    """One worker's link, seen from the core: runs what its clients ask of topics and channels."""

    log = Logger()

    def __init__(self, nsqd: NSQD, clock: IReactorTime, index: int) -> None:
        self.nsqd = nsqd
        self.index = index
        self.link = Link(clock, self.record, self._link_lost, self._read_done)
        #: the worker's clients, by the ID it knows them by (one dict for the peer's life)
        self.clients: dict[int, RemoteClient] = {}
        #: each record to its handler (:data:`HANDLERS`), through the link's table
        self.dispatch = link.Dispatch(link.CORE, f"WORKER({index})", self, self.HANDLERS, self.clients)
        #: each topic's grant to this worker, least recently topped up first
        #: (docs/architecture.md, "Publishes answered by the worker")
        self.grants: dict[str, Grant] = {}
        #: the most bytes a worker holds of one topic: the workers' grants together are at most a
        #: quarter of --max-unwritten-bytes, counted there, so they never hold the node up alone
        workers = max(1, int(getattr(nsqd.options, "workers", 1)))
        self.share = min(GRANT_MAX, nsqd.unwritten.limit // (4 * workers * (GRANTED_TOPICS + 1)))
        #: granted publishes read and not yet queued: their bodies, seqs, topic and defer
        self._batch: list[bytes] = []
        self._batch_seqs: list[int] = []
        self._batch_topic = ""
        self._batch_defer = 0
        #: no more grants: the worker is gone (what is left on its link is still read)
        self.closed = False
        #: fires once the link ended and everything on it was read
        self.done: Deferred[None] = Deferred()
        #: the connections the core handed this worker that it still holds (handed, less the
        #: GONE and DROPPED records): what the core balances by
        self.connections = 0
        #: the worker said READY (it serves handed connections)
        self.ready = False
        #: called once when the worker says READY
        self.on_ready: Any = None

    def send(self, pieces: list[bytes]) -> None:
        self.link.send(pieces)

    def stop(self) -> None:
        """Ask the worker to close its clients and exit."""
        self.send(link.encode(link.STOP))
        self.link.flush()

    # -- records from the worker -------------------------------------------

    #: the method that runs each kind of record from the worker (checked against the link's table)
    HANDLERS: dict[int, str] = {
        link.OPEN: "_on_open", link.INFO: "_on_info", link.GONE: "_on_gone", link.PUB: "_publish",
        link.SUB: "_sub", link.STATE: "_on_state", link.FIN: "_on_fin", link.REQ: "_req",
        link.TOUCH: "_on_touch", link.GRANTED_PUB: "_granted_pub", link.SYNC: "_on_sync",
        link.RETURN: "_on_return", link.READY: "_on_ready", link.DROPPED: "_on_dropped",
    }

    @property
    def unknown_conns(self) -> int:
        """Records from the worker that named a connection the core does not know."""
        return self.dispatch.unknown_conns

    def record(self, kind: int, data: bytes, start: int, end: int) -> None:
        if self._batch and kind != link.GRANTED_PUB:
            self._publish_batch()  # what the worker sent before this is queued before it runs
        self.dispatch(kind, data, start, end)

    def _on_open(self, conn: int, identity: bytes) -> None:
        client = RemoteClient(self, conn, self.nsqd.new_client_id(), json.loads(identity))
        self.clients[conn] = client
        self.nsqd.add_client(client.client_id, client)

    def _on_info(self, client: RemoteClient, identity: bytes) -> None:
        client.adopt(json.loads(identity))

    def _on_gone(self, client: RemoteClient | None) -> None:
        self.connections -= 1
        if client is not None:
            del self.clients[client.conn]
            self._gone(client)

    def _on_dropped(self) -> None:
        self.connections -= 1

    def _on_ready(self) -> None:
        if not self.ready:
            self.ready = True
            if self.on_ready is not None:
                self.on_ready(self)

    def _on_sync(self, seq: int) -> None:
        self.send(link.encode(link.ACK, seq, link.ACK_OK, ""))

    def _on_return(self, left: int, topic: str) -> None:
        # what the worker had left (unused): every publish before this was read, so ours agrees
        grant = self.grants.pop(topic, None)
        if grant is not None:
            self.nsqd.keep_promise(grant.nbytes)

    def _on_state(self, client: RemoteClient, ready: int, paused: int, state: int) -> None:
        """RDY, CLS, or its writes paused or resumed: the state the worker's connection keeps,
        then RDY as one process runs it (the worker checked its bound already)."""
        client.paused = bool(paused)
        client.state = ClientState(state)
        commands.ready(client, ready, self.nsqd.options.max_rdy_count)

    def _on_fin(self, client: RemoteClient, msg_ids: list[bytes]) -> None:
        self._failed(client, "FIN", commands.finish(client, msg_ids))

    def _req(self, client: RemoteClient, reqs: list[tuple[bytes, float]]) -> None:
        self._failed(client, "REQ", commands.requeue(client, reqs))

    def _on_touch(self, client: RemoteClient, msg_id: bytes) -> None:
        self._failed(client, "TOUCH", commands.touch(client, msg_id))

    def _failed(self, client: RemoteClient, cmd: str, failed: Failures) -> None:
        """What could not be acknowledged: a FAILED record each, the worker answers its client."""
        for msg_id, why in failed:
            self.send(link.encode(link.FAILED, client.conn, cmd, msg_id, str(why)))

    def _gone(self, client: RemoteClient) -> None:
        if client.channel is not None:
            client.channel.remove_client(client)
            client.channel = None
        self.nsqd.remove_client(client.client_id)

    def _sub(self, seq: int, client: RemoteClient | None, topic: str, channel: str) -> None:
        if client is None:  # (counted and logged as unknown): the worker still hears
            self.send(link.encode(link.ACK, seq, link.ACK_FAILED, "unknown connection"))
            return
        try:
            outcome = commands.subscribe(self.nsqd, topic, channel, client)
        except Exception as e:  # a bug: logged, and the worker, waiting on this SUB, still hears
            self.log.failure("WORKER({index}): SUB {topic}:{channel} failed", index=self.index,
                             topic=topic, channel=channel)
            self.send(link.encode(link.ACK, seq, link.ACK_FAILED, str(e)))
            return
        if outcome is SUBSCRIBED:
            self.send(link.encode(link.ACK, seq, link.ACK_OK, ""))
        elif outcome is TOO_MANY:
            self.send(link.encode(link.ACK, seq, link.ACK_TOO_MANY, ""))
        else:  # the node's subscribe answers now: a refusal
            assert not isinstance(outcome, Deferred)
            self.send(link.encode(link.ACK, seq, link.ACK_FAILED, outcome.why))

    def _publish(self, seq: int, client: RemoteClient | None, defer_ms: int, topic: str,
                 bodies: list[bytes]) -> None:
        """nsqd's publish for a worker's client: the node's admission
        (:func:`~nsqtw.core.admission.admit`), as a V2 connection has it; the answer an ACK record."""
        outcome = admit(self.nsqd, topic, bodies, defer_ms / 1000.0, client)
        if outcome is PUBLISHED:
            self._grant(topic)  # first, so the worker's next publish finds it
            self.send(link.encode(link.ACK, seq, link.ACK_OK, ""))
        elif isinstance(outcome, Written):
            outcome.deferred.addBoth(self._answer, seq)
        elif isinstance(outcome, WaitForRoom):
            outcome.room.addBoth(self._when_room, seq, client, defer_ms, topic, bodies)
        else:
            self.send(link.encode(link.ACK, seq, link.ACK_FAILED, outcome.why))

    def _when_room(self, result: object, seq: int, client: RemoteClient | None, defer_ms: int,
                   topic: str, bodies: list[bytes]) -> None:
        room = settled(result)
        if isinstance(room, Failed):
            self.send(link.encode(link.ACK, seq, link.ACK_FAILED, room.why))
        else:
            self._publish(seq, client, defer_ms, topic, bodies)

    def _granted_pub(self, seq: int, client: RemoteClient | None, defer_ms: int, name: str,
                     bodies: list[bytes]) -> None:
        """A publish the worker answered already, under the topic's grant: published as one
        process would, without asking for room (it was promised). No answer: more credit once
        half the grant is used, one record for many publishes.

        Consecutive ones to the same topic in one read of the link are queued
        together, as one MPUB would be (:meth:`_publish_batch`): on a busy node
        a read holds many workers' clients' publishes, and one publish of many
        messages costs the topic a fraction of as many publishes of one.
        """
        count = len(bodies)
        nbytes = len(bodies[0]) if count == 1 else sum(map(len, bodies))
        grant = self.grants.get(name)
        low = True
        if grant is not None:
            used = min(nbytes, grant.nbytes)
            grant.nbytes -= used
            self.nsqd.keep_promise(used)
            low = not grant.revoked and 2 * grant.nbytes <= self.share
        if self._batch and (name != self._batch_topic or defer_ms != self._batch_defer):
            self._publish_batch()
        self._batch_topic, self._batch_defer = name, defer_ms
        self._batch.extend(bodies)
        self._batch_seqs.append(seq)
        if client is not None:
            client.pub_counts[name] = client.pub_counts.get(name, 0) + count
        if low:
            self._grant(name)

    def _publish_batch(self) -> None:
        """Queue the granted publishes gathered so far (see :meth:`_granted_pub`)."""
        bodies, seqs, name = self._batch, self._batch_seqs, self._batch_topic
        self._batch, self._batch_seqs = [], []
        try:
            queued = self.nsqd.publish(name, bodies, self._batch_defer / 1000.0)
        except (ExitingError, BackendError) as e:
            self._lost_publish(name, len(bodies), e)
            for seq in seqs:  # a worker still waiting for one (its link was backed up) hears why
                self.send(link.encode(link.ACK, seq, link.ACK_FAILED, str(e)))
            return
        if queued is not None:  # a batch queued a slice a turn
            queued.addErrback(lambda f: self._lost_publish(name, len(bodies), f.value))

    def _lost_publish(self, name: str, count: int, error: object) -> None:
        self.log.error("WORKER({index}): {count} message(s) answered under a grant to topic {topic} "
                       "could not be queued - {error}", index=self.index, count=count, topic=name, error=error)

    def _grant(self, name: str) -> None:
        """Top up this worker's grant for the topic as far as the node promises, and send it;
        past :data:`GRANTED_TOPICS`, ask for the least recently topped-up one back."""
        if self.closed:
            return
        grant = self.grants.pop(name, None)
        if grant is None:
            grant = Grant()
            active = [n for n, g in self.grants.items() if not g.revoked]
            if len(active) >= GRANTED_TOPICS:
                oldest = active[0]
                self.grants[oldest].revoked = True
                self.send(link.encode(link.REVOKE, 0, oldest))
        self.grants[name] = grant  # last: the most recently used
        want = self.share - grant.nbytes
        give = self.nsqd.promise(name, want) if want > 0 and not grant.revoked else 0
        if give:
            grant.nbytes += give
            self.send(link.encode(link.GRANT, give, name))
        elif not grant.nbytes and not grant.revoked:
            del self.grants[name]

    def _answer(self, result: object, seq: int) -> None:
        written = settled(result)
        if isinstance(written, Failed):
            status = link.ACK_FAILED if written.fatal else link.ACK_NO_REPLICA
            self.send(link.encode(link.ACK, seq, status, written.why))
        else:
            self.send(link.encode(link.ACK, seq, link.ACK_OK, ""))

    def lost(self, reason: Failure) -> None:
        """The worker is gone (exited, killed): its clients are too; what they held in flight
        goes back to their channels, and what its grants held is free again."""
        self.closed = True
        clients = list(self.clients.values())
        self.clients.clear()
        for client in clients:
            self._gone(client)
        grants, self.grants = self.grants, {}
        self.nsqd.keep_promise(sum(g.nbytes for g in grants.values()))

    def _read_done(self) -> None:
        if self._batch:
            self._publish_batch()

    def _link_lost(self, reason: Failure) -> None:
        # (nothing gathered is left: each read's batch was queued as that read ended)
        self.lost(reason)
        if not self.done.called:
            self.done.callback(None)
