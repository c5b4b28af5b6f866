"""The in-flight (by timeout) and deferred (by due time) queues of a channel."""

from __future__ import annotations

import heapq
import itertools
from collections import deque
from typing import Any

from nsqtw.core.message import Message

#: when this many heap entries are stale (FINed, requeued, touched) and they
#: outnumber the live ones twice, the heap is rebuilt
_COMPACT_MIN = 1024

_seq = itertools.count()


def _current(live: dict[bytes, Message], msg: Message, msg_id: bytes, when: float) -> bool:
    """Whether an entry is its message's current one: still in ``live``, under this deadline."""
    return live.get(msg_id) is msg and msg.deadline == when


class TimeoutQueue:
    """Messages ordered by a deadline, with lazy removal.

    Most deadlines arrive in order (every client of a channel usually has the
    same msg_timeout), so they go to a FIFO, which costs an append and a
    popleft; only an out-of-order deadline (a shorter timeout, a REQ delay)
    pays for the heap. The FIFO holds batches: a channel puts a whole
    delivered batch in flight with one deadline (:meth:`push_many`), and a
    batch all of whose messages are gone is dropped from the front with one
    set operation in C (``isdisjoint``) instead of a check per message. A
    single :meth:`push` (a deferred message, a TOUCH) is an entry of its own,
    ``(deadline, message, id)``, no bigger than a message's entry used to be.

    Removing from the middle of either is O(n); instead an entry is left in
    place and recognised as stale when it surfaces (the message is no longer
    in ``live`` under that deadline). A batch that still has an ID in
    ``live`` only because that message was put in flight again later can
    make :meth:`next_deadline` early, never late: :meth:`pop_due` checks
    each message exactly. When stale entries pile up both are rebuilt from
    the live ones, so memory stays proportional to them.
    """

    __slots__ = ("live", "_fifo", "_heap", "_stale")

    def __init__(self) -> None:
        self.live: dict[bytes, Message] = {}
        #: in deadline order: (deadline, messages, their IDs) for a batch, (deadline, message, ID) for one
        self._fifo: deque[tuple[float, Any, Any]] = deque()
        self._heap: list[tuple[float, int, Message]] = []
        self._stale = 0

    def __len__(self) -> int:
        return len(self.live)

    def push(self, msg: Message, when: float) -> None:
        msg.deadline = when
        self.live[msg.id] = msg
        fifo = self._fifo
        if not fifo or fifo[-1][0] <= when:
            fifo.append((when, msg, msg.id))
        else:
            heapq.heappush(self._heap, (when, next(_seq), msg))

    def push_many(self, msgs: list[Message], ids: list[bytes], when: float) -> None:
        """:meth:`push` for a batch with one deadline, whose ``deadline`` the caller has set."""
        if not msgs:
            return  # (sampling can leave a client's batch empty)
        self.live.update(zip(ids, msgs, strict=True))
        fifo = self._fifo
        if not fifo or fifo[-1][0] <= when:
            fifo.append((when, list(msgs), list(ids)))  # copies: the caller's lists may grow
        else:
            heap = self._heap
            for msg in msgs:
                heapq.heappush(heap, (when, next(_seq), msg))

    def remove(self, msg_id: bytes) -> Message | None:
        msg = self.live.pop(msg_id, None)
        if msg is not None:
            self.removed(1)
        return msg

    def removed(self, count: int) -> None:
        """``count`` messages were taken out of ``live`` by the caller directly.

        A channel finishing a run of FINs pops them from ``live`` in its own
        loop (it checks each one's owner first) and accounts for them here
        once, instead of a method call per message.
        """
        self._stale += count
        if self._over():
            self._trim_fifo()  # usually enough with one client: its FINs come in delivery order
            if self._over():
                self._sweep()  # with several, each finishes its own batches in order
                if self._over():
                    self._compact()

    def _over(self) -> bool:
        """Whether stale entries are many, and twice the live ones: time to drop some."""
        return self._stale > _COMPACT_MIN and self._stale > 2 * len(self.live)

    def pop_due(self, now: float) -> list[Message]:
        live = self.live
        due: list[Message] = []
        fifo = self._fifo
        while fifo and fifo[0][0] <= now:
            when, msgs, ids = fifo.popleft()
            if type(ids) is bytes:
                msgs, ids = (msgs,), (ids,)
            for msg, msg_id in zip(msgs, ids, strict=True):
                if _current(live, msg, msg_id, when):
                    del live[msg_id]
                    due.append(msg)
                else:
                    self._stale -= 1
        heap = self._heap
        while heap and heap[0][0] <= now:
            when, _, msg = heapq.heappop(heap)
            if _current(live, msg, msg.id, when):
                del live[msg.id]
                due.append(msg)
            else:
                self._stale -= 1
        return due

    def next_deadline(self) -> float | None:
        """The earliest deadline (possibly early, see the class docstring), or None."""
        self._trim_fifo()
        live = self.live
        heap = self._heap
        while heap:
            when, _, msg = heap[0]
            if _current(live, msg, msg.id, when):
                break
            heapq.heappop(heap)
            self._stale -= 1
        fifo = self._fifo
        if fifo:
            return min(fifo[0][0], heap[0][0]) if heap else fifo[0][0]
        return heap[0][0] if heap else None

    def clear(self) -> list[Message]:
        msgs = list(self.live.values())
        self.live.clear()
        self._fifo.clear()
        self._heap.clear()
        self._stale = 0
        return msgs

    def _trim_fifo(self) -> None:
        """Drop the batches at the front none of whose IDs is in flight any more.

        FINs mostly come in delivery order, so a batch at the front whose
        last message is still in flight is told at once; ``isdisjoint``
        alone would look up every ID already finished before it found that
        one, at each delivery (about 10% of the reactor's time under
        ``bench_reader``).
        """
        fifo = self._fifo
        live = self.live
        keys = live.keys()
        while fifo:
            when, msgs, ids = fifo[0]
            if type(ids) is bytes:
                if _current(live, msgs, ids, when):
                    return
                self._stale -= 1
            elif ids[-1] not in live and keys.isdisjoint(ids):
                self._stale -= len(ids)
            else:
                return
            fifo.popleft()

    def _sweep(self) -> None:
        """Drop every batch none of whose IDs is in flight any more, wherever it is in the FIFO.

        Clients of one channel finish at their own pace, so finished batches
        of fast clients pile up behind a batch of a slower one that
        :meth:`_trim_fifo` stops at. Each client finishes its own batches in
        order, so all but about one batch a client are wholly finished, and
        a set operation in C each drops them; :meth:`_compact`'s check of
        every entry in Python is left for what this does not clear (it was a
        tenth of the core's time under ``bench_reader`` with 16 consumers).
        """
        keys = self.live.keys()
        self._fifo = deque(e for e in self._fifo if type(e[2]) is bytes or not keys.isdisjoint(e[2]))
        # each message in ``live`` has exactly one current entry; the rest are stale
        self._stale = max(0, self._entries() - len(self.live))

    def _entries(self) -> int:
        """Entries held, stale ones included (what compaction keeps bounded)."""
        return sum(1 if type(ids) is bytes else len(ids) for _, _, ids in self._fifo) + len(self._heap)

    def _compact(self) -> None:
        live = self.live
        fifo: deque[tuple[float, Any, Any]] = deque()
        for when, msgs, ids in self._fifo:
            if type(ids) is bytes:
                if _current(live, msgs, ids, when):
                    fifo.append((when, msgs, ids))
                continue
            keep = [(m, i) for m, i in zip(msgs, ids, strict=True) if _current(live, m, i, when)]
            if keep:
                fifo.append((when, [m for m, _ in keep], [i for _, i in keep]))
        self._fifo = fifo
        self._heap = [e for e in self._heap if _current(live, e[2], e[2].id, e[0])]
        heapq.heapify(self._heap)
        self._stale = 0
