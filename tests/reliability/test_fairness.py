"""One client cannot stall the others: hostile loads with a well-behaved bystander watching.

Each attack of tests/attacks.py runs against a live daemon while a
bystander publishes one message at a time (round trips timed) and a
consumer with a 1 s heartbeat answers its heartbeats. Bounds are generous
for a loaded CI machine and still far below what these attacks cost before
the per-turn budget (seconds of stall, heartbeat consumers cut).
docs/reliability.md's "Hostile clients" table names each test.
"""

from __future__ import annotations

import json
import struct
import threading
import time
import urllib.request

from tests.attacks import (
    MAGIC,
    Bystander,
    LookupBystander,
    _connect,
    _identify,
    _read_frame,
    churn,
    deflate_bomb,
    endless_chunked,
    http_mpub_lines,
    huge_config,
    in_process,
    mpub_flood,
    pipelined_pings,
    warm_up,
)
from tests.daemon import Daemon, LookupdDaemon

#: the worst bystander round trip allowed during an attack (seconds); before: 0.7 to 19 s
WORST = 0.5


def check(watch) -> None:
    assert not watch.bystander_error, watch.summary()
    assert len(watch.round_trips) >= 5, watch.summary()
    assert watch.worst < WORST, watch.summary()
    assert not watch.consumer_cut, watch.summary()


def test_deflate_bomb_does_not_stall_others(daemon_factory) -> None:
    """64 KB of deflate that inflates to 64 MB of NOPs: the bomb is worked through in slices."""
    d: Daemon = daemon_factory()
    with Bystander(d.tcp_address) as watch:
        result = deflate_bomb(d.tcp_address, 64 << 20, seconds=3)
    assert result["sent"] > 0
    check(watch)


def test_tiny_mpub_flood_does_not_stall_others(daemon_factory) -> None:
    """Ten publishers pipelining tiny MPUBs: each is served its share, the bystander in time."""
    d: Daemon = daemon_factory()
    with Bystander(d.tcp_address) as watch:
        result = mpub_flood(d.tcp_address, publishers=10, seconds=3)
    assert result["messages"] > 0
    check(watch)


def test_endless_chunked_body_is_cut_and_others_served(daemon_factory) -> None:
    """A chunked /pub that never ends gets 413 after about the limit, not a read of everything."""
    d: Daemon = daemon_factory()
    with Bystander(d.tcp_address) as watch:
        result = endless_chunked(d.http_address, seconds=5)
    assert result["status"] == "413", result
    assert result["sent_bytes"] < 8 * 1024 * 1024, result  # 1 MiB limit + 256 KiB + socket buffers
    check(watch)


def test_connection_churn_leaves_a_bystander_alone(daemon_factory) -> None:
    """3,000 connect/close cycles (bare TCP, SUB, HTTP): the bystander stays under the bound."""
    d: Daemon = daemon_factory()
    with Bystander(d.tcp_address) as watch:
        result = churn(d.tcp_address, d.http_address, 3000)
    assert result["cycles"] == 3000
    check(watch)


def test_absurd_lookupd_config_is_refused_at_once(daemon_factory) -> None:
    """20,000 lookupd addresses: 400 INVALID_VALUE at once, no sockets opened, a clear log line."""
    d: Daemon = daemon_factory()
    with Bystander(d.tcp_address) as watch:
        result = huge_config(d.http_address, 20000)
    assert (result["status"], result["body"]) == (400, '{"message":"INVALID_VALUE"}'), result
    assert result["seconds"] < 2, result
    d.wait_output("20000 addresses, more than the 100 nsqtw accepts")
    check(watch)
    with urllib.request.urlopen(f"http://{d.http_address}/config/nsqlookupd_tcp_addresses") as r:
        assert json.load(r) == []


def test_topic_creation_storm_is_served_in_slices(daemon_factory) -> None:
    """10,000 pipelined PUBs, each to a new topic: all answered, the bystander barely notices."""
    d: Daemon = daemon_factory()
    payload = MAGIC + b"".join(b"PUB storm%d\n" % i + struct.pack(">i", 1) + b"m" for i in range(10_000))
    with Bystander(d.tcp_address) as watch:
        sock = _connect(d.tcp_address, timeout=60)
        sock.sendall(payload)
        oks = 0
        while oks < 10_000:
            kind, data = _read_frame(sock)
            assert data == b"OK"
            oks += 1
        sock.close()
    check(watch)


def test_stats_with_huge_identities_is_sliced(daemon_factory) -> None:
    """Twenty subscribers with 1 MiB client_ids: /stats answers in full while others are served."""
    d: Daemon = daemon_factory("--max-body-size=2097152")
    big = []
    for i in range(20):
        sock = _connect(d.tcp_address)
        sock.sendall(MAGIC + _identify({"client_id": chr(65 + i) * (1 << 20), "hostname": "h"})
                     + b"SUB huge c\n")
        assert _read_frame(sock)[1] == b"OK"
        assert _read_frame(sock)[1] == b"OK"
        big.append(sock)
    with Bystander(d.tcp_address) as watch:
        for fmt in ("json", "text", "json"):
            with urllib.request.urlopen(f"http://{d.http_address}/stats?format={fmt}&topic=huge", timeout=60) as r:
                body = r.read()
            if fmt == "text":  # nsqd's text lines name a client by host, port and user agent
                assert body.count(b"[V2 h:") == 20
            else:
                assert len(body) > 20 << 20
                clients = json.loads(body)["topics"][0]["channels"][0]["clients"]
                assert sorted(c["client_id"][0] for c in clients) == [chr(65 + i) for i in range(20)]
    for sock in big:
        sock.close()
    check(watch)


def test_consumer_latency_while_stats_is_polled(daemon_factory) -> None:
    """2,000 channels × 2 clients, /stats requested in a loop: a consumer's delivery latency stays low."""
    d: Daemon = daemon_factory()
    subscribers = []
    for t in range(20):
        for c in range(100):
            for _ in range(2):
                sock = _connect(d.tcp_address)
                sock.sendall(MAGIC + f"SUB scale{t} c{c}\n".encode())
                subscribers.append(sock)
    for sock in subscribers:
        assert _read_frame(sock)[1] == b"OK"
    stop = threading.Event()
    polls = []

    def poll() -> None:
        while not stop.is_set():
            started = time.monotonic()
            with urllib.request.urlopen(f"http://{d.http_address}/stats?format=json", timeout=60) as r:
                r.read()
            polls.append(time.monotonic() - started)

    consumer = _connect(d.tcp_address)
    consumer.sendall(MAGIC + b"SUB latency c\nRDY 1\n")
    assert _read_frame(consumer)[1] == b"OK"
    producer = _connect(d.tcp_address)
    producer.sendall(MAGIC)
    # the first /stats of a daemon imports and warms what the JSON takes (0.4 s on a loaded machine):
    # not what the bound below is about, a /stats that holds up deliveries
    with urllib.request.urlopen(f"http://{d.http_address}/stats?format=json", timeout=60) as r:
        r.read()
    poller = threading.Thread(target=poll, daemon=True)
    poller.start()
    latencies = []
    try:
        deadline = time.monotonic() + 4
        while time.monotonic() < deadline or len(polls) < 2:
            started = time.monotonic()
            producer.sendall(b"PUB latency\n" + struct.pack(">i", 1) + b"x")
            kind, payload = _read_frame(consumer)
            while kind != 2:
                kind, payload = _read_frame(consumer)
            latencies.append(time.monotonic() - started)
            consumer.sendall(b"FIN " + payload[10:26] + b"\n")
            assert _read_frame(producer)[1] == b"OK"
            time.sleep(0.01)
    finally:
        stop.set()
        poller.join(60)
    for sock in subscribers:
        sock.close()
    latencies.sort()
    assert len(polls) >= 2
    # the bound is 50 ms: 95 % of deliveries must meet it even on a loaded CI machine,
    # and none may take more than 0.3 s (/stats in one go stalled them for its whole time)
    assert latencies[len(latencies) * 95 // 100] < 0.05, (latencies[-5:], polls)
    assert latencies[-1] < 0.3, (latencies[-5:], polls)



def test_huge_mpub_of_tiny_lines_is_published_in_slices(daemon_factory) -> None:
    """A 5 MB /mpub of one-byte lines (2.6 million messages): OK, each published once, the bystander in time."""
    d: Daemon = daemon_factory()
    warm_up(d.http_address)  # the first routed request imports the HTTP router: not this attack's cost
    with Bystander(d.tcp_address) as watch:
        result = http_mpub_lines(d.http_address)
    assert (result["status"], result["body"]) == (200, "OK"), result
    check(watch)
    with urllib.request.urlopen(f"http://{d.http_address}/stats?format=json&topic=bigmpub", timeout=30) as r:
        topic = json.load(r)["topics"][0]
    assert topic["message_count"] == topic["depth"] == result["messages"] == 5 * 1024 * 1024 // 2, topic


def test_pipelined_pings_are_answered_in_slices(daemon_factory) -> None:
    """20,000 keep-alive GET /ping in one write: all answered 200 OK, in order, the bystander in time."""
    d: Daemon = daemon_factory()
    warm_up(d.http_address)
    with Bystander(d.tcp_address) as watch:
        result = pipelined_pings(d.http_address, 20_000)
    assert result["answers"] == result["ok"] == 20_000, result
    check(watch)


#: a REGISTER flood's bystander: its worst /lookup (seconds), and how many answers it must get per
#: second of flood (it asks every 10 ms when answered at once; before the slices, on a loaded 2-core
#: machine: worst 2.1 s, 15 a second; after: worst 0.1 s, 60 a second)
LOOKUP_WORST = 1.0
LOOKUPS_PER_SECOND = 20


def test_register_flood_leaves_lookup_answered(tmp_path) -> None:
    """A fake nsqd pipelines 30,000 REGISTERs: all answered OK and visible; /lookup keeps being answered."""
    d = LookupdDaemon(str(tmp_path)).start()
    try:
        with LookupBystander(d.http_address) as watch:
            result = in_process("register_flood", d.tcp_address, 30_000)
        assert result.get("registers") == result.get("ok") == 30_000, result
        assert not watch.error, watch.summary()
        assert watch.worst < LOOKUP_WORST, watch.summary()
        assert len(watch.times) >= LOOKUPS_PER_SECOND * result["seconds"], (result, watch.summary())
        with urllib.request.urlopen(f"http://{d.http_address}/topics", timeout=30) as r:
            topics = set(json.load(r)["topics"])
        assert topics == {f"flood{i}" for i in range(30_000)} | {"bystander"}
    finally:
        d.stop()


def test_req_storm_leaves_others_served_and_loses_nothing(daemon_factory) -> None:
    """A consumer with RDY 2500 REQs every message with timeout 0 for 5 s, then FINs: each of the 2,500 FINed once."""
    d: Daemon = daemon_factory()
    with Bystander(d.tcp_address) as watch:
        result = in_process("req_storm", d.tcp_address, 5)
    assert "error" not in result, result
    assert result["reqs"] > 2500, result
    assert (result["finned"], result["finned_twice"], result["errors"]) == (2500, 0, 0), result
    check(watch)
    rts = sorted(watch.round_trips)
    assert rts[len(rts) // 2] < REQ_STORM_MEDIAN, watch.summary()
    with urllib.request.urlopen(f"http://{d.http_address}/stats?format=json&topic=reqstorm", timeout=30) as r:
        channel = json.load(r)["topics"][0]["channels"][0]
    assert (channel["depth"], channel["in_flight_count"], channel["deferred_count"]) == (0, 0, 0), channel


#: the bystander's median PUB round trip during a REQ storm (seconds)
REQ_STORM_MEDIAN = 0.05
