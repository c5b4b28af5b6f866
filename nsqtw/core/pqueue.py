"""The in-flight (by timeout) and deferred (by due time) queues of a channel."""

from __future__ import annotations

import heapq
import itertools
from collections import deque

from nsqtw.core.message import Message

#: when this many heap entries are stale (FINed, requeued, touched) and they
#: outnumber the live ones twice, the heap is rebuilt
_COMPACT_MIN = 1024

_seq = itertools.count()


class TimeoutQueue:
    """Messages ordered by a deadline, with lazy removal.

    Most deadlines arrive in order (every client of a channel usually has the
    same msg_timeout), so they go to a FIFO, which costs an append and a
    popleft; only an out-of-order deadline (a shorter timeout, a REQ delay)
    pays for the heap. Removing from the middle of either is O(n); instead an
    entry is left in place and recognised as stale when it surfaces (the
    message is no longer in ``live`` under that deadline). When stale entries
    pile up both are rebuilt from the live ones, so memory stays proportional
    to them.
    """

    __slots__ = ("live", "_fifo", "_heap", "_stale")

    def __init__(self) -> None:
        self.live: dict[bytes, Message] = {}
        self._fifo: deque[tuple[float, Message]] = deque()
        self._heap: list[tuple[float, int, Message]] = []
        self._stale = 0

    def __len__(self) -> int:
        return len(self.live)

    def push(self, msg: Message, when: float) -> None:
        msg.deadline = when
        self.live[msg.id] = msg
        fifo = self._fifo
        if not fifo or fifo[-1][0] <= when:
            fifo.append((when, msg))
        else:
            heapq.heappush(self._heap, (when, next(_seq), msg))

    def push_many(self, msgs: list[Message], ids: list[bytes], when: float) -> None:
        """:meth:`push` for a batch with one deadline, whose ``deadline`` the caller has set.

        A channel puts every batch it hands a client in flight with the same
        deadline, in order after the ones before: the FIFO takes the batch in
        one ``extend``.
        """
        self.live.update(zip(ids, msgs, strict=True))
        fifo = self._fifo
        if not fifo or fifo[-1][0] <= when:
            fifo.extend(zip(itertools.repeat(when), msgs))
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
        if self._stale > _COMPACT_MIN and self._stale > 2 * len(self.live):
            self._compact()

    def pop_due(self, now: float) -> list[Message]:
        live = self.live
        due = []
        fifo = self._fifo
        while fifo and fifo[0][0] <= now:
            when, msg = fifo.popleft()
            if live.get(msg.id) is msg and msg.deadline == when:
                del live[msg.id]
                due.append(msg)
            else:
                self._stale -= 1
        heap = self._heap
        while heap and heap[0][0] <= now:
            when, _, msg = heapq.heappop(heap)
            if live.get(msg.id) is msg and msg.deadline == when:
                del live[msg.id]
                due.append(msg)
            else:
                self._stale -= 1
        return due

    def next_deadline(self) -> float | None:
        live = self.live
        fifo = self._fifo
        while fifo:
            when, msg = fifo[0]
            if live.get(msg.id) is msg and msg.deadline == when:
                break
            fifo.popleft()
            self._stale -= 1
        heap = self._heap
        while heap:
            when, _, msg = heap[0]
            if live.get(msg.id) is msg and msg.deadline == when:
                break
            heapq.heappop(heap)
            self._stale -= 1
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

    def _compact(self) -> None:
        live = self.live
        self._fifo = deque(e for e in self._fifo if live.get(e[1].id) is e[1] and e[1].deadline == e[0])
        self._heap = [e for e in self._heap if live.get(e[2].id) is e[2] and e[2].deadline == e[0]]
        heapq.heapify(self._heap)
        self._stale = 0
