"""NSQD: the registry of topics and clients, and the one publish path."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any, Protocol

from twisted.internet.defer import Deferred, DeferredList
from twisted.internet.interfaces import IReactorTime
from zope.interface import implementer

from nsqtw.core.channel import Channel
from nsqtw.core.delivery import BufferedDelivery
from nsqtw.core.guid import GUIDFactory
from nsqtw.core.memory import EphemeralBackend, MemoryBackend
from nsqtw.core.topic import Topic
from nsqtw.core.unwritten import DEFAULT_MAX_UNWRITTEN, UnwrittenBytes
from nsqtw.errors import ExitingError
from nsqtw.heap import thaw
from nsqtw.interfaces import IAuthorizer, IBackendQueue, IDeliveryMode, IReplication, ITopicOwner
from nsqtw.log import Logger, set_level
from nsqtw.names import backend_name, is_ephemeral
from nsqtw.observe.quantile import Quantile


class _Options(Protocol):
    node_id: int
    mem_queue_size: int
    max_msg_timeout: float
    max_channel_consumers: int


class IRegistryListener(Protocol):
    """Told about topics and channels coming and going (lookupd, metadata)."""

    def topic_created(self, topic: Topic) -> None: ...
    def topic_deleted(self, topic: Topic) -> None: ...
    def channel_created(self, topic: Topic, channel: Channel) -> None: ...
    def channel_deleted(self, topic: Topic, channel: Channel) -> None: ...


BackendFactory = Callable[[str], IBackendQueue]

#: the most messages of one batch :meth:`NSQD.publish` queues in one reactor turn (a few ms)
PUBLISH_SLICE = 4096


@implementer(ITopicOwner)
class NSQD:
    """Everything one nsqd node holds: topics, channels and connected clients."""

    log = Logger()

    def __init__(self, options: Any, clock: IReactorTime,
                 backend_factory: BackendFactory | None = None,
                 mode: IDeliveryMode | None = None) -> None:
        self.options = options
        self.clock = clock
        self.guid = GUIDFactory(options.node_id, clock)
        self.topics: dict[str, Topic] = {}
        self.clients: dict[int, Any] = {}
        self.listeners: list[IRegistryListener] = []
        self.start_time_precise = clock.seconds()
        self.start_time = int(self.start_time_precise)
        self._backend_factory = backend_factory or MemoryBackend
        #: how messages reach disk and move between topics and channels (nsqd's own by default)
        self.mode: IDeliveryMode = mode or BufferedDelivery(options.sync_every)
        self._client_ids = itertools.count(1)
        self._errors: dict[str, str] = {}
        #: the queues and journals failing now, as they report it (IBackendQueue.watch_health)
        self._storage_errors: dict[object, str] = {}
        self.exiting = False
        self.loading = False
        #: batches being published a slice per reactor turn (:meth:`publish`)
        self.sliced_publishes: set[SlicedPublish] = set()
        #: corrupt segments its disk queues set aside since the start (:meth:`count_set_aside`)
        self._set_aside = 0
        #: bytes waiting in memory for the disk over all the node's disk queues (the node-wide bound)
        self.unwritten = UnwrittenBytes(int(getattr(options, "max_unwritten_bytes", DEFAULT_MAX_UNWRITTEN)))
        #: run-time settings PUT /config can change
        self.runtime_log_level: str = str(getattr(options, "log_level", "info")).lower()
        self.runtime_lookupd_tcp_addresses: list[str] | None = list(
            getattr(options, "lookupd_tcp_address", ()))
        #: called with the option's name after PUT /config changed it (lookupd connections)
        self.config_listeners: list[Callable[[str], None]] = []
        #: told (via ``changed()``) whenever nsqd.dat needs rewriting
        self.metadata: Any = None
        #: the bound ports, filled in by the listeners (port 0 means "pick one")
        self.tcp_port = 0
        self.http_port = 0
        self.https_port = 0
        #: the server TLS context (``--tls-cert``/``--tls-key``), None without
        self.tls: Any = None
        #: the IAuthorizer asked about AUTH secrets (``--auth-http-address``), None without
        self.auth: IAuthorizer | None = None
        #: ``--replicas=2``: told of every publish and FIN (nsqtw.replica), None without
        self.replication: IReplication | None = None

    # -- health -----------------------------------------------------------

    def set_health(self, source: str, error: str | None, quiet: bool = False) -> None:
        """Record (or clear) a failure that /ping and /stats should report; ``quiet``: no log
        line (a state expected at start, such as worker processes starting)."""
        if error is None:
            if self._errors.pop(source, None) is not None and not quiet:
                self.log.info("NSQ: health restored ({source})", source=source)
        elif self._errors.get(source) != error:
            self._errors[source] = error
            if not quiet:
                self.log.error("NSQ: unhealthy ({source}) - {error}", source=source, error=error)

    def storage_health(self, source: object, error: str | None) -> None:
        """A disk queue or journal's failure began (``error``) or ended (``None``)."""
        if error is None:
            self._storage_errors.pop(source, None)
        else:
            self._storage_errors[source] = error

    def health(self) -> str:
        """"OK", or nsqd's "NOK - <error>".

        O(1) in the number of topics and channels: the queues report their
        failures as they begin and end (:meth:`storage_health`), so a ``/ping``
        on a node with 10,000 channels does not ask each of them (it took
        18 ms of the reactor when it did).
        """
        if self._errors:
            return "NOK - " + next(iter(self._errors.values()))
        if self._storage_errors:
            return "NOK - " + next(iter(self._storage_errors.values()))
        return "OK"

    def is_healthy(self) -> bool:
        return not (self._errors or self._storage_errors)

    # -- clients ----------------------------------------------------------

    def new_client_id(self) -> int:
        return next(self._client_ids)

    def add_client(self, client_id: int, client: Any) -> None:
        self.clients[client_id] = client

    def remove_client(self, client_id: int) -> None:
        self.clients.pop(client_id, None)

    # -- topics and channels ----------------------------------------------

    def make_backend(self, name: str, ephemeral: bool) -> IBackendQueue:
        backend: IBackendQueue = EphemeralBackend(name) if ephemeral else self._backend_factory(name)
        backend.watch_health(self.storage_health)
        return backend

    def get_topic(self, name: str) -> Topic:
        """The topic of that name, created (and announced) if new."""
        topic = self.topics.get(name)
        if topic is None:
            ephemeral = is_ephemeral(name)
            backend = self.make_backend(backend_name(name), ephemeral)
            topic = Topic(self, name, backend, self.clock, self.mode)
            self.topics[name] = topic
            self.log.info("TOPIC({topic}): created", topic=name)
            for listener in self.listeners:
                listener.topic_created(topic)
            self.metadata_changed()
        return topic

    def config_changed(self, name: str) -> None:
        """PUT /config/<name> changed a run-time setting."""
        if name == "log_level":
            set_level(self.runtime_log_level)
        for listener in list(self.config_listeners):
            listener(name)

    def state_changed(self) -> None:
        """A topic or channel was paused or unpaused."""
        self.metadata_changed()

    def metadata_changed(self) -> None:
        """A topic or channel was created, deleted, paused or unpaused."""
        if self.metadata is not None and not self.loading:
            self.metadata.changed()

    def load(self, entries: list[dict[str, Any]]) -> None:
        """Recreate topics and channels (and their paused states) from nsqd.dat."""
        self.loading = True
        try:
            for t in entries:
                topic = self.get_topic(t["name"])
                if t["paused"]:
                    topic.pause()
                for c in t["channels"]:
                    channel = topic.get_channel(c["name"])
                    if c["paused"]:
                        channel.pause()
        finally:
            self.loading = False

    def deferred_due(self) -> dict[str, dict[bytes, float]]:
        """Due times of every durable channel's deferred messages (kept across restarts)."""
        out = {}
        for topic in self.topics.values():
            if not topic.ephemeral:
                tdue = topic.deferred_due()
                if tdue:
                    out[backend_name(topic.name)] = tdue
            for channel in topic.channels.values():
                if not channel.ephemeral and not topic.ephemeral:
                    due = channel.deferred_due()
                    if due:
                        out[backend_name(topic.name, channel.name)] = due
        return out

    def restore_deferred(self, due: dict[str, dict[bytes, float]]) -> None:
        for topic in self.topics.values():
            ids = due.get(backend_name(topic.name))
            if ids:
                topic.restored_due = ids
            for channel in topic.channels.values():
                ids = due.get(backend_name(topic.name, channel.name))
                if ids:
                    channel.restored_due = ids

    def segments_set_aside(self) -> int:
        """Corrupt segments the node's disk queues renamed to ``.bad`` since it started (those of
        topics and channels deleted since too): kept as they are counted, so a ``/stats`` of one
        channel of a topic with thousands costs no walk over all of them."""
        return self._set_aside

    def count_set_aside(self, segments: int) -> None:
        """A disk queue renamed ``segments`` corrupt segments to ``.bad``."""
        self._set_aside += segments

    def backends(self) -> list[IBackendQueue]:
        out = []
        for topic in self.topics.values():
            out.append(topic.backend)
            out.extend(c.backend for c in topic.channels.values())
        return out

    def get_existing_topic(self, name: str) -> Topic | None:
        return self.topics.get(name)

    def make_channel(self, topic: Topic, name: str) -> Channel:
        o = self.options
        bname = backend_name(topic.name, name)
        ephemeral = topic.ephemeral or is_ephemeral(name)
        backend = self.make_backend(bname, ephemeral)
        channel = Channel(topic, name, backend, self.clock, o.mem_queue_size,
                          o.max_msg_timeout, o.max_channel_consumers, self.mode)
        if not ephemeral:
            channel.replication = self.replication
        percentiles = o.e2e_processing_latency_percentile
        if percentiles:
            channel.e2e = Quantile(o.e2e_processing_latency_window_time, percentiles,
                                   self.clock.seconds())
        return channel

    def channel_created(self, topic: Topic, channel: Channel) -> None:
        for listener in self.listeners:
            listener.channel_created(topic, channel)
        self.metadata_changed()

    def channel_deleted(self, topic: Topic, channel: Channel) -> None:
        thaw()  # its cycles may have been frozen at start
        for listener in self.listeners:
            listener.channel_deleted(topic, channel)
        self.metadata_changed()

    def delete_topic(self, name: str) -> Deferred[Any]:
        """Remove a topic with its channels and data; raises KeyError when there is none."""
        topic = self.topics.pop(name)
        thaw()  # its cycles may have been frozen at start
        self.log.info("TOPIC({topic}): deleting", topic=name)
        d = topic.delete()
        for listener in self.listeners:
            listener.topic_deleted(topic)
        self.metadata_changed()
        return d

    def topic_unused(self, topic: Topic) -> None:
        """An ephemeral topic lost its last channel: delete it, as nsqd does."""
        if self.topics.get(topic.name) is topic:
            self.delete_topic(topic.name).addErrback(
                lambda f: self.log.failure("TOPIC({topic}): delete failed", f, topic=topic.name))

    def subscribe(self, topic: str, channel: str, client: Any) -> Channel:
        """``client``'s SUB: the channel (made if new) with it added; ValueError past
        ``--max-channel-consumers``."""
        subscription = self.get_topic(topic).get_channel(channel)
        subscription.add_client(client)
        return subscription

    # -- publishing -------------------------------------------------------

    def wait_for_room(self, topic_name: str) -> Deferred[None] | None:
        """None when a publish to that topic may be accepted now, else what to wait on first.

        The one admission rule for TCP and HTTP publishers, checked before
        the data is accepted: the node's unwritten bytes under
        ``--max-unwritten-bytes`` (:class:`UnwrittenBytes`) and the topic's own
        backlog under its bound (:meth:`Topic.has_room`). Past either a TCP
        publisher is not read meanwhile, an HTTP one is answered when there
        is room or 503 after a bound. When the Deferred fires, ask again:
        another publisher may have taken the room. Raises ExitingError.
        """
        if self.exiting:
            raise ExitingError()
        if self.unwritten.over():
            return self.unwritten.when_under()
        topic = self.get_topic(topic_name)
        if topic.has_room():
            return None
        return topic.wait_for_room()

    def promise(self, topic_name: str, nbytes: int) -> int:
        """Promise a worker process that publishes of up to ``nbytes`` to that topic will be
        taken, unasked; how many bytes were promised (``nbytes`` or 0).

        A promise is given where one process would answer a publish at once
        (:meth:`Topic.takes_promises`) and the node's unwritten bytes are
        under ``--max-unwritten-bytes``; the promised bytes count there until
        :meth:`keep_promise` (docs/architecture.md, "Publishes answered by the
        worker"), so what the workers may publish unasked is bounded with
        everything else that waits for a disk.
        """
        topic = self.topics.get(topic_name)
        if (self.exiting or topic is None or not topic.takes_promises() or self.unwritten.over()
                or (self.replication is not None and not topic.ephemeral)):
            return 0  # (a replicated publish is answered once its copy is acked: never unasked)
        self.unwritten.add(nbytes)
        return nbytes

    def keep_promise(self, nbytes: int) -> None:
        """Promised bytes used (their publish arrived) or given back."""
        self.unwritten.remove(nbytes)

    def publish(self, topic_name: str, bodies: list[bytes], defer: float = 0.0,
                client: object = None) -> Deferred[None] | None:
        """The one publish path for TCP and HTTP: new IDs, timestamps, queue.

        ``client``, the publishing connection, is not needed here (a
        connection counts its own publishes); a worker's node, which
        stands in for this one, sends it to the core that counts them.

        Raises ExitingError or BackendError (the caller turns them into
        E_PUB_FAILED or a 500). Returns None when the messages are queued in
        memory, or a Deferred that fires once the ones that went to disk are
        written: answer the publisher only then, as nsqd does.

        A batch of more than :data:`PUBLISH_SLICE` messages (a 5 MB ``/mpub``
        of one-byte lines holds 2.6 million) is queued that many per reactor
        turn, so the node serves everyone else in between; the Deferred
        returned fires once all of it is queued (:class:`SlicedPublish`).
        """
        topic = self.get_topic(topic_name)
        if len(bodies) > PUBLISH_SLICE:
            return SlicedPublish(self, topic, bodies, defer).start()
        return self._queue(topic, bodies, defer)

    def _queue(self, topic: Topic, bodies: list[bytes], defer: float) -> Deferred[None] | None:
        now_ns = int(self.clock.seconds() * 1e9)
        # PUB, DPUB, an MPUB of one: one value, without the range
        values = (self.guid.new_value(),) if len(bodies) == 1 else self.guid.new_values(len(bodies))
        written = topic.publish(values, bodies, now_ns, defer)
        replication = self.replication
        if replication is None or topic.ephemeral:
            return written
        # --replicas=2: answered once queued here (and written, when the mode waits for that)
        # and held by a peer; the copy travels while this node writes its own
        copied: Deferred[None] = replication.published(topic.name, values, bodies, now_ns, defer)
        if written is None:
            return copied
        return all_of([written, copied])

    # -- shutdown ---------------------------------------------------------

    def close(self) -> Deferred[Any]:
        """Flush every topic and channel to its backend and close them.

        A batch still being published in slices is first queued whole, so
        what the flush writes holds all of it or (had it not begun) none.
        """
        for batch in list(self.sliced_publishes):
            batch.finish_now()
        self.exiting = True
        self.unwritten.release_waiters()  # publishers waiting for room ask again: ExitingError
        for client in list(self.clients.values()):
            client.close()
        return DeferredList([t.close() for t in list(self.topics.values())], consumeErrors=True)


def all_of(waits: list[Deferred[None]]) -> Deferred[None]:
    """Fires with None once every one of ``waits`` has fired; fails at once with the first failure
    (itself, not DeferredList's FirstError wrapping it)."""
    out: Deferred[None] = DeferredList(waits, fireOnOneErrback=True, consumeErrors=True)  # type: ignore[assignment]
    return out.addCallbacks(lambda _: None, lambda f: f.value.subFailure)


class SlicedPublish:
    """One huge batch queued :data:`PUBLISH_SLICE` messages per reactor turn, into one topic.

    All of it goes to the topic it started with: a topic deleted meanwhile
    refuses the rest (ExitingError), so nothing of the batch stays anywhere.
    When the node starts to close, :meth:`finish_now` queues the rest at
    once, before the flush. A backend that fails part way leaves the part
    before it queued, as nsqd's ``PutMessages`` does.
    """

    def __init__(self, nsqd: NSQD, topic: Topic, bodies: list[bytes], defer: float) -> None:
        self.nsqd = nsqd
        self.topic = topic
        self.bodies = bodies
        self.defer = defer
        self.done: Deferred[None] = Deferred()
        self._next = 0
        self._written: list[Deferred[None]] = []
        self._call: Any = None

    def start(self) -> Deferred[None]:
        """Queue the first slice now (its ExitingError or BackendError is raised), the rest later."""
        first = self.nsqd._queue(self.topic, self.bodies[:PUBLISH_SLICE], self.defer)
        if first is not None:
            self._written.append(first)
        self._next = PUBLISH_SLICE
        self.nsqd.sliced_publishes.add(self)
        self._call = self.nsqd.clock.callLater(0, self._turn)
        return self.done

    def finish_now(self) -> None:
        """Queue everything left in this turn."""
        if self._call is not None and self._call.active():
            self._call.cancel()
        self._slice(len(self.bodies))

    def _turn(self) -> None:
        self._call = None
        self._slice(PUBLISH_SLICE)

    def _slice(self, count: int) -> None:
        start = self._next
        bodies = self.bodies
        end = min(len(bodies), start + count)
        self._next = end
        try:
            written = self.nsqd._queue(self.topic, bodies[start:end], self.defer)
        except Exception:  # noqa: BLE001 - ExitingError, BackendError: the publisher's error
            self.nsqd.sliced_publishes.discard(self)
            self.done.errback()
            return
        if written is not None:
            self._written.append(written)
        if end < len(bodies):
            self._call = self.nsqd.clock.callLater(0, self._turn)
            return
        self.nsqd.sliced_publishes.discard(self)
        self.bodies = []
        if not self._written:
            self.done.callback(None)
            return
        all_of(self._written).addCallbacks(self.done.callback, self.done.errback)
