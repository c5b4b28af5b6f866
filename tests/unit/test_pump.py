"""Pumps of one clock woken in a turn share one delayed call and run at most TURN_SLICE a turn."""

from __future__ import annotations

from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase

from nsqtw.core import pump as pump_module
from nsqtw.core.pump import TURN_SLICE, Pump
from tests.helpers import make_nsqd
from tests.unit.test_protocol_v2 import Consumer, publish


def one_turn(clock: Clock) -> None:
    """Run the calls due now, not those they schedule (a reactor turn; Clock.advance runs both)."""
    due = [c for c in clock.getDelayedCalls() if c.getTime() <= clock.seconds()]
    for call in due:
        clock.calls.remove(call)
        call.called = 1
        call.func(*call.args, **call.kw)


class TurnTests(SynchronousTestCase):
    def test_pumps_woken_together_share_one_call_and_run_a_slice_per_turn(self) -> None:
        """600 channel pumps woken by one hand-off: one delayed call, then TURN_SLICE pumps per
        turn, in the order they were woken, each once."""
        clock = Clock()
        ran: list[int] = []
        pumps = [Pump(clock, lambda i=i: ran.append(i) or False, f"p{i}")  # type: ignore[func-returns-value]
                 for i in range(600)]
        for p in pumps:
            p.start()
            p.wake()
            p.wake()  # a second wake in the same turn costs nothing
        self.assertEqual(len(clock.getDelayedCalls()), 1)
        turns = []
        while clock.getDelayedCalls():
            before = len(ran)
            one_turn(clock)
            turns.append(len(ran) - before)
        self.assertEqual(turns, [TURN_SLICE, TURN_SLICE, 600 - 2 * TURN_SLICE])
        self.assertEqual(ran, list(range(600)))

    def test_a_pump_woken_while_the_turn_runs_waits_for_the_next(self) -> None:
        """A drain that wants more wakes its pump again: it runs on the next turn, not in this one."""
        clock = Clock()
        ran: list[str] = []
        again = [True]

        def drain() -> bool:
            ran.append("a")
            more, again[0] = again[0], False
            return more
        a = Pump(clock, drain, "a")
        a.start()
        a.wake()
        one_turn(clock)
        self.assertEqual(ran, ["a"])
        one_turn(clock)
        self.assertEqual(ran, ["a", "a"])
        self.assertEqual(clock.getDelayedCalls(), [])

    def test_pumps_of_different_clocks_keep_their_own_turns(self) -> None:
        """Each clock (reactor) has its own turn."""
        c1, c2 = Clock(), Clock()
        p1, p2 = Pump(c1, lambda: False, "p1"), Pump(c2, lambda: False, "p2")
        for p in (p1, p2):
            p.start()
            p.wake()
        self.assertEqual((len(c1.getDelayedCalls()), len(c2.getDelayedCalls())), (1, 1))
        self.assertIsNot(pump_module._turn_of(c1), pump_module._turn_of(c2))


class FinWakeTests(SynchronousTestCase):
    """A FIN wakes its channel's pump only when the channel holds something to deliver."""

    def test_a_fin_with_nothing_queued_makes_no_turn_and_one_with_messages_queued_delivers(self) -> None:
        nsqd, clock = make_nsqd()
        c = Consumer(nsqd, clock, "t", "c", rdy=1)
        publish(nsqd, clock, "t", b"1", b"2")
        channel = nsqd.topics["t"].channels["c"]
        [(_, first, body)] = c.messages()
        self.assertEqual(body, b"1")
        c.proto.dataReceived(b"FIN " + first + b"\n")  # "2" is queued: the pump is woken for it
        self.assertTrue(channel._pump._scheduled)
        clock.advance(0)
        [(_, second, body)] = c.messages()
        self.assertEqual(body, b"2")
        c.proto.dataReceived(b"FIN " + second + b"\n")  # nothing queued: no turn
        self.assertFalse(channel._pump._scheduled)
        self.assertEqual((channel.finish_count, len(channel.in_flight)), (2, 0))
        publish(nsqd, clock, "t", b"3")  # what arrives later wakes it
        [(_, _, body)] = c.messages()
        self.assertEqual(body, b"3")

    def test_a_deferred_req_with_nothing_queued_makes_no_turn_and_one_due_now_delivers(self) -> None:
        nsqd, clock = make_nsqd()
        c = Consumer(nsqd, clock, "t", "c", rdy=1)
        publish(nsqd, clock, "t", b"1")
        channel = nsqd.topics["t"].channels["c"]
        [(_, first, _)] = c.messages()
        c.proto.dataReceived(b"REQ " + first + b" 1000\n")  # deferred, nothing else queued: no turn
        self.assertFalse(channel._pump._scheduled)
        self.assertEqual((channel.requeue_count, len(channel.in_flight)), (1, 0))
        clock.advance(1.0)  # due: delivered again
        [(_, again, body)] = c.messages()
        self.assertEqual((again, body), (first, b"1"))
        c.proto.dataReceived(b"REQ " + again + b" 0\n")  # due now: queued, the pump woken for it
        self.assertTrue(channel._pump._scheduled)
        clock.advance(0)
        [(_, _, body)] = c.messages()
        self.assertEqual(body, b"1")
