"""The Spark connector's consumer and producer against a real nsqtw daemon, without Spark.

These drive :class:`Consumer` the way Spark's stream reader does (plan,
messages, acknowledge) and check what nsqd sees through ``/stats``.
"""

from __future__ import annotations

import dataclasses
import json
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from nsqtw.spark import consumer as consumer_module
from nsqtw.spark.blocks import encode_ids
from nsqtw.spark.client import NSQClientError
from nsqtw.spark.consumer import Consumer
from nsqtw.spark.discovery import all_nodes
from nsqtw.spark.offsets import Offset
from nsqtw.spark.options import ReaderOptions, WriterOptions
from nsqtw.spark.producer import Producer
from tests import rawclient
from tests.certs import make_certs
from tests.daemon import Daemon
from tests.helpers import wait_for
from tests.integration.test_features_live import AuthServer


def channel_stats(d: Daemon, topic: str, channel: str) -> dict[str, Any]:
    url = f"http://{d.http_address}/stats?format=json&topic={topic}&channel={channel}"
    with urllib.request.urlopen(url, timeout=10) as r:
        data = json.load(r)
    for t in data["topics"]:
        for c in t["channels"]:
            if t["topic_name"] == topic and c["channel_name"] == channel:
                return c  # type: ignore[no-any-return]
    return {}


def topic_stats(d: Daemon, topic: str) -> dict[str, Any]:
    with urllib.request.urlopen(f"http://{d.http_address}/stats?format=json&topic={topic}", timeout=10) as r:
        data = json.load(r)
    return next((t for t in data["topics"] if t["topic_name"] == topic), {})


def publish(d: Daemon, topic: str, bodies: list[bytes]) -> None:
    c = rawclient.Client(d.tcp_address)
    c.mpub(topic, bodies)
    assert c.response() == rawclient.OK
    c.close()


def options(d: Daemon, **extra: str) -> ReaderOptions:
    """One connection (max_in_flight under nsqd's --max-rdy-count) unless ``extra`` says otherwise."""
    return ReaderOptions.parse({"nsqd_tcp_addresses": d.tcp_address, "topic": "ev", "channel": "sp",
                                "max_in_flight": "1000", **extra})


@pytest.fixture
def consumers() -> Iterator[list[Consumer]]:
    made: list[Consumer] = []
    yield made
    for c in made:
        c.close()


def start(made: list[Consumer], opts: ReaderOptions) -> Consumer:
    c = Consumer(opts)
    made.append(c)
    c.start()
    return c


def plan_until(c: Consumer, begin: Offset, n: int, max_rows: int | None = None, timeout: float = 20) -> Offset:
    """Call plan() as Spark's trigger loop does until a batch of ``n`` is there."""
    deadline = time.monotonic() + timeout
    while True:
        end = c.plan(begin, max_rows)
        if end.seq - begin.seq >= n:
            return end
        # what has arrived is planned at once: a loaded machine may deliver one connection's
        # messages before the others' (CI: 100 of 450). Planned again from the same start, the
        # batch comes back with the rest, as Spark re-plans after a driver restart.
        assert end.seq >= begin.seq, (begin, end)
        if time.monotonic() > deadline:
            raise AssertionError(f"no batch of {n} within {timeout}s")
        time.sleep(0.05)


def rows(c: Consumer, begin: Offset, end: Offset) -> list[tuple[bytes, bytes, int, int]]:
    """``(id, body, timestamp, attempts)`` of the batch's messages, in order."""
    return [r for b in c.messages(begin, end) for r in b.rows()]


def bodies(c: Consumer, begin: Offset, end: Offset) -> list[bytes]:
    return [body for _id, body, _ts, _a in rows(c, begin, end)]


def only_after(d: Daemon, c: Consumer, end: Offset, timeout: float = 20) -> None:
    """Publish one more message: the batch after ``end`` (committed) is that message alone; once it
    is committed the channel is empty, nothing in flight."""
    publish(d, "ev", [b"after"])
    nxt = plan_until(c, end, 1, timeout=timeout)  # Spark committed the batch: plan the next
    assert bodies(c, end, nxt) == [b"after"]
    c.acknowledge(nxt)
    wait_for(lambda: channel_stats(d, "ev", "sp")["in_flight_count"] == 0, what="FINs")
    assert channel_stats(d, "ev", "sp")["depth"] == 0


def test_fin_only_after_commit(nsqd: Daemon, consumers: list[Consumer]) -> None:
    """Messages stay in flight while their batch is open and are FINed by commit."""
    publish(nsqd, "ev", [b"m%d" % i for i in range(20)])
    c = start(consumers, options(nsqd))
    begin = Offset(0)
    end = plan_until(c, begin, 20)
    assert end.seq == 20 and end.count() == 20
    assert sorted(bodies(c, begin, end)) == sorted(b"m%d" % i for i in range(20))
    assert channel_stats(nsqd, "ev", "sp")["in_flight_count"] == 20
    c.acknowledge(end)
    wait_for(lambda: channel_stats(nsqd, "ev", "sp")["in_flight_count"] == 0, what="FINs")
    s = channel_stats(nsqd, "ev", "sp")
    assert (s["depth"], s["requeue_count"], s["timeout_count"]) == (0, 0, 0)


def test_next_plan_acknowledges_start(nsqd: Daemon, consumers: list[Consumer]) -> None:
    """Planning the batch after ``start`` FINs everything up to ``start``; limits are honoured."""
    publish(nsqd, "ev", [b"a%d" % i for i in range(10)])
    c = start(consumers, options(nsqd))
    e1 = plan_until(c, Offset(0), 4, max_rows=4)
    assert e1.seq == 4
    assert channel_stats(nsqd, "ev", "sp")["in_flight_count"] == 10  # all held: 4 planned, 6 waiting
    e2 = plan_until(c, e1, 4, max_rows=4)
    assert e2.seq == 8
    wait_for(lambda: channel_stats(nsqd, "ev", "sp")["in_flight_count"] == 6, what="first batch FINed")
    e3 = plan_until(c, e2, 2, max_rows=4)
    assert bodies(c, Offset(0), e1) + bodies(c, e1, e2) == []  # FINed batches are gone
    assert bodies(c, e2, e3) == [b"a8", b"a9"]
    c.acknowledge(e3)
    wait_for(lambda: channel_stats(nsqd, "ev", "sp")["in_flight_count"] == 0, what="all FINed")
    assert c.stats["finished"] == 10


def test_batch_contents_and_fields(nsqd: Daemon, consumers: list[Consumer]) -> None:
    """messages() of an open batch carries id, body, timestamp and attempts from nsqd."""
    before = time.time_ns()
    publish(nsqd, "ev", [b"x", b"y"])
    c = start(consumers, options(nsqd))
    end = plan_until(c, Offset(0), 2)
    held = rows(c, Offset(0), end)
    assert [body for _id, body, _ts, _a in held] == [b"x", b"y"]
    assert all(a == 1 and len(i) == 16 for i, _body, _ts, a in held)
    assert all(before - 10**9 <= ts <= time.time_ns() for _i, _body, ts, _a in held)
    assert list(end.ids) == [nsqd.tcp_address]
    assert sorted(end.id_arrays()[nsqd.tcp_address].tolist()) == sorted(i for i, _b, _t, _a in held)


def test_held_across_idle_longer_than_msg_timeout(nsqd: Daemon, consumers: list[Consumer]) -> None:
    """Held messages are TOUCHed and heartbeats answered, so a long idle hold causes no redelivery."""
    publish(nsqd, "ev", [b"t%d" % i for i in range(5)])
    opts = options(nsqd, msg_timeout_ms="1000")
    connect = dataclasses.replace(opts.endpoints.connect, heartbeat_interval_ms=1000)
    opts = dataclasses.replace(opts, endpoints=dataclasses.replace(opts.endpoints, connect=connect))
    c = start(consumers, opts)
    end = plan_until(c, Offset(0), 3, max_rows=3)
    time.sleep(3.5)  # idle: 3.5 msg timeouts, 3.5 heartbeat intervals (what is checked comes below)
    s = channel_stats(nsqd, "ev", "sp")
    assert (s["timeout_count"], s["requeue_count"], s["in_flight_count"], s["client_count"]) == (0, 0, 5, 1)
    assert c.stats["touched"] >= 5 and c.stats["lost"] == 0
    e2 = plan_until(c, end, 2)
    assert all(a == 1 for _i, _b, _t, a in rows(c, end, e2))
    c.acknowledge(e2)
    wait_for(lambda: channel_stats(nsqd, "ev", "sp")["in_flight_count"] == 0, what="FINs")
    assert channel_stats(nsqd, "ev", "sp")["depth"] == 0


def held_up(c: Consumer) -> Callable[[], None]:
    """Stop ``c`` TOUCHing what it holds (a process held up past ``msg_timeout``); returns the undo."""
    c._touch_due = lambda: None  # type: ignore[method-assign]

    def resume() -> None:
        del c._touch_due

    return resume


def test_a_batched_message_nsqd_timed_out_and_sent_again_is_written_once(
        nsqd: Daemon, consumers: list[Consumer]) -> None:
    """A batch's messages time out at nsqd before Spark commits it (the process was held up past
    msg_timeout) and come back at once: the batch still writes them, their new copies go into no
    later batch, and the commit FINs those copies. (Before, the next batch wrote all of them again:
    1,014 duplicates in a 10-minute chaos run on an overloaded machine.)"""
    publish(nsqd, "ev", [b"o%d" % i for i in range(6)])
    c = start(consumers, options(nsqd, msg_timeout_ms="1000"))
    end = plan_until(c, Offset(0), 6)
    resume = held_up(c)
    wait_for(lambda: channel_stats(nsqd, "ev", "sp")["timeout_count"] >= 6, what="nsqd times them out")
    wait_for(lambda: c.stats["received"] >= 12, what="nsqd sends them again")
    resume()
    assert sorted(bodies(c, Offset(0), end)) == sorted(b"o%d" % i for i in range(6))
    only_after(nsqd, c, end)
    assert c.stats["skipped"] == 6


def test_a_batched_message_nsqd_timed_out_and_sends_after_the_commit_is_dropped(
        nsqd: Daemon, consumers: list[Consumer]) -> None:
    """The same, with nsqd sending the timed-out messages again only after Spark committed their
    batch (the channel paused meanwhile, as a backlog ahead of them would): the failed TOUCH or FIN
    tells the source they will come back, and it FINs them on sight."""
    publish(nsqd, "ev", [b"p%d" % i for i in range(6)])
    c = start(consumers, options(nsqd, msg_timeout_ms="1000"))
    end = plan_until(c, Offset(0), 6)
    post = f"http://{nsqd.http_address}/channel/%s?topic=ev&channel=sp"
    urllib.request.urlopen(urllib.request.Request(post % "pause", method="POST"), timeout=10).close()
    resume = held_up(c)
    wait_for(lambda: channel_stats(nsqd, "ev", "sp")["timeout_count"] >= 6, what="nsqd times them out")
    resume()
    assert sorted(bodies(c, Offset(0), end)) == sorted(b"p%d" % i for i in range(6))
    c.acknowledge(end)
    urllib.request.urlopen(urllib.request.Request(post % "unpause", method="POST"), timeout=10).close()
    wait_for(lambda: c.stats["skipped"] == 6, what="the copies sent again are FINed on sight")
    only_after(nsqd, c, end)


def test_restart_drops_committed_redeliveries(nsqd: Daemon, consumers: list[Consumer]) -> None:
    """A new process FINs on sight what Spark committed but the dead process never FINed."""
    publish(nsqd, "ev", [b"r%d" % i for i in range(6)])
    a = start(consumers, options(nsqd))
    committed = plan_until(a, Offset(0), 6)
    a.close()  # the stream process dies after Spark committed the batch, before the next plan
    b = start(consumers, options(nsqd))
    assert b.plan(committed, None) == committed
    wait_for(lambda: b.stats["skipped"] == 6, what="redeliveries dropped")
    wait_for(lambda: channel_stats(nsqd, "ev", "sp")["in_flight_count"] == 0, what="FINs")
    assert channel_stats(nsqd, "ev", "sp")["depth"] == 0
    publish(nsqd, "ev", [b"new"])
    end = plan_until(b, committed, 1)
    assert end.seq == 7 and bodies(b, committed, end) == [b"new"]


def test_ids_that_never_come_back_are_not_carried_for_ever(
        nsqd: Daemon, consumers: list[Consumer], monkeypatch: pytest.MonkeyPatch) -> None:
    """A new process drops a committed offset's messages on sight; those the dead process had
    FINed never come back, and after SKIP_KEEP they are forgotten instead of being listed as
    unfinished in every offset after (and checked against every message received)."""
    monkeypatch.setattr(consumer_module, "SKIP_KEEP", 0.5)
    publish(nsqd, "ev", [b"r%d" % i for i in range(3)])
    a = start(consumers, options(nsqd))
    e1 = plan_until(a, Offset(0), 3)
    a.acknowledge(e1)  # committed and FINed
    wait_for(lambda: channel_stats(nsqd, "ev", "sp")["in_flight_count"] == 0, what="FINs")
    a.close()
    b = start(consumers, options(nsqd))
    publish(nsqd, "ev", [b"x"])
    e2 = plan_until(b, e1, 1)
    assert e2.unfinished == e1.ids  # b cannot know they were FINed: it waits for them a while
    time.sleep(1.5)  # two turns of SKIP_KEEP
    publish(nsqd, "ev", [b"y"])
    e3 = plan_until(b, e2, 1)
    assert bodies(b, e2, e3) == [b"y"] and not e3.unfinished


def test_a_replayed_batch_is_rebuilt_from_nsqds_redelivery(nsqd: Daemon, consumers: list[Consumer]) -> None:
    """A batch Spark replays after a restart has the messages its offset lists: the new process
    waits for nsqd to give them back and writes them in that batch, not in a later one."""
    publish(nsqd, "ev", [b"p%d" % i for i in range(6)])
    a = start(consumers, options(nsqd))
    e1 = plan_until(a, Offset(0), 3, max_rows=3)
    e2 = plan_until(a, e1, 3, max_rows=3)  # FINs batch 1; the process dies before batch 2 runs
    second = sorted(bodies(a, e1, e2))
    wait_for(lambda: channel_stats(nsqd, "ev", "sp")["in_flight_count"] == 3, what="batch 1 FINed")
    a.close()
    b = start(consumers, options(nsqd))
    again = rows(b, e1, e2)
    assert sorted(body for _i, body, _t, _a in again) == second
    assert all(a == 2 for _i, _b, _t, a in again)
    assert sorted(i for i, _b, _t, _a in again) == sorted(e2.id_arrays()[nsqd.tcp_address].tolist())
    assert sorted(bodies(b, e1, e2)) == second  # Spark may ask twice: the same rows
    publish(nsqd, "ev", [b"next"])
    e3 = plan_until(b, e2, 1)  # Spark committed the replayed batch: its messages are FINed
    assert bodies(b, e2, e3) == [b"next"] and not e3.missed
    b.acknowledge(e3)
    wait_for(lambda: channel_stats(nsqd, "ev", "sp")["in_flight_count"] == 0, what="FINs")
    assert channel_stats(nsqd, "ev", "sp")["depth"] == 0


def test_a_replay_makes_room_for_its_messages(nsqd: Daemon, consumers: list[Consumer]) -> None:
    """When newer messages fill every RDY slot before the replayed batch's come back, the replay
    gives the newer ones back (REQ, deferred until its wait would end) until its own arrive,
    instead of waiting out replay_timeout_ms."""
    publish(nsqd, "ev", [b"p%d" % i for i in range(6)])
    a = start(consumers, options(nsqd, max_in_flight="3"))
    e1 = plan_until(a, Offset(0), 3, max_rows=3)
    e2 = plan_until(a, e1, 3, max_rows=3)
    second = sorted(bodies(a, e1, e2))
    publish(nsqd, "ev", [b"q%d" % i for i in range(20)])
    wait_for(lambda: channel_stats(nsqd, "ev", "sp")["in_flight_count"] == 3, what="batch 1 FINed")
    a.close()
    b = start(consumers, options(nsqd, max_in_flight="3", replay_timeout_ms="3000"))
    assert sorted(bodies(b, e1, e2)) == second  # within replay_timeout_ms, so not waited out
    # nsqd delivered newer messages first: the slots were freed, each newer message given back
    # once and deferred (given back without a delay, they came straight back, again and again)
    assert 0 < b.stats["requeued"] <= 20
    assert channel_stats(nsqd, "ev", "sp")["deferred_count"] > 0
    e3 = plan_until(b, e2, 3)
    assert all(body.startswith(b"q") for body in bodies(b, e2, e3))
    b.acknowledge(e3)


def test_a_replay_waiting_for_stragglers_keeps_what_came_back_in_flight(
        nsqd: Daemon, consumers: list[Consumer]) -> None:
    """While a replay waits for the last of its messages, those already back are TOUCHed like any
    held message, so nsqd does not time them out and deliver them a second time."""
    publish(nsqd, "ev", [b"p%d" % i for i in range(3)])
    a = start(consumers, options(nsqd))
    e1 = plan_until(a, Offset(0), 3)
    a.close()
    address = nsqd.tcp_address
    straggler = np.array([b"7fffffffffffffff"], "S16")  # an id nsqd never redelivers
    ids = np.concatenate([e1.id_arrays()[address], straggler])
    replayed = Offset(e1.seq + 1, {address: encode_ids(ids)})
    b = start(consumers, options(nsqd, msg_timeout_ms="1000", replay_timeout_ms="3000"))
    assert sorted(bodies(b, Offset(0), replayed)) == [b"p0", b"p1", b"p2"]  # 3 s: three msg_timeouts
    s = channel_stats(nsqd, "ev", "sp")
    assert (s["timeout_count"], s["in_flight_count"]) == (0, 3)
    assert b.stats["touched"] >= 3
    nxt = b.plan(replayed, None)
    assert nxt == replayed  # nothing new
    wait_for(lambda: channel_stats(nsqd, "ev", "sp")["in_flight_count"] == 0, what="FINs")


class Sink:
    """Spark's file sink as the source sees it: a batch's rows count once it is committed."""

    def __init__(self) -> None:
        self.batches: dict[int, list[bytes]] = {}

    def run(self, c: Consumer, batch: int, begin: Offset, end: Offset) -> None:
        """Spark runs ``batch`` and commits it (a batch already in the sink's log is not written)."""
        written = bodies(c, begin, end)
        self.batches.setdefault(batch, written)

    def bodies(self) -> list[bytes]:
        return sorted(b for rows in self.batches.values() for b in rows)


def test_two_driver_deaths_a_batch_apart_lose_nothing(nsqd: Daemon, consumers: list[Consumer]) -> None:
    """The first process plans batch 2 and dies; the second replays it, commits it, plans batch 3 and
    dies before running it; the third replays batch 3. Every message is in the sink once. (Before,
    the second process wrote batch 2 empty and took its messages into batch 3; the third dropped
    them as batch 2's committed ones when nsqd redelivered them: one batch lost.)"""
    sink = Sink()
    publish(nsqd, "ev", [b"p%d" % i for i in range(6)])
    a = start(consumers, options(nsqd))
    e1 = plan_until(a, Offset(0), 3, max_rows=3)
    sink.run(a, 1, Offset(0), e1)
    e2 = plan_until(a, e1, 3, max_rows=3)
    a.close()  # batch 2 planned (in the offset log), never run
    b = start(consumers, options(nsqd))
    sink.run(b, 2, e1, e2)  # the replay
    publish(nsqd, "ev", [b"n%d" % i for i in range(3)])
    e3 = plan_until(b, e2, 3)
    b.close()  # batch 3 planned, never run
    c = start(consumers, options(nsqd))
    sink.run(c, 3, e2, e3)
    publish(nsqd, "ev", [b"last"])
    e4 = plan_until(c, e3, 1)
    sink.run(c, 4, e3, e4)
    c.acknowledge(e4)
    assert sink.bodies() == sorted([b"p%d" % i for i in range(6)] + [b"n0", b"n1", b"n2", b"last"])
    wait_for(lambda: channel_stats(nsqd, "ev", "sp")["in_flight_count"] == 0, what="FINs")
    assert channel_stats(nsqd, "ev", "sp")["depth"] == 0


def test_a_replay_without_its_messages_does_not_drop_them_later(nsqd: Daemon, consumers: list[Consumer]) -> None:
    """A replay whose messages nsqd does not give back within replay_timeout_ms (the old process
    still holds them) is committed without them; the next offset lists them as missed, so a process
    that replays the batch after it writes them when they come instead of dropping them as
    committed."""
    sink = Sink()
    publish(nsqd, "ev", [b"p%d" % i for i in range(6)])
    a = start(consumers, options(nsqd, max_in_flight="3"))  # holding batch 2, a takes nothing newer
    e1 = plan_until(a, Offset(0), 3, max_rows=3)
    sink.run(a, 1, Offset(0), e1)
    e2 = plan_until(a, e1, 3, max_rows=3)  # batch 1 FINed; batch 2's messages stay in flight to a
    wait_for(lambda: channel_stats(nsqd, "ev", "sp")["in_flight_count"] == 3, what="batch 1 FINed")
    b = start(consumers, options(nsqd, replay_timeout_ms="300"))
    sink.run(b, 2, e1, e2)  # nothing comes back: a (a driver on a vanished host) holds them
    assert sink.batches[2] == []
    publish(nsqd, "ev", [b"n0"])
    e3 = plan_until(b, e2, 1)
    assert e3.missed == e2.ids
    a.close()  # nsqd gives batch 2's messages back, to b, which dies before running batch 3
    wait_for(lambda: channel_stats(nsqd, "ev", "sp")["in_flight_count"] == 4, what="redelivered to b")
    b.close()
    c = start(consumers, options(nsqd))
    sink.run(c, 3, e2, e3)
    e4 = plan_until(c, e3, 3)
    sink.run(c, 4, e3, e4)
    c.acknowledge(e4)
    assert sink.bodies() == sorted([b"p%d" % i for i in range(6)] + [b"n0"])
    wait_for(lambda: channel_stats(nsqd, "ev", "sp")["in_flight_count"] == 0, what="FINs")
    assert channel_stats(nsqd, "ev", "sp")["depth"] == 0


def test_available_now_stops_at_start_time(nsqd: Daemon, consumers: list[Consumer]) -> None:
    """availableNow takes what was published before it began, then requeues the rest and stops."""
    publish(nsqd, "ev", [b"old%d" % i for i in range(5)])
    c = Consumer(options(nsqd, drain_timeout_ms="500"))
    consumers.append(c)
    c.available_now()
    time.sleep(0.01)
    publish(nsqd, "ev", [b"late%d" % i for i in range(3)])
    c.start()
    end = c.plan(Offset(0), None)
    assert sorted(bodies(c, Offset(0), end)) == sorted(b"old%d" % i for i in range(5))
    assert c.plan(end, None) == end  # drained: the query ends here
    wait_for(lambda: channel_stats(nsqd, "ev", "sp")["in_flight_count"] == 0, what="nothing in flight")
    s = channel_stats(nsqd, "ev", "sp")
    assert s["depth"] == 3 and c.stats["requeued"] == 3


def test_reconnects_after_nsqd_restart(daemon_factory: Callable[..., Daemon], tmp_path: Path,
                                       consumers: list[Consumer]) -> None:
    """When nsqd goes away the held messages are given up, and the consumer comes back with nsqd."""
    data = tmp_path / "restart"
    data.mkdir()
    d = daemon_factory(data_path=str(data))
    publish(d, "ev", [b"before"])
    c = start(consumers, options(d))
    plan_until(c, Offset(0), 1)
    address = d.tcp_address
    d.kill()
    wait_for(lambda: c.stats["lost"] == 1, what="connection loss noticed")
    d2 = daemon_factory(data_path=str(data), tcp=address)
    publish(d2, "ev", [b"after"])
    end = plan_until(c, Offset(1), 1, timeout=30)
    assert b"after" in bodies(c, Offset(1), end)


@pytest.mark.parametrize("ran_before_the_loss", [False, True], ids=["lost-then-run", "run-then-lost"])
def test_a_lost_connections_batch_keeps_its_messages_and_drops_their_redelivery(
        daemon_factory: Callable[..., Daemon], tmp_path: Path, consumers: list[Consumer],
        ran_before_the_loss: bool) -> None:
    """A node killed after a batch was planned, before or while Spark ran it: the batch has its
    messages either way, and once it is committed the restarted node's redelivery of them (same ids,
    --durable-delivery) is FINed, not emitted again: exactly once into a sink whose batches are
    idempotent. (Before, a batch run first and then cut off came back as a second batch of the same
    messages; one cut off first lost them where the node had not kept them.)"""
    data = tmp_path / "durable"
    data.mkdir()
    d = daemon_factory("--durable-delivery", data_path=str(data))
    publish(d, "ev", [b"k%d" % i for i in range(6)])
    c = start(consumers, options(d))
    end = plan_until(c, Offset(0), 6)
    batch = sorted(b"k%d" % i for i in range(6))
    if ran_before_the_loss:
        assert sorted(bodies(c, Offset(0), end)) == batch
    address = d.tcp_address
    d.kill()
    wait_for(lambda: c.stats["lost"] == 6, what="connection loss noticed")
    assert sorted(bodies(c, Offset(0), end)) == batch  # Spark runs it (again)
    d2 = daemon_factory("--durable-delivery", data_path=str(data), tcp=address)
    wait_for(lambda: channel_stats(d2, "ev", "sp").get("in_flight_count") == 6, timeout=30,
             what="the restarted node redelivers the batch's messages")
    only_after(d2, c, end, timeout=30)
    assert c.stats["skipped"] == 6


def test_a_restart_drops_what_a_lost_connection_left_unfinished(
        daemon_factory: Callable[..., Daemon], tmp_path: Path, consumers: list[Consumer]) -> None:
    """A batch committed while its node was down cannot be FINed; if the stream process dies before
    the node comes back, the next process still knows those ids (the offsets carry them) and FINs
    them on sight instead of emitting them a second time."""
    data = tmp_path / "durable"
    data.mkdir()
    d = daemon_factory("--durable-delivery", data_path=str(data))
    other = daemon_factory()
    both = options(d, nsqd_tcp_addresses=f"{d.tcp_address},{other.tcp_address}")
    publish(d, "ev", [b"k%d" % i for i in range(6)])
    a = start(consumers, both)
    end1 = plan_until(a, Offset(0), 6)
    assert sorted(bodies(a, Offset(0), end1)) == sorted(b"k%d" % i for i in range(6))
    address = d.tcp_address
    d.kill()  # the batch's node dies before Spark commits it
    wait_for(lambda: a.stats["lost"] == 6, what="connection loss noticed")
    publish(other, "ev", [b"other"])
    end2 = plan_until(a, end1, 1)  # Spark committed batch 1: its FINs cannot go out
    assert bodies(a, end1, end2) == [b"other"]
    assert end2.unfinished and not end1.unfinished
    a.close()  # the stream process dies too, before the node is back
    d2 = daemon_factory("--durable-delivery", data_path=str(data), tcp=address)
    b = start(consumers, both)
    assert b.plan(end2, None) == end2  # Spark committed batch 2 as well
    wait_for(lambda: b.stats["skipped"] == 7, timeout=30, what="both batches' redeliveries dropped")
    publish(d2, "ev", [b"after"])
    end3 = plan_until(b, end2, 1, timeout=30)
    assert bodies(b, end2, end3) == [b"after"]
    b.acknowledge(end3)
    for node in (d2, other):
        wait_for(lambda n=node: channel_stats(n, "ev", "sp")["in_flight_count"] == 0, what="FINs")
        assert channel_stats(node, "ev", "sp")["depth"] == 0


def test_lookupd_discovery(daemon_factory: Callable[..., Daemon], lookupd_factory: Callable[..., Any],
                           consumers: list[Consumer]) -> None:
    """With nsqlookupd the consumer finds the topic's nsqds once they appear, re-asking periodically."""
    lookupd = lookupd_factory("--broadcast-address=127.0.0.1")
    nsqd = daemon_factory("--broadcast-address=127.0.0.1", f"--lookupd-tcp-address={lookupd.tcp_address}")
    opts = ReaderOptions.parse({"lookupd_http_addresses": lookupd.http_address, "topic": "ev",
                                "channel": "sp", "lookupd_poll_interval_ms": "200"})
    c = start(consumers, opts)
    assert c.addresses() == []  # TOPIC_NOT_FOUND: nothing to connect to yet
    publish(nsqd, "ev", [b"found"])
    end = plan_until(c, Offset(0), 1)
    assert c.addresses() == [nsqd.tcp_address]
    assert bodies(c, Offset(0), end) == [b"found"]


def test_a_start_waits_for_lookupd_to_come_back(daemon_factory: Callable[..., Daemon],
                                                lookupd_factory: Callable[..., Any],
                                                consumers: list[Consumer]) -> None:
    """A query (re)started while nsqlookupd is down asks again until it answers (connect_timeout_ms),
    instead of failing at once; one that never comes back is still a clear error."""
    lookupd = lookupd_factory("--broadcast-address=127.0.0.1")
    nsqd = daemon_factory("--broadcast-address=127.0.0.1", f"--lookupd-tcp-address={lookupd.tcp_address}")
    publish(nsqd, "ev", [b"x"])
    tcp, http = lookupd.tcp_address, lookupd.http_address
    lookupd.kill()

    gone = ReaderOptions.parse({"lookupd_http_addresses": http, "topic": "ev", "channel": "sp",
                                "connect_timeout_ms": "1500"})
    began = time.monotonic()
    with pytest.raises(NSQClientError, match="no lookupd answered"):
        start(consumers, gone)
    assert time.monotonic() - began >= 1.4

    c = Consumer(ReaderOptions.parse({"lookupd_http_addresses": http, "topic": "ev", "channel": "sp",
                                      "connect_timeout_ms": "30000", "lookupd_poll_interval_ms": "200"}))
    consumers.append(c)
    starting = threading.Thread(target=c.start)
    starting.start()
    time.sleep(1.0)
    assert starting.is_alive()  # lookupd is still down: the start waits, it has not failed
    lookupd_factory("--broadcast-address=127.0.0.1", tcp=tcp, http=http)  # back; nsqd registers again
    starting.join(30)
    assert not starting.is_alive()
    end = plan_until(c, Offset(0), 1, timeout=30)
    assert bodies(c, Offset(0), end) == [b"x"]


def test_unreachable_nsqd_is_a_clear_error(nsqd: Daemon) -> None:
    """A consumer that can reach no nsqd fails at start with the address in the message."""
    host, port = nsqd.tcp
    nsqd.stop()
    c = Consumer(ReaderOptions.parse({"nsqd_tcp_addresses": f"{host}:{port}", "topic": "t", "channel": "c",
                                      "connect_timeout_ms": "2000"}))
    with pytest.raises(NSQClientError, match=f"cannot subscribe to any nsqd: {host}:{port}: cannot connect"):
        c.start()
    c.close()


def test_producer_chunks_mpub(nsqd: Daemon) -> None:
    """The producer publishes every body, in several MPUBs when they exceed max_body_size."""
    o = WriterOptions.parse({"nsqd_tcp_addresses": nsqd.tcp_address, "topic": "out",
                             "max_msg_size": "100", "max_body_size": "1000"})
    p = Producer(o, partition_id=3)
    sent = [b"w%03d" % i for i in range(500)]
    assert p.publish("out", sent) == 500
    p.close()
    assert (p.count, p.bytes) == (500, 2000)
    assert topic_stats(nsqd, "out")["message_count"] == 500
    sub = rawclient.subscribe(nsqd.tcp_address, "out", "check", rdy=500)
    got = sorted(m.body for m in sub.messages(500, timeout=20, fin=True))
    sub.close()
    assert got == sent


def test_producer_with_lookupd_uses_nodes_for_new_topics(daemon_factory: Callable[..., Daemon],
                                                        lookupd_factory: Callable[..., Any]) -> None:
    """A topic no nsqd has yet is published to a node from lookupd's /nodes."""
    lookupd = lookupd_factory("--broadcast-address=127.0.0.1")
    nsqd = daemon_factory("--broadcast-address=127.0.0.1", f"--lookupd-tcp-address={lookupd.tcp_address}")
    wait_for(lambda: all_nodes([f"http://{lookupd.http_address}"]), what="the node in /nodes")
    p = Producer(WriterOptions.parse({"lookupd_http_addresses": lookupd.http_address, "topic": "fresh"}))
    p.publish("fresh", [b"1", b"2"])
    p.close()
    assert p.count == 2
    assert topic_stats(nsqd, "fresh")["message_count"] == 2


def test_tls(daemon_factory: Callable[..., Daemon], tmp_path: Path, consumers: list[Consumer]) -> None:
    """With tls=true the consumer and the producer upgrade after IDENTIFY and verify nsqd's certificate."""
    certs = make_certs(str(tmp_path))
    nsqd = daemon_factory(f"--tls-cert={certs.server_cert}", f"--tls-key={certs.server_key}",
                          "--tls-required=tcp-https")  # TCP needs TLS; plain HTTP stays for /stats
    tls = {"nsqd_tcp_addresses": nsqd.tcp_address, "tls": "true", "tls_ca_file": certs.ca}
    p = Producer(WriterOptions.parse({**tls, "topic": "ev"}))
    p.publish("ev", [b"s%d" % i for i in range(50)])
    p.close()
    # held past their timeout, they live on by TOUCHes, which share the TLS connection with the reads
    # (sent halfway to it, every 0.2 s at most: 2 s leaves a loaded machine 0.8 s for one to go)
    c = start(consumers, ReaderOptions.parse({**tls, "topic": "ev", "channel": "sp", "msg_timeout_ms": "2000"}))
    end = plan_until(c, Offset(0), 50)
    time.sleep(3.0)
    assert sorted(bodies(c, Offset(0), end)) == sorted(b"s%d" % i for i in range(50))
    c.acknowledge(end)
    wait_for(lambda: channel_stats(nsqd, "ev", "sp")["in_flight_count"] == 0, what="FINs over TLS")
    s = channel_stats(nsqd, "ev", "sp")
    assert (s["depth"], s["timeout_count"]) == (0, 0)
    assert s["clients"][0]["tls"] is True
    untrusted = ReaderOptions.parse({**tls, "tls_ca_file": "", "topic": "ev", "channel": "x"})
    with pytest.raises(NSQClientError, match="CERTIFICATE_VERIFY_FAILED"):
        Consumer(untrusted).start()


def test_auth(daemon_factory: Callable[..., Daemon], consumers: list[Consumer]) -> None:
    """auth_secret goes out with AUTH when nsqd requires it; without it the error names the option."""
    grants = {"spark": {"ttl": 60, "identity": "spark", "authorizations": [
        {"topic": "^ev$", "channels": [".*"], "permissions": ["publish", "subscribe"]}]}}
    server = AuthServer(grants)
    try:
        nsqd = daemon_factory(f"--auth-http-address={server.address}")
        base = {"nsqd_tcp_addresses": nsqd.tcp_address, "topic": "ev"}
        p = Producer(WriterOptions.parse({**base, "auth_secret": "spark"}))
        p.publish("ev", [b"secret"])
        p.close()
        c = start(consumers, ReaderOptions.parse({**base, "channel": "sp", "auth_secret": "spark"}))
        end = plan_until(c, Offset(0), 1)
        assert bodies(c, Offset(0), end) == [b"secret"]
        assert {q["secret"] for q in server.queries} == {"spark"}
        with pytest.raises(NSQClientError, match="requires AUTH; set the auth_secret option"):
            Consumer(ReaderOptions.parse({**base, "channel": "x"})).start()
        with pytest.raises(NSQClientError, match="E_AUTH_FAILED"):
            Producer(WriterOptions.parse({**base, "auth_secret": "wrong"})).publish("ev", [b"x"])
    finally:
        server.close()


def test_several_connections_per_nsqd(daemon_factory: Callable[..., Daemon], consumers: list[Consumer]) -> None:
    """max_in_flight above nsqd's --max-rdy-count opens more connections: one batch exceeds one RDY."""
    d = daemon_factory("--max-rdy-count=100")
    publish(d, "ev", [b"c%03d" % i for i in range(450)])
    c = start(consumers, options(d, max_in_flight="500"))
    assert c.connection_count() == 5
    end = plan_until(c, Offset(0), 450)
    assert sorted(bodies(c, Offset(0), end)) == [b"c%03d" % i for i in range(450)]
    s = channel_stats(d, "ev", "sp")
    assert (s["client_count"], s["in_flight_count"]) == (5, 450)
    assert max(client["in_flight_count"] for client in s["clients"]) <= 100
    c.acknowledge(end)  # each FIN goes out on the connection its message came in on
    wait_for(lambda: channel_stats(d, "ev", "sp")["in_flight_count"] == 0, what="FINs")
    s = channel_stats(d, "ev", "sp")
    assert (s["depth"], s["requeue_count"], s["timeout_count"]) == (0, 0, 0)


def test_max_bytes_in_flight(nsqd: Daemon, consumers: list[Consumer]) -> None:
    """Once the held bodies reach max_bytes_in_flight the consumer asks for no more until FINs free room."""
    c = start(consumers, options(nsqd, max_bytes_in_flight="1000"))
    publish(nsqd, "ev", [b"%03d" % i + b"x" * 97 for i in range(10)])  # 10 x 100 bytes: full
    wait_for(lambda: c.stats["full"] == 1, what="the byte limit")
    publish(nsqd, "ev", [b"%03d" % i + b"y" * 97 for i in range(10, 20)])
    time.sleep(0.5)
    s = channel_stats(nsqd, "ev", "sp")
    assert (s["in_flight_count"], s["depth"]) == (10, 10)  # RDY 0: the second ten wait in nsqd
    e1 = plan_until(c, Offset(0), 10)
    e2 = plan_until(c, e1, 10)  # FINs the first ten, which makes room again
    assert [b[:3] for b in bodies(c, e1, e2)] == [b"%03d" % i for i in range(10, 20)]
    c.acknowledge(e2)
    wait_for(lambda: channel_stats(nsqd, "ev", "sp")["in_flight_count"] == 0, what="FINs")
    assert channel_stats(nsqd, "ev", "sp")["depth"] == 0
