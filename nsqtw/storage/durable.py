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
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

from twisted.internet.defer import Deferred, ensureDeferred, succeed
from twisted.internet.interfaces import IReactorTime
from zope.interface import implementer

from nsqtw.core.delivery import BufferedDelivery
from nsqtw.core.handoff import durable_backend
from nsqtw.core.message import MSG_ID_LENGTH, Message
from nsqtw.errors import BackendError, ExitingError
from nsqtw.interfaces import IChannelDelivery, IDeliveryMode, ITopicDelivery, Position
from nsqtw.names import backend_name

if TYPE_CHECKING:
    from nsqtw.core.channel import Channel
    from nsqtw.core.topic import Topic
    from nsqtw.storage.journal import Journal

__all__ = ["DurableChannelDelivery", "DurableDelivery", "DurableTopicDelivery"]

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
    """Whatever leaves the channel's queue is journaled first (memory holds only journal-owned messages)."""

    mem_queue_size = sys.maxsize
    journaled = True

    def __init__(self, channel: Channel, journal: Journal) -> None:
        self.channel = channel
        self.journal = journal
        self._backend = durable_backend(channel.backend)
        journal.snapshot = self._journal_snapshot
        #: the topic's records up to this position reached this channel before a restart
        self.handoff_floor: Position | None = journal.handoff_floor
        self._taken_floor: Position | None = journal.taken_floor
        #: a wake-up is registered for when the journal catches up
        self._waiting_journal = False
        recovered, journal.recovered = journal.recovered, {}
        if recovered:
            now = channel.clock.seconds()
            for msg_id, (ts, attempts, due_ms, body) in recovered.items():
                msg = Message(msg_id + body, ts, attempts)
                due = due_ms / 1000.0
                if due > now:
                    channel.deferred.push(msg, due)
                    channel.arm(due)
                else:
                    channel.memory.append(msg)
            channel.log.info("CHANNEL({topic}:{channel}): recovered {count} unfinished messages from its journal"
                             " ({deferred} deferred)", topic=channel.topic_name, channel=channel.name,
                             count=len(recovered), deferred=len(channel.deferred))

    def refuses_handoff(self) -> bool:
        """The channel's queue cannot take writes, or its journal is far behind on fsyncs:
        the topic waits rather than skip it (memory stays bounded meanwhile)."""
        return self._backend.write_error is not None or self.journal.behind()

    def _journal_snapshot(self) -> Iterable[tuple[Message, float]]:
        channel = self.channel
        for m in channel.memory:
            yield m, 0.0
        for m in channel.in_flight.live.values():
            yield m, 0.0
        for m in channel.deferred.live.values():
            yield m, m.deadline

    def next_messages(self, n: int) -> list[Message]:
        channel = self.channel
        journal = self.journal
        backend = self._backend
        if journal.behind():
            # its unsynced records are past the bound (fsync slow or failing): take
            # nothing more for delivery until they are on disk
            if not self._waiting_journal:
                self._waiting_journal = True
                journal.on_synced(self._journal_caught_up)
            return []
        out: list[Message] = []
        last: Position | None = None
        seen: set[bytes] = set()
        # copies already owned by the journal (around a crash) are skipped;
        # keep reading until something is left, a few batches at most
        for _ in range(8):
            records = backend.read_positions(n - len(out)) if backend.depth() else []
            if not records:
                break
            last = (records[-1][1], records[-1][2])
            self._take(records, out, seen)
            if out:
                break
        else:
            if not out and backend.depth():
                channel.wake()  # all skipped so far: more next turn
        k = min(n - len(out), len(channel.memory))
        if k > 0:
            out.extend(channel.take_queued(k))
        if out:
            journal.delivering(out)
        if last is not None:
            # after the messages' own records: if this one survives, so did they
            journal.taken(last)
            mark = backend.read_mark()
            journal.on_synced(lambda: backend.commit_read(mark))
        return out

    def _journal_caught_up(self) -> None:
        self._waiting_journal = False
        self.channel.wake()

    def _take(self, records: list[tuple[bytes, int, int]], out: list[Message], seen: set[bytes]) -> None:
        channel = self.channel
        journal = self.journal
        floor = self._taken_floor
        due = channel.restored_due
        now = channel.clock.seconds()
        for data, num, pos in records:
            if floor is not None and (num, pos) <= floor:
                continue  # journaled before a restart the queue's read position did not see
            msg = channel.decode(data)
            if msg is None:
                continue
            mid = msg.id = msg.data[:MSG_ID_LENGTH]  # the journal needs every ID: slice it once
            if journal.is_live(mid) or mid in seen:
                continue  # a copy the journal already owns (handed over twice around a crash)
            seen.add(mid)
            if due and channel.defer_restored(msg, now):
                continue
            out.append(msg)
        if floor is not None and (records[-1][1], records[-1][2]) >= floor:
            self._taken_floor = None

    def put_handoff(self, msgs: list[Message], pos: Position) -> Deferred[None]:
        """Messages from the topic, up to its record ``pos``.

        Fires once they are safe here: the ready ones fsynced in this
        channel's queue, the deferred ones and the hand-off in its journal.
        Raises ExitingError or BackendError.
        """
        channel = self.channel
        if channel.exiting:
            raise ExitingError()
        floor = self.handoff_floor
        if floor is not None and pos >= floor:
            self.handoff_floor = None  # past what it had before the restart
        if not msgs:
            return succeed(None)
        channel.message_count += len(msgs)
        ready = [m for m in msgs if not m.deadline]  # DPUB delays: see Message.deadline
        later = [m for m in msgs if m.deadline]
        if ready:
            channel.backend.put_many([m.encode() for m in ready])
            channel.wake()
        return ensureDeferred(self._hand_off(bool(ready), later, pos))

    async def _hand_off(self, wrote: bool, later: list[Message], pos: Position) -> None:
        channel = self.channel
        while wrote:
            try:
                await channel.backend.written()
                break
            except BackendError:
                if channel.exiting or channel.owner.exiting:
                    raise
                d: Deferred[None] = Deferred()
                channel.clock.callLater(1.0, d.callback, None)
                await d
        # Recorded only now: the queue's copies are fsynced, and none of them
        # has been taken yet (reads come back after this write's callback), so
        # no record about them can precede this one in the journal.
        self.journal.handed_off(pos)
        if later:
            now = channel.clock.seconds()
            for m in later:
                channel.defer_published(m.copy(), now)  # (other channels hold the same object)
        await self.journal.synced()

    def deferred(self, msg: Message, when: float) -> None:
        self.journal.deferred(msg, when)

    def finished(self, msg_ids: list[bytes]) -> None:
        self.journal.finished_many(msg_ids)

    def emptied(self) -> None:
        self.journal.cleared()

    def health(self) -> str | None:
        error: str | None = self.journal.error
        return error

    def close(self) -> Deferred[None]:
        return ensureDeferred(self._close())

    async def _close(self) -> None:
        """Graceful stop: put the journal's messages back in the queue, then drop the journal.

        What is left is a plain nsqd data directory (deferred due times go
        to ``nsqtw.deferred.json`` as without the flag). If anything fails,
        the journal stays and the next start with --durable-delivery uses it.
        """
        channel = self.channel
        journal = self.journal
        backend = self._backend
        if not channel.flush_or_log():
            await backend.close()
            await journal.close()
            return
        backend.commit_read(backend.read_mark())
        try:
            await backend.close()
        except Exception:
            await journal.close()
            raise
        await journal.remove()

    def delete(self) -> None:
        channel = self.channel
        self.journal.remove().addErrback(
            lambda f: channel.log.failure("CHANNEL({topic}:{channel}): failed to remove journal", f,
                                          topic=channel.topic_name, channel=channel.name))
