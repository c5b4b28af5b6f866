"""A channel: its queue, its subscribed clients, and messages in flight or deferred."""

from __future__ import annotations

import random
import sys
from collections import deque
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from twisted.internet.defer import Deferred, ensureDeferred, succeed
from twisted.internet.interfaces import IDelayedCall, IReactorTime

from nsqtw.core.message import Message, decode_message
from nsqtw.core.pqueue import TimeoutQueue
from nsqtw.core.pump import Pump
from nsqtw.errors import BackendError, ExitingError, NotInFlightError
from nsqtw.interfaces import IBackendQueue, IConsumer
from nsqtw.log import Logger
from nsqtw.names import is_ephemeral
from nsqtw.observe.quantile import Quantile

if TYPE_CHECKING:
    from nsqtw.core.topic import Topic
    from nsqtw.interfaces import IDurableBackendQueue
    from nsqtw.storage.journal import Journal, Position

#: messages handed to clients in one reactor turn before yielding
DELIVERY_BATCH = 4096
def _sample(msgs: list[Message], rate: int) -> list[Message]:
    """The messages a client with IDENTIFY ``sample_rate`` gets; nsqd drops the others.

    nsqd sends a message when a draw from 0..99 is at most the rate, and the
    rest are gone for this channel (neither in flight nor requeued).
    """
    draw = random.randrange
    return [m for m in msgs if draw(100) <= rate]


class Channel:
    """Holds one channel's copy of every message of its topic.

    Messages wait in memory (bounded by ``--mem-queue-size``) or in the
    backend; the pump hands them to subscribed clients with RDY to spare and
    puts them in flight; a single timer serves every in-flight timeout and
    deferred due time of the channel.
    """

    log = Logger()

    def __init__(self, topic: Topic, name: str, backend: IBackendQueue,
                 clock: IReactorTime, mem_queue_size: int, max_msg_timeout: float,
                 max_channel_consumers: int,
                 on_delete: Callable[[Channel], None], journal: Journal | None = None) -> None:
        self.topic = topic
        self.topic_name = topic.name
        self.name = name
        self.ephemeral = is_ephemeral(name)
        self.backend = backend
        self._clock = clock
        self._mem_queue_size = mem_queue_size
        self._max_msg_timeout = max_msg_timeout
        self._max_channel_consumers = max_channel_consumers
        self._on_delete = on_delete

        self.memory: deque[Message] = deque()
        self.clients: dict[int, IConsumer] = {}
        self.in_flight = TimeoutQueue()
        self.deferred = TimeoutQueue()
        self.paused = False
        self.exiting = False

        self.message_count = 0
        self.requeue_count = 0
        self.timeout_count = 0
        #: end-to-end latency of finished messages (--e2e-processing-latency-percentile)
        self.e2e: Quantile | None = None

        self._rotation = 0
        #: due times (unix seconds) of deferred messages flushed at the last stop
        self.restored_due: dict[bytes, float] = {}
        self._timer: IDelayedCall | None = None
        self._timer_at = 0.0
        #: --durable-delivery: what records where this channel's messages are
        self.journal = journal
        #: the topic's records up to this position reached this channel before a restart
        self.handoff_floor: Position | None = None
        self._taken_floor: Position | None = None
        self._next: Callable[[int], list[Message]] = self._next_messages
        self._pump = Pump(clock, self._deliver, f"CHANNEL({topic.name}:{name})")
        if journal is not None:
            self._start_durable(journal)
        self._pump.start()
        backend.set_readable_callback(self._pump.wake)

    def __repr__(self) -> str:
        return f"<Channel {self.topic_name}:{self.name}>"

    # -- queueing ---------------------------------------------------------

    def depth(self) -> int:
        return len(self.memory) + self.backend.depth()

    def put_many(self, msgs: list[Message]) -> None:
        """Queue messages from the topic (deferred ones wait for their time)."""
        if self.exiting:
            raise ExitingError()
        self.message_count += len(msgs)
        ready = msgs
        if any(m.deferred for m in msgs):
            now = self._clock.seconds()
            ready = []
            for m in msgs:
                if m.deferred:
                    self._defer(m, m.deferred, now)
                    m.deferred = 0.0
                else:
                    ready.append(m)
        if ready:
            self._queue(ready)

    def _queue(self, msgs: list[Message]) -> None:
        memory = self.memory
        room = self._mem_queue_size - len(memory)
        if room > 0:
            memory.extend(msgs[:room])
            msgs = msgs[room:]
        if msgs:
            try:
                self.backend.put_many([m.encode() for m in msgs])
            except BackendError as e:
                self.log.error("CHANNEL({topic}:{channel}): failed to write {n} messages to backend - {error}",
                               topic=self.topic_name, channel=self.name, n=len(msgs), error=e)
                raise
        self._pump.wake()

    def _defer(self, msg: Message, delay: float, now: float) -> None:
        when = now + delay
        self.deferred.push(msg, when)
        self._arm(when)
        if self.journal is not None:
            self.journal.deferred(msg, when)

    def put_deferred(self, msg: Message, delay: float) -> None:
        if self.exiting:
            raise ExitingError()
        self.message_count += 1
        self._defer(msg, delay, self._clock.seconds())

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
        self.clients[client.client_id] = client
        self._pump.wake()

    def remove_client(self, client: IConsumer) -> None:
        """Unsubscribe a client and requeue the messages it still had in flight."""
        if self.clients.pop(client.client_id, None) is None:
            return
        orphans = [m for m in self.in_flight.live.values() if m.client is client]
        if orphans and not self.exiting:
            for m in orphans:
                self.in_flight.remove(m.id)
                m.client = None
            self.requeue_count += len(orphans)
            try:
                self._queue(orphans)
            except BackendError:
                pass  # logged by _queue; health says why
        if not self.clients and self.ephemeral and not self.exiting:
            self._on_delete(self)

    def wake(self) -> None:
        """A client's capacity changed (RDY, FIN, resumed writing): deliver."""
        self._pump.wake()

    # -- delivery ---------------------------------------------------------

    def _decode(self, data: bytes) -> Message | None:
        """A record from the backend as a Message; a bad one is logged and skipped, as nsqd does."""
        try:
            return decode_message(data)
        except ValueError as e:
            self.log.error("CHANNEL({topic}:{channel}): failed to decode message - {error}",
                           topic=self.topic_name, channel=self.name, error=e)
            return None

    def _defer_restored(self, msg: Message, now: float) -> bool:
        """A message deferred at the last stop waits out its due time again; True if it must wait."""
        when = self.restored_due.pop(msg.id, None)
        if when is not None and when > now:
            self._defer(msg, when - now, now)
            return True
        return False

    def _next_messages(self, n: int) -> list[Message]:
        out: list[Message] = []
        if self.backend.depth():
            due = self.restored_due
            now = self._clock.seconds()
            for data in self.backend.read(n):
                msg = self._decode(data)
                if msg is None:
                    continue
                if due and self._defer_restored(msg, now):
                    continue
                out.append(msg)
        memory = self.memory
        k = min(n - len(out), len(memory))
        if k > 0:
            pop = memory.popleft
            out.extend(pop() for _ in range(k))
        return out

    def _deliver(self) -> bool:
        if self.paused or not self.clients or self.exiting:
            return False
        budget = DELIVERY_BATCH
        clients = list(self.clients.values())
        n = len(clients)
        start = self._rotation % n
        self._rotation += 1
        clients = clients[start:] + clients[:start]
        now = self._clock.seconds()
        in_flight = self.in_flight
        # Round-robin in slices of 64 for fairness, but one deliver() (one
        # write) per client per turn.
        batches: dict[int, list[Message]] = {}
        wanting = [(c, cap) for c in clients if (cap := c.ready_capacity()) > 0]
        exhausted = False
        while wanting and budget > 0 and not exhausted:
            still = []
            for client, cap in wanting:
                msgs = self._next(min(cap, budget, 64))
                if not msgs:
                    exhausted = True
                    break
                taken = len(msgs)
                if client.sample_rate:
                    msgs = _sample(msgs, client.sample_rate)
                deadline = now + client.msg_timeout
                for m in msgs:
                    m.attempts += 1
                    m.client = client
                    m.delivered_at = now
                    in_flight.push(m, deadline)
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
        for client_id, msgs in batches.items():
            self.clients[client_id].deliver(msgs)
        deadline = in_flight.next_deadline()
        if deadline is not None:
            self._arm(deadline)
        return budget <= 0 and not exhausted

    # -- acknowledgements -------------------------------------------------

    def _pop_in_flight(self, client: IConsumer, msg_id: bytes) -> Message:
        msg = self.in_flight.live.get(msg_id)
        if msg is None:
            raise NotInFlightError("ID not in flight")
        if msg.client is not client:
            raise NotInFlightError("client does not own message")
        self.in_flight.remove(msg_id)
        msg.client = None
        return msg

    def finish_many(self, client: IConsumer, msg_ids: list[bytes]) -> list[tuple[bytes, NotInFlightError]]:
        """FIN: these messages are done with. Returns the ones that could not be, with why."""
        failed = []
        live = self.in_flight.live
        remove = self.in_flight.remove
        e2e = self.e2e
        now = self._clock.seconds() if e2e is not None else 0.0
        for msg_id in msg_ids:
            msg = live.get(msg_id)
            if msg is None or msg.client is not client:
                why = "ID not in flight" if msg is None else "client does not own message"
                failed.append((msg_id, NotInFlightError(why)))
                continue
            remove(msg_id)
            msg.client = None
            client.message_finished()
            if e2e is not None:
                e2e.insert(now, msg.timestamp)
        if self.journal is not None:
            bad = {i for i, _ in failed}
            self.journal.finished_many([i for i in msg_ids if i not in bad] if bad else msg_ids)
        self._pump.wake()
        return failed

    def requeue(self, client: IConsumer, msg_id: bytes, delay: float) -> None:
        """REQ: send it again now, or after ``delay`` seconds."""
        if self.exiting:
            raise ExitingError()
        msg = self._pop_in_flight(client, msg_id)
        client.message_requeued()
        self.requeue_count += 1
        if delay > 0:
            self._defer(msg, delay, self._clock.seconds())
        else:
            self._queue([msg])
        self._pump.wake()

    def touch(self, client: IConsumer, msg_id: bytes, timeout: float) -> None:
        """TOUCH: restart the message's timeout, never past ``--max-msg-timeout``."""
        msg = self.in_flight.live.get(msg_id)
        if msg is None:
            raise NotInFlightError("ID not in flight")
        if msg.client is not client:
            raise NotInFlightError("client does not own message")
        now = self._clock.seconds()
        deadline = min(now + timeout, msg.delivered_at + self._max_msg_timeout)
        self.in_flight.remove(msg_id)
        self.in_flight.push(msg, deadline)
        self._arm(deadline)

    # -- timers -----------------------------------------------------------

    def _arm(self, when: float) -> None:
        timer = self._timer
        if timer is not None and timer.active():
            if self._timer_at <= when:
                return
            timer.cancel()
        self._timer_at = when
        self._timer = self._clock.callLater(max(0.0, when - self._clock.seconds()), self._on_timer)

    def _on_timer(self) -> None:
        self._timer = None
        if self.exiting:
            return
        now = self._clock.seconds()
        expired = self.in_flight.pop_due(now)
        if expired:
            for m in expired:
                client = m.client
                m.client = None
                if client is not None and client.client_id in self.clients:
                    client.message_timed_out()
            self.timeout_count += len(expired)
        due = self.deferred.pop_due(now)
        ready = expired + due
        if ready:
            try:
                self._queue(ready)
            except BackendError:
                pass  # logged by _queue; health says why
        nexts = [t for t in (self.in_flight.next_deadline(), self.deferred.next_deadline()) if t is not None]
        if nexts:
            self._arm(min(nexts))

    # -- administration ---------------------------------------------------

    def pause(self) -> None:
        self.paused = True
        self.topic.nsqd.metadata_changed()

    def unpause(self) -> None:
        self.paused = False
        self.topic.nsqd.metadata_changed()
        self._pump.wake()

    def empty(self) -> Deferred[None]:
        """Drop every queued, in-flight and deferred message (nsqd's /channel/empty)."""
        self.memory.clear()
        for m in self.in_flight.clear():
            m.client = None
        self.deferred.clear()
        for client in self.clients.values():
            client.in_flight_emptied()
        if self.journal is not None:
            self.journal.cleared()
        return self.backend.empty()

    def all_pending(self) -> Iterable[Message]:
        """Every message the channel still owes a FIN: queued, in flight, deferred."""
        yield from self.memory
        yield from self.in_flight.live.values()
        yield from self.deferred.live.values()

    def deferred_due(self) -> dict[bytes, float]:
        """Due times of the deferred messages, to keep across a restart."""
        due = {m.id: m.deadline for m in self.deferred.live.values()}
        due.update(self.restored_due)
        return due

    def flush(self) -> None:
        """Move memory, in-flight and deferred messages into the backend (graceful stop)."""
        msgs = list(self.memory) + self.in_flight.clear() + self.deferred.clear()
        self.memory.clear()
        for m in msgs:
            m.client = None
        if msgs:
            self.backend.put_many([m.encode() for m in msgs])

    def _stop(self) -> None:
        self.exiting = True
        self._pump.stop()
        if self._timer is not None and self._timer.active():
            self._timer.cancel()
        self._timer = None

    def close(self) -> Deferred[None]:
        """Graceful stop: flush everything to the backend and close it."""
        self._stop()
        if self.journal is not None:
            return ensureDeferred(self._close_durable(self.journal))
        try:
            self.flush()
        except BackendError as e:
            self.log.error("CHANNEL({topic}:{channel}): failed to flush - {error}",
                           topic=self.topic_name, channel=self.name, error=e)
        return self.backend.close()

    def delete(self) -> Deferred[None]:
        """Drop the channel: disconnect its clients, forget its messages, remove its backend."""
        self._stop()
        for client in list(self.clients.values()):
            client.channel_deleted()
        self.clients.clear()
        self.memory.clear()
        self.in_flight.clear()
        self.deferred.clear()
        if self.journal is not None:
            self.journal.remove().addErrback(
                lambda f: self.log.failure("CHANNEL({topic}:{channel}): failed to remove journal", f,
                                           topic=self.topic_name, channel=self.name))
        return self.backend.delete()

    def stats_counts(self) -> dict[str, Any]:
        return {
            "depth": self.depth(),
            "backend_depth": self.backend.depth(),
            "in_flight_count": len(self.in_flight),
            "deferred_count": len(self.deferred),
            "message_count": self.message_count,
            "requeue_count": self.requeue_count,
            "timeout_count": self.timeout_count,
        }


    # -- durable delivery (--durable-delivery) -----------------------------
    #
    # The topic hands messages over into this channel's disk queue (fsynced);
    # whatever leaves the queue, for delivery or to wait for its due time, is
    # recorded in the journal first, and the queue's read position moves on
    # only once the journal holding those records is fsynced. Memory here
    # holds only journal-owned messages (requeued or timed out).

    def _start_durable(self, journal: Journal) -> None:
        self._mem_queue_size = sys.maxsize
        self._next = self._next_messages_durable
        journal.snapshot = self._journal_snapshot
        self.handoff_floor = journal.handoff_floor
        self._taken_floor = journal.taken_floor
        recovered, journal.recovered = journal.recovered, {}
        if recovered:
            now = self._clock.seconds()
            for msg_id, (ts, attempts, due_ms, body) in recovered.items():
                msg = Message(msg_id, body, ts, attempts)
                due = due_ms / 1000.0
                if due > now:
                    self.deferred.push(msg, due)
                    self._arm(due)
                else:
                    self.memory.append(msg)
            self.log.info("CHANNEL({topic}:{channel}): recovered {count} unfinished messages from its journal"
                          " ({deferred} deferred)", topic=self.topic_name, channel=self.name,
                          count=len(recovered), deferred=len(self.deferred))

    def _journal_snapshot(self) -> Iterable[tuple[Message, float]]:
        for m in self.memory:
            yield m, 0.0
        for m in self.in_flight.live.values():
            yield m, 0.0
        for m in self.deferred.live.values():
            yield m, m.deadline

    def _next_messages_durable(self, n: int) -> list[Message]:
        journal = self.journal
        assert journal is not None
        backend: IDurableBackendQueue = self.backend  # type: ignore[assignment]
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
            self._take(records, journal, out, seen)
            if out:
                break
        else:
            if not out and backend.depth():
                self._pump.wake()  # all skipped so far: more next turn
        memory = self.memory
        k = min(n - len(out), len(memory))
        if k > 0:
            pop = memory.popleft
            out.extend(pop() for _ in range(k))
        if out:
            journal.delivering(out)
        if last is not None:
            # after the messages' own records: if this one survives, so did they
            journal.taken(last)
            mark = backend.read_mark()
            journal.on_synced(lambda: backend.commit_read(mark))
        return out

    def _take(self, records: list[tuple[bytes, int, int]], journal: Journal, out: list[Message],
              seen: set[bytes]) -> None:
        floor = self._taken_floor
        due = self.restored_due
        now = self._clock.seconds()
        for data, num, pos in records:
            if floor is not None and (num, pos) <= floor:
                continue  # journaled before a restart the queue's read position did not see
            msg = self._decode(data)
            if msg is None:
                continue
            if journal.is_live(msg.id) or msg.id in seen:
                continue  # a copy the journal already owns (handed over twice around a crash)
            seen.add(msg.id)
            if due and self._defer_restored(msg, now):
                continue
            out.append(msg)
        if floor is not None and (records[-1][1], records[-1][2]) >= floor:
            self._taken_floor = None

    def put_handoff(self, msgs: list[Message], pos: Position) -> Deferred[None]:
        """Durable mode: messages from the topic, up to its record ``pos``.

        Fires once they are safe here: the ready ones fsynced in this
        channel's queue, the deferred ones and the hand-off in its journal.
        Raises ExitingError or BackendError.
        """
        if self.exiting:
            raise ExitingError()
        if not msgs:
            return succeed(None)
        self.message_count += len(msgs)
        ready = [m for m in msgs if not m.deferred]
        later = [m for m in msgs if m.deferred]
        if ready:
            self.backend.put_many([m.encode() for m in ready])
            self._pump.wake()
        return ensureDeferred(self._hand_off(bool(ready), later, pos))

    async def _hand_off(self, wrote: bool, later: list[Message], pos: Position) -> None:
        journal = self.journal
        assert journal is not None
        while wrote:
            try:
                await self.backend.written()
                break
            except BackendError:
                if self.exiting or self.topic.exiting:
                    raise
                d: Deferred[None] = Deferred()
                self._clock.callLater(1.0, d.callback, None)
                await d
        # Recorded only now: the queue's copies are fsynced, and none of them
        # has been taken yet (reads come back after this write's callback), so
        # no record about them can precede this one in the journal.
        journal.handed_off(pos)
        if later:
            now = self._clock.seconds()
            for m in later:
                self._defer(m, m.deferred, now)
                m.deferred = 0.0
        await journal.synced()

    async def _close_durable(self, journal: Journal) -> None:
        """Graceful stop: put the journal's messages back in the queue, then drop the journal.

        What is left is a plain nsqd data directory (deferred due times go
        to ``nsqtw.deferred.json`` as without the flag). If anything fails,
        the journal stays and the next start with --durable-delivery uses it.
        """
        backend: IDurableBackendQueue = self.backend  # type: ignore[assignment]
        try:
            self.flush()
        except BackendError as e:
            self.log.error("CHANNEL({topic}:{channel}): failed to flush - {error}",
                           topic=self.topic_name, channel=self.name, error=e)
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
