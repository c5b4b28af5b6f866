"""The zope interfaces at nsqtw's seams."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, TypeVar

from twisted.internet.defer import Deferred
from zope.interface import Attribute, Interface

T = TypeVar("T")

#: an opaque token for "every record read so far" (epoch, total read, file number, position)
ReadMark = tuple[int, int, int, int]

if TYPE_CHECKING:
    from nsqtw.core.message import Message
    from nsqtw.protocol.auth import AuthState


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
        writes (closed, or the disk failed); a write accepted here is handed
        to the disk thread in order with every other write.
        """

    def put_many(records: Sequence[bytes]) -> None:
        """Append several records (one write for the whole batch)."""

    def written() -> Deferred[None]:
        """A Deferred that fires once every record put so far is written.

        Written means handed to the operating system (``write()`` returned),
        so a killed process cannot lose it. Errbacks with BackendError if the
        write failed.
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


class IDurableBackendQueue(IBackendQueue):
    """A backend for ``--durable-delivery``: written means fsynced, and reads
    are consumed on disk only when the reader commits them.

    A record handed out by ``read_positions`` is still where a restart finds
    it until ``commit_read`` covers it, so the reader can first make it safe
    elsewhere (a channel's queue, a channel's journal).
    """

    write_error = Attribute("Why writes are refused right now, or ``None``.")

    def read_positions(max_count: int) -> list[tuple[bytes, int, int]]:
        """Up to ``max_count`` records as ``(data, file_num, end_pos)``, oldest first."""

    def read_mark() -> ReadMark | None:
        """An opaque mark covering every record ``read_positions`` returned so far (or None)."""

    def commit_read(mark: ReadMark | None) -> None:
        """Let the persisted read position move past the records ``mark`` covers."""


class IDiskExecutor(Interface):
    """Runs functions one at a time, in submission order, off the reactor thread."""

    def submit(fn: Callable[..., T], *args: object) -> Deferred[T]:
        """Run ``fn(*args)``; the Deferred fires on the reactor thread with its result."""

    def stop() -> None:
        """Stop accepting work; jobs already queued still run."""


class IConsumer(Interface):
    """What a channel needs from a subscribed client to deliver messages."""

    client_id = Attribute("A unique integer per connection (nsqd's client ID).")
    msg_timeout = Attribute("Seconds a delivered message stays in flight.")
    sample_rate = Attribute("Percentage (1-99) of messages to send, 0 for all (IDENTIFY sample_rate).")

    def ready_capacity() -> int:
        """How many more messages the client can take now (RDY minus in flight; 0 when paused)."""

    def deliver(messages: list[Message]) -> None:
        """Send these messages (already marked in flight) to the client."""

    def message_finished() -> None:
        """One of this client's in-flight messages was FINed."""

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

    def query(remote_ip: str, tls: bool, secret: str, common_name: str) -> Deferred[AuthState]:
        """A Deferred firing with an :class:`nsqtw.protocol.auth.AuthState`, or failing with the reason."""
