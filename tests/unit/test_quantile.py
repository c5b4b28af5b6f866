"""End-to-end latency percentiles: accuracy, bounded memory, windows that rotate, topic aggregation."""

from __future__ import annotations

import random

from twisted.trial.unittest import SynchronousTestCase

from nsqtw._go.json import go_json
from nsqtw.observe.quantile import BUFFER_SIZE, Quantile, Stream, aggregate, empty_result

NS = 1_000_000_000


class StreamTests(SynchronousTestCase):
    def test_exact_before_the_first_fold(self) -> None:
        """Below the buffer size a query is exact: the ceil(n*q)-th smallest sample."""
        s = Stream([0.5, 0.99, 1.0])
        for v in [5, 1, 4, 2, 3]:
            s.insert(v)
        self.assertEqual((s.query(0.5), s.query(0.99), s.query(1.0)), (3, 5, 5))
        self.assertEqual(s.count(), 5)
        self.assertEqual(Stream([0.5]).query(0.5), 0)

    def test_accuracy_and_bounded_memory(self) -> None:
        """100k shuffled samples: within the 1% rank targets, max exact, and a small summary."""
        s = Stream([0.5, 0.95, 0.99, 1.0])
        values = list(range(1, 100_001))
        random.Random(7).shuffle(values)
        for v in values:
            s.insert(v)
        self.assertEqual(s.count(), 100_000)
        self.assertEqual(s.query(1.0), 100_000)
        for q in (0.5, 0.95, 0.99):
            # perks' targeted error: within 2*epsilon of the rank (in units of n)
            self.assertLess(abs(s.query(q) - q * 100_000), 0.02 * 100_000, q)
        self.assertLess(len(s.summary.items) + len(s.buffer), 2 * BUFFER_SIZE)


class QuantileTests(SynchronousTestCase):
    def test_result_shape(self) -> None:
        """The result is nsqd's {count, percentiles: [{quantile, value}]}, values in ns, numbers as
        Go writes its float64s (whole ones as ints, for the fast JSON encoder)."""
        q = Quantile(600.0, [1.0, 0.5], now=100.0)
        for i in range(1, 11):
            q.insert(100.0, 100 * NS - i * 1000)
        result = q.result(100.0)
        self.assertEqual(result["count"], 10)
        self.assertEqual([p["quantile"] for p in result["percentiles"]], [1.0, 0.5])
        self.assertEqual(result["percentiles"][0]["value"], 10000.0)
        self.assertEqual(go_json(result["percentiles"]),
                         b'[{"quantile":1,"value":10000},{"quantile":0.5,"value":6000}]')

    def test_windows_rotate(self) -> None:
        """After half a window the old half is kept; after a whole window every sample has aged out."""
        q = Quantile(10.0, [1.0], now=0.0)
        q.insert(1.0, 0)  # 1s latency
        q.insert(6.0, 4 * NS)  # 2s latency, in the second half
        self.assertEqual(q.result(6.0)["count"], 2)
        self.assertEqual(q.result(11.0)["count"], 1)  # the first half went
        self.assertEqual(q.result(11.0)["percentiles"][0]["value"], 2 * NS)
        self.assertEqual(q.result(16.5)["count"], 0)
        self.assertEqual(q.result(1000.0), {"count": 0, "percentiles": [{"quantile": 1.0, "value": 0.0}]})
        q.insert(1000.0, 999 * NS)
        self.assertEqual(q.result(1000.0)["count"], 1)

    def test_aggregate_merges_channels(self) -> None:
        """A topic merges its channels' windows; no channel with latency means nsqd's empty result."""
        a = Quantile(600.0, [1.0], now=0.0)
        b = Quantile(600.0, [1.0], now=0.0)
        a.insert(1.0, 0)
        b.insert(3.0, 0)
        total = aggregate([a, None, b], 600.0, [1.0], 3.0)
        self.assertEqual(total["count"], 2)
        self.assertEqual(total["percentiles"], [{"quantile": 1.0, "value": 3.0 * NS}])
        self.assertEqual(aggregate([None], 600.0, [1.0], 3.0), empty_result())
        self.assertEqual(empty_result(), {"count": 0, "percentiles": None})
