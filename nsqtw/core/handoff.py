"""How a topic's pump hands a batch to its channels: the bounds, the batch, the slices, the ledger.

These are the topic's own machinery, the same in every delivery mode: the
pump itself is :meth:`nsqtw.core.topic.Topic.distribute`. A delivery mode
only answers the topic's questions (:class:`~nsqtw.interfaces.ITopicDelivery`,
:class:`~nsqtw.interfaces.IChannelDelivery`).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from twisted.internet import defer
from twisted.internet.defer import Deferred, DeferredList, ensureDeferred, succeed

from nsqtw.core.message import MIN_VALID_MSG_LENGTH, record_id
from nsqtw.errors import BackendError, ExitingError
from nsqtw.interfaces import IBackendQueue, IDurableBackendQueue, Position, ReadMark
from nsqtw.log import Logger

if TYPE_CHECKING:
    from nsqtw.core.channel import Channel
    from nsqtw.core.message import Message

__all__ = ["BACKLOG_BYTES", "BACKLOG_LIMIT", "HANDOFF_CHANNELS", "HANDOFF_SLICE", "SPILL_INTERVAL", "TOPIC_BATCH",
           "Batch", "Handoff", "HandoffLedger", "HandoffSlot", "durable_backend", "is_behind", "only_spill",
           "put_in_memory", "put_journaled", "when_written"]

#: messages a topic takes from its queue at once, to hand to its channels
TOPIC_BATCH = 8192
#: channel copies (messages × channels) a topic hands off in one pump step before yielding
HANDOFF_SLICE = 4096
#: ... and channels: a message queued on a channel the caches no longer hold costs about a
#: microsecond whatever the batch (a PUB to 5,000 channels), so a step reaches at most these
HANDOFF_CHANNELS = 1024
#: seconds a topic lets publishes gather while every copy would only go to a disk queue
#: (:meth:`nsqtw.core.topic.Topic.distribute`): a disk queue hands its writes to its thread at
#: most every 5 ms anyway, so the copies of one PUB after another reach it in one ``put_many``
SPILL_INTERVAL = 0.005
#: past this many records waiting for the disk thread, publishers wait for the write
BACKLOG_LIMIT = 10000
#: ... or past this many bytes of them (large messages)
BACKLOG_BYTES = 16 * 1024 * 1024


class TopicView(Protocol):
    """What the hand-off needs of the topic that runs it (``nsqtw.core.topic.Topic``, which
    imports this module)."""

    name: str
    log: Logger
    exiting: bool
    #: channels deleted so far (a hand-off under way leaves them out)
    channel_deletions: int
    channels: dict[str, Channel]


def is_behind(backend: IBackendQueue) -> bool:
    """Whether a backend's disk thread is so far behind that its writers must wait."""
    return backend.backlog() > BACKLOG_LIMIT or backend.backlog_bytes() > BACKLOG_BYTES


def durable_backend(backend: IBackendQueue) -> IDurableBackendQueue:
    """``backend`` as the disk queue it must be for a topic that commits its reads."""
    if not IDurableBackendQueue.providedBy(backend):
        raise TypeError(f"this delivery mode needs disk queues, not {backend!r}")
    return IDurableBackendQueue(backend)


def only_spill(channels: list[Channel]) -> bool:
    """Whether each of ``channels`` (at least one) would put a batch only into its backend, with
    nobody to deliver to: no client, not journaled, a full memory queue."""
    for channel in channels:
        if channel.clients or channel.journaled or channel.room():
            return False
    return bool(channels)


def put_in_memory(channels: list[Channel], msgs: list[Message], shared: bool) -> list[Channel]:
    """A topic's batch (no DPUB delays) queued on every channel whose memory queue has room for it all.

    What :meth:`Channel.put_many` does for them, in one loop with no call
    per channel: a topic with thousands of channels runs this for each
    batch it hands off (docs/performance.md, "Fan-out"). Returns the
    channels left for :meth:`Channel.put_many` (closing, or short of room)
    and for :func:`put_journaled` (journaled).
    """
    n = len(msgs)
    one = msgs[0] if n == 1 else None  # a PUB's batch: appended, no list to walk per channel
    left = []
    for channel in channels:
        memory = channel.memory
        if channel.exiting or channel.journaled or channel.mem_limit - len(memory) < n:
            left.append(channel)
            continue
        channel.given += n
        if one is None:
            memory.extend(msgs)
        else:
            memory.append(one)
        if shared:
            channel.shared = True
        if channel.clients:
            channel.wake()
    return left


def when_written(backend: IBackendQueue, closing: Callable[[], bool]) -> Deferred[Any]:
    """Fires once ``backend`` has written everything put so far, through failed attempts
    (a full disk keeps the records and retries); fails only if ``closing()`` meanwhile."""
    d: Deferred[Any] = backend.written()
    d.addErrback(lambda f: f if closing() else when_written(backend, closing))
    return d


def put_journaled(channel: Channel, msgs: list[Message], pos: Position) -> Deferred[None]:
    """A journaled channel's copy of a topic's batch, up to the topic's record ``pos``.

    The ready ones go straight into the channel's backend (its memory queue
    holds only what the journal owns). Fires once all of them are safe
    there: written, the hand-off recorded by the channel's delivery mode,
    the DPUB ones deferred, and the mode's records synced. Raises
    ExitingError or BackendError.
    """
    if channel.exiting:
        raise ExitingError()
    floor = channel.handoff_floor
    if floor is not None and pos >= floor:
        channel.handoff_floor = None  # past what it had before the restart
    if not msgs:
        return succeed(None)
    channel.given += len(msgs)
    ready = [m for m in msgs if not m.deadline]  # DPUB delays: see Message.deadline
    later = [m for m in msgs if m.deadline]
    if ready:
        channel.backend.put_many([m.encode() for m in ready])
        channel.wake()
    return ensureDeferred(_journal_handoff(channel, bool(ready), later, pos))


async def _journal_handoff(channel: Channel, wrote: bool, later: list[Message], pos: Position) -> None:
    if wrote:
        await when_written(channel.backend, lambda: channel.exiting or channel.owner.exiting)
    # Recorded only now: the queue's copies are written, and none of them
    # has been taken yet (reads come back after this write's callback), so
    # no record about them can precede this one.
    channel.delivery.handed_off(pos)
    if later:
        now = channel.clock.seconds()
        for m in later:
            channel.defer_published(m.copy(), now)  # (other channels hold the same object)
    await channel.delivery.synced()


class Handoff:
    """One batch on its way from a topic to its channels, a slice of the channels per pump step.

    A step gives the batch to at most :data:`HANDOFF_SLICE` channel copies'
    worth of channels (at least one) and at most :data:`HANDOFF_CHANNELS`
    channels, so a publish to a topic with thousands of channels never holds the reactor for all of them: a bystander's
    commands are answered between steps. Every channel still gets the
    batches in order: the topic starts the next batch only when this one has
    reached every channel it was meant for. Channels deleted meanwhile are
    skipped; channels created meanwhile get the next batch.
    """

    def __init__(self, topic: TopicView, channels: list[Channel], batch: Batch) -> None:
        self.topic = topic
        self.channels = channels
        self.batch = batch
        self.per_step = max(1, min(HANDOFF_CHANNELS, HANDOFF_SLICE // max(1, batch.size)))
        self._at = 0
        self._deletions = topic.channel_deletions

    def step(self) -> bool:
        """Give the batch to the next slice of channels; True once every channel has it."""
        at = self._at
        end = self._at = at + self.per_step
        self.batch.give(self._present(self.channels[at:end]))
        if end < len(self.channels):
            return False
        self.batch.reached(self._present(self.channels))  # the channels it reached that are still there
        return True

    def finish(self) -> None:
        """Give it to every channel left now (a graceful stop)."""
        while not self.step():
            pass

    def _present(self, channels: list[Channel]) -> list[Channel]:
        """``channels`` but those deleted since the hand-off began."""
        if self.topic.channel_deletions == self._deletions:
            return channels
        present = self.topic.channels
        return [c for c in channels if present.get(c.name) is c]


class HandoffSlot:
    """The hand-off a topic has under way, if any: one at a time, a step per pump turn."""

    def __init__(self) -> None:
        self._current: Handoff | None = None

    def begin(self, handoff: Handoff) -> bool:
        """Take its first step; True while it needs more (the pump comes back for them)."""
        if handoff.step():
            return False
        self._current = handoff
        return True

    @property
    def idle(self) -> bool:
        """No hand-off under way."""
        return self._current is None

    def step(self) -> bool | None:
        """The next step of the one under way: None when there is none, else True while it needs more."""
        current = self._current
        if current is None:
            return None
        if current.step():
            self._current = None
            return False
        return True

    def finish(self) -> None:
        """Complete the one under way now (a graceful stop: no channel may miss its copies)."""
        if self._current is not None:
            self._current.finish()
            self._current = None


class Batch:
    """One batch a topic copies to its channels: read back from its backend, then from its memory.

    ``records`` are the backend's records as read (``decoded``: the first
    of them as Messages, as many as the emptiest channel memory takes),
    ``due`` DPUB messages read back with a due time the topic knows,
    ``tail`` the messages taken from the topic's memory after the records.
    ``shared``: more than one channel takes the same Message objects.

    A topic that commits its reads (``ledger``) also has each record's
    position (``read``) and the batch's ``mark``: once the batch reached
    every channel, the ledger waits for each channel to have it safe (a
    journaled channel's hand-off, another channel's write) before the
    topic's read position passes it.
    """

    def __init__(self, topic: TopicView, due: list[Message], records: list[bytes], decoded: list[Message],
                 tail: list[Message], shared: bool, ledger: HandoffLedger | None = None,
                 read: list[tuple[bytes, int, int]] | None = None, mark: ReadMark | None = None,
                 due_ids: list[bytes] | None = None) -> None:
        self.topic = topic
        self.due = due
        self.records = records
        self.decoded = decoded
        self.tail = tail
        self.shared = shared
        self.size = len(due) + len(records) + len(tail)
        #: every message decoded, for a channel with room for them all
        self._whole = due + decoded + tail if len(decoded) == len(records) else []
        #: whether any has a DPUB delay (asked once, not by every channel)
        self.delayed = bool(due) or any(m.deadline for m in tail)
        self._tail_split: tuple[list[Message], list[bytes]] | None = None
        self._tail_encoded: list[bytes] | None = None
        self._ledger = ledger
        self._read = read or []
        self._mark = mark
        self._due_ids = due_ids
        #: journaled channels' hand-offs under way (Deferreds, for the ledger)
        self._waits: list[Deferred[Any]] = []

    def plain_messages(self) -> list[Message]:
        """The whole batch as Messages when every channel with room would queue it as it is
        (no records left encoded, no DPUB delay), else an empty list."""
        return self._whole if not self.delayed else []

    def give(self, channels: list[Channel]) -> None:
        """Queue the batch on each of ``channels`` (see :meth:`for_channel`).

        A failing disk does not refuse it (the channel's disk queue keeps the
        records in memory for its retry, and the topic holds further
        batches while that backlog is over the bound); only a closing channel
        or a record of an invalid size can, and is logged.
        """
        if self._whole and not self.delayed:  # the usual case: all of it in each memory queue
            channels = put_in_memory(channels, self._whole, self.shared)
        for channel in channels:
            try:
                if channel.journaled:
                    self._waits.append(put_journaled(channel, self._after(channel.handoff_floor), self.end()))
                    continue
                msgs, encoded = self.for_channel(channel.room())
                channel.put_many(msgs, encoded, shared=self.shared, delayed=self.delayed)
            except (ExitingError, BackendError) as e:
                self.topic.log.error("TOPIC({topic}): failed to put msg(s) to channel({channel}) - {error}",
                                     topic=self.topic.name, channel=channel.name, error=e)
                if channel.journaled:
                    self._waits.append(defer.fail(e))  # left uncommitted (see HandoffLedger)

    def reached(self, channels: list[Channel]) -> None:
        """The batch reached every channel still there: the ledger waits for them to have it safe."""
        ledger = self._ledger
        if ledger is None:
            return
        waits = self._waits
        topic = self.topic
        waits.extend(when_written(c.backend, lambda: topic.exiting) for c in channels if not c.journaled)
        ledger.add(self._mark, waits, self._due_ids)

    def end(self) -> Position:
        """The position past the batch's last record."""
        _, num, pos = self._read[-1]
        return (num, pos)

    def _after(self, floor: Position | None) -> list[Message]:
        """The batch's messages but those whose record is at or before ``floor`` (a journaled
        channel had them before a restart)."""
        msgs = self._whole or self.due + self.decoded + self.tail
        if floor is None:
            return msgs
        at = {record_id(d): (num, pos) for d, num, pos in self._read if len(d) >= MIN_VALID_MSG_LENGTH}
        return [m for m in msgs if (pos := at.get(m.id)) is None or pos > floor]  # (None: from memory)

    def for_channel(self, room: int) -> tuple[list[Message], list[bytes]]:
        """What a channel whose memory queue has ``room`` takes: Messages, then records for its backend."""
        records = self.records
        decoded = self.decoded
        k = min(room, len(decoded))  # (fewer decoded than the room: the batch is short)
        if k >= len(records):
            tail = self.tail
            left = room - len(records)
            if left >= len(tail) or self.delayed:
                # (DPUB ones in the tail: the channel sorts the overflow out itself)
                return self._whole, []
            # the memory queue is full after the first ``left`` of the tail: the rest as records
            return self.due + decoded + tail[:left], self._encoded_tail()[left:]
        # the memory queue is full after the first ``k``: the rest goes to the backend as it is
        dpub, encoded = self._split_tail()
        return self.due + decoded[:k] + dpub, records[k:] + encoded

    def _encoded_tail(self) -> list[bytes]:
        """The memory messages (none of them DPUB) encoded, once for every channel."""
        if self._tail_encoded is None:
            self._tail_encoded = [m.encode() for m in self.tail]
        return self._tail_encoded

    def _split_tail(self) -> tuple[list[Message], list[bytes]]:
        """The memory messages as they follow records into a backend: encoded once for every channel,
        but for DPUB ones (the channel defers them, see Message.deadline)."""
        if self._tail_split is None:
            tail = self.tail
            self._tail_split = ([m for m in tail if m.deadline], [m.encode() for m in tail if not m.deadline])
        return self._tail_split


class HandoffLedger:
    """Batches a topic handed to its channels, oldest first, until every channel has them safe.

    The topic's read position (``commit_read``) passes a batch only once it
    and every batch before it reached every channel, so a kill -9 between
    the topic's queue and a channel's loses nothing: after a restart the
    topic reads the uncommitted batches again. A failed hand-off is left
    uncommitted for the same reason. A topic keeps one when its delivery
    mode says so (``commit_after_handoff``).
    """

    def __init__(self, topic: TopicView, backend: IDurableBackendQueue,
                 on_commit: Callable[[list[bytes]], None]) -> None:
        self.topic = topic
        self.backend = backend
        #: told the DPUB ids of each batch as it is committed (the delivery mode's ``committed``)
        self.on_commit = on_commit
        #: [read mark, handed off everywhere?, DPUB ids]
        self._entries: deque[list[Any]] = deque()
        self._under_way: set[Deferred[Any]] = set()

    def add(self, mark: ReadMark | None, waits: list[Deferred[Any]], due_ids: list[bytes] | None = None) -> None:
        """A batch up to ``mark`` was handed off; ``waits`` fire once each channel has it."""
        if mark is None:
            return
        entry: list[Any] = [mark, False, due_ids or []]
        self._entries.append(entry)
        if not waits:
            entry[1] = True
            self._commit()
            return
        d: Deferred[Any] = DeferredList(waits, consumeErrors=True)
        self._under_way.add(d)
        d.addCallback(self._handed_off, entry, d)

    def under_way(self) -> list[Deferred[Any]]:
        """The hand-offs not finished yet (a graceful stop waits for them)."""
        return list(self._under_way)

    def _handed_off(self, results: list[tuple[bool, Any]], entry: list[Any], d: Deferred[Any]) -> None:
        self._under_way.discard(d)
        failed = [r for ok, r in results if not ok]
        if failed:
            # left uncommitted: after a restart these records are read again
            self.topic.log.error("TOPIC({topic}): hand-off to a channel failed - {error}",
                                 topic=self.topic.name, error=failed[0].getErrorMessage())
            return
        entry[1] = True
        self._commit()

    def _commit(self) -> None:
        entries = self._entries
        last: ReadMark | None = None
        while entries and entries[0][1]:
            last, _, due_ids = entries.popleft()
            if due_ids:
                self.on_commit(due_ids)
        if last is not None:
            self.backend.commit_read(last)
