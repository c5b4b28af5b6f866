"""A consumer's run of REQs is taken whole and requeued in one call, with nsqd's answers and errors.

Socket-free (StringTransport, task.Clock). The live REQ storm with a
bystander is in tests/reliability/test_fairness.py.
"""

from __future__ import annotations

from twisted.trial.unittest import SynchronousTestCase

from nsqtw.core.message import FRAME_TYPE_ERROR
from nsqtw.protocol.wire import Command, V2Parser
from tests.helpers import make_nsqd, take_frames
from tests.unit.test_protocol_v2 import Consumer, publish


class ReqRunTests(SynchronousTestCase):
    """A run of REQ lines is one command only for the lines nsqd would read as a plain REQ with
    two arguments; the rest are parsed one by one."""

    def test_plain_lines_are_taken_the_rest_left(self) -> None:
        ids = [b"%016x" % i for i in range(5)]
        data = b"".join(b"REQ " + i + b" %d\n" % n for n, i in enumerate(ids))
        for tail in (b"REQ " + ids[0] + b" 0\r\n", b"REQ " + ids[0] + b" -1\n", b"REQ " + ids[0] + b" 0 x\n",
                     b"REQ short 0\n", b"REQ " + ids[0] + b" 1234567890\n", b"FIN " + ids[0] + b"\n",
                     b"REQ " + ids[0] + b" 0"):
            with self.subTest(tail=tail):
                parser = V2Parser(1024, 4096, expect_magic=False)
                parser.feed(data + tail)
                self.assertEqual(parser.next_command(),
                                 Command(b"REQ", [], reqs=[(i, n) for n, i in enumerate(ids)]))
                cmd = parser.next_command()
                if tail.startswith(b"FIN"):
                    self.assertEqual(cmd, Command(b"FIN", [], ids=[ids[0]]))
                elif tail.endswith(b"\n"):
                    assert cmd is not None
                    self.assertIsNone(cmd.reqs)  # a line of its own, its arguments as sent
                    self.assertEqual(cmd.args, tail.rstrip(b"\r\n").split(b" ")[1:])
                else:
                    self.assertIsNone(cmd)

    def test_at_most_limit_at_once(self) -> None:
        """A run carries at most the number of REQs the caller asks for; the rest come next."""
        data = b"".join(b"REQ %016x 0\n" % i for i in range(300))
        parser = V2Parser(1024, 4096, expect_magic=False)
        parser.feed(data)
        sizes = []
        while (cmd := parser.next_command(128)) is not None:
            assert cmd.reqs is not None
            sizes.append(len(cmd.reqs))
        self.assertEqual(sizes, [128, 128, 44])
        parser.feed(data[:46])
        cmd = parser.next_command(1)
        assert cmd is not None and cmd.reqs is not None
        self.assertEqual(len(cmd.reqs), 1)

    def test_not_inside_a_body(self) -> None:
        """Bytes that look like REQ lines inside a PUB body are body bytes."""
        body = b"REQ 0123456789abcdef 0\n"
        parser = V2Parser(1024, 4096, expect_magic=False)
        parser.feed(b"PUB t\n" + len(body).to_bytes(4, "big") + body + body)
        self.assertEqual(parser.next_command(), Command(b"PUB", [b"t"], body=body))
        self.assertEqual(parser.next_command(), Command(b"REQ", [], reqs=[(b"0123456789abcdef", 0)]))


class RequeueRunTests(SynchronousTestCase):
    """A run of REQs on a subscribed connection: the same result as one REQ at a time."""

    def test_a_run_requeues_each_with_its_delay(self) -> None:
        """Ten REQs in one read: the ones with timeout 0 are redelivered, the others wait their time."""
        nsqd, clock = make_nsqd()
        c = Consumer(nsqd, clock, "t", "c", rdy=10)
        publish(nsqd, clock, "t", *[b"%d" % i for i in range(10)])
        got = c.messages()
        self.assertEqual(len(got), 10)
        c.send(b"".join(b"REQ " + msg_id + (b" 0\n" if i % 2 else b" 1000\n") for i, (_, msg_id, _) in enumerate(got)))
        again = c.messages()
        self.assertEqual(sorted(m[2] for m in again), [b"%d" % i for i in range(1, 10, 2)])
        self.assertTrue(all(m[0] == 2 for m in again))
        channel = nsqd.topics["t"].channels["c"]
        self.assertEqual((channel.requeue_count, c.proto.requeue_count, len(channel.deferred)), (10, 10, 5))
        self.assertEqual(c.proto.in_flight_count, 5)
        clock.advance(1.01)
        c.send(b"")
        self.assertEqual(sorted(m[2] for m in c.messages()), [b"%d" % i for i in range(0, 10, 2)])

    def test_errors_in_a_run_are_nsqd_errors_in_order(self) -> None:
        """A REQ of an ID not in flight or owned by another client: E_REQ_FAILED, the others still requeued."""
        nsqd, clock = make_nsqd()
        a = Consumer(nsqd, clock, "t", "c", rdy=1)
        b = Consumer(nsqd, clock, "t", "c", rdy=1)
        publish(nsqd, clock, "t", b"1", b"2")
        [(_, mine, _)] = a.messages()
        [(_, theirs, _)] = b.messages()
        a.proto.dataReceived(b"REQ 0000000000000000 0\nREQ " + theirs + b" 0\nREQ " + mine + b" 0\n")
        frames = take_frames(a.transport)
        errors = [payload for kind, payload in frames if kind == FRAME_TYPE_ERROR]
        self.assertEqual(errors, [b"E_REQ_FAILED REQ 0000000000000000 failed ID not in flight",
                                  b"E_REQ_FAILED REQ " + theirs + b" failed client does not own message"])
        self.assertFalse(a.transport.disconnecting)
        channel = nsqd.topics["t"].channels["c"]
        self.assertEqual(channel.requeue_count, 1)
        self.assertIn(theirs, channel.in_flight.live)

    def test_a_timeout_past_the_maximum_is_clamped_in_a_run(self) -> None:
        """A run with one timeout past --max-req-timeout: each REQ as if sent alone, that one clamped."""
        nsqd, clock = make_nsqd(max_req_timeout=10.0)
        c = Consumer(nsqd, clock, "t", "c", rdy=2)
        publish(nsqd, clock, "t", b"1", b"2")
        (_, first, _), (_, second, _) = c.messages()
        c.send(b"REQ " + first + b" 0\nREQ " + second + b" 99999999\n")
        self.assertEqual([m[2] for m in c.messages()], [b"1"])
        clock.advance(10.01)
        c.send(b"")
        self.assertEqual([m[2] for m in c.messages()], [b"2"])

    def test_a_slice_takes_at_most_reqs_per_slice(self) -> None:
        """1,000 REQs in one read: REQS_PER_SLICE requeued, reading paused; the rest on later turns."""
        from nsqtw.protocol.v2 import REQS_PER_SLICE
        from tests.unit.test_http_api import _one_turn

        nsqd, clock = make_nsqd()
        c = Consumer(nsqd, clock, "t", "c", rdy=1000)
        publish(nsqd, clock, "t", *[b"%d" % i for i in range(1000)])
        got = c.messages()
        channel = nsqd.topics["t"].channels["c"]
        c.proto.dataReceived(b"".join(b"REQ " + msg_id + b" 0\n" for _, msg_id, _ in got))
        self.assertEqual(channel.requeue_count, REQS_PER_SLICE)
        self.assertEqual(c.transport.producerState, "paused")
        counts = []
        while channel.requeue_count < 1000 and len(counts) < 100:
            _one_turn(clock)
            counts.append(channel.requeue_count)
        steps = [b - a for a, b in zip([REQS_PER_SLICE, *counts], counts, strict=False)]
        self.assertTrue(all(step <= REQS_PER_SLICE for step in steps), counts)
        self.assertEqual(channel.requeue_count, 1000)
