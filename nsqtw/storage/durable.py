"""``--durable-delivery``: the delivery mode in which no message lives only in memory.

The topic hands messages over into each channel's disk queue (fsynced);
whatever leaves a channel's queue, for delivery or to wait for its due
time, is recorded in the channel's journal first, and the queue's read
position moves on only once the journal holding those records is fsynced.
A topic's read position passes a batch only once every durable channel has
it safe. After kill -9 the journals rebuild exactly the unfinished messages
(see docs/durability.md). Ephemeral topics and channels fall back to the
buffered mode: they keep nothing on disk by definition.

This is one of the delivery modes whose answers Topic and Channel ask for
(:mod:`nsqtw.core.delivery` holds the other two); it lives in storage
because it is built on the journal.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Literal

from twisted.internet.defer import Deferred
from twisted.internet.interfaces import IReactorTime
from zope.interface import implementer

from nsqtw.core.delivery import BufferedDelivery
from nsqtw.core.handoff import durable_backend
from nsqtw.core.message import Message
from nsqtw.interfaces import IChannelDelivery, IDeliveryMode, ITopicDelivery, Position
from nsqtw.log import Logger
from nsqtw.names import backend_name
from nsqtw.storage.journal import COMPACT_MIN_BYTES, Journal

if TYPE_CHECKING:
    from nsqtw.core.channel import Channel
    from nsqtw.core.topic import Topic

__all__ = ["DurableChannelDelivery", "DurableDelivery", "DurableTopicDelivery", "compact_min", "keep_free"]

#: the most a durable node keeps free for delivery on its data path's filesystem (see keep_free)
KEEP_FREE_MAX = 32 << 20


def keep_free(fs_bytes: int, writer: Literal["topic", "channel", "journal"]) -> int:
    """Bytes a durable node's ``writer`` ("topic", "channel" or "journal") leaves free on a
    filesystem of ``fs_bytes``.

    Delivery itself needs disk here: whatever leaves a channel's queue is
    journaled first, and a queue's space comes back only once it is read
    and its metadata says so. On a disk filled to the last byte nothing
    could be delivered, so nothing read, so no space ever came back, while
    publishers took every byte a compaction freed. So the last bytes are
    shared out in layers: publishing (a topic's queue) stops while less
    than an eighth of the filesystem (at most :data:`KEEP_FREE_MAX`) is
    free, the hand-off into channels' queues at half that, the journals'
    appends at an eighth of that; the rest is for the queues' metadata,
    which a consumed segment's removal waits on (journals filling the disk
    to the last page wedged a node: no metadata could be written, so no
    consumed segment went). Consumers drain the backlog, the drained
    segments go, publishing resumes.
    """
    reserve = min(KEEP_FREE_MAX, fs_bytes // 8)
    return {"topic": reserve, "channel": reserve // 2, "journal": reserve // 16}[writer]


def compact_min(fs_bytes: int) -> int:
    """The size under which a durable channel's journal is not compacted, on a filesystem of
    ``fs_bytes``: :data:`~nsqtw.storage.journal.COMPACT_MIN_BYTES`, or a 64th of a small
    filesystem. Two journals of finished records just under 4 MiB each would otherwise keep
    an 8 MiB disk full after its backlog was drained."""
    return min(COMPACT_MIN_BYTES, fs_bytes // 64)


#: makes the journal of a durable topic or channel from its backend name
JournalFactory = Callable[[str], "Journal"]


@implementer(IDeliveryMode)
class DurableDelivery:
    """Durable strategies for every topic and channel that is not ephemeral."""

    def __init__(self, journal_factory: JournalFactory, sync_every: int) -> None:
        self.journal_factory = journal_factory
        self.fallback = BufferedDelivery(sync_every)

    def for_topic(self, topic: Topic) -> ITopicDelivery:
        if topic.ephemeral:
            return self.fallback.for_topic(topic)
        return DurableTopicDelivery(self.journal_factory(backend_name(topic.name)), topic.clock)

    def for_channel(self, channel: Channel) -> IChannelDelivery:
        if channel.ephemeral or channel.topic_ephemeral:
            return self.fallback.for_channel(channel)
        return DurableChannelDelivery(channel, self.journal_factory(backend_name(channel.topic_name,
                                                                                 channel.name)))


@implementer(ITopicDelivery)
class DurableTopicDelivery:
    """Every message goes to the topic's disk queue; publishers wait for its fsync; the
    topic's read position passes a batch only once every durable channel has it safe.

    The journal keeps the due times of DPUB messages in the queue (nsqd's
    record has no field for them).
    """

    mem_queue_size = 0
    wait_for_write = True
    commit_after_handoff = True

    def __init__(self, journal: Journal, clock: IReactorTime) -> None:
        self.journal = journal
        self._clock = clock

    def published(self, delayed: list[Message], written: Deferred[None]) -> Deferred[None]:
        if delayed:  # DPUB delays (see Message.deadline)
            journal = self.journal
            now = self._clock.seconds()
            for m in delayed:
                journal.due(m.id, now + m.deadline)
            written.addCallback(lambda _: journal.synced())
        return written

    def dues(self) -> Mapping[bytes, float]:
        return self.journal.dues

    def committed(self, due_ids: list[bytes]) -> None:
        self.journal.drop_dues(due_ids)

    def health(self) -> str | None:
        return self.journal.error

    def close(self) -> Deferred[object]:
        # the topic's queue is closed: the due times the journal holds went to
        # nsqtw.deferred.json with the topic's (see NSQD.deferred_due)
        d: Deferred[Any] = self.journal.remove()
        return d

    def delete(self) -> Deferred[object]:
        d: Deferred[Any] = self.journal.remove()
        return d


@implementer(IChannelDelivery)
class DurableChannelDelivery:
    """Whatever leaves the channel's queue is journaled first (memory holds only journal-owned messages).

    The channel reads its queue and takes the topic's hand-offs itself
    (:meth:`Channel.next_messages`, :func:`~nsqtw.core.handoff.put_journaled`); this mode
    answers which records come next, which messages its journal already
    owns, and journals what leaves the queue before it leaves.
    """

    log = Logger()

    mem_queue_size = sys.maxsize
    journaled = True

    def __init__(self, channel: Channel, journal: Journal) -> None:
        self.journal = journal
        self._name = f"{channel.topic_name}:{channel.name}"
        self._backend = durable_backend(channel.backend)
        self._wake = channel.wake
        journal.snapshot = channel.pending
        #: the topic's records up to this position reached this channel before a restart
        self.handoff_floor: Position | None = journal.handoff_floor
        #: the channel's records up to this position were journaled before a restart
        self._taken_floor: Position | None = journal.taken_floor
        #: the position past the last record read, until the channel says what it took
        self._last: Position | None = None
        #: a wake-up is registered for when the journal catches up
        self._waiting_journal = False

    def restored(self) -> list[tuple[Message, float]]:
        recovered, self.journal.recovered = self.journal.recovered, {}
        return [(Message(msg_id + body, ts, attempts), due_ms / 1000.0)
                for msg_id, (ts, attempts, due_ms, body) in recovered.items()]

    def refuses_handoff(self) -> bool:
        """The channel's queue cannot take writes, or its journal is far behind on fsyncs:
        the topic waits rather than skip it (memory stays bounded meanwhile)."""
        return self._backend.write_error is not None or self.journal.behind()

    def handed_off(self, pos: Position) -> None:
        self.journal.handed_off(pos)

    def synced(self) -> Deferred[None]:
        return self.journal.synced()

    def may_take(self) -> bool:
        """False while the journal's unsynced records are past the bound (fsync slow or
        failing): nothing more leaves the queue until they are on disk."""
        journal = self.journal
        if not journal.behind():
            return True
        if not self._waiting_journal:
            self._waiting_journal = True
            journal.on_synced(self._journal_caught_up)
        return False

    def _journal_caught_up(self) -> None:
        self._waiting_journal = False
        self._wake()

    def read(self, n: int) -> list[bytes]:
        """Records read on from the queue, but those journaled before a restart the queue's
        read position did not see."""
        while True:
            records = self._backend.read_positions(n)
            if not records:
                return []
            last = self._last = (records[-1][1], records[-1][2])
            floor = self._taken_floor
            if floor is None:
                return [r[0] for r in records]
            if last >= floor:
                self._taken_floor = None
            out = [data for data, num, pos in records if (num, pos) > floor]
            if out:
                return out

    def owns(self, msg_id: bytes) -> bool:
        return self.journal.is_live(msg_id)

    def taking(self, msgs: list[Message]) -> None:
        """Journal what leaves the queue; the queue's read position moves past the records
        read only once the journal holding them is fsynced."""
        journal = self.journal
        if msgs:
            journal.delivering(msgs)
        last = self._last
        if last is not None:
            self._last = None
            # after the messages' own records: if this one survives, so did they
            journal.taken(last)
            backend = self._backend
            mark = backend.read_mark()
            journal.on_synced(lambda: backend.commit_read(mark))

    def deferred(self, msg: Message, when: float) -> None:
        self.journal.deferred(msg, when)

    def finished(self, msg_ids: list[bytes]) -> None:
        self.journal.finished_many(msg_ids)

    def emptied(self) -> None:
        self.journal.cleared()

    def health(self) -> str | None:
        error: str | None = self.journal.error
        return error

    def flushed(self) -> None:
        """Every message the journal held is back in the queue: its read position may pass
        every record read."""
        self._backend.commit_read(self._backend.read_mark())

    def close(self, keep: bool) -> Deferred[None]:
        """The channel's queue is closed. The journal goes, leaving a plain nsqd data
        directory (deferred due times go to ``nsqtw.deferred.json`` as without the flag);
        ``keep``: something failed, and the next start with --durable-delivery uses it."""
        return self.journal.close() if keep else self.journal.remove()

    def delete(self) -> None:
        self.journal.remove().addErrback(
            lambda f: self.log.failure("CHANNEL({channel}): failed to remove journal", f, channel=self._name))
