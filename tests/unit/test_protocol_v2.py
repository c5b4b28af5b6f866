"""The V2 protocol against an in-memory NSQD, time driven by task.Clock."""

from __future__ import annotations

import json
import struct
from typing import Any

from twisted.trial.unittest import SynchronousTestCase

from nsqtw.core import flight
from nsqtw.core.message import FRAME_TYPE_ERROR, FRAME_TYPE_MESSAGE, FRAME_TYPE_RESPONSE, frame
from nsqtw.protocol.v2 import ClientState, V2Factory, V2Protocol
from nsqtw.protocol.wire import encode_command, encode_mpub
from tests.helpers import EPOCH, connect, decode_message_frame, make_nsqd, one_turn, read_frames, reference, take_frames


def settle(clock, turns: int = 5) -> None:
    for _ in range(turns):
        clock.advance(0)


class ReferenceTests(SynchronousTestCase):
    """Go nsqd v1.3.0's recorded answers, byte for byte."""

    def test_reference_tcp_cases(self) -> None:
        """Every recorded TCP exchange gives the same frames and the same close/keep-open."""
        cases = [c for c in reference("nsqd-1.3.0-responses.json")["tcp"] if "sent" in c]
        self.assertGreater(len(cases), 30)
        for case in cases:
            nsqd, clock = make_nsqd(msg_timeout=2.0)
            proto, transport = connect(nsqd, clock, magic=False)
            proto.dataReceived(case["sent"].encode("latin-1"))
            settle(clock)
            expected = [(r["frame_type"], r["data"].encode()) for r in case["received"] if "frame_type" in r]
            closes = any(r.get("trailing_bytes") == "<connection closed>" for r in case["received"])
            self.assertEqual(take_frames(transport), expected, case["case"])
            self.assertEqual(transport.disconnecting, closes, case["case"])

    def test_reference_message_frame(self) -> None:
        """A delivered message frame: 8-byte ns timestamp, attempts 1, 16 hex id, body."""
        nsqd, clock = make_nsqd()
        pub, pt = connect(nsqd, clock)
        pub.dataReceived(encode_command(b"PUB", b"ref_msg", body=b"payload"))
        sub, st = connect(nsqd, clock)
        sub.dataReceived(b"SUB ref_msg c\nRDY 1\n")
        settle(clock)
        frames = take_frames(st)
        self.assertEqual(frames[0], (FRAME_TYPE_RESPONSE, b"OK"))
        ftype, payload = frames[1]
        self.assertEqual(ftype, FRAME_TYPE_MESSAGE)
        ts, attempts, msg_id, data = decode_message_frame(payload)
        self.assertEqual((ts, attempts, data), (int(EPOCH * 1e9), 1, b"payload"))
        self.assertRegex(msg_id.decode(), r"^[0-9a-f]{16}$")


class Consumer:
    """A subscribed connection with helpers to read what it got."""

    def __init__(self, nsqd, clock, topic: str, channel: str, rdy: int = 1, identify: dict | None = None):
        self.clock = clock
        self.proto, self.transport = connect(nsqd, clock)
        if identify is not None:
            self.proto.dataReceived(encode_command(b"IDENTIFY", body=json.dumps(identify).encode()))
            assert take_frames(self.transport)[0][0] == FRAME_TYPE_RESPONSE
        self.proto.dataReceived(f"SUB {topic} {channel}\n".encode())
        assert take_frames(self.transport) == [(FRAME_TYPE_RESPONSE, b"OK")]
        if rdy:
            self.send(f"RDY {rdy}\n".encode())

    def send(self, data: bytes) -> None:
        self.proto.dataReceived(data)
        settle(self.clock)

    def messages(self) -> list[tuple[int, bytes, bytes]]:
        out = []
        for ftype, payload in take_frames(self.transport):
            if ftype == FRAME_TYPE_MESSAGE:
                _, attempts, msg_id, data = decode_message_frame(payload)
                out.append((attempts, msg_id, data))
        return out

    def fin(self, msg_id: bytes) -> None:
        self.send(b"FIN " + msg_id + b"\n")


def publish(nsqd, clock, topic: str, *bodies: bytes) -> None:
    proto, transport = connect(nsqd, clock)
    proto.dataReceived(encode_mpub(topic.encode(), list(bodies)))
    settle(clock)
    assert take_frames(transport) == [(FRAME_TYPE_RESPONSE, b"OK")]
    proto.connectionLost(None)


class DeliveryTests(SynchronousTestCase):
    def test_fan_out_to_every_channel(self) -> None:
        """Each channel gets its own copy of every message."""
        nsqd, clock = make_nsqd()
        a = Consumer(nsqd, clock, "t", "a", rdy=10)
        b = Consumer(nsqd, clock, "t", "b", rdy=10)
        publish(nsqd, clock, "t", b"1", b"2", b"3")
        self.assertEqual([m[2] for m in a.messages()], [b"1", b"2", b"3"])
        self.assertEqual([m[2] for m in b.messages()], [b"1", b"2", b"3"])

    def test_clients_of_a_channel_share_it(self) -> None:
        """Two clients of one channel split the messages; none is delivered twice."""
        nsqd, clock = make_nsqd()
        a = Consumer(nsqd, clock, "t", "c", rdy=100)
        b = Consumer(nsqd, clock, "t", "c", rdy=100)
        publish(nsqd, clock, "t", *[b"%d" % i for i in range(200)])
        got_a, got_b = a.messages(), b.messages()
        bodies = sorted(int(m[2]) for m in got_a + got_b)
        self.assertEqual(bodies, list(range(200)))
        self.assertTrue(got_a and got_b)

    def test_a_turn_hands_each_client_its_even_share_in_one_slice(self) -> None:
        """Plenty queued: each client takes its even share of the turn at once, not in slices of 64
        (each a read of the queue, an in-flight batch and a timer entry); little queued, still
        each client some."""
        nsqd, clock = make_nsqd()
        channel = nsqd.get_topic("t").get_channel("c")
        a = Consumer(nsqd, clock, "t", "c", rdy=2500)
        b = Consumer(nsqd, clock, "t", "c", rdy=2500)
        asked: list[int] = []
        take = channel.next_messages

        def counted(n: int) -> list:
            asked.append(n)
            return take(n)

        channel.next_messages = counted  # type: ignore[method-assign]
        publish(nsqd, clock, "t", *[b"%d" % i for i in range(3000)])
        self.assertEqual((len(a.messages()), len(b.messages())), (1500, 1500))
        self.assertEqual(asked, [1500, 1500, 1000])  # (the last finds the queue empty)
        asked.clear()
        publish(nsqd, clock, "t", *[b"%d" % i for i in range(100)])
        self.assertEqual(sorted((len(a.messages()), len(b.messages()))), [36, 64])  # (the other goes first)
        self.assertEqual(asked, [64, 64, 64])

    def test_duplicate_id_never_in_flight_twice(self) -> None:
        """Two copies of one ID in a channel's queue (a hand-off replayed after kill -9): the copy
        whose ID is in flight, or arrives in the same batch, is dropped; FIN of the one sent works."""
        from nsqtw.core.message import Message
        nsqd, clock = make_nsqd()
        channel = nsqd.get_topic("t").get_channel("c")
        m = Message(b"0123456789abcdef" + b"once", 1, 0)
        channel.put_many([m, m.copy()])
        c = Consumer(nsqd, clock, "t", "c", rdy=10)
        [(_, msg_id, body)] = c.messages()
        self.assertEqual(body, b"once")
        channel.put_many([m.copy()])  # another copy arrives while the first is in flight
        settle(clock)
        self.assertEqual(c.messages(), [])
        c.fin(msg_id)
        self.assertEqual(take_frames(c.transport), [])  # no E_FIN_FAILED
        self.assertEqual(len(channel.in_flight), 0)

    def test_disconnect_costs_only_its_own_in_flight(self) -> None:
        """Issue #16: a client's disconnect requeues its own in-flight messages through a per-client
        index, never scanning the channel's whole in-flight map."""
        nsqd, clock = make_nsqd()
        publish(nsqd, clock, "t", *[b"%d" % i for i in range(300)])
        big = Consumer(nsqd, clock, "t", "c", rdy=250)
        small = Consumer(nsqd, clock, "t", "c", rdy=50)
        got_small = small.messages()
        self.assertEqual(len(got_small) + len(big.messages()), 300)
        channel = nsqd.topics["t"].channels["c"]

        class NoScan(dict):  # type: ignore[type-arg]
            def values(self):  # type: ignore[no-untyped-def]
                raise AssertionError("the whole in-flight map was scanned")

            def items(self):  # type: ignore[no-untyped-def]
                raise AssertionError("the whole in-flight map was scanned")

        channel.in_flight.live = NoScan(channel.in_flight.live)
        small.fin(got_small[0][1])
        self.assertEqual(channel.owned_count(small.proto), len(got_small) - 1 + len(small.messages()))
        small.proto.connectionLost(None)
        settle(clock)
        self.assertEqual(channel.depth(), 300 - 1 - 250)  # its in-flight ones requeued
        self.assertEqual(len(channel.in_flight), 250)
        self.assertEqual(channel.owned_count(big.proto), 250)

    def test_rdy_bounds_in_flight(self) -> None:
        """A client never has more in flight than its RDY; FIN makes room for the next."""
        nsqd, clock = make_nsqd()
        publish(nsqd, clock, "t", b"1", b"2", b"3")
        c = Consumer(nsqd, clock, "t", "c", rdy=2)
        first = c.messages()
        self.assertEqual(len(first), 2)
        c.fin(first[0][1])
        self.assertEqual([m[2] for m in c.messages()], [b"3"])

    def test_messages_wait_for_a_channel(self) -> None:
        """Messages published before any channel exists are kept and delivered later."""
        nsqd, clock = make_nsqd()
        publish(nsqd, clock, "t", b"early")
        self.assertEqual(nsqd.topics["t"].depth(), 1)
        c = Consumer(nsqd, clock, "t", "c")
        self.assertEqual([m[2] for m in c.messages()], [b"early"])

    def test_overflow_past_mem_queue_size_is_kept(self) -> None:
        """Past --mem-queue-size messages go to the backend, and come back in full."""
        nsqd, clock = make_nsqd(mem_queue_size=2)
        publish(nsqd, clock, "t", *[b"%d" % i for i in range(10)])
        topic = nsqd.topics["t"]
        self.assertEqual((len(topic.memory), topic.backend.depth()), (2, 8))
        c = Consumer(nsqd, clock, "t", "c", rdy=100)
        self.assertEqual(sorted(int(m[2]) for m in c.messages()), list(range(10)))

    def test_ephemeral_overflow_is_dropped(self) -> None:
        """#ephemeral topics drop what does not fit in memory, like nsqd."""
        nsqd, clock = make_nsqd(mem_queue_size=2)
        publish(nsqd, clock, "t#ephemeral", *[b"%d" % i for i in range(10)])
        self.assertEqual(nsqd.topics["t#ephemeral"].depth(), 2)

    def test_paused_channel_holds_messages(self) -> None:
        """A paused channel delivers nothing until unpaused."""
        nsqd, clock = make_nsqd()
        c = Consumer(nsqd, clock, "t", "c", rdy=10)
        nsqd.topics["t"].channels["c"].pause()
        publish(nsqd, clock, "t", b"x")
        self.assertEqual(c.messages(), [])
        nsqd.topics["t"].channels["c"].unpause()
        settle(clock)
        self.assertEqual([m[2] for m in c.messages()], [b"x"])

    def test_paused_topic_holds_messages(self) -> None:
        """A paused topic copies nothing to its channels until unpaused."""
        nsqd, clock = make_nsqd()
        c = Consumer(nsqd, clock, "t", "c", rdy=10)
        nsqd.topics["t"].pause()
        publish(nsqd, clock, "t", b"x")
        self.assertEqual(c.messages(), [])
        self.assertEqual(nsqd.topics["t"].depth(), 1)
        nsqd.topics["t"].unpause()
        settle(clock)
        self.assertEqual([m[2] for m in c.messages()], [b"x"])


class PumpWakeTests(SynchronousTestCase):
    """A channel's pump runs a turn only when some client can take a message."""

    def test_subscribe_and_leave_cost_no_pump_turn(self) -> None:
        """SUB (at RDY 0) and a disconnect holding nothing schedule no pump turn; RDY does, and a
        disconnect that requeues messages in flight wakes the pump for the remaining consumer."""
        nsqd, clock = make_nsqd()
        channel = nsqd.get_topic("t").get_channel("c")
        clock.advance(1)
        pending = len(clock.getDelayedCalls())
        proto, transport = connect(nsqd, clock)
        proto.dataReceived(encode_command(b"SUB", b"t", b"c"))
        self.assertFalse(channel._pump._scheduled)
        proto.connectionLost(None)  # type: ignore[arg-type]
        self.assertFalse(channel._pump._scheduled)
        self.assertEqual(len([c for c in clock.getDelayedCalls() if c.func == channel._pump._fire]), 0)
        self.assertLessEqual(len(clock.getDelayedCalls()), pending)

        nsqd.publish("t", [b"a", b"b"])
        clock.advance(0)
        clock.advance(0)
        first, t1 = connect(nsqd, clock)
        second, t2 = connect(nsqd, clock)
        first.dataReceived(encode_command(b"SUB", b"t", b"c") + encode_command(b"RDY", b"2"))
        self.assertTrue(channel._pump._scheduled)  # RDY wakes it
        clock.advance(0)
        self.assertEqual(len(channel.in_flight), 2)
        second.dataReceived(encode_command(b"SUB", b"t", b"c") + encode_command(b"RDY", b"2"))
        clock.advance(0)
        first.connectionLost(None)  # type: ignore[arg-type]
        self.assertTrue(channel._pump._scheduled)  # the requeued two go to the other consumer
        clock.advance(0)
        clock.advance(0)
        self.assertEqual([t for t, _ in take_frames(t2)], [FRAME_TYPE_RESPONSE] + [FRAME_TYPE_MESSAGE] * 2)


class FlightTests(SynchronousTestCase):
    def test_timeout_redelivers_with_attempts_plus_one(self) -> None:
        """A message not FINed within msg_timeout is requeued and redelivered with attempts+1."""
        nsqd, clock = make_nsqd(msg_timeout=2.0)
        c = Consumer(nsqd, clock, "t", "c")
        publish(nsqd, clock, "t", b"x")
        [(attempts, msg_id, _)] = c.messages()
        self.assertEqual(attempts, 1)
        clock.advance(1.9)
        settle(clock)
        self.assertEqual(c.messages(), [])
        clock.advance(0.2)
        settle(clock)
        self.assertEqual(c.messages(), [(2, msg_id, b"x")])
        self.assertEqual(nsqd.topics["t"].channels["c"].timeout_count, 1)

    def test_client_msg_timeout_from_identify(self) -> None:
        """IDENTIFY msg_timeout replaces --msg-timeout for that client."""
        nsqd, clock = make_nsqd(msg_timeout=60.0)
        c = Consumer(nsqd, clock, "t", "c", identify={"msg_timeout": 1000})
        publish(nsqd, clock, "t", b"x")
        self.assertEqual(len(c.messages()), 1)
        clock.advance(1.01)
        settle(clock)
        self.assertEqual([m[0] for m in c.messages()], [2])

    def test_touch_extends_the_timeout(self) -> None:
        """TOUCH restarts the in-flight timer."""
        nsqd, clock = make_nsqd(msg_timeout=2.0)
        c = Consumer(nsqd, clock, "t", "c")
        publish(nsqd, clock, "t", b"x")
        [(_, msg_id, _)] = c.messages()
        clock.advance(1.5)
        c.send(b"TOUCH " + msg_id + b"\n")
        clock.advance(1.5)
        settle(clock)
        self.assertEqual(c.messages(), [])
        clock.advance(0.6)
        settle(clock)
        self.assertEqual([m[0] for m in c.messages()], [2])

    def test_touch_never_past_max_msg_timeout(self) -> None:
        """TOUCH cannot keep a message in flight past --max-msg-timeout from delivery."""
        nsqd, clock = make_nsqd(msg_timeout=2.0, max_msg_timeout=3.0)
        c = Consumer(nsqd, clock, "t", "c")
        publish(nsqd, clock, "t", b"x")
        [(_, msg_id, _)] = c.messages()
        clock.advance(1.5)
        c.send(b"TOUCH " + msg_id + b"\n")
        clock.advance(1.6)
        settle(clock)
        self.assertEqual([m[0] for m in c.messages()], [2])

    def test_touch_cap_counts_from_the_latest_sending(self) -> None:
        """A second TOUCH is capped from the same delivery; once the message times out and is sent
        again, its cap counts from that sending, not the first."""
        nsqd, clock = make_nsqd(msg_timeout=2.0, max_msg_timeout=3.0)
        c = Consumer(nsqd, clock, "t", "c")
        publish(nsqd, clock, "t", b"x")
        [(_, msg_id, _)] = c.messages()
        for attempts in (2, 3):  # the first sending, then the one after its timeout
            for _ in range(2):
                clock.advance(1.0)
                c.send(b"TOUCH " + msg_id + b"\n")  # deadline min(now + 2, sent + 3): sent + 3 both times
            clock.advance(0.9)
            settle(clock)
            self.assertEqual(c.messages(), [])
            clock.advance(0.2)  # 3.1 s from this sending: timed out and sent again
            settle(clock)
            self.assertEqual([m[0] for m in c.messages()], [attempts])

    def test_what_was_sent_is_forgotten_once_finished(self) -> None:
        """A client's record of what it was sent stays bounded while it FINs thousands, and still
        holds the one message it keeps: counted, and requeued when it goes."""
        self.patch(flight, "SENT_SLACK", 20)
        nsqd, clock = make_nsqd()
        publish(nsqd, clock, "t", *[b"%d" % i for i in range(2000)])
        c = Consumer(nsqd, clock, "t", "c", rdy=10)
        channel = nsqd.topics["t"].channels["c"]
        kept = None
        held = []
        for _ in range(300):
            got = c.messages()
            if not got:
                break
            if kept is None:
                kept, got = got[0], got[1:]
            for _, msg_id, _ in got:
                c.fin(msg_id)
            held.append(channel._owned[c.proto.client_id]._held)
        self.assertEqual(channel.finish_count, 1999)
        # at most twice the deliveries still holding something (the kept one's, the latest) and the slack
        self.assertLessEqual(max(held), 2 * (10 + 10) + 20, held)
        self.assertGreater(len(set(held)), 10)  # it grew and was cut back, over and over
        self.assertEqual(channel.owned_count(c.proto), 1)
        c.proto.connectionLost(None)
        settle(clock)
        self.assertEqual((channel.depth(), len(channel.in_flight)), (1, 0))
        self.assertEqual(channel.next_messages(5)[0].id, kept[1])

    def test_req_now_and_with_delay(self) -> None:
        """REQ 0 redelivers at once; REQ with a delay defers it."""
        nsqd, clock = make_nsqd()
        c = Consumer(nsqd, clock, "t", "c")
        publish(nsqd, clock, "t", b"x")
        [(_, msg_id, _)] = c.messages()
        c.send(b"REQ " + msg_id + b" 0\n")
        [(attempts, msg_id2, _)] = c.messages()
        self.assertEqual((attempts, msg_id2), (2, msg_id))
        c.send(b"REQ " + msg_id + b" 5000\n")
        channel = nsqd.topics["t"].channels["c"]
        self.assertEqual((len(channel.deferred), channel.requeue_count), (1, 2))
        clock.advance(4.9)
        settle(clock)
        self.assertEqual(c.messages(), [])
        clock.advance(0.2)
        settle(clock)
        self.assertEqual([m[0] for m in c.messages()], [3])
        self.assertEqual(c.proto.requeue_count, 2)

    def test_req_delay_clamped_to_max_req_timeout(self) -> None:
        """A REQ delay past --max-req-timeout is clamped, not refused."""
        nsqd, clock = make_nsqd(max_req_timeout=10.0)
        c = Consumer(nsqd, clock, "t", "c")
        publish(nsqd, clock, "t", b"x")
        [(_, msg_id, _)] = c.messages()
        c.send(b"REQ " + msg_id + b" 99999999\n")
        clock.advance(10.01)
        settle(clock)
        self.assertEqual(len(c.messages()), 1)

    def test_dpub_defers_delivery(self) -> None:
        """DPUB messages arrive after their delay, not before."""
        nsqd, clock = make_nsqd()
        c = Consumer(nsqd, clock, "t", "c")
        p, pt = connect(nsqd, clock)
        p.dataReceived(encode_command(b"DPUB", b"t", b"3000", body=b"later"))
        settle(clock)
        self.assertEqual(take_frames(pt), [(FRAME_TYPE_RESPONSE, b"OK")])
        self.assertEqual(c.messages(), [])
        self.assertEqual(len(nsqd.topics["t"].channels["c"].deferred), 1)
        clock.advance(3.01)
        settle(clock)
        self.assertEqual([m[2] for m in c.messages()], [b"later"])

    def test_fin_of_another_clients_message_fails(self) -> None:
        """FIN of a message in flight to another client is E_FIN_FAILED, and not fatal."""
        nsqd, clock = make_nsqd()
        a = Consumer(nsqd, clock, "t", "c")
        b = Consumer(nsqd, clock, "t", "c", rdy=0)
        publish(nsqd, clock, "t", b"x")
        [(_, msg_id, _)] = a.messages()
        b.send(b"FIN " + msg_id + b"\n")
        self.assertEqual(take_frames(b.transport),
                         [(FRAME_TYPE_ERROR, b"E_FIN_FAILED FIN " + msg_id + b" failed client does not own message")])
        self.assertFalse(b.transport.disconnecting)

    def test_output_buffer_settings_never_hold_messages(self) -> None:
        """A large output buffer and timeout are upper bounds: messages leave on the next turns, not after 1s."""
        nsqd, clock = make_nsqd()
        start = clock.seconds()
        c = Consumer(nsqd, clock, "t", "c", rdy=100, identify={
            "feature_negotiation": True, "output_buffer_size": 65536, "output_buffer_timeout": 1000})
        publish(nsqd, clock, "t", b"1", b"2")
        self.assertEqual(clock.seconds(), start)
        self.assertEqual(sorted(m[2] for m in c.messages()), [b"1", b"2"])

    def test_run_of_fins_with_failures_answers_in_order(self) -> None:
        """FINs sent back to back: each bad one gets its E_FIN_FAILED, the good ones all land."""
        nsqd, clock = make_nsqd()
        c = Consumer(nsqd, clock, "t", "c", rdy=10)
        publish(nsqd, clock, "t", b"1", b"2", b"3")
        ids = [m[1] for m in c.messages()]
        bogus = b"ffffffffffffffff"
        c.send(b"".join(b"FIN " + i + b"\n" for i in [ids[0], bogus, ids[1], ids[1], ids[2]]))
        self.assertEqual(take_frames(c.transport), [
            (FRAME_TYPE_ERROR, b"E_FIN_FAILED FIN " + bogus + b" failed ID not in flight"),
            (FRAME_TYPE_ERROR, b"E_FIN_FAILED FIN " + ids[1] + b" failed ID not in flight"),
        ])
        self.assertEqual(c.proto.finish_count, 3)
        self.assertEqual(c.proto.in_flight_count, 0)
        self.assertEqual(len(nsqd.topics["t"].channels["c"].in_flight), 0)
        self.assertFalse(c.transport.disconnecting)

    def test_disconnect_requeues_in_flight(self) -> None:
        """When a consumer goes away its in-flight messages go to the others at once."""
        nsqd, clock = make_nsqd()
        a = Consumer(nsqd, clock, "t", "c", rdy=5)
        publish(nsqd, clock, "t", b"1", b"2")
        self.assertEqual(len(a.messages()), 2)
        b = Consumer(nsqd, clock, "t", "c", rdy=5)
        a.proto.connectionLost(None)
        settle(clock)
        got = b.messages()
        self.assertEqual(sorted(m[2] for m in got), [b"1", b"2"])
        self.assertEqual({m[0] for m in got}, {2})

    def test_cls_then_fin(self) -> None:
        """CLS answers CLOSE_WAIT, ignores RDY after it, and still accepts FIN."""
        nsqd, clock = make_nsqd()
        c = Consumer(nsqd, clock, "t", "c")
        publish(nsqd, clock, "t", b"1", b"2")
        [(_, msg_id, _)] = c.messages()
        c.send(b"CLS\n")
        self.assertEqual(take_frames(c.transport), [(FRAME_TYPE_RESPONSE, b"CLOSE_WAIT")])
        self.assertEqual(c.proto.state, ClientState.CLOSING)
        c.send(b"RDY 10\n")
        c.fin(msg_id)
        self.assertEqual(take_frames(c.transport), [])
        self.assertFalse(c.transport.disconnecting)

    def test_slow_reader_is_not_fed(self) -> None:
        """While the transport asks us to pause, the client gets nothing; resume delivers."""
        nsqd, clock = make_nsqd()
        c = Consumer(nsqd, clock, "t", "c", rdy=10)
        c.proto.pauseProducing()
        publish(nsqd, clock, "t", b"x")
        self.assertEqual(c.messages(), [])
        c.proto.resumeProducing()
        settle(clock)
        self.assertEqual(len(c.messages()), 1)

    def test_max_channel_consumers(self) -> None:
        """--max-channel-consumers refuses the next SUB with nsqd's error."""
        nsqd, clock = make_nsqd(max_channel_consumers=1)
        Consumer(nsqd, clock, "t", "c")
        p, t = connect(nsqd, clock)
        p.dataReceived(b"SUB t c\n")
        self.assertEqual(take_frames(t), [(FRAME_TYPE_ERROR,
                         b"E_TOO_MANY_CHANNEL_CONSUMERS channel consumers for t:c exceeds limit of 1")])
        self.assertTrue(t.disconnecting)


class EphemeralTests(SynchronousTestCase):
    def test_ephemeral_channel_and_topic_vanish(self) -> None:
        """An ephemeral channel goes with its last client, an ephemeral topic with its last channel."""
        nsqd, clock = make_nsqd()
        c = Consumer(nsqd, clock, "e#ephemeral", "c#ephemeral")
        self.assertIn("e#ephemeral", nsqd.topics)
        c.proto.connectionLost(None)
        settle(clock)
        self.assertNotIn("e#ephemeral", nsqd.topics)

    def test_ephemeral_channel_on_durable_topic(self) -> None:
        """An ephemeral channel on a normal topic goes; the topic stays."""
        nsqd, clock = make_nsqd()
        c = Consumer(nsqd, clock, "t", "c#ephemeral")
        c.proto.connectionLost(None)
        settle(clock)
        self.assertEqual(list(nsqd.topics["t"].channels), [])


class HeartbeatTests(SynchronousTestCase):
    def test_heartbeats_sent_at_interval(self) -> None:
        """A heartbeat every negotiated interval."""
        nsqd, clock = make_nsqd()
        c = Consumer(nsqd, clock, "t", "c", identify={"heartbeat_interval": 1000})
        clock.advance(1.0)
        self.assertEqual(take_frames(c.transport), [(FRAME_TYPE_RESPONSE, b"_heartbeat_")])

    def test_default_interval_is_half_client_timeout(self) -> None:
        """Without IDENTIFY the interval is --client-timeout / 2."""
        nsqd, clock = make_nsqd(client_timeout=10.0)
        p, t = connect(nsqd, clock)
        clock.advance(4.9)
        self.assertEqual(take_frames(t), [])
        clock.advance(0.1)
        self.assertEqual(take_frames(t), [(FRAME_TYPE_RESPONSE, b"_heartbeat_")])

    def test_silent_client_cut_after_two_intervals(self) -> None:
        """A client that sends nothing for two intervals is disconnected."""
        nsqd, clock = make_nsqd()
        c = Consumer(nsqd, clock, "t", "c", identify={"heartbeat_interval": 1000})
        clock.advance(1.0)
        c.send(b"NOP\n")
        clock.advance(1.99)
        self.assertFalse(c.transport.disconnecting)
        clock.advance(0.02)
        self.assertTrue(c.transport.disconnecting)

    def test_client_silent_from_the_start_cut_after_two_intervals(self) -> None:
        """Not even the magic: cut two intervals after connecting, after one heartbeat."""
        nsqd, clock = make_nsqd(client_timeout=10.0)
        p, t = connect(nsqd, clock, magic=False)
        clock.advance(9.99)
        self.assertEqual(take_frames(t), [(FRAME_TYPE_RESPONSE, b"_heartbeat_")])
        self.assertFalse(t.disconnecting)
        clock.advance(0.01)
        self.assertTrue(t.disconnecting)
        self.assertEqual(take_frames(t), [])  # the deadline fires before the second heartbeat

    def test_deadline_after_identify_counts_from_identify(self) -> None:
        """IDENTIFY's heartbeat interval restarts both: cut two new intervals after it."""
        nsqd, clock = make_nsqd(client_timeout=10.0)
        p, t = connect(nsqd, clock)
        clock.advance(3.0)
        p.dataReceived(encode_command(b"IDENTIFY", body=b'{"heartbeat_interval": 2000}'))
        take_frames(t)
        clock.advance(3.99)
        self.assertFalse(t.disconnecting)
        clock.advance(0.01)
        self.assertTrue(t.disconnecting)

    def test_a_short_connection_makes_one_timer(self) -> None:
        """Connect, SUB, leave: only the heartbeat's timer is made (the deadline's waits for it)."""
        nsqd, clock = make_nsqd()
        p, t = connect(nsqd, clock)
        p.dataReceived(b"SUB t c\n")
        self.assertEqual(take_frames(t), [(FRAME_TYPE_RESPONSE, b"OK")])
        self.assertEqual(len([c for c in clock.getDelayedCalls() if c.func == p._send_heartbeat]), 1)
        self.assertEqual([c for c in clock.getDelayedCalls() if c.func == p._read_timeout], [])
        p.connectionLost(None)
        self.assertEqual([c for c in clock.getDelayedCalls() if c.func in (p._send_heartbeat, p._read_timeout)],
                         [])

    def test_client_stalled_mid_frame_is_cut(self) -> None:
        """Half a frame does not keep a connection alive."""
        nsqd, clock = make_nsqd()
        c = Consumer(nsqd, clock, "t", "c", identify={"heartbeat_interval": 1000})
        c.proto.dataReceived(b"PUB t\n\x00\x00\x00\x10abc")
        clock.advance(1.0)
        c.proto.dataReceived(b"d")
        clock.advance(1.01)
        self.assertTrue(c.transport.disconnecting)

    def test_heartbeats_disabled(self) -> None:
        """heartbeat_interval -1 disables heartbeats and the deadline, and forbids SUB."""
        nsqd, clock = make_nsqd()
        p, t = connect(nsqd, clock)
        p.dataReceived(encode_command(b"IDENTIFY", body=b'{"heartbeat_interval": -1}'))
        self.assertEqual(take_frames(t), [(FRAME_TYPE_RESPONSE, b"OK")])
        clock.advance(3600)
        self.assertEqual(take_frames(t), [])
        self.assertFalse(t.disconnecting)
        p.dataReceived(b"SUB t c\n")
        self.assertEqual(take_frames(t), [(FRAME_TYPE_ERROR, b"E_INVALID cannot SUB with heartbeats disabled")])


class IdentifyTests(SynchronousTestCase):
    def identify(self, data: dict) -> list:
        nsqd, clock = make_nsqd()
        p, t = connect(nsqd, clock)
        p.dataReceived(encode_command(b"IDENTIFY", body=json.dumps(data).encode()))
        return take_frames(t)

    def test_invalid_values(self) -> None:
        """Out-of-range IDENTIFY settings get nsqd's E_BAD_BODY texts."""
        cases = {
            "heartbeat_interval": (999, "heartbeat interval (999) is invalid"),
            "output_buffer_size": (63, "output buffer size (63) is invalid"),
            "output_buffer_timeout": (99999999, "output buffer timeout (99999999) is invalid"),
            "sample_rate": (100, "sample rate (100) is invalid"),
            "msg_timeout": (999, "msg timeout (999) is invalid"),
        }
        for key, (value, text) in cases.items():
            self.assertEqual(self.identify({key: value}),
                             [(FRAME_TYPE_ERROR, f"E_BAD_BODY IDENTIFY {text}".encode())], key)

    def test_wrong_json_types(self) -> None:
        """A field of the wrong type is a JSON decode error, as Go's decoder makes it."""
        for data in ({"heartbeat_interval": "1000"}, {"client_id": 5}, {"msg_timeout": 1.5}):
            self.assertEqual(self.identify(data),
                             [(FRAME_TYPE_ERROR, b"E_BAD_BODY IDENTIFY failed to decode JSON body")])

    def test_negotiated_values_reported(self) -> None:
        """feature_negotiation reports the client's effective settings."""
        [(ftype, payload)] = self.identify({"feature_negotiation": True, "msg_timeout": 5000,
                                            "output_buffer_size": -1, "sample_rate": 10})
        resp = json.loads(payload)
        self.assertEqual((resp["msg_timeout"], resp["output_buffer_size"], resp["output_buffer_timeout"],
                          resp["sample_rate"]), (5000, 1, 0, 10))

    def test_identify_twice(self) -> None:
        """IDENTIFY after SUB is refused."""
        nsqd, clock = make_nsqd()
        c = Consumer(nsqd, clock, "t", "c")
        c.send(encode_command(b"IDENTIFY", body=b"{}"))
        self.assertEqual(take_frames(c.transport),
                         [(FRAME_TYPE_ERROR, b"E_INVALID cannot IDENTIFY in current state")])


class StatsTests(SynchronousTestCase):
    def test_client_counters(self) -> None:
        """A consumer's counters and state as /stats will show them."""
        nsqd, clock = make_nsqd()
        c = Consumer(nsqd, clock, "t", "c", rdy=5,
                     identify={"client_id": "me", "hostname": "h", "user_agent": "ua/1"})
        publish(nsqd, clock, "t", b"1", b"2", b"3")
        msgs = c.messages()
        c.fin(msgs[0][1])
        c.send(b"REQ " + msgs[1][1] + b" 0\n")
        stats = c.proto.stats()
        self.assertEqual((stats["client_id"], stats["hostname"], stats["user_agent"], stats["state"]),
                         ("me", "h", "ua/1", ClientState.SUBSCRIBED))
        self.assertEqual((stats["ready_count"], stats["message_count"], stats["finish_count"],
                          stats["requeue_count"], stats["in_flight_count"]), (5, 4, 1, 1, 2))

    def test_publish_counts(self) -> None:
        """A producer's per-topic publish counts."""
        nsqd, clock = make_nsqd()
        p, t = connect(nsqd, clock)
        p.dataReceived(encode_command(b"PUB", b"a", body=b"x") + encode_mpub(b"b", [b"1", b"2"]))
        self.assertEqual(p.pub_counts, {"a": 1, "b": 2})
        self.assertEqual(nsqd.topics["b"].message_bytes, 2)
        self.assertEqual(struct.unpack(">i", t.value()[:4])[0], 6)


class PublishStreamTests(SynchronousTestCase):
    """A publisher's stream of PUBs and MPUBs: the same answers and messages however it is cut."""

    STREAM = [encode_command(b"PUB", b"t", body=b"a"),
              encode_command(b"PUB", b"t", body=b"b") + encode_mpub(b"t", [b"c", b"d"])
              + encode_command(b"PUB", b"u", body=b"e") + encode_command(b"PUB", b"u", body=b"f"),
              encode_command(b"PUB", b"t", body=b"g")[:9],  # cut off in its size
              encode_command(b"PUB", b"t", body=b"g")[9:] + b"NOP\n" + encode_mpub(b"u", [b"h"]),
              b"PUB t\n" + struct.pack(">i", 0)]  # E_BAD_MESSAGE, fatal

    def run_stream(self, reads: list[bytes]) -> tuple[bytes, dict[str, list[bytes]], dict[str, int]]:
        nsqd, clock = make_nsqd()
        proto, transport = connect(nsqd, clock)
        for data in reads:
            proto.dataReceived(data)
            settle(clock)
        bodies = {name: [m.body for m in topic.memory] for name, topic in nsqd.topics.items()}
        return transport.value(), bodies, dict(proto.pub_counts)

    def test_same_answers_and_messages_in_any_chunking(self) -> None:
        """As sent, byte by byte and in one read: the OKs, the messages in order, the counts,
        the fatal error at the end."""
        answers, bodies, counts = self.run_stream(self.STREAM)
        whole = b"".join(self.STREAM)
        self.assertEqual((answers, bodies, counts), self.run_stream([whole[i:i + 1] for i in range(len(whole))]))
        self.assertEqual((answers, bodies, counts), self.run_stream([whole]))
        self.assertEqual(bodies, {"t": [b"a", b"b", b"c", b"d", b"g"], "u": [b"e", b"f", b"h"]})
        self.assertEqual(counts, {"t": 5, "u": 3})
        frames = read_frames(answers)
        self.assertEqual(frames[:-1], [(FRAME_TYPE_RESPONSE, b"OK")] * 7)
        self.assertEqual(frames[-1], (FRAME_TYPE_ERROR, b"E_BAD_MESSAGE PUB invalid message body size 0"))

    def test_tls_required_keeps_the_generic_checks(self) -> None:
        """While TLS is required but not yet on, a PUB to a known topic is refused as nsqd refuses it."""
        nsqd, clock = make_nsqd()
        proto, transport = connect(nsqd, clock)
        proto.dataReceived(encode_command(b"PUB", b"t", body=b"a"))
        transport.clear()
        proto._need_tls = True
        proto.dataReceived(encode_command(b"PUB", b"t", body=b"b"))
        self.assertEqual(take_frames(transport),
                         [(FRAME_TYPE_ERROR, b"E_INVALID cannot PUB in current state (TLS required)")])
        self.assertEqual([m.body for m in nsqd.topics["t"].memory], [b"a"])


class RunStateTests(SynchronousTestCase):
    """A run of FINs or REQs before SUB is refused as its first line alone would be."""

    def test_runs_before_sub_are_refused(self) -> None:
        for name, line in ((b"FIN", b"FIN 0123456789abcdef\n"), (b"REQ", b"REQ 0123456789abcdef 0\n")):
            nsqd, clock = make_nsqd()
            proto, transport = connect(nsqd, clock)
            proto.dataReceived(line * 3 + b"NOP\n")
            self.assertEqual(take_frames(transport),
                             [(FRAME_TYPE_ERROR, b"E_INVALID cannot " + name + b" in current state")])
            self.assertTrue(transport.disconnecting)


class CorkTests(SynchronousTestCase):
    """Over a listener's connection (EagerServer, on a real socket pair) the answers to one
    read's commands leave in one send, corked by the transport."""

    def connection(self) -> tuple[V2Protocol, Any, Any]:
        """A V2 connection over an EagerServer on one end of a real socket pair, not yet
        connected to its protocol: (protocol, transport, the socket counting its sends)."""
        import socket

        from twisted.internet.testing import MemoryReactorClock

        from nsqtw.net import eager
        from tests.unit.test_eager import _CountingSocket

        listener = socket.create_server(("127.0.0.1", 0))
        peer = socket.create_connection(listener.getsockname())
        ours, _ = listener.accept()
        listener.close()
        self.addCleanup(peer.close)
        ours.setblocking(False)
        sock = _CountingSocket(ours)
        nsqd, clock = make_nsqd()
        proto = V2Factory(nsqd, clock).buildProtocol(None)
        server = eager.EagerServer(sock, proto, ("127.0.0.1", 1234), None, 1, MemoryReactorClock())
        self.addCleanup(lambda: server.connected and server.abortConnection())
        return proto, server, sock

    def test_one_send_per_read(self) -> None:
        proto, server, sock = self.connection()
        proto.makeConnection(server)
        proto.dataReceived(b"  V2" + encode_command(b"PUB", b"t", body=b"a") + b"NOP\n"
                           + encode_mpub(b"t", [b"b", b"c"]) + b"FOO\n")
        ok = frame(FRAME_TYPE_RESPONSE, b"OK")
        self.assertEqual(sock.sends, [ok + ok + frame(FRAME_TYPE_ERROR, b"E_INVALID invalid command FOO")])
        proto.dataReceived(b"")  # closed: nothing more is sent
        self.assertEqual(len(sock.sends), 1)

    def test_cork_only_when_more_than_one_command_arrived(self) -> None:
        """A read holding one command is answered by its one write without corking; a read
        holding several corks once, and each read is still one send."""
        proto, server, sock = self.connection()
        corks: list[None] = []
        cork = server.cork
        server.cork = lambda: (corks.append(None), cork())[1]  # type: ignore[method-assign]
        proto.makeConnection(server)
        ok = frame(FRAME_TYPE_RESPONSE, b"OK")
        proto.dataReceived(b"  V2" + encode_command(b"PUB", b"t", body=b"a"))
        self.assertEqual((sock.sends, len(corks)), ([ok], 0))
        proto.dataReceived(encode_command(b"PUB", b"t", body=b"b") + encode_command(b"PUB", b"t", body=b"c"))
        self.assertEqual((sock.sends, len(corks)), ([ok, ok + ok], 1))
        self.assertIsNone(server._corked)


class AdminTests(SynchronousTestCase):
    def test_empty_channel_clears_client_in_flight(self) -> None:
        """Emptying a channel drops its in-flight messages and resets the clients' counts."""
        nsqd, clock = make_nsqd()
        c = Consumer(nsqd, clock, "t", "c", rdy=5)
        publish(nsqd, clock, "t", b"1", b"2")
        self.assertEqual(len(c.messages()), 2)
        channel = nsqd.topics["t"].channels["c"]
        channel.empty()
        self.assertEqual((len(channel.in_flight), c.proto.in_flight_count), (0, 0))
        publish(nsqd, clock, "t", b"3")
        self.assertEqual([m[2] for m in c.messages()], [b"3"])

    def test_delete_channel_disconnects_its_clients(self) -> None:
        """Deleting a channel closes the connections subscribed to it, as nsqd does."""
        nsqd, clock = make_nsqd()
        c = Consumer(nsqd, clock, "t", "c")
        nsqd.topics["t"].delete_channel("c")
        self.assertTrue(c.transport.disconnecting)
        self.assertEqual(list(nsqd.topics["t"].channels), [])


class DeliveryFailureTests(SynchronousTestCase):
    def test_attempts_wrap_like_go_uint16(self) -> None:
        """Past 65,535 attempts the counter wraps to 0 (Go's uint16) and delivery goes on."""
        nsqd, clock = make_nsqd()
        c = Consumer(nsqd, clock, "t", "c")
        publish(nsqd, clock, "t", b"x")
        [(_, msg_id, _)] = c.messages()
        channel = nsqd.topics["t"].channels["c"]
        channel.in_flight.live[msg_id].attempts = 65534  # as if REQed 65,533 times already
        c.send(b"REQ " + msg_id + b" 0\n")
        [(attempts, again, _)] = c.messages()
        self.assertEqual((attempts, again), (65535, msg_id))
        c.send(b"REQ " + msg_id + b" 0\n")
        [(attempts, again, body)] = c.messages()
        self.assertEqual((attempts, again, body), (0, msg_id, b"x"))
        c.fin(msg_id)
        self.assertEqual(len(channel.in_flight), 0)

    def test_a_delivery_that_raises_leaves_no_message_without_a_deadline(self) -> None:
        """A frame that cannot be built fails that client's write only: the other client gets its
        messages, and the failed ones stay timed, time out and are delivered again."""
        from nsqtw.core.message import Message
        from nsqtw.protocol import v2

        nsqd, clock = make_nsqd(msg_timeout=10.0)
        first = Consumer(nsqd, clock, "t", "c", rdy=0)
        second = Consumer(nsqd, clock, "t", "c", rdy=0)
        real_frames = v2.frames

        def frames(msgs: list[Message]) -> bytes:
            if any(msg.body == b"poison" and msg.attempts == 1 for msg in msgs):
                raise RuntimeError("injected")
            return real_frames(msgs)

        self.patch(v2, "frames", frames)
        first.send(b"RDY 5\n")
        second.send(b"RDY 5\n")
        # one delivery turn serves both: whoever takes the poison fails its write, the other is served
        publish(nsqd, clock, "t", b"poison", *[b"m%d" % i for i in range(9)])
        channel = nsqd.topics["t"].channels["c"]
        counts = sorted([len(first.messages()), len(second.messages())])
        self.assertEqual(counts, [0, 5])
        self.assertEqual(len(self.flushLoggedErrors(RuntimeError)), 1)
        self.assertEqual(len(channel.in_flight), 10)  # the failed five are in flight with a deadline
        self.assertTrue(channel._timer is not None and channel._timer.active())
        clock.advance(10.5)  # everything times out (nobody FINs), is requeued and delivered again
        settle(clock)
        self.assertEqual(channel.timeout_count, 10)
        got = first.messages() + second.messages()
        self.assertEqual(sorted(m[2] for m in got), sorted([b"poison"] + [b"m%d" % i for i in range(9)]))
        self.assertEqual({m[0] for m in got}, {2})
        self.assertEqual((first.proto.in_flight_count, second.proto.in_flight_count), (5, 5))


class SliceTests(SynchronousTestCase):
    """One client's input is run a slice of reactor time at a time (issue #21's per-turn budget)."""

    def _sliced(self, nsqd, clock, steps_per_slice: int):
        proto, transport = connect(nsqd, clock)
        ticks = iter(range(10**9))
        # a CPU clock that moves one unit per look: a slice is ``steps_per_slice`` looks
        proto._now = lambda: next(ticks)
        proto.slice_seconds = steps_per_slice
        return proto, transport

    def test_a_flood_is_run_over_several_turns_in_order_with_nothing_lost(self) -> None:
        nsqd, clock = make_nsqd()
        proto, transport = self._sliced(nsqd, clock, 2)
        bodies = [b"%d" % i for i in range(500)]
        proto.dataReceived(b"".join(encode_command(b"PUB", b"sliced", body=b) for b in bodies))
        first = take_frames(transport)
        self.assertTrue(0 < len(first) < 500, len(first))  # a first slice, not all
        self.assertEqual(transport.producerState, "paused")  # the flooder waits: TCP pushes back
        turns = 1
        got = list(first)
        while len(got) < 500 and turns < 1000:
            one_turn(clock)
            turns += 1
            got += take_frames(transport)
        self.assertEqual(got, [(FRAME_TYPE_RESPONSE, b"OK")] * 500)
        self.assertGreater(turns, 10)
        self.assertEqual(transport.producerState, "producing")
        c = Consumer(nsqd, clock, "sliced", "c", rdy=500)
        self.assertEqual([m[2] for m in c.messages()], bodies)

    def test_other_clients_run_between_slices(self) -> None:
        """While a flooder is sliced, a second client's command is answered in the next turn."""
        nsqd, clock = make_nsqd()
        flooder, ft = self._sliced(nsqd, clock, 2)
        flooder.dataReceived(b"NOP\n" * 100_000)
        other, ot = connect(nsqd, clock)
        other.dataReceived(encode_command(b"PUB", b"other", body=b"x"))
        self.assertEqual(take_frames(ot), [(FRAME_TYPE_RESPONSE, b"OK")])
        self.assertTrue(flooder.parser.buffered() > 0)  # the flood is still waiting its turns

    def test_a_slice_and_a_disk_wait_follow_each_other(self) -> None:
        """A used-up slice, then a publish waiting on the disk: reading resumes after each is over."""
        from twisted.internet.defer import Deferred

        from nsqtw.protocol.v2 import Input
        nsqd, clock = make_nsqd()
        proto, transport = self._sliced(nsqd, clock, 2)
        proto._yield_slice()
        self.assertEqual((transport.producerState, proto._input), ("paused", Input.YIELDED))
        one_turn(clock)
        self.assertEqual((transport.producerState, proto._input), ("producing", Input.RUNNING))
        written: Deferred[None] = Deferred()
        proto._block_until(written, lambda _: None)
        one_turn(clock)  # a turn passes, the write does not: still waiting, read again once more comes
        self.assertEqual((transport.producerState, proto._input), ("producing", Input.WAITING))
        proto.dataReceived(b"NOP\n")
        self.assertEqual((transport.producerState, proto._input), ("paused", Input.WAITING))
        written.callback(None)
        self.assertEqual((transport.producerState, proto._input), ("producing", Input.RUNNING))

    def test_what_escapes_a_waits_answer_is_logged_and_closes_the_connection(self) -> None:
        """The wait's one callback keeps nothing in the Deferred: a bug in the answer (not an NSQ
        error) is logged as unexpected and closes the connection; what came meanwhile is not run."""
        from twisted.internet.defer import Deferred

        from nsqtw.protocol.v2 import Input
        nsqd, clock = make_nsqd()
        proto, transport = connect(nsqd, clock)
        written: Deferred[None] = Deferred()

        def broken(_: object) -> None:
            raise ZeroDivisionError("a bug")

        proto._block_until(written, broken)
        proto.dataReceived(encode_command(b"PUB", b"t", body=b"later"))
        written.callback(None)
        self.assertEqual(len(self.flushLoggedErrors(ZeroDivisionError)), 1)
        self.assertEqual(proto._input, Input.CLOSED)
        self.assertTrue(transport.disconnecting)
        self.assertIsNone(written.result)  # consumed: no unhandled error in the Deferred
        self.assertNotIn("t", nsqd.topics)

    def test_a_closed_connection_stays_closed_after_a_run_of_reqs(self) -> None:
        """A run of REQs whose error closes the connection does not yield a slice: it stays closed."""
        from nsqtw.protocol.v2 import REQS_PER_SLICE, Input
        nsqd, clock = make_nsqd()
        proto, transport = connect(nsqd, clock)
        proto.dataReceived(b"REQ 0123456789abcdef 0\n" * REQS_PER_SLICE + b"NOP\n")
        self.assertEqual(proto._input, Input.CLOSED)
        one_turn(clock)
        self.assertEqual(proto._input, Input.CLOSED)


class GarbageTests(SynchronousTestCase):
    def test_a_closed_connection_is_freed_without_the_cyclic_collector(self) -> None:
        """Under connection churn, connections left in reference cycles piled up until the
        collector freed tens of thousands at once (16-52 ms reactor stalls); a closed
        connection's protocol is now freed by reference counting alone."""
        import gc
        import weakref

        from nsqtw import log

        # info lines carry the protocol (client=self); outside a daemon Twisted keeps recent
        # events in memory until logging begins, which would hold it here
        before = log.level_name()
        log.set_level("error")
        self.addCleanup(log.set_level, before)
        nsqd, clock = make_nsqd()
        was_enabled = gc.isenabled()
        gc.disable()
        self.addCleanup(lambda: gc.enable() if was_enabled else None)
        proto, transport = connect(nsqd, clock)
        proto.dataReceived(b"SUB t c\nRDY 1\nPUB t\n" + struct.pack(">i", 2) + b"hi")
        settle(clock)
        ref = weakref.ref(proto)
        # a real transport drops its protocol and its producer when the connection is lost
        transport.protocol = transport.producer = None
        proto.connectionLost(None)
        settle(clock)
        del proto, transport
        self.assertIsNone(ref(), "the protocol is still alive: something holds it, or a cycle does")
