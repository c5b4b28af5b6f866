"""A channel: its queue, its subscribed clients, and messages in flight or deferred."""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

from twisted.internet.defer import Deferred, ensureDeferred
from twisted.internet.interfaces import IDelayedCall, IReactorTime

from nsqtw.core.flight import Sent, put_in_flight, take_back, time_out
from nsqtw.core.message import Message, copy_messages, decode_messages, end_flight
from nsqtw.core.pqueue import TimeoutQueue
from nsqtw.core.pump import Pausable, Pump
from nsqtw.errors import BackendError, ExitingError, NotInFlightError
from nsqtw.interfaces import (
    IBackendQueue,
    IChannelDelivery,
    IChannelOwner,
    IConsumer,
    IDeliveryMode,
    IReplication,
    Position,
)
from nsqtw.log import Logger
from nsqtw.names import is_ephemeral
from nsqtw.observe.quantile import Quantile

if TYPE_CHECKING:
    from nsqtw.core.parking import Parking

#: messages handed to clients in one reactor turn before yielding
DELIVERY_BATCH = 4096
#: the smallest slice a client takes at a time while the turn's messages go round its clients
DELIVERY_SLICE = 64


class Channel(Pausable):
    """Holds one channel's copy of every message of its topic.

    Messages wait in memory (bounded by ``--mem-queue-size``) or in the
    backend; the pump hands them to subscribed clients with RDY to spare and
    puts them in flight; a single timer serves every in-flight timeout and
    deferred due time of the channel.
    """

    log = Logger()
    owner: IChannelOwner

    def __init__(self, owner: IChannelOwner, name: str, backend: IBackendQueue,
                 clock: IReactorTime, mem_queue_size: int, max_msg_timeout: float,
                 max_channel_consumers: int, mode: IDeliveryMode) -> None:
        self.owner = owner
        self.topic_name: str = owner.name
        self.topic_ephemeral = is_ephemeral(self.topic_name)
        self.name = name
        self.ephemeral = is_ephemeral(name)
        self.backend = backend
        self.clock = clock
        #: ``--mem-queue-size``; the delivery mode decides what the channel really keeps
        self.options_mem_queue_size = mem_queue_size
        self._max_msg_timeout = max_msg_timeout
        self._max_channel_consumers = max_channel_consumers

        self.memory: deque[Message] = deque()
        #: the memory queue may hold Message objects other channels hold too (see put_many)
        self.shared = False
        #: the topic's shared log, where the channel's copies wait while it has no client
        #: (:mod:`nsqtw.core.parking`); None: the channel always holds its own
        self.parking: Parking[Channel] | None = None
        self.clients: dict[int, IConsumer] = {}
        self.in_flight = TimeoutQueue()
        #: client id -> what was sent to it (so a disconnect costs O(its own in-flight), and
        #: TOUCH knows the --max-msg-timeout cap)
        self._owned: dict[int, Sent] = {}
        self.deferred = TimeoutQueue()
        self.paused = False
        self.exiting = False

        #: messages given to the channel's own queues: ``message_count`` less its parked share
        self.given = 0
        self.requeue_count = 0
        self.timeout_count = 0
        #: messages FINished (nsqd counts these only per client; an nsqtw /metrics figure)
        self.finish_count = 0
        #: end-to-end latency of finished messages (--e2e-processing-latency-percentile)
        self.e2e: Quantile | None = None
        #: ``--replicas=2``: told of each run of FINs (set by NSQD.make_channel), None without
        self.replication: IReplication | None = None
        #: ``--replicas=2``: IDs a replica delivered while this node was away (:meth:`drop_taken`); while
        #: ``held`` (a start's first seconds: ``nsqtw.replica.notice``), nothing is delivered, waiting for them
        self.taken_elsewhere: set[bytes] = set()
        self.held = False

        self._rotation = 0
        #: due times (unix seconds) of deferred messages flushed at the last stop
        self.restored_due: dict[bytes, float] = {}
        self._timer: IDelayedCall | None = None
        self._timer_at = 0.0
        self._pump = Pump(clock, self._deliver, f"CHANNEL({self.topic_name}:{name})")
        self.delivery: IChannelDelivery = mode.for_channel(self)
        #: the memory queue's bound, as the delivery mode sets it (read for every batch a topic hands off)
        self.mem_limit: int = self.delivery.mem_queue_size
        #: the topic hands this channel its batches straight into its backend and waits for each
        #: (:func:`nsqtw.core.handoff.put_journaled`)
        self.journaled: bool = self.delivery.journaled
        #: the topic's records up to this position reached this channel before a restart
        self.handoff_floor: Position | None = self.delivery.handoff_floor
        self._restore(self.delivery.restored())
        self._pump.start()
        backend.set_readable_callback(self._pump.wake)

    def __repr__(self) -> str:
        return f"<Channel {self.topic_name}:{self.name}>"

    # -- queueing ---------------------------------------------------------

    def depth(self) -> int:
        return self.in_memory() + self.backend.depth()

    def in_memory(self) -> int:
        """Messages queued in memory: the memory queue's and, while parked, the share of the topic's log."""
        return len(self.memory) + self._share()

    def _share(self) -> int:
        parking = self.parking
        return 0 if parking is None else parking.share(self)

    def room(self) -> int:
        """How many more messages the memory queue takes before they go to the backend."""
        return max(0, self.mem_limit - self.in_memory())

    @property
    def message_count(self) -> int:
        """Messages the channel was given (nsqd's ``message_count``), its parked share included."""
        return self.given + self._share()

    # -- parking (nsqtw.core.parking) ---------------------------------------

    def may_park(self) -> bool:
        """Whether the channel's copies may wait in the topic's log: nobody reads them from memory."""
        return not self.clients and not self.exiting and not self.journaled

    def take_share(self, msgs: Iterable[Message], n: int) -> None:
        """The parking gives back the ``n`` messages the channel shared while parked: its own
        queued messages now, after those it had (other channels hold the same objects)."""
        self.memory.extend(msgs)
        self.shared = True
        self.given += n

    def share_dropped(self, n: int) -> None:
        """The parking dropped the ``n`` messages the channel shared (an empty): given all the same."""
        self.given += n

    def _unpark(self) -> None:
        if self.parking is not None:
            self.parking.unpark(self)

    def _park_later(self) -> None:
        if self.parking is not None and self.may_park():
            self.parking.want(self)

    def put_many(self, msgs: list[Message], records: Sequence[bytes] = (), *, shared: bool = False,
                 delayed: bool | None = None) -> None:
        """Queue messages from the topic (deferred ones wait for their time).

        ``records`` are more of them, after ``msgs``, still in the backend's
        encoding: they go to the backend as they are (the topic passes only
        what the memory queue has no room for, see :meth:`room`).
        ``shared``: other channels hold the same Message objects, so this
        one takes its own copy of each only as it leaves the memory queue
        (:meth:`take_queued`) or waits for a DPUB delay. ``delayed``: whether
        any has a DPUB delay, when the caller knows (None: the channel looks).
        """
        if self.exiting:
            raise ExitingError()
        self._unpark()
        self.given += len(msgs) + len(records)
        ready = msgs
        if delayed is None:
            delayed = any(m.deadline for m in msgs)
        if delayed:  # a DPUB delay (see Message.deadline)
            now = self.clock.seconds()
            ready = []
            for m in msgs:
                if m.deadline:
                    self.defer_published(m.copy() if shared else m, now)
                else:
                    ready.append(m)
        if shared and ready:
            self.shared = True
        if ready or records:
            self._queue(ready, records)

    def take_queued(self, n: int) -> list[Message]:
        """Up to ``n`` messages out of the memory queue, for delivery: the channel's own objects.

        Messages the topic shared among its channels (:meth:`put_many`) are
        copied here, as they leave: a channel that delivers a message later
        or never has paid one pointer for it meanwhile.
        """
        memory = self.memory
        if n >= len(memory):
            out = list(memory)
            memory.clear()
        else:
            pop = memory.popleft
            out = [pop() for _ in range(n)]
        if self.shared:
            self.shared = bool(memory)
            out = copy_messages(out)
        return out

    def _queue(self, msgs: list[Message], records: Sequence[bytes] = ()) -> None:
        parked = self.parking is not None and self.parking.is_parked(self)
        if parked:  # (a deferred message came due while nobody reads the channel)
            self._unpark()
        memory = self.memory
        room = self.room()
        if room >= len(msgs):
            memory.extend(msgs)
            msgs = []
        elif room:
            memory.extend(msgs[:room])
            msgs = msgs[room:]
        if msgs or records:
            encoded = [m.encode() for m in msgs]
            encoded.extend(records)
            try:
                self.backend.put_many(encoded)
            except BackendError as e:
                self.log.error("CHANNEL({topic}:{channel}): failed to write {n} messages to backend - {error}",
                               topic=self.topic_name, channel=self.name, n=len(encoded), error=e)
                raise
        if self.clients:  # else nothing to deliver to: a client's SUB and RDY wake the pump
            self._pump.wake()
        elif parked:
            self._park_later()

    def defer(self, msg: Message, delay: float, now: float) -> None:
        """``msg`` waits ``delay`` seconds from ``now`` before it is queued again."""
        when = now + delay
        self.deferred.push(msg, when)
        self.arm(when)
        self.delivery.deferred(msg, when)

    def defer_published(self, msg: Message, now: float) -> None:
        """A DPUB message, as the channel takes it: its delay (kept in ``deadline`` until
        now, see Message) becomes a due time."""
        delay, msg.deadline = msg.deadline, 0.0
        self.defer(msg, delay, now)

    def put_deferred(self, msg: Message, delay: float) -> None:
        if self.exiting:
            raise ExitingError()
        self.given += 1
        self.defer(msg, delay, self.clock.seconds())

    # -- clients ----------------------------------------------------------

    def add_client(self, client: IConsumer) -> None:
        """Subscribe a client; raises ValueError past ``--max-channel-consumers``."""
        if self.exiting:
            raise ExitingError()
        if client.client_id in self.clients:
            return
        limit = self._max_channel_consumers
        if limit and len(self.clients) >= limit:
            raise ValueError("too many consumers")
        self._unpark()  # its messages are read from the memory queue from now on
        self.clients[client.client_id] = client
        self._owned[client.client_id] = Sent()
        if client.ready_capacity() > 0:  # a V2 consumer starts at RDY 0: its RDY wakes the pump
            self._pump.wake()

    def remove_client(self, client: IConsumer) -> None:
        """Unsubscribe a client and requeue the messages it still had in flight."""
        if self.clients.pop(client.client_id, None) is None:
            return
        sent = self._owned.pop(client.client_id, None)
        live = self.in_flight.live
        orphans = [] if sent is None else sent.in_flight(live, client)
        if orphans and not self.exiting:
            for m in orphans:
                self.in_flight.remove(m.id)
                m.client = None
            self.requeue_count += len(orphans)
            try:
                self._queue(orphans)
            except BackendError:
                pass  # closing (a failing disk keeps them for its retry); logged by _queue
        if not self.clients and self.ephemeral and not self.exiting:
            self.owner.channel_unused(self)
        elif not self.clients:
            self._park_later()

    def wake(self) -> None:
        """A client's capacity changed (RDY, FIN, resumed writing): deliver.

        Without clients there is nobody to deliver to: no pump turn (a
        connect/SUB/close cycle used to cost one, 6% of the cycle).
        """
        if self.clients:
            self._pump.wake()

    def _restore(self, restored: list[tuple[Message, float]]) -> None:
        """Messages the delivery mode kept across a crash, each with its due time (0: now)."""
        if not restored:
            return
        now = self.clock.seconds()
        for msg, due in restored:
            if due > now:
                self.deferred.push(msg, due)
                self.arm(due)
            else:
                self.memory.append(msg)
        self.log.info("CHANNEL({topic}:{channel}): recovered {count} unfinished messages from its journal"
                      " ({deferred} deferred)", topic=self.topic_name, channel=self.name,
                      count=len(restored), deferred=len(self.deferred))

    # -- delivery ---------------------------------------------------------

    def next_messages(self, n: int) -> list[Message]:
        """Up to ``n`` messages to deliver now, oldest first: the backend's, then memory's.

        The delivery mode says which records come next (``read``), which
        messages it already owns (a copy handed over twice around a crash),
        and is told what leaves the queue before it leaves (``taking``).
        """
        delivery = self.delivery
        if not delivery.may_take():
            return []  # (the mode wakes the channel when it may again)
        out: list[Message] = []
        if self.backend.depth():
            seen: set[bytes] = set()
            for _ in range(8):  # a few batches at most, while every copy read is one already owned
                records = delivery.read(n - len(out))
                if not records:
                    break
                msgs = self.decode_all(records)
                if self.journaled:
                    msgs = self._fresh(msgs, seen)
                if self.restored_due:
                    now = self.clock.seconds()
                    msgs = [msg for msg in msgs if not self.defer_restored(msg, now)]
                out.extend(msgs)
                if out or not self.journaled:
                    break
            else:
                if not out and self.backend.depth():
                    self.wake()  # all skipped so far: more next turn
        k = min(n - len(out), len(self.memory))
        if k > 0:
            out.extend(self.take_queued(k))
        if self.taken_elsewhere:
            out = self._left_out(out)
        delivery.taking(out)
        return out

    def drop_taken(self, ids: Iterable[bytes]) -> None:
        """A replica that took this topic over while this node was away delivered these: left out."""
        self.taken_elsewhere.update(ids)
        self._pump.wake()

    def _left_out(self, out: list[Message]) -> list[Message]:
        keep = [m for m in out if m.id not in (taken := self.taken_elsewhere)]
        if len(keep) < len(out):
            taken.difference_update(gone := [m.id for m in out if m.id in taken])
            if self.replication is not None:
                self.replication.finished(self.topic_name, self.name, gone)
            if not keep and self.depth():
                self.wake()  # (all left out: the next ones next turn)
        if not self.depth() and not self.deferred.live and not self.owner.depth():
            taken.clear()  # nothing left that could be one of them (here or in the topic)
        return keep

    def _fresh(self, msgs: list[Message], seen: set[bytes]) -> list[Message]:
        """``msgs`` but the copies the delivery mode already owns, or already read."""
        owns = self.delivery.owns
        out = []
        for msg in msgs:
            mid = msg.id
            if owns(mid) or mid in seen:
                continue
            seen.add(mid)
            out.append(msg)
        return out

    def decode_all(self, records: list[bytes]) -> list[Message]:
        """Records from the backend as Messages; a bad one is logged and skipped, as nsqd does."""
        return decode_messages(records, self._bad_record)

    def _bad_record(self, error: ValueError) -> None:
        self.log.error("CHANNEL({topic}:{channel}): failed to decode message - {error}",
                       topic=self.topic_name, channel=self.name, error=error)

    def defer_restored(self, msg: Message, now: float) -> bool:
        """A message deferred at the last stop waits out its due time again; True if it must wait."""
        when = self.restored_due.pop(msg.id, None)
        if when is not None and when > now:
            self.defer(msg, when - now, now)
            return True
        return False

    def _deliver(self) -> bool:
        if self.paused or self.held or not self.clients or self.exiting:
            return False
        budget = DELIVERY_BATCH
        clients = list(self.clients.values())
        n = len(clients)
        start = self._rotation % n
        self._rotation += 1
        clients = clients[start:] + clients[:start]
        now = self.clock.seconds()
        in_flight = self.in_flight
        # Round-robin in slices, one deliver() (one write) per client per turn. A slice is a client's
        # even share of what the turn hands out, at least DELIVERY_SLICE: a slice costs a read, an
        # in-flight batch and a timer entry. A journaled channel keeps the small slices: its mode may
        # stop the taking between two (the journal's unsynced bound)
        batches: dict[int, list[Message]] = {}
        wanting = [(c, cap) for c in clients if (cap := c.ready_capacity()) > 0]
        share = DELIVERY_SLICE
        if wanting and not self.journaled:
            share = max(share, min(budget, self.depth()) // len(wanting))
        exhausted = False
        while wanting and budget > 0 and not exhausted:
            still = []
            for client, cap in wanting:
                msgs = self.next_messages(min(cap, budget, share))
                if not msgs:
                    exhausted = True
                    break
                taken = len(msgs)
                sent = self._owned.get(client.client_id)
                if sent is None:
                    sent = self._owned[client.client_id] = Sent()
                msgs, dropped = put_in_flight(msgs, client, in_flight, self.deferred.live, sent, now)
                if dropped:
                    self.log.info("CHANNEL({topic}:{channel}): dropped {n} duplicate message(s) already in flight"
                                  " (a hand-off replayed after a crash)", topic=self.topic_name, channel=self.name,
                                  n=dropped)
                if msgs:
                    batch = batches.get(client.client_id)
                    if batch is None:
                        batches[client.client_id] = msgs
                    else:
                        batch.extend(msgs)
                budget -= taken
                cap -= len(msgs)  # sampled-out messages leave the client ready for more
                if budget <= 0:
                    break
                if cap > 0:
                    still.append((client, cap))
            wanting = still
        # the timer first: whatever a delivery raises, every message put in flight has its deadline
        deadline = in_flight.next_deadline()
        if deadline is not None:
            self.arm(deadline)
        for client_id, msgs in batches.items():
            try:
                self.clients[client_id].deliver(msgs)
            except Exception:
                # those messages stay in flight and time out (requeued) like any undelivered ones;
                # the other clients still get theirs
                self.log.failure("CHANNEL({topic}:{channel}): failed to deliver {count} messages",
                                 topic=self.topic_name, channel=self.name, count=len(msgs))
        return budget <= 0 and not exhausted

    def owned_count(self, client: IConsumer) -> int:
        """How many messages ``client`` has in flight here (from what was sent to it)."""
        sent = self._owned.get(client.client_id)
        return 0 if sent is None else len(sent.in_flight(self.in_flight.live, client))

    # -- acknowledgements -------------------------------------------------

    def finish_many(self, client: IConsumer, msg_ids: list[bytes]) -> list[tuple[bytes, NotInFlightError]]:
        """FIN: these messages are done with. Returns the ones that could not be, with why.

        This runs per message delivered: :func:`end_flight` (compiled) does the dict work, the counts
        are a call each. The pump wakes only if there is something to deliver (not a turn per FIN run
        while a reader faster than the disk waits for it: 70,000 in 10 s of ``bench_reader``).
        """
        e2e = self.e2e
        timestamps: list[int] | None = [] if e2e is not None else None
        failed = [(msg_id, NotInFlightError(why)) for msg_id, why in
                  end_flight(self.in_flight.live, client, msg_ids, timestamps)]
        done = len(msg_ids) - len(failed)
        self.in_flight.removed(done)
        client.messages_finished(done)
        if e2e is not None and timestamps is not None:
            now = self.clock.seconds()
            for timestamp in timestamps:
                e2e.insert(now, timestamp)
        self.finish_count += done
        bad = {i for i, _ in failed}
        finished = [i for i in msg_ids if i not in bad] if bad else msg_ids
        self.delivery.finished(finished)
        replication = self.replication
        if replication is not None and done:
            replication.finished(self.topic_name, self.name, finished)
        if self.memory or self.backend.depth():  # (what arrives later wakes it)
            self._pump.wake()
        return failed

    def requeue(self, client: IConsumer, msg_id: bytes, delay: float) -> None:
        """REQ: send it again now, or after ``delay`` seconds."""
        failed = self.requeue_many(client, [(msg_id, delay)])
        if failed:
            raise failed[0][1]

    def requeue_many(self, client: IConsumer, reqs: list[tuple[bytes, float]]
                     ) -> list[tuple[bytes, NotInFlightError | ExitingError]]:
        """REQ of a run of messages, each with its delay (0: send it again now).

        Returns the ones that could not be, with why. A consumer that
        retries everything sends REQs as others send FINs: the in-flight
        bookkeeping is one loop, those due now are queued together, and the
        pump wakes once if there is anything to deliver (as for FINs)."""
        if self.exiting:
            return [(msg_id, ExitingError()) for msg_id, _ in reqs]
        refused, again, later = take_back(self.in_flight.live, client, reqs)
        if later:
            now = self.clock.seconds()
            for msg, delay in later:
                self.defer(msg, delay, now)
        failed: list[tuple[bytes, NotInFlightError | ExitingError]] = [
            (msg_id, NotInFlightError(why)) for msg_id, why in refused]
        done = len(reqs) - len(failed)
        self.in_flight.removed(done)
        self.requeue_count += done
        if again:
            self._queue(again)
        if self.memory or self.backend.depth():  # (deferred ones wake it when due)
            self._pump.wake()
        return failed

    def touch(self, client: IConsumer, msg_id: bytes, timeout: float) -> None:
        """TOUCH: restart the message's timeout, never past ``--max-msg-timeout``."""
        msg = self.in_flight.live.get(msg_id)
        if msg is None:
            raise NotInFlightError("ID not in flight")
        if msg.client is not client:
            raise NotInFlightError("client does not own message")
        now = self.clock.seconds()
        sent = self._owned.get(client.client_id)
        delivered_at = now if sent is None else sent.sent_at(msg, client)
        deadline = min(now + timeout, delivered_at + self._max_msg_timeout)
        self.in_flight.remove(msg_id)
        self.in_flight.push(msg, deadline)
        self.arm(deadline)

    # -- timers -----------------------------------------------------------

    def arm(self, when: float) -> None:
        timer = self._timer
        if timer is not None and timer.active():
            if self._timer_at <= when:
                return
            timer.cancel()
        self._timer_at = when
        self._timer = self.clock.callLater(max(0.0, when - self.clock.seconds()), self._on_timer)

    def _on_timer(self) -> None:
        self._timer = None
        if self.exiting:
            return
        now = self.clock.seconds()
        expired = self.in_flight.pop_due(now)
        if expired:
            time_out(expired, self.clients)
            self.timeout_count += len(expired)
        due = self.deferred.pop_due(now)
        ready = expired + due
        if ready:
            try:
                self._queue(ready)
            except BackendError:
                pass  # closing (a failing disk keeps them for its retry); logged by _queue
        nexts = [t for t in (self.in_flight.next_deadline(), self.deferred.next_deadline()) if t is not None]
        if nexts:
            self.arm(min(nexts))

    # -- administration ---------------------------------------------------

    def empty(self) -> Deferred[None]:
        """Drop every queued, in-flight and deferred message (nsqd's /channel/empty)."""
        if self.parking is not None:
            self.parking.drop_share(self)
            self._park_later()
        self.memory.clear()
        for m in self.in_flight.clear():
            m.client = None
        for sent in self._owned.values():
            sent.clear()
        self.deferred.clear()
        self.taken_elsewhere.clear()
        for client in self.clients.values():
            client.in_flight_emptied()
        self.delivery.emptied()
        return self.backend.empty()

    def pending(self) -> Iterable[tuple[Message, float]]:
        """Every message the channel still owes a FIN, with its due time: queued and in
        flight (0), deferred (when it is due)."""
        self._unpark()
        for m in self.memory:
            yield m, 0.0
        for m in self.in_flight.live.values():
            yield m, 0.0
        for m in self.deferred.live.values():
            yield m, m.deadline

    def deferred_due(self) -> dict[bytes, float]:
        """Due times of the deferred messages, to keep across a restart."""
        due = {m.id: m.deadline for m in self.deferred.live.values()}
        due.update(self.restored_due)
        return due

    def flush(self) -> None:
        """Move memory, in-flight and deferred messages into the backend (graceful stop)."""
        self._unpark()
        msgs = list(self.memory) + self.in_flight.clear() + self.deferred.clear()
        for sent in self._owned.values():
            sent.clear()
        self.memory.clear()
        for m in msgs:
            m.client = None
        if msgs:
            self.backend.put_many([m.encode() for m in msgs])

    def flush_or_log(self) -> bool:
        """:meth:`flush` at a graceful stop; a failure is logged (the messages stay where they were)."""
        try:
            self.flush()
        except BackendError as e:
            self.log.error("CHANNEL({topic}:{channel}): failed to flush - {error}",
                           topic=self.topic_name, channel=self.name, error=e)
            return False
        return True

    def _stop(self) -> None:
        self.exiting = True
        self._pump.stop()
        if self._timer is not None and self._timer.active():
            self._timer.cancel()
        self._timer = None

    def close(self) -> Deferred[None]:
        """Graceful stop: flush everything to the backend and close it (then the delivery
        mode's own files: kept if anything failed)."""
        self._stop()
        return ensureDeferred(self._close())

    async def _close(self) -> None:
        flushed = self.flush_or_log()
        if flushed:
            self.delivery.flushed()
        try:
            await self.backend.close()
        except Exception:
            await self.delivery.close(keep=True)
            raise
        await self.delivery.close(keep=not flushed)

    def delete(self) -> Deferred[None]:
        """Drop the channel: disconnect its clients, forget its messages, remove its backend."""
        self._stop()
        for client in list(self.clients.values()):
            client.channel_deleted()
        self.clients.clear()
        self._owned.clear()
        if self.parking is not None:
            self.parking.leave(self)
        self.memory.clear()
        self.in_flight.clear()
        self.deferred.clear()
        self.delivery.delete()
        return self.backend.delete()

    def health(self) -> str | None:
        """The channel's storage failure, or ``None``."""
        return self.backend.health() or self.delivery.health()

    def stats_counts(self) -> dict[str, Any]:
        """The counts /stats and /metrics show (``/stats`` reads them for every channel: no
        figure is asked for twice)."""
        backend_depth = self.backend.depth()
        share = self._share()
        return {
            "depth": len(self.memory) + share + backend_depth,
            "backend_depth": backend_depth,
            "in_flight_count": len(self.in_flight),
            "deferred_count": len(self.deferred),
            "message_count": self.given + share,
            "requeue_count": self.requeue_count,
            "timeout_count": self.timeout_count,
            "finish_count": self.finish_count,
        }
