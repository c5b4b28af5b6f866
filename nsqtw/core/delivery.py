"""nsqd's own delivery modes: buffered (the default) and commit-after-write (``--sync-every=1``).

A delivery mode decides how a topic's messages reach its backend and move
on to its channels, and how a channel takes messages out of its queue.
Topic and Channel are given one strategy each (:class:`~nsqtw.interfaces.ITopicDelivery`,
:class:`~nsqtw.interfaces.IChannelDelivery`) by the node's
:class:`~nsqtw.interfaces.IDeliveryMode` and never branch on the mode
themselves. The third mode, ``--durable-delivery``, needs journals and lives
with them in :mod:`nsqtw.storage.durable`.

- **Buffered** (:class:`PlainTopicDelivery`): nsqd's behaviour. Messages wait in
  memory up to ``--mem-queue-size``, then in the backend; the topic reads
  its backend and copies each batch to every channel.
- **Commit-after-write** (:class:`CommitAfterWriteTopicDelivery`, chosen by
  ``--sync-every=1`` over disk queues): publishers wait for the write, and
  the topic's read position passes a batch only once every channel has
  written its copy, so a kill -9 loses nothing acknowledged between the two.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from twisted.internet.defer import Deferred, DeferredList, ensureDeferred, succeed
from zope.interface import implementer

from nsqtw.core.channel import put_in_memory
from nsqtw.core.message import MIN_VALID_MSG_LENGTH
from nsqtw.errors import BackendError, ExitingError
from nsqtw.interfaces import (
    IBackendQueue,
    IChannelDelivery,
    IDeliveryMode,
    IDurableBackendQueue,
    ITopicDelivery,
    ReadMark,
)

if TYPE_CHECKING:
    from nsqtw.core.channel import Channel
    from nsqtw.core.message import Message
    from nsqtw.core.topic import Topic

__all__ = ["HANDOFF_SLICE", "TOPIC_BATCH", "BufferedDelivery", "CommitAfterWriteTopicDelivery", "Handoff",
           "HandoffLedger", "HandoffSlot", "PlainChannelDelivery", "PlainTopicDelivery", "any_channel_behind",
           "durable_backend", "is_behind", "wait_while_node_behind"]

#: messages a topic takes from its queue at once, to hand to its channels
TOPIC_BATCH = 8192
#: channel copies (messages × channels) a topic hands off in one pump step before yielding
HANDOFF_SLICE = 4096
#: past this many records waiting for the disk thread, publishers wait for the write
BACKLOG_LIMIT = 10000
#: ... or past this many bytes of them (large messages)
BACKLOG_BYTES = 16 * 1024 * 1024


def is_behind(backend: IBackendQueue) -> bool:
    """Whether a backend's disk thread is so far behind that its writers must wait."""
    return backend.backlog() > BACKLOG_LIMIT or backend.backlog_bytes() > BACKLOG_BYTES


def any_channel_behind(topic: Topic) -> Channel | None:
    """A channel of ``topic`` whose disk queue is behind (:func:`is_behind`), or None.

    Asked before every batch a topic hands off. While the node's unwritten
    bytes could not put any single queue over the bound (every record is at
    least a message header long), the answer is None without asking each
    of thousands of channels.
    """
    if topic.owner.unwritten.total <= BACKLOG_LIMIT * MIN_VALID_MSG_LENGTH:
        return None
    for channel in topic.channels.values():
        if is_behind(channel.backend):
            return channel
    return None


def wait_while_node_behind(topic: Topic, then: Callable[[object], object]) -> bool:
    """Whether the node's unwritten bytes are over ``--max-unwritten-bytes``; if so ``then`` runs once under.

    A topic then keeps its messages instead of copying them to its channels:
    the copies would only add to the memory waiting for the disks.
    """
    unwritten = topic.owner.unwritten
    if not unwritten.over():
        return False
    unwritten.when_under().addBoth(then)
    return True


def durable_backend(backend: IBackendQueue) -> IDurableBackendQueue:
    """``backend`` as the disk queue it must be for modes that commit reads."""
    if not IDurableBackendQueue.providedBy(backend):
        raise TypeError(f"this delivery mode needs disk queues, not {backend!r}")
    return IDurableBackendQueue(backend)


@implementer(IDeliveryMode)
class BufferedDelivery:
    """nsqd's own mode; with ``sync_every <= 1`` over disk queues, commit-after-write."""

    def __init__(self, sync_every: int) -> None:
        self.sync_every = sync_every

    def for_topic(self, topic: Topic) -> ITopicDelivery:
        wait = self.sync_every <= 1
        if wait and IDurableBackendQueue.providedBy(topic.backend):
            return CommitAfterWriteTopicDelivery(topic)
        return PlainTopicDelivery(topic, wait_for_write=wait)

    def for_channel(self, channel: Channel) -> IChannelDelivery:
        return PlainChannelDelivery(channel)


class Handoff:
    """One batch on its way from a topic to its channels, a slice of the channels per pump step.

    A step gives the batch to at most :data:`HANDOFF_SLICE` channel copies'
    worth of channels (at least one), so a publish to a topic with thousands
    of channels never holds the reactor for all of them: a bystander's
    commands are answered between steps. Every channel still gets the
    batches in order: the topic starts the next batch only when this one has
    reached every channel it was meant for. Channels deleted meanwhile are
    skipped; channels created meanwhile get the next batch.
    """

    def __init__(self, topic: Topic, channels: list[Channel], size: int,
                 give: Callable[[list[Channel]], object], done: Callable[[list[Channel]], object]) -> None:
        self.topic = topic
        self.channels = channels
        self.per_step = max(1, HANDOFF_SLICE // max(1, size))
        self._give = give
        self._done = done
        self._at = 0
        self._deletions = topic.channel_deletions

    def step(self) -> bool:
        """Give the batch to the next slice of channels; True once every channel has it."""
        at = self._at
        end = self._at = at + self.per_step
        self._give(self._present(self.channels[at:end]))
        if end < len(self.channels):
            return False
        self._done(self._present(self.channels))  # the channels it reached that are still there
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
    """The hand-off a topic's delivery mode has under way, if any: one at a time, a step per pump turn."""

    def __init__(self) -> None:
        self._current: Handoff | None = None

    def begin(self, handoff: Handoff) -> bool:
        """Take its first step; True while it needs more (the pump comes back for them)."""
        if handoff.step():
            return False
        self._current = handoff
        return True

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


@implementer(ITopicDelivery)
class PlainTopicDelivery:
    """Read a batch (backend first, then memory) and give every channel its copy, a slice per step.

    With more than one channel the channels share the batch's Message
    objects: a channel copies a message only as it takes it out of its
    memory queue for delivery (:meth:`Channel.put_many`, ``shared``), so a
    copy costs a pointer in each channel's queue and nothing per channel
    that never delivers it meanwhile.
    """

    def __init__(self, topic: Topic, wait_for_write: bool) -> None:
        self.topic = topic
        self.mem_queue_size: int = topic.options.mem_queue_size
        self.wait_for_write = wait_for_write
        #: waiting for a channel's disk to catch up before copying more to it
        self._held = False
        self._handoff = HandoffSlot()

    def _read(self) -> tuple[list[bytes], ReadMark | None]:
        return self.topic.backend.read(TOPIC_BATCH), None

    def _after_put(self, channels: list[Channel], mark: ReadMark | None) -> None:
        pass

    def distribute(self) -> bool:
        topic = self.topic
        if topic.exiting:
            return False
        more = self._handoff.step()
        if more is not None:
            return more or bool(topic.memory) or topic.backend.depth() > 0
        channels = list(topic.channels.values())
        if not channels or topic.paused or self._held:
            return False
        behind = any_channel_behind(topic)
        if behind is not None:
            # that channel's disk is behind: keep messages here (where their
            # own backlog pauses publishers) until it has caught up
            self._held = True
            behind.backend.written().addBoth(self._release)
            return False
        if wait_while_node_behind(topic, self._release):
            self._held = True
            return False
        due: list[Message] = []  # DPUB messages read back after a restart
        records: list[bytes] = []
        decoded: list[Message] = []
        mark = None
        if topic.backend.depth():
            read, mark = self._read()
            # decoded: as many as the emptiest channel memory takes (beyond its
            # room, a channel puts records in its backend as they were read)
            due, decoded, records = topic.split_records(read, max(c.room() for c in channels))
            if due:
                topic.apply_dues(due, {})
        memory = topic.memory
        k = min(TOPIC_BATCH - len(due) - len(records), len(memory))
        tail: list[Message] = []
        if k == len(memory):
            tail = list(memory)
            memory.clear()
        elif k > 0:
            pop = memory.popleft
            tail = [pop() for _ in range(k)]
        if not (due or records or tail):
            return False
        batch = _Batch(topic, due, records, decoded, tail, shared=len(channels) > 1)
        handoff = Handoff(topic, channels, batch.size, batch.give, lambda reached: self._after_put(reached, mark))
        return self._handoff.begin(handoff) or bool(memory) or topic.backend.depth() > 0

    def _release(self, _: object) -> None:
        self._held = False
        self.topic.wake()

    def published(self, delayed: list[Message], written: Deferred[None]) -> Deferred[None]:
        return written

    def deferred_due(self) -> dict[bytes, float]:
        return dict(self.topic.restored_due)

    def health(self) -> str | None:
        return None

    def close(self) -> Deferred[object]:
        topic = self.topic
        self._handoff.finish()  # the channels not reached yet get it before they flush
        ds: list[Deferred[Any]] = [c.close() for c in topic.channels.values()]
        try:
            if topic.memory:
                topic.backend.put_many([m.encode() for m in topic.memory])
                topic.memory.clear()
        except BackendError as e:
            topic.log.error("TOPIC({topic}): failed to flush - {error}", topic=topic.name, error=e)
        ds.append(topic.backend.close())
        done: Deferred[Any] = DeferredList(ds, consumeErrors=True)
        return done

    def delete(self) -> Deferred[object]:
        return succeed(None)


class _Batch:
    """One batch a topic copies to its channels: read back from its backend, then from its memory.

    ``records`` are the backend's records as read (``decoded``: the first
    of them as Messages, as many as the emptiest channel memory takes),
    ``due`` DPUB messages read back after a restart, ``tail`` the messages
    taken from the topic's memory after the records. ``shared``: more than
    one channel takes the same Message objects.
    """

    def __init__(self, topic: Topic, due: list[Message], records: list[bytes], decoded: list[Message],
                 tail: list[Message], shared: bool) -> None:
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

    def give(self, channels: list[Channel]) -> None:
        """Queue the batch on each of ``channels`` (see :meth:`for_channel`).

        A failing disk does not refuse it (the channel's disk queue keeps the
        records in memory for its retry, and the delivery mode holds further
        batches while that backlog is over the bound); only a closing channel
        or a record of an invalid size can, and is logged.
        """
        if self._whole and not self.delayed:  # the usual case: all of it in each memory queue
            channels = put_in_memory(channels, self._whole, self.shared)
        for channel in channels:
            msgs, encoded = self.for_channel(channel.room())
            try:
                channel.put_many(msgs, encoded, shared=self.shared, delayed=self.delayed)
            except (ExitingError, BackendError) as e:
                self.topic.log.error("TOPIC({topic}): failed to put msg(s) to channel({channel}) - {error}",
                                     topic=self.topic.name, channel=channel.name, error=e)

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
    """Batches a topic handed to its channels, oldest first, until every channel has them.

    The topic's read position (``commit_read``) passes a batch only once it
    and every batch before it reached every channel, so a kill -9 between
    the topic's queue and a channel's loses nothing: after a restart the
    topic reads the uncommitted batches again. A failed hand-off is left
    uncommitted for the same reason. Used by the commit-after-write and the
    durable modes.
    """

    def __init__(self, topic: Topic, backend: IDurableBackendQueue,
                 on_commit: Callable[[list[bytes]], None] | None = None) -> None:
        self.topic = topic
        self.backend = backend
        #: told the DPUB ids of each batch as it is committed (the durable mode's journal)
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
            if due_ids and self.on_commit is not None:
                self.on_commit(due_ids)
        if last is not None:
            self.backend.commit_read(last)


class CommitAfterWriteTopicDelivery(PlainTopicDelivery):
    """``--sync-every=1``: the topic's read position passes a batch only once every channel wrote it."""

    def __init__(self, topic: Topic) -> None:
        super().__init__(topic, wait_for_write=True)
        self._backend = durable_backend(topic.backend)
        self._ledger = HandoffLedger(topic, self._backend)

    def _read(self) -> tuple[list[bytes], ReadMark | None]:
        records = [r[0] for r in self._backend.read_positions(TOPIC_BATCH)]
        return records, self._backend.read_mark()

    def _after_put(self, channels: list[Channel], mark: ReadMark | None) -> None:
        self._ledger.add(mark, [self._when_written(c.backend) for c in channels])

    def _when_written(self, backend: IBackendQueue) -> Deferred[Any]:
        """Fires once ``backend`` has written everything put so far, through failed attempts
        (a full disk keeps the records and retries); fails only if the topic is closing meanwhile."""
        d: Deferred[Any] = backend.written()
        d.addErrback(lambda f: f if self.topic.exiting else self._when_written(backend))
        return d

    def close(self) -> Deferred[object]:
        if not self._ledger.under_way():
            return super().close()
        return ensureDeferred(self._close_after_handoffs())

    async def _close_after_handoffs(self) -> object:
        # let the channels' writes under way finish, so the read position persisted is exact
        await DeferredList(self._ledger.under_way(), consumeErrors=True)
        return await super().close()


@implementer(IChannelDelivery)
class PlainChannelDelivery:
    """Backend first, then memory; nothing to record beyond the channel's own queues."""

    def __init__(self, channel: Channel) -> None:
        self.channel = channel
        self.mem_queue_size: int = channel.options_mem_queue_size

    def next_messages(self, n: int) -> list[Message]:
        channel = self.channel
        out: list[Message] = []
        if channel.backend.depth():
            out = channel.decode_all(channel.backend.read(n))
            if channel.restored_due:
                now = channel.clock.seconds()
                out = [msg for msg in out if not channel.defer_restored(msg, now)]
        k = min(n - len(out), len(channel.memory))
        if k > 0:
            out.extend(channel.take_queued(k))
        return out

    def deferred(self, msg: Message, when: float) -> None:
        pass

    def finished(self, msg_ids: list[bytes]) -> None:
        pass

    def emptied(self) -> None:
        pass

    def health(self) -> str | None:
        return None

    def close(self) -> Deferred[None]:
        self.channel.flush_or_log()
        return self.channel.backend.close()

    def delete(self) -> None:
        pass
