"""A huge publish is checked whole and queued in bounded slices across reactor turns, all or nothing.

Socket-free: ``NSQD.publish`` over a ``task.Clock`` (one ``_one_turn`` is
one reactor turn), nsqd's ``/mpub`` through StubTreq. The live side (a
5 MB ``/mpub`` of one-byte lines next to a bystander) is in
tests/reliability/test_fairness.py.
"""

from __future__ import annotations

import random
import struct
from typing import Any
from unittest import mock

from twisted.trial.unittest import SynchronousTestCase

from nsqtw.core.nsqd import PUBLISH_SLICE
from nsqtw.errors import ExitingError
from nsqtw.http.base import APIError
from nsqtw.nsqd import http as nsqd_http
from nsqtw.nsqd.http import _mpub_lines, _read_mpub
from tests.helpers import make_nsqd
from tests.unit.test_http_api import Client, _one_turn


def go_mpub_lines(data: bytes, max_msg: int, read_max: int) -> list[bytes]:
    """nsqd's reading of a newline-separated /mpub body, line by line (the reference)."""
    bodies = []
    total = 0
    pos = 0
    while True:
        nl = data.find(b"\n", pos)
        stop = len(data) if nl == -1 else nl + 1
        block = data[pos:stop]
        pos = stop
        total += len(block)
        if total == read_max:
            raise APIError(413, "BODY_TOO_BIG")
        if block.endswith(b"\n"):
            block = block[:-1]
        if block:
            if len(block) > max_msg:
                raise APIError(413, "MSG_TOO_BIG")
            bodies.append(block)
        if nl == -1:
            return bodies


def run_steps(steps: Any) -> tuple[int, Any]:
    """Run a step generator to its end: how many steps it took, and its result or the APIError it raised."""
    count = 0
    try:
        while True:
            next(steps)
            count += 1
    except StopIteration as done:
        return count, done.value
    except APIError as e:
        return count, (e.code, e.text)


def drain(steps: Any) -> Any:
    return run_steps(steps)[1]


def reference(data: bytes, max_msg: int, read_max: int) -> Any:
    try:
        return go_mpub_lines(data, max_msg, read_max)
    except APIError as e:
        return (e.code, e.text)


class MpubLinesTests(SynchronousTestCase):
    """``_mpub_lines`` reads a text body as nsqd does, whatever the piece size it splits it by."""

    CASES = [b"", b"\n", b"a", b"a\n", b"a\n\nbb\nccc\n", b"\n\n\nx", b"xxxx\ny", b"y\nxxxx", b"y\nxxxx\n",
             b"xxx\nxxx\nxxx", b"abc\r\nde\n", b"xxxxxxxxxx", b"x\nxxxxxxxxx", b"xxxxxxxxx\n", b"xxxxxxxx\nx"]

    def test_same_as_nsqd_on_edge_cases(self) -> None:
        """Empty lines, a last line without newline, a long line before or at the read limit."""
        for piece in (1, 2, 3, 7, 65536):
            for data in self.CASES:
                for max_msg in (1, 3, 9):
                    for read_max in (len(data), len(data) + 1, 10, 11):
                        if len(data) > read_max or read_max == 0:
                            continue  # the body is read with nsqd's limit: never more than read_max
                        with self.subTest(piece=piece, data=data, max_msg=max_msg, read_max=read_max), \
                                mock.patch.object(nsqd_http, "MPUB_TEXT_PIECE", piece):
                            self.assertEqual(drain(_mpub_lines(data, max_msg, read_max)),
                                             reference(data, max_msg, read_max))

    def test_same_as_nsqd_on_random_bodies(self) -> None:
        """Random bodies of short and long lines, cut into random pieces."""
        rng = random.Random(37)
        for _ in range(300):
            lines = [b"m" * rng.choice((0, 0, 1, 2, 5, 8, 9, 10, 30)) for _ in range(rng.randrange(1, 40))]
            data = b"\n".join(lines) + rng.choice((b"", b"\n"))
            max_msg = rng.choice((8, 9, 10, 100))
            read_max = rng.choice((len(data), len(data) + 1, len(data) + 50))
            with mock.patch.object(nsqd_http, "MPUB_TEXT_PIECE", rng.randrange(1, 60)):
                self.assertEqual(drain(_mpub_lines(data, max_msg, read_max)), reference(data, max_msg, read_max),
                                 (data, max_msg, read_max))

    def test_a_big_body_takes_one_step_per_piece(self) -> None:
        """64 KiB of one-byte lines per step: 5 MiB takes 80 steps, each bounded."""
        data = b"x\n" * (5 * 1024 * 1024 // 2)
        count, bodies = run_steps(_mpub_lines(data, 1024 * 1024, 5 * 1024 * 1024 + 1))
        self.assertEqual(count, 80)
        self.assertEqual(len(bodies), len(data) // 2)

    def test_binary_body_takes_one_step_per_piece(self) -> None:
        """A binary body of 20,000 messages yields after every 8,192 and reads them all."""
        body = struct.pack(">i", 20_000) + (struct.pack(">i", 1) + b"x") * 20_000
        self.assertEqual(run_steps(_read_mpub(body, 10, len(body))), (2, [b"x"] * 20_000))


class SlicedPublishTests(SynchronousTestCase):
    """``NSQD.publish`` of more than ``PUBLISH_SLICE`` messages queues that many per reactor turn."""

    def test_queued_a_slice_per_turn_and_answered_at_the_end(self) -> None:
        """3.5 slices of messages: one slice now, one per turn after, the Deferred fires with the last."""
        nsqd, clock = make_nsqd(mem_queue_size=10 * PUBLISH_SLICE)
        bodies = [b"%d" % i for i in range(PUBLISH_SLICE * 7 // 2)]
        done = nsqd.publish("t", bodies)
        topic = nsqd.topics["t"]
        self.assertIsNotNone(done)
        seen = [topic.message_count]
        while not done.called and len(seen) < 10:
            _one_turn(clock)
            seen.append(topic.message_count)
        self.assertEqual(seen, [PUBLISH_SLICE, 2 * PUBLISH_SLICE, 3 * PUBLISH_SLICE, len(bodies)])
        self.assertIsNone(self.successResultOf(done))
        self.assertEqual([m.body for m in topic.memory], bodies)
        self.assertEqual(len({m.id for m in topic.memory}), len(bodies))
        self.assertEqual(nsqd.sliced_publishes, set())

    def test_a_batch_of_one_slice_is_queued_at_once(self) -> None:
        """Up to PUBLISH_SLICE messages: queued in this turn, nothing to wait on."""
        nsqd, _ = make_nsqd(mem_queue_size=10 * PUBLISH_SLICE)
        self.assertIsNone(nsqd.publish("t", [b"m"] * PUBLISH_SLICE))
        self.assertEqual(nsqd.topics["t"].message_count, PUBLISH_SLICE)

    def test_closing_queues_the_rest_before_the_flush(self) -> None:
        """The node closing mid-batch: the rest is queued first, so the flush holds all of it."""
        nsqd, clock = make_nsqd(mem_queue_size=10 * PUBLISH_SLICE)
        bodies = [b"m"] * (PUBLISH_SLICE * 3)
        done = nsqd.publish("t", bodies)
        topic = nsqd.topics["t"]
        self.assertEqual(topic.message_count, PUBLISH_SLICE)
        counts_at_close = []
        real_close = topic.close

        def close() -> Any:
            counts_at_close.append(topic.message_count)
            return real_close()

        topic.close = close  # type: ignore[method-assign]
        nsqd.close()
        self.assertEqual(counts_at_close, [len(bodies)])
        self.assertIsNone(self.successResultOf(done))
        self.assertEqual(clock.getDelayedCalls(), [])

    def test_a_topic_deleted_mid_batch_refuses_the_rest(self) -> None:
        """The topic deleted between slices: the rest is refused (ExitingError), not put in a new topic."""
        nsqd, clock = make_nsqd(mem_queue_size=10 * PUBLISH_SLICE)
        done = nsqd.publish("t", [b"m"] * (PUBLISH_SLICE * 3))
        nsqd.delete_topic("t")
        _one_turn(clock)
        self.failureResultOf(done, ExitingError)
        self.assertNotIn("t", nsqd.topics)
        self.assertEqual(nsqd.sliced_publishes, set())


class HTTPMpubSliceTests(SynchronousTestCase):
    """nsqd's ``/mpub`` of many messages: parsed and published over several turns, all or nothing."""

    def _post(self, client: Client, url: str, body: bytes) -> tuple[int, bytes]:
        """The answer, once the reactor has nothing left to run."""
        d = client.stub.request("POST", "http://127.0.0.1" + url, data=body)
        client.stub.flush()
        for _ in range(500):
            if not client.clock.getDelayedCalls():
                break
            _one_turn(client.clock)
            client.stub.flush()
        r = self.successResultOf(d)
        return r.code, self.successResultOf(r.content())

    def test_a_big_body_is_published_whole_over_several_turns(self) -> None:
        """256 KiB of one-byte lines: at most PUBLISH_SLICE messages queued per reactor turn, OK only once
        all are queued, every message once and in order.

        The topic's message count is read after every turn: how many turns the
        HTTP client and server take to carry the body is theirs to choose."""
        client = Client(self, max_body_size=1 << 18, mem_queue_size=1 << 18)
        count = 1 << 17
        body = b"".join(b"%d\n" % (i % 10) for i in range(count))
        answers: list[object] = []
        d = client.stub.request("POST", "http://127.0.0.1/mpub?topic=t", data=body)
        d.addCallback(lambda r: answers.append(r) or r)
        seen: list[tuple[int, bool]] = []  # (messages queued, answered) before the first turn and after each

        def look() -> None:
            client.stub.flush()
            topic = client.nsqd.topics.get("t")
            seen.append((topic.message_count if topic else 0, bool(answers)))

        look()
        while client.clock.getDelayedCalls() and len(seen) < 500:
            _one_turn(client.clock)
            look()
        counts = [queued for queued, _ in seen]
        steps = [b - a for a, b in zip([0, *counts], counts, strict=False)]
        self.assertEqual(counts[-1], count)
        self.assertTrue(all(0 <= step <= PUBLISH_SLICE for step in steps), steps)
        self.assertFalse(any(answered for queued, answered in seen if queued < count), seen)
        r = self.successResultOf(d)
        self.assertEqual((r.code, self.successResultOf(r.content())), (200, b"OK"))
        self.assertEqual([m.body for m in client.nsqd.topics["t"].memory], body.split(b"\n")[:-1])

    def test_a_too_big_message_at_the_end_publishes_nothing(self) -> None:
        """A message too big in the last line of a big body: nsqd's 413 MSG_TOO_BIG, and none of the others."""
        client = Client(self, max_body_size=1 << 20, max_msg_size=100, mem_queue_size=1 << 20)
        body = b"x\n" * ((1 << 19) - 100) + b"y" * 101
        code, content = self._post(client, "/mpub?topic=t", body)
        self.assertEqual((code, content), (413, b'{"message":"MSG_TOO_BIG"}'))
        self.assertEqual(client.nsqd.topics["t"].message_count, 0)

    def test_a_binary_body_with_a_bad_message_at_the_end_publishes_nothing(self) -> None:
        """Binary: 100,000 good messages then one of size 0: 413 BAD_MESSAGE, none published."""
        client = Client(self, max_body_size=1 << 20, mem_queue_size=1 << 20)
        body = struct.pack(">i", 100_001) + (struct.pack(">i", 1) + b"x") * 100_000 + struct.pack(">i", 0)
        code, content = self._post(client, "/mpub?topic=t&binary=true", body)
        self.assertEqual((code, content), (413, b'{"message":"BAD_MESSAGE"}'))
        self.assertEqual(client.nsqd.topics["t"].message_count, 0)
