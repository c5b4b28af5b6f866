"""A topic: its queue and its channels; the pump gives every channel a copy."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from twisted.internet import defer
from twisted.internet.defer import Deferred, DeferredList, ensureDeferred
from twisted.internet.interfaces import IReactorTime

from nsqtw.core.channel import Channel
from nsqtw.core.message import Message, decode_message
from nsqtw.core.pump import Pump
from nsqtw.errors import BackendError, ExitingError
from nsqtw.interfaces import IBackendQueue, IDurableBackendQueue
from nsqtw.log import Logger
from nsqtw.names import is_ephemeral

if TYPE_CHECKING:
    from nsqtw.core.nsqd import NSQD
    from nsqtw.storage.journal import Journal

#: messages copied to the channels in one reactor turn before yielding
TOPIC_BATCH = 8192
#: past this many records waiting for the disk thread, publishers wait for the write
BACKLOG_LIMIT = 10000
#: ... or past this many bytes of them (large messages)
BACKLOG_BYTES = 16 * 1024 * 1024


def _behind(backend: IBackendQueue) -> bool:
    """Whether a backend's disk thread is so far behind that its writers must wait."""
    return backend.backlog() > BACKLOG_LIMIT or backend.backlog_bytes() > BACKLOG_BYTES


class Topic:
    """Messages published to one topic, before they are copied to channels.

    While a topic has no channel, or is paused, messages wait here (memory up
    to ``--mem-queue-size``, then the backend), as in nsqd.
    """

    log = Logger()

    def __init__(self, nsqd: NSQD, name: str, backend: IBackendQueue, clock: IReactorTime,
                 on_delete: Callable[[Topic], None], journal: Journal | None = None) -> None:
        self.nsqd = nsqd
        self.name = name
        self.ephemeral = is_ephemeral(name)
        self.backend = backend
        self._clock = clock
        self._on_delete = on_delete
        self.channels: dict[str, Channel] = {}
        self.memory: deque[Message] = deque()
        self.paused = False
        self.exiting = False
        self.message_count = 0
        self.message_bytes = 0
        #: waiting for a channel's disk to catch up before copying more to it
        self._held = False
        #: --durable-delivery: every message goes to the disk queue and the
        #: publisher waits for its fsync; see _distribute_durable
        self.durable = bool(getattr(nsqd.options, "durable_delivery", False)) and not self.ephemeral
        self._mem_queue_size = 0 if self.durable else nsqd.options.mem_queue_size
        self._wait_for_write = self.durable or nsqd.options.sync_every <= 1
        #: durable mode: [read mark, handed off everywhere?] per batch, oldest first
        self._marks: deque[list[Any]] = deque()
        self._handoffs: set[Deferred[Any]] = set()
        #: durable mode: due times of DPUB messages in the queue (nsqd's record has no field for them)
        self.journal = journal
        #: due times (unix seconds) of DPUB messages in the queue at the last graceful stop
        self.restored_due: dict[bytes, float] = {}
        #: --sync-every=1: the topic's read position passes records only once every
        #: channel has written them, so a kill -9 cannot lose an acknowledged message
        #: between the topic's queue and a channel's (the marks above are reused)
        self._commit_after_write = (not self.durable and self._wait_for_write
                                    and IDurableBackendQueue.providedBy(backend))
        distribute = self._distribute_durable if self.durable else self._distribute
        self._pump = Pump(clock, distribute, f"TOPIC({name})")
        self._pump.start()
        backend.set_readable_callback(self._pump.wake)

    def __repr__(self) -> str:
        return f"<Topic {self.name}>"

    def depth(self) -> int:
        return len(self.memory) + self.backend.depth()

    # -- publishing -------------------------------------------------------

    def put_messages(self, msgs: list[Message]) -> Deferred[None] | None:
        """Queue published messages; raises ExitingError or BackendError.

        Returns None when the publisher can be answered now: the messages
        are in memory, or handed to the disk thread. Returns the backend's
        ``written()`` when the publisher must wait for the write: with
        ``--sync-every=1`` (every acknowledged message survives kill -9), or
        when the disk is behind by more than BACKLOG_LIMIT records or
        BACKLOG_BYTES (so a publisher faster than the disk is slowed down to
        its pace).
        """
        if self.exiting:
            raise ExitingError()
        memory = self.memory
        room = self._mem_queue_size - len(memory)
        rest = msgs
        if room > 0:
            memory.extend(msgs[:room])
            rest = msgs[room:]
        if rest:
            try:
                self.backend.put_many([m.encode() for m in rest])
            except BackendError as e:
                self.log.error("TOPIC({topic}): failed to write message to backend - {error}",
                               topic=self.name, error=e)
                # what went to memory stays: nsqd accepts a batch whole or not at all
                for _ in range(len(msgs) - len(rest)):
                    memory.pop()
                raise
        self.message_count += len(msgs)
        self.message_bytes += sum(len(m.body) for m in msgs)
        if self.channels:  # else nothing to do until get_channel() wakes the pump
            self._pump.wake()
        if rest and (self._wait_for_write or _behind(self.backend)):
            written = self.backend.written()
            journal = self.journal
            if journal is not None and rest[0].deferred:
                now = self._clock.seconds()
                for m in rest:
                    journal.due(m.id, now + m.deferred)
                written.addCallback(lambda _: journal.synced())
            return written
        return None

    def _distribute(self) -> bool:
        channels = list(self.channels.values())
        if not channels or self.paused or self.exiting or self._held:
            return False
        for channel in channels:
            if _behind(channel.backend):
                # that channel's disk is behind: keep messages here (where their
                # own backlog pauses publishers) until it has caught up
                self._held = True
                channel.backend.written().addBoth(self._release)
                return False
        msgs: list[Message] = []
        mark = None
        if self.backend.depth():
            if self._commit_after_write:
                backend: IDurableBackendQueue = self.backend  # type: ignore[assignment]
                records = [r[0] for r in backend.read_positions(TOPIC_BATCH)]
                mark = backend.read_mark()
            else:
                records = self.backend.read(TOPIC_BATCH)
            for data in records:
                try:
                    msgs.append(decode_message(data))
                except ValueError as e:
                    self.log.error("TOPIC({topic}): failed to decode message - {error}",
                                   topic=self.name, error=e)
            if self.restored_due:
                self._apply_dues(msgs, None)
        memory = self.memory
        k = min(TOPIC_BATCH - len(msgs), len(memory))
        if k == len(memory):
            msgs.extend(memory)
            memory.clear()
        elif k > 0:
            pop = memory.popleft
            msgs.extend(pop() for _ in range(k))
        if not msgs:
            return False
        first, others = channels[0], channels[1:]
        for channel in others:
            self._put(channel, [m.copy() for m in msgs])
        self._put(first, msgs)
        if mark is not None:
            entry: list[Any] = [mark, False, []]
            self._marks.append(entry)
            d = DeferredList([self._when_written(c.backend) for c in channels], consumeErrors=True)
            self._handoffs.add(d)
            d.addCallback(self._handed_off, entry, d)
        return bool(memory) or self.backend.depth() > 0

    def _when_written(self, backend: IBackendQueue) -> Deferred[Any]:
        """Fires once ``backend`` has written everything put so far, through failed attempts
        (a full disk keeps the records and retries); fails only if the topic is closing meanwhile."""
        d = backend.written()
        d.addErrback(lambda f: f if self.exiting else self._when_written(backend))
        return d

    def _release(self, _: object) -> None:
        self._held = False
        self._pump.wake()

    def _distribute_durable(self) -> bool:
        """Durable mode: copy a batch to every channel; the topic's read position
        moves past it only once every durable channel has it safe.

        After a restart the topic re-reads what it had not committed; a
        channel's journal says how far it had got (``handoff_floor``) and
        the records before that are not given to it again.
        """
        channels = list(self.channels.values())
        if not channels or self.paused or self.exiting:
            return False
        backend: IDurableBackendQueue = self.backend  # type: ignore[assignment]
        for channel in channels:
            error = channel.backend.write_error if channel.journal is not None else None  # type: ignore[attr-defined]
            if error is not None:
                # a durable channel cannot take writes: wait rather than skip it
                self._clock.callLater(1.0, self._pump.wake)
                return False
        records = backend.read_positions(TOPIC_BATCH)
        if not records:
            return False
        mark = backend.read_mark()
        msgs: list[Message] = []
        positions: list[tuple[int, int]] = []
        for data, num, pos in records:
            try:
                msgs.append(decode_message(data))
            except ValueError as e:
                self.log.error("TOPIC({topic}): failed to decode message - {error}", topic=self.name, error=e)
                continue
            positions.append((num, pos))
        due_ids = self._apply_dues(msgs, self.journal) if self.restored_due or (
            self.journal is not None and self.journal.dues) else []
        end = (records[-1][1], records[-1][2])
        waits: list[Deferred[None]] = []
        for i, channel in enumerate(channels):
            batch = msgs
            floor = channel.handoff_floor
            if floor is not None:
                batch = [m for m, p in zip(msgs, positions, strict=True) if p > floor]
                if end >= floor:
                    channel.handoff_floor = None
            if i:
                batch = [m.copy() for m in batch]
            try:
                if channel.journal is not None:
                    waits.append(channel.put_handoff(batch, end))
                else:
                    channel.put_many(batch)
            except (ExitingError, BackendError) as e:
                self.log.error("TOPIC({topic}): failed to put msg(s) to channel({channel}) - {error}",
                               topic=self.name, channel=channel.name, error=e)
                if channel.journal is not None:
                    waits.append(defer.fail(e))
        entry: list[Any] = [mark, False, due_ids]
        self._marks.append(entry)
        if waits:
            d = DeferredList(waits, consumeErrors=True)
            self._handoffs.add(d)
            d.addCallback(self._handed_off, entry, d)
        else:
            entry[1] = True
            self._commit_marks()
        return backend.depth() > 0

    def _apply_dues(self, msgs: list[Message], journal: Journal | None) -> list[bytes]:
        """Give DPUB messages read back from the queue their due time; returns their ids."""
        dues = journal.dues if journal is not None else {}
        restored = self.restored_due
        now = self._clock.seconds()
        ids = []
        for m in msgs:
            when = dues.get(m.id)
            if when is None and restored:
                when = restored.pop(m.id, None)
            if when is not None:
                ids.append(m.id)
                if when > now:
                    m.deferred = when - now
        return ids

    def deferred_due(self) -> dict[bytes, float]:
        """Due times of DPUB messages still in the queue, to keep across a restart."""
        due = dict(self.restored_due)
        if self.journal is not None:
            due.update(self.journal.dues)
        return due

    def _handed_off(self, results: list[tuple[bool, Any]], entry: list[Any], d: Deferred[Any]) -> None:
        self._handoffs.discard(d)
        failed = [r for ok, r in results if not ok]
        if failed:
            # left uncommitted: after a restart these records are read again
            self.log.error("TOPIC({topic}): hand-off to a channel failed - {error}",
                           topic=self.name, error=failed[0].getErrorMessage())
            return
        entry[1] = True
        self._commit_marks()

    def _commit_marks(self) -> None:
        marks = self._marks
        last = None
        while marks and marks[0][1]:
            last, _, due_ids = marks.popleft()
            if due_ids and self.journal is not None:
                self.journal.drop_dues(due_ids)
        if last is not None:
            self.backend.commit_read(last)  # type: ignore[attr-defined]

    def _put(self, channel: Channel, msgs: list[Message]) -> None:
        try:
            channel.put_many(msgs)
        except (ExitingError, BackendError) as e:
            self.log.error("TOPIC({topic}): failed to put msg(s) to channel({channel}) - {error}",
                           topic=self.name, channel=channel.name, error=e)

    # -- channels ---------------------------------------------------------

    def get_channel(self, name: str) -> Channel:
        """The channel of that name, created (and announced) if new."""
        channel = self.channels.get(name)
        if channel is None:
            if self.exiting:
                raise ExitingError()
            channel = self.nsqd.make_channel(self, name)
            self.channels[name] = channel
            self.log.info("TOPIC({topic}): new channel({channel})", topic=self.name, channel=name)
            self.nsqd.channel_created(self, channel)
            self._pump.wake()
        return channel

    def delete_channel(self, name: str) -> Deferred[None]:
        """Remove a channel and its data; raises KeyError when there is none."""
        channel = self.channels.pop(name)
        self.log.info("TOPIC({topic}): deleting channel {channel}", topic=self.name, channel=name)
        d = channel.delete()
        self.nsqd.channel_deleted(self, channel)
        if not self.channels and self.ephemeral and not self.exiting:
            self._on_delete(self)
        return d

    def _channel_wants_delete(self, channel: Channel) -> None:
        # an ephemeral channel lost its last client
        if self.channels.get(channel.name) is channel:
            self.delete_channel(channel.name).addErrback(
                lambda f: self.log.failure("TOPIC({topic}): delete channel failed", f, topic=self.name))

    # -- administration ---------------------------------------------------

    def pause(self) -> None:
        self.paused = True
        self.nsqd.metadata_changed()

    def unpause(self) -> None:
        self.paused = False
        self.nsqd.metadata_changed()
        self._pump.wake()

    def empty(self) -> Deferred[None]:
        self.memory.clear()
        return self.backend.empty()

    def _stop(self) -> None:
        self.exiting = True
        self._pump.stop()

    def close(self) -> Deferred[Any]:
        """Graceful stop: every message goes to its backend, every backend closes."""
        self._stop()
        if self.durable:
            return ensureDeferred(self._close_durable())
        if self._handoffs:
            return ensureDeferred(self._close_after_handoffs())
        return self._close_plain()

    async def _close_after_handoffs(self) -> Any:
        # --sync-every=1: let the channels' writes under way finish, so the read position persisted is exact
        await DeferredList(list(self._handoffs), consumeErrors=True)
        return await self._close_plain()

    def _close_plain(self) -> Deferred[Any]:
        ds = [c.close() for c in self.channels.values()]
        try:
            if self.memory:
                self.backend.put_many([m.encode() for m in self.memory])
                self.memory.clear()
        except BackendError as e:
            self.log.error("TOPIC({topic}): failed to flush - {error}", topic=self.name, error=e)
        ds.append(self.backend.close())
        return DeferredList(ds, consumeErrors=True)

    async def _close_durable(self) -> Any:
        # let hand-offs under way finish, so the read position persisted is exact
        if self._handoffs:
            await DeferredList(list(self._handoffs), consumeErrors=True)
        await DeferredList([c.close() for c in self.channels.values()], consumeErrors=True)
        await self.backend.close()
        if self.journal is not None:
            # the due times it holds go to nsqtw.deferred.json (see NSQD.deferred_due)
            await self.journal.remove()

    def delete(self) -> Deferred[Any]:
        """Remove the topic, its channels and their data."""
        self._stop()
        ds = []
        for name in list(self.channels):
            channel = self.channels.pop(name)
            ds.append(channel.delete())
            self.nsqd.channel_deleted(self, channel)
        self.memory.clear()
        ds.append(self.backend.delete())
        if self.journal is not None:
            ds.append(self.journal.remove())
        return DeferredList(ds, consumeErrors=True)
