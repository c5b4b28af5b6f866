"""``--durable-delivery``: the delivery mode in which no message lives only in memory.

The topic hands messages over into each channel's disk queue (fsynced);
whatever leaves a channel's queue, for delivery or to wait for its due
time, is recorded in the channel's journal first, and the queue's read
position moves on only once the journal holding those records is fsynced.
A topic's read position passes a batch only once every durable channel has
it safe. After kill -9 the journals rebuild exactly the unfinished messages
(see docs/durability.md). Ephemeral topics and channels fall back to the
buffered mode: they keep nothing on disk by definition.

This is one of the delivery strategies Topic and Channel are given
(:mod:`nsqtw.core.delivery` holds the other two); it lives in storage
because it is built on the journal.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from twisted.internet import defer
from twisted.internet.defer import Deferred, DeferredList, ensureDeferred, succeed
from zope.interface import implementer

from nsqtw.core.delivery import (
    TOPIC_BATCH,
    BufferedDelivery,
    Handoff,
    HandoffLedger,
    HandoffSlot,
    durable_backend,
    wait_while_node_behind,
)
from nsqtw.core.message import MSG_ID_LENGTH, Message
from nsqtw.errors import BackendError, ExitingError
from nsqtw.interfaces import IChannelDelivery, IDeliveryMode, ITopicDelivery
from nsqtw.names import backend_name

if TYPE_CHECKING:
    from nsqtw.core.channel import Channel
    from nsqtw.core.topic import Topic
    from nsqtw.storage.journal import Journal, Position

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
        return DurableTopicDelivery(topic, self.journal_factory(backend_name(topic.name)))

    def for_channel(self, channel: Channel) -> IChannelDelivery:
        if channel.ephemeral or channel.topic_ephemeral:
            return self.fallback.for_channel(channel)
        return DurableChannelDelivery(channel, self.journal_factory(backend_name(channel.topic_name,
                                                                                 channel.name)))


@implementer(ITopicDelivery)
class DurableTopicDelivery:
    """Every message goes to the topic's disk queue; publishers wait for its fsync."""

    mem_queue_size = 0
    wait_for_write = True

    def __init__(self, topic: Topic, journal: Journal) -> None:
        self.topic = topic
        #: the due times of DPUB messages in the queue (nsqd's record has no field for them)
        self.journal = journal
        self._backend = durable_backend(topic.backend)
        self._ledger = HandoffLedger(topic, self._backend, journal.drop_dues)
        self._handoff = HandoffSlot()

    def published(self, delayed: list[Message], written: Deferred[None]) -> Deferred[None]:
        if delayed:  # DPUB delays (see Message.deadline)
            journal = self.journal
            now = self.topic.clock.seconds()
            for m in delayed:
                journal.due(m.id, now + m.deadline)
            written.addCallback(lambda _: journal.synced())
        return written

    def distribute(self) -> bool:
        """Hand a batch to every channel, a slice of them per step (:class:`Handoff`); the
        topic's read position moves past it only once every durable channel has it safe.

        After a restart the topic re-reads what it had not committed; a
        channel's journal says how far it had got (``handoff_floor``) and
        the records before that are not given to it again.
        """
        topic = self.topic
        if topic.exiting:
            return False
        more = self._handoff.step()
        if more is not None:
            return more or self._backend.depth() > 0
        channels = list(topic.channels.values())
        if not channels or topic.paused:
            return False
        backend = self._backend
        for channel in channels:
            delivery = channel.delivery
            if isinstance(delivery, DurableChannelDelivery) and (
                    delivery.write_error() is not None or delivery.journal.behind()):
                # a durable channel cannot take writes, or its journal is far behind on
                # fsyncs: wait rather than skip it (memory stays bounded meanwhile)
                topic.clock.callLater(1.0, topic.wake)
                return False
        if wait_while_node_behind(topic, lambda _: topic.wake()):
            return False
        records = backend.read_positions(TOPIC_BATCH)
        if not records:
            return False
        mark = backend.read_mark()
        msgs: list[Message] = []
        positions: list[tuple[int, int]] = []
        for data, num, pos in records:
            msg = topic.decode(data)
            if msg is not None:
                msgs.append(msg)
                positions.append((num, pos))
        due_ids = topic.apply_dues(msgs, self.journal.dues) if topic.restored_due or self.journal.dues else []
        end = (records[-1][1], records[-1][2])
        waits: list[Deferred[None]] = []
        shared = len(channels) > 1

        def give(slice_: list[Channel]) -> None:
            for channel in slice_:
                delivery = channel.delivery
                batch = msgs
                try:
                    if isinstance(delivery, DurableChannelDelivery):
                        floor = delivery.handoff_floor
                        if floor is not None:
                            batch = [m for m, p in zip(msgs, positions, strict=True) if p > floor]
                            if end >= floor:
                                delivery.handoff_floor = None
                        waits.append(delivery.put_handoff(batch, end))
                    else:
                        channel.put_many(batch, shared=shared)
                except (ExitingError, BackendError) as e:
                    topic.log.error("TOPIC({topic}): failed to put msg(s) to channel({channel}) - {error}",
                                    topic=topic.name, channel=channel.name, error=e)
                    if isinstance(delivery, DurableChannelDelivery):
                        waits.append(defer.fail(e))

        handoff = Handoff(topic, channels, len(msgs), give, lambda _: self._ledger.add(mark, waits, due_ids))
        return self._handoff.begin(handoff) or backend.depth() > 0

    def deferred_due(self) -> dict[bytes, float]:
        due = dict(self.topic.restored_due)
        due.update(self.journal.dues)
        return due

    def health(self) -> str | None:
        return self.journal.error

    def close(self) -> Deferred[object]:
        return ensureDeferred(self._close())

    async def _close(self) -> object:
        topic = self.topic
        self._handoff.finish()  # the channels not reached yet get it before they close
        # let hand-offs under way finish, so the read position persisted is exact
        await DeferredList(self._ledger.under_way(), consumeErrors=True)
        await DeferredList([c.close() for c in topic.channels.values()], consumeErrors=True)
        await topic.backend.close()
        # the due times it holds go to nsqtw.deferred.json (see NSQD.deferred_due)
        await self.journal.remove()
        return None

    def delete(self) -> Deferred[object]:
        d: Deferred[Any] = self.journal.remove()
        return d


@implementer(IChannelDelivery)
class DurableChannelDelivery:
    """Whatever leaves the channel's queue is journaled first (memory holds only journal-owned messages)."""

    mem_queue_size = sys.maxsize

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

    def write_error(self) -> str | None:
        """Why the channel's queue refuses writes right now, or ``None``."""
        error: str | None = self._backend.write_error
        return error

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
