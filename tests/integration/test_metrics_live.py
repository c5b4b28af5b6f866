"""/metrics of live daemons, parsed back with prometheus_client and checked against /stats and /nodes."""

from __future__ import annotations

import json
import os
import re
import urllib.request
from pathlib import Path
from typing import Any

from prometheus_client.openmetrics.parser import text_string_to_metric_families as parse_openmetrics
from prometheus_client.parser import text_string_to_metric_families

from tests.daemon import Daemon
from tests.helpers import wait_for
from tests.rawclient import Client, subscribe

ROOT = Path(__file__).resolve().parents[2]
E2E = "--e2e-processing-latency-percentile=0.5,0.99"

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def get(address: str, path: str, accept: str | None = None) -> tuple[str, bytes]:
    req = urllib.request.Request(f"http://{address}{path}", headers={"Accept": accept} if accept else {})
    with urllib.request.urlopen(req, timeout=30) as r:
        return r.headers["Content-Type"], r.read()


def post(address: str, path: str, data: bytes = b"") -> None:
    with urllib.request.urlopen(urllib.request.Request(f"http://{address}{path}", data=data), timeout=30) as r:
        assert r.status == 200


def scrape(address: str) -> Samples:
    content_type, body = get(address, "/metrics")
    assert content_type == "text/plain; version=0.0.4; charset=utf-8"
    out: Samples = {}
    for family in text_string_to_metric_families(body.decode()):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def stats(address: str) -> dict[str, Any]:
    return json.loads(get(address, "/stats?format=json")[1])


def channel_labels(topic: str, channel: str) -> tuple[tuple[str, str], ...]:
    return (("channel", channel), ("topic", topic))


def test_metrics_agree_with_stats(daemon_factory) -> None:
    """After real publishes, deliveries, FINs, REQs and deferred messages, every per-topic and
    per-channel figure of /metrics is /stats' figure, and fsyncs were timed."""
    d = daemon_factory(E2E, "--mem-queue-size=5", "--sync-every=1")
    post(d.http_address, "/topic/create?topic=orders")
    post(d.http_address, "/channel/create?topic=orders&channel=billing")
    post(d.http_address, "/channel/create?topic=orders&channel=idle")
    post(d.http_address, "/mpub?topic=orders", b"\n".join(b"order-%d" % i for i in range(30)))
    post(d.http_address, "/pub?topic=orders&defer=600000", b"later")
    consumer = subscribe(d.tcp_address, "orders", "billing", rdy=10)
    got = consumer.messages(10)
    consumer.cmd("RDY", 0)  # hold the rest back: the FINs below free RDY room
    for m in got[:6]:
        consumer.fin(m)
    consumer.cmd("REQ", got[6].id.decode(), 0)
    wait_for(lambda: stats(d.http_address)["topics"][0]["channels"][0]["requeue_count"] == 1, what="REQ")
    snap = stats(d.http_address)
    got_metrics = scrape(d.http_address)
    assert stats(d.http_address)["topics"] == snap["topics"]  # nothing moved between the two pages
    topic = snap["topics"][0]
    t = (("topic", "orders"),)
    assert got_metrics[("nsqd_topic_depth", t)] == topic["depth"]
    assert got_metrics[("nsqd_topic_backend_depth", t)] == topic["backend_depth"]
    assert got_metrics[("nsqd_topic_messages_total", t)] == topic["message_count"] == 31
    assert got_metrics[("nsqd_topic_message_bytes_total", t)] == topic["message_bytes"]
    assert got_metrics[("nsqd_topic_channels", t)] == 2
    for c in topic["channels"]:
        labels = channel_labels("orders", c["channel_name"])
        for metric, key in (("nsqd_channel_depth", "depth"), ("nsqd_channel_backend_depth", "backend_depth"),
                            ("nsqd_channel_in_flight", "in_flight_count"),
                            ("nsqd_channel_deferred", "deferred_count"),
                            ("nsqd_channel_messages_total", "message_count"),
                            ("nsqd_channel_requeued_total", "requeue_count"),
                            ("nsqd_channel_timed_out_total", "timeout_count"),
                            ("nsqd_channel_clients", "client_count")):
            assert got_metrics[(metric, labels)] == c[key], (metric, c["channel_name"])
        for p in c["e2e_processing_latency"]["percentiles"]:
            q = labels[:1] + (("quantile", str(p["quantile"])),) + labels[1:]
            assert got_metrics[("nsqd_channel_e2e_processing_latency_seconds", q)] == p["value"] / 1e9
    billing = channel_labels("orders", "billing")
    assert got_metrics[("nsqd_channel_finished_total", billing)] == 6
    assert got_metrics[("nsqd_channel_in_flight", billing)] == 3
    assert got_metrics[("nsqd_channel_deferred", billing)] == 1
    assert got_metrics[("nsqd_channel_e2e_processing_latency_samples", billing)] == 6
    assert got_metrics[("nsqd_channel_backend_depth", billing)] > 0  # past --mem-queue-size: on disk
    assert got_metrics[("nsqd_healthy", ())] == 1
    assert got_metrics[("nsqd_topics", ())] == 1 and got_metrics[("nsqd_channels", ())] == 2
    assert got_metrics[("nsqd_clients", ())] == 1
    assert got_metrics[("nsqd_start_time_seconds", ())] // 1 == snap["start_time"]
    assert got_metrics[("nsqd_fsync_duration_seconds_count", ())] > 0  # --sync-every=1 over disk writes
    assert got_metrics[("nsqd_threads", ())] == len(os.listdir(f"/proc/{d.pid}/task"))
    assert got_metrics[("process_resident_memory_bytes", ())] > 0
    assert not [name for name, _ in got_metrics if name.startswith("nsqd_client_")]
    consumer.close()


def test_openmetrics_when_accepted(nsqd: Daemon) -> None:
    """Accept: application/openmetrics-text gets OpenMetrics 1.0, read by the strict OpenMetrics parser."""
    post(nsqd.http_address, "/pub?topic=t", b"m")
    content_type, body = get(nsqd.http_address, "/metrics", "application/openmetrics-text;version=1.0.0")
    assert content_type.startswith("application/openmetrics-text; version=1.0.0; charset=utf-8")
    families = {f.name: f for f in parse_openmetrics(body.decode())}
    assert families["nsqd_topic_messages"].type == "counter"
    assert families["nsqd_topic_messages"].samples[0].value == 1
    assert families["nsqd_fsync_duration_seconds"].type == "histogram"
    # a plain scraper gets the text format
    assert get(nsqd.http_address, "/metrics", "text/plain")[0] == "text/plain; version=0.0.4; charset=utf-8"


def test_per_client_series_behind_the_flag(daemon_factory) -> None:
    """--metrics-per-client adds one series per consumer and producer, with /stats' client figures."""
    d = daemon_factory("--metrics-per-client")
    producer = Client(d.tcp_address)
    for i in range(4):
        producer.pub("t", b"%d" % i)
    consumer = subscribe(d.tcp_address, "t", "c", rdy=3)
    msgs = consumer.messages(3)
    consumer.cmd("RDY", 0)  # the fourth message stays queued
    consumer.fin(msgs[0])
    wait_for(lambda: stats(d.http_address)["topics"][0]["channels"][0]["clients"][0]["finish_count"] == 1,
             what="FIN")
    snap = stats(d.http_address)
    got = scrape(d.http_address)
    client = snap["topics"][0]["channels"][0]["clients"][0]
    labels = (("channel", "c"), ("client_id", str(client["client_id"])), ("hostname", client["hostname"]),
              ("remote_address", client["remote_address"]), ("topic", "t"))
    assert got[("nsqd_client_ready", labels)] == client["ready_count"] == 0
    assert got[("nsqd_client_in_flight", labels)] == client["in_flight_count"] == 2
    assert got[("nsqd_client_messages_total", labels)] == client["message_count"] == 3
    assert got[("nsqd_client_finished_total", labels)] == 1
    assert got[("nsqd_client_requeued_total", labels)] == 0
    pub = snap["producers"][0]
    assert got[("nsqd_client_published_total", (
        ("client_id", str(pub["client_id"])), ("hostname", pub["hostname"]),
        ("remote_address", pub["remote_address"]), ("topic", "t")))] == 4
    assert got[("nsqd_producers", ())] == 1
    producer.close()
    consumer.close()


def test_corrupt_segment_counted(tmp_path, daemon_factory) -> None:
    """A corrupt segment set aside shows in nsqd_disk_segments_set_aside_total, the node still healthy,
    and stays counted once its topic is deleted."""
    data = tmp_path / "c"
    d = daemon_factory("--mem-queue-size=0", "--max-bytes-per-file=1000", data_path=str(data))
    pub = Client(d.tcp_address)
    for i in range(100):
        pub.pub("t", b"x%03d" % i)
    d.stop()
    first = data / "t.diskqueue.000000.dat"
    raw = bytearray(first.read_bytes())
    raw[0:4] = b"\x7f\xff\xff\xff"
    first.write_bytes(bytes(raw))
    d2 = daemon_factory("--mem-queue-size=0", "--max-bytes-per-file=1000", data_path=str(data))
    subscribe(d2.tcp_address, "t", "c", rdy=100).drain()
    got = scrape(d2.http_address)
    assert got[("nsqd_disk_segments_set_aside_total", ())] == stats(d2.http_address)["segments_set_aside"] == 1
    assert got[("nsqd_healthy", ())] == 1
    post(d2.http_address, "/topic/delete?topic=t")  # a counter: deleting the queue takes nothing back
    got = scrape(d2.http_address)
    assert got[("nsqd_disk_segments_set_aside_total", ())] == stats(d2.http_address)["segments_set_aside"] == 1


def test_disk_write_errors_counted(tmp_path) -> None:
    """While the disk refuses writes, nsqd_disk_write_errors_total grows and the node reads unhealthy."""
    from tests.reliability.faults import faulty_daemon_code

    data = tmp_path / "full"
    data.mkdir()
    flag = tmp_path / "disk-full"
    d = Daemon(str(data), "--mem-queue-size=0", code=faulty_daemon_code(),
               env={"NSQTW_TEST_DISK_FULL_FLAG": str(flag)}).start()
    try:
        post(d.http_address, "/topic/create?topic=t")
        flag.touch()
        Client(d.tcp_address).cmd("PUB", "t", body=b"lost?")  # the write fails; its publisher waits
        got = wait_for(lambda: (lambda s: s if s[("nsqd_disk_write_errors_total", ())] >= 1 else None)(
            scrape(d.http_address)), what="a write error")
        assert got[("nsqd_healthy", ())] == 0
        assert got[("nsqd_disk_unwritable_queues", ())] == 1
        flag.unlink()
        recovered = wait_for(lambda: (lambda s: s if s[("nsqd_healthy", ())] == 1 else None)(
            scrape(d.http_address)), what="health back")
        assert recovered[("nsqd_disk_write_errors_total", ())] >= got[("nsqd_disk_write_errors_total", ())]
        assert recovered[("nsqd_disk_unwritable_queues", ())] == 0
    finally:
        d.stop()


def test_lookupd_metrics(daemon_factory, lookupd_factory) -> None:
    """nsqtw-lookupd's /metrics counts the registered node, its topics and channels as /nodes shows them."""
    lookupd = lookupd_factory()
    d = daemon_factory(f"--lookupd-tcp-address={lookupd.tcp_address}")
    post(d.http_address, "/topic/create?topic=a")
    post(d.http_address, "/channel/create?topic=a&channel=x")
    post(d.http_address, "/channel/create?topic=a&channel=y")
    post(d.http_address, "/topic/create?topic=b")

    def counted() -> Samples | None:
        got = scrape(lookupd.http_address)
        return got if got.get(("nsqlookupd_channels", ())) == 2 and got.get(("nsqlookupd_topics", ())) == 2 \
            else None

    got = wait_for(counted, what="registrations")
    nodes = json.loads(get(lookupd.http_address, "/nodes")[1])["producers"]
    assert got[("nsqlookupd_producers", ())] == len(nodes) == 1
    assert sorted(nodes[0]["topics"]) == ["a", "b"]
    assert got[("nsqlookupd_topic_producers", (("topic", "a"),))] == 1
    assert got[("nsqlookupd_topic_channels", (("topic", "a"),))] == 2
    assert got[("nsqlookupd_topic_channels", (("topic", "b"),))] == 0
    assert got[("nsqlookupd_uptime_seconds", ())] > 0
    assert got[("process_cpu_seconds_total", ())] > 0
    content_type, body = get(lookupd.http_address, "/metrics", "application/openmetrics-text")
    assert content_type.startswith("application/openmetrics-text")
    assert {f.name for f in parse_openmetrics(body.decode())} >= {"nsqlookupd_producers", "nsqlookupd"}


def _dashboard_metric_names() -> set[str]:
    """Every metric name the example Grafana dashboard's queries use."""
    dashboard = json.loads((ROOT / "docs" / "grafana-nsqtw.json").read_text())
    exprs: list[str] = []

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            for key, value in node.items():
                if key in ("expr", "query") and isinstance(value, str):
                    exprs.append(value)
                else:
                    walk(value)
        elif isinstance(node, list):
            for item in node:
                walk(item)

    walk(dashboard)
    assert exprs, "the dashboard has no queries"
    return {name for e in exprs for name in re.findall(r"\b((?:nsqd|nsqlookupd|process|python)_[a-z0-9_]+)", e)}


def test_grafana_dashboard_uses_real_metrics(daemon_factory, lookupd_factory) -> None:
    """Every metric name in docs/grafana-nsqtw.json exists in a live scrape of nsqtw and nsqtw-lookupd."""
    lookupd = lookupd_factory()
    d = daemon_factory(E2E, "--sync-every=1", "--mem-queue-size=0", "--metrics-per-client",
                       f"--lookupd-tcp-address={lookupd.tcp_address}")
    consumer = subscribe(d.tcp_address, "t", "c", rdy=1)
    producer = Client(d.tcp_address)
    producer.pub("t", b"m")
    consumer.fin(consumer.message())
    wait_for(lambda: scrape(d.http_address).get(("nsqd_channel_finished_total", channel_labels("t", "c"))) == 1,
             what="the FIN")
    wait_for(lambda: scrape(lookupd.http_address).get(("nsqlookupd_topics", ())) == 1, what="registration")
    live = {name for name, _ in scrape(d.http_address)} | {name for name, _ in scrape(lookupd.http_address)}
    used = _dashboard_metric_names()
    assert used, "no metric names found"
    assert used - live == set()
    producer.close()
    consumer.close()
