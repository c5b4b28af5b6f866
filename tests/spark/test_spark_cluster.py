"""The nsq source over several nsqds found through nsqlookupd, in a real local Spark.

Nodes come and go while a long-running query reads: it keeps running,
loses nothing, and picks up a node that appears.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

from nsqtw.spark.discovery import lookup_topic
from tests.daemon import Daemon
from tests.helpers import wait_for
from tests.integration.test_spark_client import channel_stats, publish

PER_NODE = 2000
MAX_IN_FLIGHT = 300
TIMEOUT = 120


def test_nodes_come_and_go(spark: Any, daemon_factory: Any, lookupd_factory: Any, tmp_path: Path) -> None:
    """Three nsqds read in parallel; one stops mid-query and comes back, a fourth appears.

    The stopped node's messages that a batch held stay in that batch, and
    what the node delivers again of them after it returns is dropped once
    the batch is committed (no body comes twice); those it had delivered
    but no batch held yet come back from it; the new node's messages are
    picked up through lookupd, and the query never fails.
    """
    lookupd = lookupd_factory("--broadcast-address=127.0.0.1")
    lookupd_url = f"http://{lookupd.http_address}"

    def node(**kw: Any) -> Daemon:
        d: Daemon = daemon_factory("--broadcast-address=127.0.0.1",
                                   f"--lookupd-tcp-address={lookupd.tcp_address}", **kw)
        return d

    a, b, c = node(), node(), node()
    expected: set[bytes] = set()
    for name, d in (("a", a), ("b", b), ("c", c)):
        bodies = [b"%s%05d" % (name.encode(), i) for i in range(PER_NODE)]
        publish(d, "ev", bodies)
        expected.update(bodies)
    wait_for(lambda: len(lookup_topic([lookupd_url], "ev")) == 3, what="three nsqds in lookupd")

    rows: list[tuple[int, bytes, str]] = []
    retried: list[bytes] = []  # delivered again by nsqd (attempts > 1)
    # The first batch holding messages of all three nodes waits here until b
    # has been stopped: uncommitted, its messages stay in flight at b, and b
    # cannot be drained first however slow the machine is.
    holding, release = threading.Event(), threading.Event()

    def sink(df: Any, batch_id: int) -> None:
        time.sleep(0.3)  # a slow sink: messages stay in flight while nodes come and go
        batch = [(bytes(r.body), r.nsqd_address, r.attempts)
                 for r in df.select("body", "nsqd_address", "attempts").collect()]
        for body, address, attempts in batch:
            rows.append((batch_id, body, address))
            if attempts > 1:
                retried.append(body)
        if not holding.is_set() and len({address for _b, address, _n in batch}) == 3:
            holding.set()
            release.wait(TIMEOUT)

    df = (spark.readStream.format("nsq").option("lookupd_http_addresses", lookupd.http_address)
          .option("topic", "ev").option("channel", "spark").option("lookupd_poll_interval_ms", "500")
          .option("max_in_flight", str(MAX_IN_FLIGHT)).load())
    q = (df.writeStream.foreachBatch(sink).option("checkpointLocation", str(tmp_path / "ck"))
         .trigger(processingTime="200 milliseconds").start())
    try:
        # one micro-batch holds messages of all three nodes: they are read side by side
        wait_for(holding.is_set, timeout=TIMEOUT, what="a batch with messages from all three nsqds")

        # b goes away while the query holds some of its messages
        def b_busy() -> bool:
            s = channel_stats(b, "ev", "spark")
            return bool(s) and s["in_flight_count"] > 0 and s["depth"] > 0

        wait_for(b_busy, what="b holding messages in flight and in its queue")
        b_path, b_address = b.data_path, b.tcp_address
        b.stop()  # SIGTERM: nsqd keeps what was in flight, unfinished, on disk
        release.set()
        wait_for(lambda: len(lookup_topic([lookupd_url], "ev")) == 2, what="b gone from lookupd")

        # a node that appears is picked up through lookupd; the query goes on
        d = node()
        late = [b"d%05d" % i for i in range(PER_NODE)]
        publish(d, "ev", late)
        expected.update(late)
        wait_for(lambda: any(address == d.tcp_address for _b, _body, address in list(rows)), timeout=TIMEOUT,
                 what="messages from the new nsqd")
        assert q.isActive and q.exception() is None

        # b comes back with its data: what it had in flight is delivered now
        back = node(data_path=b_path, tcp=b_address)

        # b wrote what it had in flight after its queue when it stopped, so
        # every body can be seen before those come again: wait for b to be
        # drained and acknowledged too, not only for every body to be seen.
        def b_done() -> bool:
            s = channel_stats(back, "ev", "spark")
            return bool(s) and s["depth"] == 0 and s["in_flight_count"] == 0 and s["deferred_count"] == 0

        wait_for(lambda: expected <= {body for _b, body, _a in list(rows)} and b_done(), timeout=TIMEOUT,
                 what="every message of the four nsqds, and b drained and acknowledged")
        assert q.isActive and q.exception() is None
    finally:
        release.set()
        q.stop()

    seen = Counter(body for _b, body, _a in rows)
    assert set(seen) == expected
    twice = [body for body, n in seen.items() if n > 1]
    assert not twice, twice[:10]
    # what b had delivered but no batch held yet came back from b itself after its restart
    assert all(body.startswith(b"b") for body in retried)
    print(f"\n{len(retried)} of b's messages delivered again after its restart, none twice")
