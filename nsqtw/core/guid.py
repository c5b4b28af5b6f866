"""Message IDs: 16 lowercase hex characters, unique and increasing per node.

The 64-bit value packs milliseconds since an epoch (41 bits), the node id
(10 bits) and a per-millisecond sequence (12 bits), the layout nsqd uses, so
IDs from nsqtw and nsqd look alike and sort by time.
"""

from __future__ import annotations

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

    def new_ids(self, count: int) -> list[bytes]:
        """``count`` fresh IDs; when a millisecond's sequence runs out the
        next millisecond is borrowed, so IDs stay unique and increasing even
        when the clock stands still or steps back."""
        now_ms = int(self._clock.seconds() * 1000) - EPOCH_MS
        if now_ms > self._last_ms:
            self._last_ms = now_ms
            self._sequence = 0
        ids = []
        node = self._node
        for _ in range(count):
            if self._sequence > _SEQUENCE_MASK:
                self._last_ms += 1
                self._sequence = 0
            value = (self._last_ms << (NODE_BITS + SEQUENCE_BITS)) | node | self._sequence
            self._sequence += 1
            ids.append(b"%016x" % value)
        return ids

    def new_id(self) -> bytes:
        return self.new_ids(1)[0]
