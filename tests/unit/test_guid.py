"""Message IDs: unique, increasing, nsqd's layout, whatever the clock does."""

from __future__ import annotations

from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase

from nsqtw.core.guid import EPOCH_MS, GUIDFactory


def _fields(msg_id: bytes) -> tuple[int, int, int]:
    value = int(msg_id, 16)
    return value >> 22, (value >> 12) & 0x3FF, value & 0xFFF


class GUIDTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.clock = Clock()
        self.clock.advance(1_700_000_000.0)
        self.guid = GUIDFactory(7, self.clock)

    def test_layout(self) -> None:
        """16 lowercase hex characters: milliseconds since nsqd's epoch, the node, a sequence."""
        ids = self.guid.new_ids(3)
        self.assertTrue(all(len(i) == 16 and i == i.lower() for i in ids))
        ms = 1_700_000_000_000 - EPOCH_MS
        self.assertEqual([_fields(i) for i in ids], [(ms, 7, 0), (ms, 7, 1), (ms, 7, 2)])

    def test_values_format_to_the_ids(self) -> None:
        """new_values and new_ids give the same IDs from the same state."""
        twin = GUIDFactory(7, self.clock)
        values = list(self.guid.new_values(5000))  # across a borrowed millisecond too
        self.assertEqual([b"%016x" % v for v in values], twin.new_ids(5000))

    def test_one_value_at_a_time_is_the_same_as_batches_of_one(self) -> None:
        """new_value (a PUB's ID) follows new_values' rule exactly: sequence, borrowed
        millisecond, clock standing still or stepping back, mixed with batches."""
        twin = GUIDFactory(7, self.clock)
        singles: list[int] = []
        batched: list[int] = []
        for step, n in [(0.0, 4095), (0.0, 3), (0.0, 2), (-2.0, 5), (0.0001, 1), (3.0, 4200)]:
            self.clock.advance(step)
            singles.extend(self.guid.new_value() for _ in range(n))
            batched.extend(v for _ in range(n) for v in twin.new_values(1))
            singles.extend(self.guid.new_values(7))  # a batch in between
            batched.extend(twin.new_values(7))
        self.assertEqual(singles, batched)
        self.assertEqual(len(set(singles)), len(singles))
        self.assertEqual(singles, sorted(singles))
        self.assertEqual(self.guid.new_id(), b"%016x" % twin.new_value())

    def test_unique_and_increasing_across_batches_and_a_full_millisecond(self) -> None:
        """Past 4,096 IDs in one millisecond the next one is borrowed, within a batch too."""
        got: list[bytes] = []
        for n in (1, 4000, 200, 5000, 1):
            got.extend(self.guid.new_ids(n))
        self.assertEqual(len(set(got)), len(got))
        self.assertEqual(got, sorted(got))
        ms = 1_700_000_000_000 - EPOCH_MS
        self.assertEqual(_fields(got[4095]), (ms, 7, 4095))
        self.assertEqual(_fields(got[4096]), (ms + 1, 7, 0))

    def test_clock_stepping_back_keeps_ids_increasing(self) -> None:
        first = self.guid.new_ids(10)
        self.clock.advance(-5.0)
        second = self.guid.new_ids(10)
        self.assertLess(first[-1], second[0])
        self.clock.advance(10.0)
        third = self.guid.new_ids(1)
        self.assertEqual(_fields(third[0])[0], 1_700_000_005_000 - EPOCH_MS)

    def test_node_id_range(self) -> None:
        with self.assertRaises(ValueError):
            GUIDFactory(1024, self.clock)
