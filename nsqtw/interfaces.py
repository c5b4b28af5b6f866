"""The zope interfaces at nsqtw's seams.

This module imports nothing of nsqtw, so every layer can import it. Where a
method takes or returns one of nsqtw's own objects (a topic, a channel, a
message, an auth answer), the signature says ``Any`` and the docstring
names the class; the implementations declare the real type.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

from twisted.internet.defer import Deferred
from zope.interface import Attribute, Interface

T = TypeVar("T")

#: an opaque token for "every record read so far" (epoch, total read, file number, position)
ReadMark = tuple[int, int, int, int]

#: a topic's or channel's disk queue position: (file number, offset past a record)
Position = tuple[int, int]


class IBackendQueue(Interface):
    """Where a topic or channel keeps messages past ``--mem-queue-size``.

    Records are opaque bytes (nsqd's disk encoding of a message). Every method
    is called on the reactor thread and none of them blocks: implementations
    that touch files do so on their own ordered disk thread.
    """

    name = Attribute("The backend's name: ``topic`` or ``topic:channel``.")

    def put(data: bytes) -> None:
        """Append one record.

        Raises :class:`nsqtw.errors.BackendError` when the queue cannot take
        writes (closed, or a record of an invalid size); a write accepted
        here is handed to the disk thread in order with every other write.
        While the disk fails, records are still taken: they wait in memory
        and are written, in order, once it accepts again (``health()`` says
        why meanwhile). Callers bound that memory by asking ``backlog()``
        before they put (:func:`nsqtw.core.handoff.is_behind`).
        """

    def put_many(records: Sequence[bytes]) -> None:
        """Append several records (one write for the whole batch)."""

    def written() -> Deferred[None]:
        """A Deferred that fires once every record put so far is written.

        Written means handed to the operating system (``write()`` returned),
        so a killed process cannot lose it. Errbacks with BackendError if the
        write failed (the records stay queued and are retried).
        """

    def backlog() -> int:
        """Records put and not yet written (what a crash would lose)."""

    def backlog_bytes() -> int:
        """Bytes of those records: what they hold in memory until written."""

    def read(max_count: int) -> list[bytes]:
        """Return up to ``max_count`` records available right now, oldest first.

        Returns an empty list when nothing is ready; never blocks. A record
        returned here is removed from the queue (and from ``depth()``).
        """

    def set_readable_callback(callback: Callable[[], None]) -> None:
        """Register a zero-argument callable called when records become readable.

        It is called on the reactor thread whenever new records may be
        available after ``read`` returned fewer than were asked for.
        """

    def depth() -> int:
        """Number of records written and not yet returned by ``read``."""

    def empty() -> Deferred[None]:
        """Drop every record; returns a Deferred that fires when done."""

    def delete() -> Deferred[None]:
        """Drop every record and remove the queue's files; returns a Deferred."""

    def close() -> Deferred[None]:
        """Flush, sync and persist metadata, then stop; returns a Deferred."""

    def health() -> str | None:
        """``None`` when healthy, else a short text saying what failed."""

    def watch_health(listener: Callable[[object, str | None], None]) -> None:
        """Call ``listener(self, health())`` each time :meth:`health` changes (and with
        ``None`` when the queue is deleted), so the node knows its failures without asking
        every queue on each ``/ping``."""


class IDurableBackendQueue(IBackendQueue):
    """A backend for ``--durable-delivery``: written means fsynced, and reads
    are consumed on disk only when the reader commits them.

    A record handed out by ``read_positions`` is still where a restart finds
    it until ``commit_read`` covers it, so the reader can first make it safe
    elsewhere (a channel's queue, a channel's journal).
    """

    write_error = Attribute("Why writes fail right now (puts wait in memory for the retry), or ``None``.")

    def read_positions(max_count: int) -> list[tuple[bytes, int, int]]:
        """Up to ``max_count`` records as ``(data, file_num, end_pos)``, oldest first."""

    def read_mark() -> ReadMark | None:
        """An opaque mark covering every record ``read_positions`` returned so far (or None)."""

    def commit_read(mark: ReadMark | None) -> None:
        """Let the persisted read position move past the records ``mark`` covers."""


class IDiskExecutor(Interface):
    """Runs functions one at a time, in submission order, off the reactor thread."""

    def submit(fn: Callable[..., T], *args: object) -> Deferred[T]:
        """Run ``fn(*args)``; the Deferred fires on the reactor thread with its result.

        A ``Reply`` (nsqtw/storage/executor.py) returned by ``fn`` fires the
        Deferred with its value, then its ``after()`` runs before the next job.
        """

    def stop() -> None:
        """Stop accepting work; jobs already queued still run."""


class ITopicDelivery(Interface):
    """What one topic's delivery mode answers; the topic's own pump asks (a delivery mode).

    nsqd's own behaviour, ``--sync-every=1``'s commit-after-write and
    ``--durable-delivery`` differ exactly here. The topic reads its queue and
    hands each batch to its channels itself (``nsqtw.core.topic.Topic.distribute``);
    the mode answers in plain values and never drives the topic.
    """

    mem_queue_size = Attribute("int: messages the topic keeps in memory before it writes to its backend.")
    wait_for_write = Attribute("bool: whether a publisher whose messages went to the backend waits for the write.")
    commit_after_handoff = Attribute(
        "bool: whether the topic's read position may pass a batch only once every channel has it safe"
        " (the backend must then be an IDurableBackendQueue).")

    def published(delayed: list[Any], written: Deferred[None]) -> Deferred[None]:
        """Some of a publish went to the backend; returns what its publisher waits on (``written`` or later).

        ``delayed``: those of them (``nsqtw.core.message.Message``) with a
        DPUB delay (``Message.deadline``), which a record has no field for;
        usually none.
        """

    def dues() -> Mapping[bytes, float]:
        """Due times (unix seconds) the mode keeps for DPUB messages in the topic's queue, by ID."""

    def committed(due_ids: list[bytes]) -> None:
        """The topic's read position passed these DPUB messages: the mode may forget their due times."""

    def health() -> str | None:
        """``None``, or what is failing in this mode's own files."""

    def close() -> Deferred[object]:
        """The topic stopped gracefully and its backend closed: this mode's own files are done with."""

    def delete() -> Deferred[object]:
        """Remove this mode's own files for the topic (the backend is deleted by the topic)."""


class IChannelDelivery(Interface):
    """What one channel's delivery mode answers; the channel's own pump asks (a delivery mode).

    The channel reads its queue and hands messages to its clients itself
    (``nsqtw.core.channel.Channel.next_messages``); the mode says which
    records come next and records what leaves the queue.
    """

    mem_queue_size = Attribute("int: messages the channel keeps in memory before it writes to its backend.")
    journaled = Attribute(
        "bool: whether the topic hands this channel its batches straight into its disk queue"
        " (``nsqtw.core.handoff.put_journaled``) and waits for each, instead of through ``Channel.put_many``.")
    handoff_floor = Attribute(
        "The topic's queue position up to which its records reached this channel before a restart, or None.")

    def restored() -> list[tuple[Any, float]]:
        """Messages (``nsqtw.core.message.Message``) kept across a crash, each with its due time (0: now)."""

    def refuses_handoff() -> bool:
        """Whether the topic must wait before handing this channel more (the mode's files failing or behind)."""

    def handed_off(pos: Position) -> None:
        """The topic's records up to ``pos`` are safe in the channel's queue: record it."""

    def synced() -> Deferred[None]:
        """Fires once everything the mode recorded so far is on disk."""

    def may_take() -> bool:
        """Whether messages may leave the queue now (if not, the mode wakes the channel when they may)."""

    def read(n: int) -> list[bytes]:
        """Up to ``n`` more records from the channel's backend, oldest first."""

    def owns(msg_id: bytes) -> bool:
        """Whether the mode already holds a message of that ID (a copy handed over twice around a crash)."""

    def taking(msgs: list[Any]) -> None:
        """These messages leave the queue for delivery (record them before they go)."""

    def deferred(msg: Any, when: float) -> None:
        """``msg`` waits until ``when`` (DPUB, REQ with a delay)."""

    def finished(msg_ids: list[bytes]) -> None:
        """These in-flight messages were FINed."""

    def emptied() -> None:
        """The channel was emptied."""

    def health() -> str | None:
        """``None``, or what is failing in this mode's own files."""

    def flushed() -> None:
        """A graceful stop put every message the channel held back into its queue."""

    def close(keep: bool) -> Deferred[None]:
        """The channel's queue is closed: this mode's own files are done with (``keep``: something
        failed, keep them for the next start)."""

    def delete() -> None:
        """The channel is deleted: drop this mode's own files."""


class IDeliveryMode(Interface):
    """Makes each topic's and channel's delivery mode (one object per node)."""

    def for_topic(topic: Any) -> ITopicDelivery:
        """The mode of a new ``nsqtw.core.topic.Topic`` (its backend is already set)."""

    def for_channel(channel: Any) -> IChannelDelivery:
        """The mode of a new ``nsqtw.core.channel.Channel`` (its backend is already set)."""


class IPauseOwner(Interface):
    """What holds something that can be paused (a topic's node, a channel's topic)."""

    def state_changed() -> None:
        """A topic or channel was paused or unpaused (metadata to persist)."""


class ITopicOwner(IPauseOwner):
    """What a topic reports to, and asks of, the registry that holds it (NSQD)."""

    options = Attribute("The node's options.")
    unwritten = Attribute("The node's UnwrittenBytes: hand-offs wait while it is over its bound.")

    def make_channel(topic: Any, name: str) -> Any:
        """A new ``nsqtw.core.channel.Channel`` of ``topic`` with its backend and delivery mode."""

    def channel_created(topic: Any, channel: Any) -> None:
        """``channel`` was added to ``topic``."""

    def channel_deleted(topic: Any, channel: Any) -> None:
        """``channel`` was removed from ``topic``."""

    def topic_unused(topic: Any) -> None:
        """An ephemeral topic lost its last channel: the owner deletes it."""


class IChannelOwner(IPauseOwner):
    """What a channel reports to its topic (``state_changed``: the channel was paused or unpaused)."""

    name = Attribute("The topic's name.")
    exiting = Attribute("Whether the topic is closing.")

    def channel_unused(channel: Any) -> None:
        """An ephemeral channel lost its last client: the topic deletes it."""

    def depth() -> int:
        """Messages the topic holds, not yet copied to its channels."""


class IReplication(Interface):
    """What the core tells replication (``--replicas=2``; ``NSQD.replication`` is None without)."""

    def published(topic: str, values: Any, bodies: list[bytes], timestamp: int, delay: float) -> Any:
        """Messages just queued on a topic that is not ``#ephemeral`` (their ID values, bodies,
        timestamp in ns and DPUB delay): a Deferred that fires once a peer holds their copy, or
        fails with ``nsqtw.errors.ReplicaError`` after ``--replica-wait``."""

    def finished(topic: str, channel: str, ids: list[bytes]) -> None:
        """Messages finished on a channel (FIN)."""

    def channel_emptied(topic: str, channel: str | None) -> None:
        """A channel (or, with None, the topic) was emptied."""

    def info(replica: str | None = None, owner: str | None = None) -> dict[str, Any]:
        """``GET /replication``'s answer (with ``replica``: the topics placed on that node too; with
        ``owner``: the notes kept for that node)."""

    def upgrade(head: bytes) -> tuple[Any, list[bytes]]:
        """For an HTTP request's ``head`` that asks for a replication link: the maker of the link's
        protocol for the transport, once the ``101`` is written, and that answer's extra header lines."""

    def topic_stats(topic: str) -> dict[str, Any]:
        """``/stats``'s ``replica`` of a topic."""

    def node_stats() -> dict[str, Any]:
        """``/stats``'s node-level replication fields."""

    def recover() -> Any:
        """Before the node serves (its topics loaded): the replication logs a previous process left,
        read back; a coroutine."""

    def closed() -> Any:
        """After the node closed (nothing more is published or finished): what a clean stop writes
        for the next start to read back; a coroutine."""


class IConsumer(Interface):
    """What a channel needs from a subscribed client to deliver messages."""

    client_id = Attribute("A unique integer per connection (nsqd's client ID).")
    msg_timeout = Attribute("Seconds a delivered message stays in flight.")
    sample_rate = Attribute("Percentage (1-99) of messages to send, 0 for all (IDENTIFY sample_rate).")

    def ready_capacity() -> int:
        """How many more messages the client can take now (RDY minus in flight; 0 when paused)."""

    def deliver(messages: list[Any]) -> None:
        """Send these messages (``nsqtw.core.message.Message``, already marked in flight) to the client."""

    def messages_finished(count: int) -> None:
        """``count`` of this client's in-flight messages were FINed (a run of FINs, counted once)."""

    def message_requeued() -> None:
        """One of this client's in-flight messages was requeued by REQ."""

    def message_timed_out() -> None:
        """One of this client's in-flight messages timed out."""

    def in_flight_emptied() -> None:
        """The channel was emptied: none of this client's messages is in flight any more."""

    def channel_deleted() -> None:
        """The channel was deleted under this client (nsqd closes the connection)."""


class IStreamCodec(Interface):
    """One direction pair of a negotiated stream compression (snappy, deflate).

    Outgoing bytes are encoded whole, so the peer can decode each write as
    soon as it arrives; incoming bytes are buffered by ``feed`` and handed
    out by ``read`` in bounded pieces, so a small compressed input never
    turns into an unbounded allocation.
    """

    name = Attribute("The feature's name in IDENTIFY: ``snappy`` or ``deflate``.")

    def encode(data: bytes) -> bytes:
        """Compress ``data`` into bytes the peer can decode completely."""

    def feed(data: bytes) -> None:
        """Buffer compressed bytes received from the peer."""

    def read() -> bytes:
        """Return some decoded bytes (at most 64 KiB), or ``b""`` until more arrive.

        Raises :class:`nsqtw.protocol.compress.CodecError` on corrupt input.
        """


class IAuthorizer(Interface):
    """Answers an AUTH secret with the client's authorizations (nsqd's auth server client)."""

    def query(remote_ip: str, tls: bool, secret: str, common_name: str) -> Deferred[Any]:
        """A Deferred firing with an :class:`nsqtw.protocol.auth.AuthState`, or failing with the reason."""


class IConnectionDelegate(Interface):
    """What a client connection (``nsqtw.client.conn``) reports to the producer or consumer that owns it.

    The connection does the handshake, answers heartbeats and splits frames;
    what a response, an error or a message means is up to its owner.
    """

    def on_response(conn: object, data: bytes) -> None:
        """A response frame other than a heartbeat (``OK``, ``CLOSE_WAIT``)."""

    def on_error(conn: object, data: bytes) -> None:
        """An error frame (``E_BAD_TOPIC ...``)."""

    def on_message(conn: object, data: bytes) -> None:
        """A MESSAGE frame's data (timestamp, attempts, ID, body)."""

    def on_close(conn: object, reason: Exception) -> None:
        """A connection that had completed its handshake is gone."""


class IHTTPAPI(Interface):
    """What an HTTP listener's connections and requests ask of the API they serve
    (``nsqtw.http.base.GoHTTPAPI``): its direct routes, its TLS rule, its body limits, its resource."""

    direct_routes = Attribute("GET paths answered ahead of Klein: path bytes -> handler method name")
    tls_enabled = Attribute("True on an HTTPS listener")
    tls_required = Attribute("True when nsqd's --tls-required refuses plain HTTP")

    def body_limit(target: bytes) -> int:
        """How many body bytes a request to ``target`` may keep."""

    def resource() -> Any:
        """The twisted.web resource requests are rendered by (an ``IResource``)."""

