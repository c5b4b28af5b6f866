"""A topic: its queue and its channels; the pump gives every channel a copy."""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from twisted.internet.defer import Deferred, DeferredList, ensureDeferred
from twisted.internet.interfaces import IDelayedCall, IReactorTime
from zope.interface import implementer

from nsqtw.core.handoff import (
    BACKLOG_LIMIT,
    SPILL_INTERVAL,
    TOPIC_BATCH,
    Batch,
    Handoff,
    HandoffLedger,
    HandoffSlot,
    durable_backend,
    is_behind,
    only_spill,
)
from nsqtw.core.message import (
    MIN_VALID_MSG_LENGTH,
    Message,
    decode_message,
    decode_messages,
    encode_new,
    new_messages,
    record_id,
)
from nsqtw.core.parking import Parking
from nsqtw.core.pump import Pausable, Pump
from nsqtw.errors import BackendError, ExitingError
from nsqtw.interfaces import IBackendQueue, IChannelOwner, IDeliveryMode, ITopicDelivery, ITopicOwner, ReadMark
from nsqtw.log import Logger
from nsqtw.names import is_ephemeral

if TYPE_CHECKING:
    from nsqtw.core.channel import Channel


@implementer(IChannelOwner)
class Topic(Pausable):
    """Messages published to one topic, before they are copied to channels.

    While a topic has no channel, or is paused, messages wait here (memory up
    to ``--mem-queue-size``, then the backend), as in nsqd. The topic's pump
    (:meth:`distribute`) copies them to every channel; the delivery mode
    (:class:`~nsqtw.interfaces.ITopicDelivery`) only answers its questions:
    how much to keep in memory, whether publishers wait for the write,
    whether the read position may pass a batch before the channels have it
    safe, which due times it keeps.
    """

    log = Logger()
    owner: ITopicOwner

    def __init__(self, owner: ITopicOwner, name: str, backend: IBackendQueue, clock: IReactorTime,
                 mode: IDeliveryMode) -> None:
        self.owner = owner
        self.options: Any = owner.options
        self.name = name
        self.ephemeral = is_ephemeral(name)
        self.backend = backend
        self.clock = clock
        self.channels: dict[str, Channel] = {}
        #: those of them the topic hands batches to through their journals (see _must_wait)
        self._journaled: list[Channel] = []
        #: channels deleted so far (a hand-off under way leaves them out, see delivery.Handoff)
        self.channel_deletions = 0
        self.memory: deque[Message] = deque()
        self.paused = False
        self.exiting = False
        self.message_count = 0
        self.message_bytes = 0
        #: due times (unix seconds) of DPUB messages in the queue at the last graceful stop
        self.restored_due: dict[bytes, float] = {}
        self.delivery: ITopicDelivery = mode.for_topic(self)
        #: batches handed off but not yet safe in every channel (when the mode commits after the hand-off)
        self._ledger: HandoffLedger | None = None
        if self.delivery.commit_after_handoff:
            self._ledger = HandoffLedger(self, durable_backend(backend), self.delivery.committed)
        self._handoff = HandoffSlot()
        #: where the copies of channels without clients wait, one for all of them
        #: (:mod:`nsqtw.core.parking`); not for a topic that commits after the hand-off, whose
        #: channels' copies must each be safe before its read position passes them
        self._parking: Parking[Channel] | None = Parking() if self._ledger is None else None
        #: waiting for a channel's disk, or the node's, to catch up before copying more
        self._held = False
        #: ``--replicas=2``: IDs a replica delivered while this node was away, of a topic that had no
        #: channel then: each channel made while it still holds messages leaves them out
        #: (``Channel.drop_taken``); while ``held_for_notes`` (a start's first seconds:
        #: ``nsqtw.replica.notice``) nothing is copied to channels, waiting for them
        self.taken_elsewhere: set[bytes] = set()
        self.held_for_notes = False
        #: the last batch's copies all went to disk queues, nobody to deliver to (see _wake_for_publish)
        self._spilling = False
        self._spill_call: IDelayedCall | None = None
        #: publishers waiting for the backend's backlog to fall under the bound
        self._room_waiters: list[Deferred[None]] = []
        self._pump = Pump(clock, self.distribute, f"TOPIC({name})")
        self._pump.start()
        backend.set_readable_callback(self._backend_readable)

    def __repr__(self) -> str:
        return f"<Topic {self.name}>"

    def depth(self) -> int:
        return len(self.memory) + self.backend.depth()

    def in_memory(self) -> int:
        """Messages queued in memory, not yet copied to the channels."""
        return len(self.memory)

    def wake(self) -> None:
        """Run the pump on the next turn (there may be messages to copy)."""
        self._pump.wake()

    def _backend_readable(self) -> None:
        """The backend has records to read: only a topic with channels reads them (a new channel
        wakes the pump, :meth:`get_channel`)."""
        if self.channels:
            self._pump.wake()

    # -- publishing -------------------------------------------------------

    def has_room(self) -> bool:
        """Whether a publish may be accepted now: the backend's unwritten backlog is under the bound.

        The one admission rule of TCP and HTTP publishers, asked *before* the
        data is accepted (:meth:`NSQD.wait_for_room`). While the disk is slow
        or failing, the backlog stops draining, so the memory it holds stays
        under :data:`~nsqtw.core.handoff.BACKLOG_LIMIT` records /
        :data:`~nsqtw.core.handoff.BACKLOG_BYTES` plus one publish.
        """
        return not is_behind(self.backend)

    def wait_for_room(self) -> Deferred[None]:
        """Fires when :meth:`has_room` may be true again (callers check again); fails on exit.

        One watch per topic on the backend's ``written()``, however many
        publishers wait: each write that lands (or fails, when the disk is
        full: once per retry) checks the backlog once.
        """
        d: Deferred[None] = Deferred(lambda d: self._forget_waiter(d))
        self._room_waiters.append(d)
        if len(self._room_waiters) == 1:
            self._watch_room()
        return d

    def _forget_waiter(self, d: Deferred[None]) -> None:
        if d in self._room_waiters:
            self._room_waiters.remove(d)

    def _watch_room(self) -> None:
        written = self.backend.written()
        if written.called:  # nothing under way to wait on (not a disk queue): look again shortly
            written.addErrback(lambda _: None)
            self.clock.callLater(0.1, self._check_room, None)
        else:
            written.addBoth(self._check_room)

    def _check_room(self, _: object) -> None:
        if not self._room_waiters:
            return
        if self.exiting:
            waiters, self._room_waiters = self._room_waiters, []
            for d in waiters:
                d.errback(ExitingError())
        elif self.has_room():
            waiters, self._room_waiters = self._room_waiters, []
            for d in waiters:
                d.callback(None)
        else:
            self._watch_room()

    def takes_promises(self) -> bool:
        """Whether a worker process may be promised that its publishes here will be taken
        (docs/architecture.md, "Publishes answered by the worker").

        Only where :meth:`publish` answers at once: not exiting, not a mode
        that waits for the write, the backlog under its bound. (The node
        also asks for its unwritten bytes: :meth:`NSQD.promise`.) Once
        promised, nothing refuses such a publish: memory takes it, or the
        disk queue, which refuses a put only when it is closing.
        """
        return not self.exiting and not self.delivery.wait_for_write and self.has_room()

    def publish(self, values: Sequence[int], bodies: list[bytes], timestamp: int,
                delay: float = 0.0) -> Deferred[None] | None:
        """Queue freshly published messages: their ID values (``b"%016x" % value``),
        bodies, timestamp and DPUB delay. Raises ExitingError or BackendError.

        Returns None when the publisher can be answered now: the messages
        are in memory, or handed to the disk thread. Returns what to wait
        on when the delivery mode says the publisher must wait for the write
        (``--sync-every=1``, ``--durable-delivery``). A disk slower than the
        publishers slows them through :meth:`has_room`, asked before this.

        Messages past ``--mem-queue-size`` go to the backend as records made
        straight from their IDs and bodies (:func:`encode_new`), never as
        :class:`Message` objects: a topic without channels, or any topic
        with ``--mem-queue-size=0``, writes every message so, and building
        and then encoding a Message was two thirds of the reactor's work in
        an MPUB (docs/performance.md, "Publishing to disk"). A DPUB delay
        has no place in a record, so delayed messages are built and handed
        to the delivery mode (``--durable-delivery`` journals their due
        times).
        """
        if self.exiting:
            raise ExitingError()
        memory = self.memory
        delivery = self.delivery
        n = len(bodies)
        parking = self._parking
        if parking is not None and not memory and not delay and self._parks_at_once(parking, n):
            # every channel is parked: the pump's next turn would only move these from memory
            # to the channels' log (:meth:`distribute`), so they go there now and it sleeps on
            parking.append(new_messages(values, bodies, timestamp, 0.0))
            self._count(bodies)
            return None
        room = delivery.mem_queue_size - len(memory)
        records: list[bytes] = []
        delayed: list[Message] = []
        if room >= n:
            memory.extend(new_messages(values, bodies, timestamp, delay))
        else:
            room = max(room, 0)
            if delay:
                delayed = new_messages(values[room:], bodies[room:], timestamp, delay)
                records = [m.encode() for m in delayed]
            else:
                records = encode_new(timestamp, values[room:], bodies[room:])
            try:
                if len(records) == 1:
                    self.backend.put(records[0])  # a PUB: half the cost of a batch of one
                else:
                    self.backend.put_many(records)
            except BackendError as e:
                # nothing went to memory yet: nsqd accepts a batch whole or not at all
                self.log.error("TOPIC({topic}): failed to write message to backend - {error}",
                               topic=self.name, error=e)
                raise
            if room:
                memory.extend(new_messages(values[:room], bodies[:room], timestamp, delay))
        self._count(bodies)
        if self.channels:  # else nothing to do until get_channel() wakes the pump
            self._wake_for_publish()
        if records and delivery.wait_for_write:
            return delivery.published(delayed, self.backend.written())
        return None

    def _wake_for_publish(self) -> None:
        """Run the pump for what was just published: on the next turn, or, while every copy
        would only go to a disk queue (the last batch's channels were all full, without
        clients), after :data:`~nsqtw.core.handoff.SPILL_INTERVAL`.

        A PUB to 50 such channels cost 50 ``put_many`` calls and their flush
        bookkeeping, a batch per PUB; gathered, the PUBs of an interval are one
        batch and one ``put_many`` a channel, as the disk queue would have
        written them together anyway. Nobody waits for these copies; a
        channel that gets a client, or room, is seen at the next batch. The
        topic's memory queue holds the gathered messages, so it is never let
        past half full: from there the pump runs at once.
        """
        if not self._spilling or 2 * len(self.memory) >= self.delivery.mem_queue_size:
            self._pump.wake()
        elif self._spill_call is None:
            self._spill_call = self.clock.callLater(SPILL_INTERVAL, self._spill_tick)

    def _spill_tick(self) -> None:
        self._spill_call = None
        self._pump.wake()

    def _count(self, bodies: list[bytes]) -> None:
        self.message_count += len(bodies)
        self.message_bytes += sum(map(len, bodies))

    def _parks_at_once(self, parking: Parking[Channel], n: int) -> bool:
        """Whether ``n`` new plain messages may go straight to the parked channels' log: the
        pump would hand them nowhere else and has nothing before them (nothing queued or under
        way, not paused or held), and the log takes them whole (:meth:`Parking.takes_whole`).
        The pump's turn per publish, a fifth of a one-message round trip's reactor time, is
        saved: a PUB to channels nobody reads costs what a PUB to a topic without channels does."""
        return (n <= self.delivery.mem_queue_size and parking.takes_whole(n)
                and not self.paused and not self._held and not self.held_for_notes and self._handoff.idle
                and not self.backend.depth() and not self.owner.unwritten.over())

    # -- the pump: copy batches to the channels ------------------------------

    def distribute(self) -> bool:
        """The pump's body: hand one batch to every channel, a slice of them per step
        (:class:`~nsqtw.core.handoff.Handoff`); True when more is waiting (another turn).

        A batch is read from the backend first, then from memory. With more
        than one channel the channels share the batch's Message objects: a
        channel copies a message only as it takes it out of its memory queue
        (:meth:`Channel.put_many`, ``shared``). When the delivery mode
        commits after the hand-off, the read position passes the batch only
        once every channel has it safe (:class:`~nsqtw.core.handoff.HandoffLedger`).
        """
        if self.exiting:
            return False
        more = self._handoff.step()
        if more is not None:
            return more or bool(self.memory) or self.backend.depth() > 0
        channels = list(self.channels.values())
        if not channels or self.paused or self._held or self.held_for_notes or self._must_wait(channels):
            return False
        parking = self._parking
        if parking is not None:
            parking.park_candidates()
        batch = self._take_batch(channels)
        if batch is None:
            return False
        if parking is not None and len(parking):
            channels = self._park_batch(parking, batch, channels)
            if not channels:  # every channel parked: the log has the batch (no ledger to tell)
                self._spilling = False
                return bool(self.memory) or self.backend.depth() > 0
        self._spilling = self._ledger is None and only_spill(channels)
        return self._handoff.begin(Handoff(self, channels, batch)) or bool(self.memory) or self.backend.depth() > 0

    def _park_batch(self, parking: Parking[Channel], batch: Batch, channels: list[Channel]) -> list[Channel]:
        """Give ``batch`` to the parked channels at once, through the shared log, and return the
        channels the hand-off still has to reach: those not parked, and those the log could not
        carry it for (full, or the batch has records or DPUB delays: they take it the usual way)."""
        whole = batch.plain_messages()
        if whole:
            parking.full_for(len(whole))
            parking.append(whole)
        else:
            parking.unpark_all()
        return parking.active() if len(parking) else channels

    def _must_wait(self, channels: list[Channel]) -> bool:
        """Whether a channel, or the node, cannot take more now; if so the pump comes back later.

        A journaled channel whose journal or disk refuses a hand-off is asked
        again in a second. A channel whose disk is behind (:func:`is_behind`)
        holds the batches here, where their own backlog pauses publishers,
        until it has caught up; so does the node's unwritten total over
        ``--max-unwritten-bytes``: the copies would only add to the memory
        waiting for the disks.
        """
        for channel in self._journaled:
            if channel.delivery.refuses_handoff():
                self.clock.callLater(1.0, self.wake)
                return True
        unwritten = self.owner.unwritten
        # while no single queue could be over the bound, no need to ask thousands of channels
        if unwritten.total > BACKLOG_LIMIT * MIN_VALID_MSG_LENGTH:
            for channel in channels:
                if is_behind(channel.backend):
                    self._hold(channel.backend.written())
                    return True
        if unwritten.over():
            self._hold(unwritten.when_under())
            return True
        return False

    def _hold(self, until: Deferred[None]) -> None:
        self._held = True
        until.addBoth(self._release)

    def _release(self, _: object) -> None:
        self._held = False
        self.wake()

    def _take_batch(self, channels: list[Channel]) -> Batch | None:
        """The next batch: records from the backend (as many decoded as the emptiest channel
        memory takes, beyond its room a channel puts records in its backend as they were
        read), then messages from memory."""
        ledger = self._ledger
        due: list[Message] = []  # DPUB messages read back with a due time
        due_ids: list[bytes] = []
        records: list[bytes] = []
        decoded: list[Message] = []
        read: list[tuple[bytes, int, int]] | None = None
        mark: ReadMark | None = None
        if self.backend.depth():
            if ledger is None:
                records = self.backend.read(TOPIC_BATCH)
            else:
                read = ledger.backend.read_positions(TOPIC_BATCH)
                records = [r[0] for r in read]
                mark = ledger.backend.read_mark()
            kept = self.delivery.dues()
            due, decoded, records = self.split_records(records, max(c.room() for c in channels), kept)
            if due:
                due_ids = self.apply_dues(due, kept)
        memory = self.memory
        k = min(TOPIC_BATCH - len(due) - len(records), len(memory))
        tail: list[Message] = []
        if k == len(memory):
            tail = list(memory)
            memory.clear()
        elif k > 0:
            pop = memory.popleft
            tail = [pop() for _ in range(k)]
        if not (due or records or tail):
            if ledger is not None and read:  # every record read was bad (each logged): pass them
                ledger.add(mark, [])
            return None
        return Batch(self, due, records, decoded, tail, len(channels) > 1, ledger, read, mark, due_ids)

    def decode(self, data: bytes) -> Message | None:
        """A record from the backend as a Message; a bad one is logged and skipped, as nsqd does."""
        try:
            return decode_message(data)
        except ValueError as e:
            self._bad_record(e)
            return None

    def decode_all(self, records: list[bytes]) -> list[Message]:
        """Records from the backend as Messages, the bad ones logged and skipped (:meth:`decode`)."""
        return decode_messages(records, self._bad_record)

    def _bad_record(self, error: ValueError) -> None:
        self.log.error("TOPIC({topic}): failed to decode message - {error}", topic=self.name, error=error)

    def split_records(self, records: list[bytes], n: int, kept: Mapping[bytes, float]
                      ) -> tuple[list[Message], list[Message], list[bytes]]:
        """Records read from the backend, for channels whose memory queues take at most ``n`` more.

        Returns the DPUB messages among them whose due time the topic knows
        (their ID in ``restored_due``, kept across the last stop, or in
        ``kept``, the delivery mode's), decoded to wait for their time
        (:meth:`apply_dues`); the first ``n`` of the others decoded; and all
        those others still encoded. A channel puts what its memory queue
        has no room for into its backend in the encoding it was read in
        (the topic's and the channel's are the same): decoding it here
        would only have it encoded again, and decoded once more when the
        channel reads it back. A bad record is logged and skipped here, as
        :meth:`decode` does, wherever it is.
        """
        due: list[Message] = []
        restored = self.restored_due
        if restored or kept:
            others = []
            for data in records:
                if len(data) >= MIN_VALID_MSG_LENGTH and ((mid := record_id(data)) in restored or mid in kept):
                    due.append(decode_message(data))
                else:
                    others.append(data)
            records = others
        if n >= len(records):  # the common case: every channel takes them all decoded
            head, rest = records, []
        else:
            head, rest = records[:n], records[n:]
        decoded = self.decode_all(head)
        if len(decoded) < len(head):  # bad ones, each logged by decode
            head = [data for data in head if len(data) >= MIN_VALID_MSG_LENGTH]
        if not rest:
            return due, decoded, head
        if min(map(len, rest)) < MIN_VALID_MSG_LENGTH:
            rest = self._skip_bad(rest)
        return due, decoded, head + rest

    def _skip_bad(self, records: list[bytes]) -> list[bytes]:
        """``records`` without those :meth:`decode` refuses (each logged by it)."""
        good = []
        for data in records:
            if len(data) >= MIN_VALID_MSG_LENGTH:
                good.append(data)
            else:
                self.decode(data)
        return good

    def apply_dues(self, msgs: list[Message], dues: Mapping[bytes, float]) -> list[bytes]:
        """Give DPUB messages read back from the queue their due time; returns their ids."""
        restored = self.restored_due
        now = self.clock.seconds()
        ids = []
        for m in msgs:
            when = dues.get(m.id)
            if when is None and restored:
                when = restored.pop(m.id, None)
            if when is not None:
                ids.append(m.id)
                if when > now:
                    m.deadline = when - now  # the DPUB delay, as Message.deadline says
        return ids

    def deferred_due(self) -> dict[bytes, float]:
        """Due times of DPUB messages still in the queue, to keep across a restart."""
        due = dict(self.restored_due)
        due.update(self.delivery.dues())
        return due

    # -- channels ---------------------------------------------------------

    def get_channel(self, name: str) -> Channel:
        """The channel of that name, created (and announced) if new."""
        channel = self.channels.get(name)
        if channel is None:
            if self.exiting:
                raise ExitingError()
            channel = self.owner.make_channel(self, name)
            self.channels[name] = channel
            if channel.journaled:
                self._journaled.append(channel)
            if self._parking is not None:
                channel.parking = self._parking
                self._parking.join(channel)
            if self.taken_elsewhere:
                if self.depth():
                    channel.drop_taken(self.taken_elsewhere)
                else:
                    self.taken_elsewhere.clear()  # (they all left the topic)
            self.log.info("TOPIC({topic}): new channel({channel})", topic=self.name, channel=name)
            self.owner.channel_created(self, channel)
            self._pump.wake()
        return channel

    def delete_channel(self, name: str) -> Deferred[None]:
        """Remove a channel and its data; raises KeyError when there is none."""
        channel = self.channels.pop(name)
        self.channel_deletions += 1
        if channel in self._journaled:
            self._journaled.remove(channel)
        self.log.info("TOPIC({topic}): deleting channel {channel}", topic=self.name, channel=name)
        d = channel.delete()
        self.owner.channel_deleted(self, channel)
        if not self.channels and self.ephemeral and not self.exiting:
            self.owner.topic_unused(self)
        return d

    def channel_unused(self, channel: Channel) -> None:
        """An ephemeral channel lost its last client: delete it, as nsqd does."""
        if self.channels.get(channel.name) is channel:
            self.delete_channel(channel.name).addErrback(
                lambda f: self.log.failure("TOPIC({topic}): delete channel failed", f, topic=self.name))

    def state_changed(self) -> None:
        """A channel was paused or unpaused."""
        self.owner.state_changed()

    # -- administration ---------------------------------------------------

    def empty(self) -> Deferred[None]:
        self.memory.clear()
        return self.backend.empty()

    def health(self) -> str | None:
        """The first failure of the topic's or its channels' storage, or ``None``."""
        for error in (self.backend.health(), self.delivery.health()):
            if error:
                return error
        for channel in self.channels.values():
            error = channel.health()
            if error:
                return error
        return None

    def _stop(self) -> None:
        self.exiting = True
        if self._spill_call is not None:
            self._spill_call.cancel()
            self._spill_call = None
        self._pump.stop()
        self._check_room(None)

    def close(self) -> Deferred[Any]:
        """Graceful stop: every message goes to its backend, every backend closes."""
        self._stop()
        return ensureDeferred(self._close())

    async def _close(self) -> None:
        self._handoff.finish()  # the channels not reached yet get it before they flush
        if self._ledger is not None:
            # let the channels' writes under way finish, so the read position persisted is exact
            await DeferredList(self._ledger.under_way(), consumeErrors=True)
        await DeferredList([c.close() for c in self.channels.values()], consumeErrors=True)
        try:
            if self.memory:
                self.backend.put_many([m.encode() for m in self.memory])
                self.memory.clear()
        except BackendError as e:
            self.log.error("TOPIC({topic}): failed to flush - {error}", topic=self.name, error=e)
        await self.backend.close()
        await self.delivery.close()  # the mode's own files (not if the backend failed to close)

    def delete(self) -> Deferred[Any]:
        """Remove the topic, its channels and their data."""
        self._stop()
        ds: list[Deferred[Any]] = []
        for name in list(self.channels):
            channel = self.channels.pop(name)
            ds.append(channel.delete())
            self.owner.channel_deleted(self, channel)
        self._journaled.clear()
        self.memory.clear()
        ds.append(self.backend.delete())
        ds.append(self.delivery.delete())
        return DeferredList(ds, consumeErrors=True)
