"""TimeoutQueue: in-flight and deferred deadlines, FIFO fast lane plus heap."""

from __future__ import annotations

import random

from twisted.trial.unittest import SynchronousTestCase

from nsqtw.core.message import Message
from nsqtw.core.pqueue import _COMPACT_MIN, TimeoutQueue


def msg(i: int) -> Message:
    return Message(f"{i:016d}".encode() + b"body", 0)


class TimeoutQueueTests(SynchronousTestCase):
    def assert_pops_due(self, q: TimeoutQueue, model: dict[bytes, float], now: float) -> None:
        """pop_due(now) gives exactly the model's messages due by ``now``, which leave the model."""
        due = sorted(x.id for x in q.pop_due(now))
        expected = sorted(k for k, w in model.items() if w <= now)
        self.assertEqual(due, expected)
        for k in expected:
            del model[k]

    def assert_next_deadline(self, q: TimeoutQueue, model: dict[bytes, float], now: float) -> None:
        """None when nothing is in flight; otherwise never later than the earliest deadline,
        and early only to a deadline some stale entry still has, which passes with no message due."""
        got = q.next_deadline()
        if not model:
            self.assertIsNone(got)
            return
        assert got is not None
        earliest = min(model.values())
        self.assertLessEqual(got, earliest)
        if got < earliest:
            self.assertGreater(got, now)  # a wake-up to come, not one overdue
            self.assertTrue(any(when == got for when, _, _ in q._fifo) or any(e[0] == got for e in q._heap))

    def test_due_in_deadline_order_across_lanes(self) -> None:
        """In-order deadlines (FIFO) and out-of-order ones (heap) both come due on time."""
        q = TimeoutQueue()
        q.push(msg(1), 10.0)
        q.push(msg(2), 20.0)
        q.push(msg(3), 5.0)  # earlier than the FIFO's tail: heap
        q.push(msg(4), 30.0)
        self.assertEqual(q.next_deadline(), 5.0)
        self.assertEqual([m.id for m in q.pop_due(4.9)], [])
        self.assertEqual([m.id for m in q.pop_due(10.0)], [msg(1).id, msg(3).id])
        self.assertEqual(q.next_deadline(), 20.0)
        self.assertEqual(len(q), 2)

    def test_removed_and_repushed_entries_are_stale(self) -> None:
        """A FINed message never comes due; a TOUCHed one comes due at its new deadline only."""
        q = TimeoutQueue()
        a, b = msg(1), msg(2)
        q.push(a, 10.0)
        q.push(b, 11.0)
        self.assertIs(q.remove(a.id), a)
        self.assertIsNone(q.remove(a.id))
        q.remove(b.id)
        q.push(b, 50.0)  # TOUCH
        # b's old entry may make the deadline early (11), never late; it does not come due
        self.assertIn(q.next_deadline(), (11.0, 50.0))
        self.assertEqual(q.pop_due(49.0), [])
        self.assertEqual(q.next_deadline(), 50.0)
        self.assertEqual(q.pop_due(50.0), [b])
        self.assertIsNone(q.next_deadline())

    def test_stale_entries_stay_bounded(self) -> None:
        """One message stuck in flight does not let FINed entries behind it pile up."""
        q = TimeoutQueue()
        stuck = msg(0)
        q.push(stuck, 1.0)  # never finished
        for i in range(1, 20 * _COMPACT_MIN):
            m = msg(i)
            q.push(m, 1.0 + i)
            q.remove(m.id)
        entries = q._entries()
        self.assertLessEqual(entries, 3 * _COMPACT_MIN)
        self.assertEqual(q.pop_due(1e9), [stuck])

    def test_matches_a_reference_model(self) -> None:
        """Random pushes, removals and pops agree with a plain dict of deadlines."""
        rng = random.Random(7)
        q = TimeoutQueue()
        model: dict[bytes, float] = {}
        msgs = [msg(i) for i in range(300)]
        now = 0.0
        for _ in range(5000):
            m = rng.choice(msgs)
            op = rng.random()
            if op < 0.5:
                q.remove(m.id)
                when = now + rng.choice([10.0, 10.0, 10.0, rng.uniform(0, 20)])
                q.push(m, when)
                model[m.id] = when
            elif op < 0.8:
                self.assertEqual(q.remove(m.id) is not None, model.pop(m.id, None) is not None)
            else:
                now += rng.uniform(0, 3)
                self.assert_pops_due(q, model, now)
            self.assertEqual(len(q), len(model))
            self.assert_next_deadline(q, model, now)

    def test_batches_match_a_reference_model(self) -> None:
        """push_many (a channel's delivered batch) and caller-side removals (a run of FINs,
        counted with removed()) agree with a plain dict, out-of-order batches included,
        and the stale entries they leave stay bounded."""
        rng = random.Random(11)
        q = TimeoutQueue()
        model: dict[bytes, float] = {}
        msgs = [msg(i) for i in range(400)]
        now = 0.0
        for _ in range(4000):
            op = rng.random()
            if op < 0.4:
                batch = [m for m in rng.sample(msgs, rng.randint(1, 20)) if m.id not in model]
                when = now + rng.choice([10.0, 10.0, rng.uniform(0, 20)])
                for m in batch:
                    m.deadline = when
                    model[m.id] = when
                q.push_many(batch, [m.id for m in batch], when)
            elif op < 0.8:
                gone = [i for i in {m.id for m in rng.sample(msgs, 30)} if i in q.live]
                for i in gone:
                    del q.live[i]
                    del model[i]
                q.removed(len(gone))
            else:
                now += rng.uniform(0, 3)
                self.assert_pops_due(q, model, now)
            self.assertEqual(len(q), len(model))
            self.assert_next_deadline(q, model, now)
            self.assertLessEqual(q._entries(), 3 * max(len(model), _COMPACT_MIN) + 20)

    def test_clients_finishing_at_their_own_pace_need_no_full_compaction(self) -> None:
        """Sixteen clients' deliveries interleave in the FIFO and each finishes its own in order,
        one of them much later: the finished batches behind the slow client's are dropped by a
        set operation each, the entries stay bounded, and nothing due is lost or early."""
        compactions: list[int] = []

        class Counted(TimeoutQueue):
            def _compact(self) -> None:
                compactions.append(len(self.live))
                super()._compact()

        q = Counted()
        model: dict[bytes, float] = {}
        pending: list[list[list[bytes]]] = [[] for _ in range(16)]  # per client, its batches in order
        n = 0
        for turn in range(400):
            when = 30.0 + turn * 0.01
            for client in range(16):
                batch = [msg(n + k) for k in range(20)]
                n += 20
                for m in batch:
                    m.deadline = when
                    model[m.id] = when
                q.push_many(batch, [m.id for m in batch], when)
                pending[client].append([m.id for m in batch])
            for client in range(1, 16):  # the fast clients FIN all but their newest batch
                while len(pending[client]) > 1:
                    ids = pending[client].pop(0)
                    for i in ids:
                        del q.live[i]
                        del model[i]
                    q.removed(len(ids))
            self.assertEqual(len(q), len(model))
            self.assertLessEqual(q._entries(), 3 * max(len(model), _COMPACT_MIN) + 20 * 16)
        self.assertEqual(compactions, [])
        # client 0 never finished: its messages, and only they and the newest batches, come due
        self.assert_pops_due(q, model, 1e9)
        self.assertEqual(model, {})
