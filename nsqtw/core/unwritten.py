"""The node-wide bound on message bytes that wait in memory for a disk write.

Each disk queue keeps the records it was given and has not yet written
(the disk thread is behind, or the disk is full or failing) in memory, and
each queue bounds its own backlog (:func:`nsqtw.core.delivery.is_behind`).
With thousands of queues those bounds add up to more memory than a node has,
so every disk queue of a node also counts its backlog here, and the node
stops taking more — publishers wait, topics hold their hand-offs — while the
total is over ``--max-unwritten-bytes``. The count is kept as the backlogs
change, so asking costs O(1) whatever the number of queues.
"""

from __future__ import annotations

from twisted.internet.defer import Deferred

__all__ = ["DEFAULT_MAX_UNWRITTEN", "UnwrittenBytes"]

#: ``--max-unwritten-bytes``' default: 16 queues' worth of their own bound
DEFAULT_MAX_UNWRITTEN = 256 * 1024 * 1024


class UnwrittenBytes:
    """Bytes put into a node's disk queues and not yet written, over all of them."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.total = 0
        self._waiters: list[Deferred[None]] = []

    def __repr__(self) -> str:
        return f"<UnwrittenBytes {self.total}/{self.limit}>"

    def over(self) -> bool:
        """Whether the node must take no more until the disk catches up."""
        return self.total > self.limit

    def add(self, nbytes: int) -> None:
        self.total += nbytes

    def remove(self, nbytes: int) -> None:
        """Records were written (or dropped on purpose): wake the waiters once under the bound."""
        self.total -= nbytes
        if self._waiters and self.total <= self.limit:
            self.release_waiters()

    def when_under(self) -> Deferred[None]:
        """Fires once the total is at or under the bound (at once if it is); ask again then."""
        d: Deferred[None] = Deferred(self._forget)
        if self.total <= self.limit:
            d.callback(None)
        else:
            self._waiters.append(d)
        return d

    def release_waiters(self) -> None:
        """Fire every waiter now (the node is stopping: they ask again and hear so)."""
        waiters, self._waiters = self._waiters, []
        for d in waiters:
            d.callback(None)

    def _forget(self, d: Deferred[None]) -> None:
        if d in self._waiters:
            self._waiters.remove(d)
