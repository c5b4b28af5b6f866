"""Message IDs: 16 lowercase hex characters, unique and increasing per node.

The 64-bit value packs milliseconds since an epoch (41 bits), the node id
(10 bits) and a per-millisecond sequence (12 bits), the layout nsqd uses, so
IDs from nsqtw and nsqd look alike and sort by time.
"""

from __future__ import annotations

from collections.abc import Sequence

from twisted.internet.interfaces import IReactorTime

EPOCH_MS = 1288834974657
NODE_BITS = 10
SEQUENCE_BITS = 12
MAX_NODE_ID = (1 << NODE_BITS) - 1
_SEQUENCE_MASK = (1 << SEQUENCE_BITS) - 1


class GUIDFactory:
    """Makes message IDs for one node from the injected clock."""

    __slots__ = ("_clock", "_node", "_last_ms", "_sequence")

    def __init__(self, node_id: int, clock: IReactorTime) -> None:
        if not 0 <= node_id <= MAX_NODE_ID:
            raise ValueError(f"node id {node_id} out of range 0-{MAX_NODE_ID}")
        self._clock = clock
        self._node = node_id << SEQUENCE_BITS
        self._last_ms = -1
        self._sequence = 0

    def _catch_up(self) -> None:
        """Start a fresh sequence when the clock has passed the millisecond last used.

        A clock standing still or stepping back keeps the last millisecond
        (and a borrowed one stays borrowed), so IDs never go backwards.
        """
        now_ms = int(self._clock.seconds() * 1000) - EPOCH_MS
        if now_ms > self._last_ms:
            self._last_ms = now_ms
            self._sequence = 0

    def new_values(self, count: int) -> Sequence[int]:
        """``count`` fresh IDs as 64-bit values (``b"%016x" % value`` is the ID).

        When a millisecond's sequence runs out the next millisecond is
        borrowed, so IDs stay unique and increasing even when the clock
        stands still or steps back. The values of one millisecond are
        consecutive, so a batch is usually one ``range``: an MPUB's IDs cost
        no Python work per message here, and the publisher formats each
        one straight into the message's data.
        """
        self._catch_up()
        node = self._node
        seq = self._sequence
        if seq + count <= _SEQUENCE_MASK + 1:
            self._sequence = seq + count
            first = (self._last_ms << (NODE_BITS + SEQUENCE_BITS)) | node | seq
            return range(first, first + count)
        values: list[int] = []
        while count:
            if self._sequence > _SEQUENCE_MASK:
                self._last_ms += 1
                self._sequence = 0
            take = min(count, _SEQUENCE_MASK + 1 - self._sequence)
            first = (self._last_ms << (NODE_BITS + SEQUENCE_BITS)) | node | self._sequence
            values.extend(range(first, first + take))
            self._sequence += take
            count -= take
        return values

    def new_value(self) -> int:
        """One fresh ID as its value: :meth:`new_values` of one, without the range.

        A one-message PUB (or MPUB of one) asks for one ID per command; this
        is the same rule (the next sequence number, a borrowed millisecond
        once the sequence runs out) at a third of the cost.
        """
        self._catch_up()
        seq = self._sequence
        if seq > _SEQUENCE_MASK:
            self._last_ms += 1
            seq = 0
        self._sequence = seq + 1
        return (self._last_ms << (NODE_BITS + SEQUENCE_BITS)) | self._node | seq

    def new_ids(self, count: int) -> list[bytes]:
        """``count`` fresh IDs (see :meth:`new_values`)."""
        return [b"%016x" % v for v in self.new_values(count)]

    def new_id(self) -> bytes:
        return b"%016x" % self.new_value()
