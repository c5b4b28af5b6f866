"""The nsq data source in a real local Spark against a real nsqtw on loopback."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from tests.daemon import Daemon
from tests.helpers import wait_for
from tests.integration.test_spark_client import channel_stats, publish, topic_stats

TIMEOUT = 120


def reader(spark: Any, d: Daemon, topic: str = "ev", **options: str) -> Any:
    r = (spark.readStream.format("nsq").option("nsqd_tcp_addresses", d.tcp_address)
         .option("topic", topic).option("channel", "spark"))
    for k, v in options.items():
        r = r.option(k, v)
    return r.load()


def collecting(into: list[Any], fail_after: int | None = None) -> Any:
    """A foreachBatch sink that keeps (batch, body, attempts) rows.

    With ``fail_after=n`` it fails on the first batch with rows after ``n``
    such batches were kept (Spark may run an empty batch 0 first).
    """
    kept = [0]

    def sink(df: Any, batch_id: int) -> None:
        rows = [(batch_id, r.body, r.attempts) for r in df.select("body", "attempts").collect()]
        if rows and kept[0] == fail_after:
            raise RuntimeError("the sink is down")
        kept[0] += bool(rows)
        into.extend(rows)

    return sink


def run_available_now(df: Any, sink: Any, checkpoint: Path) -> None:
    q = (df.writeStream.foreachBatch(sink).option("checkpointLocation", str(checkpoint))
         .trigger(availableNow=True).start())
    assert q.awaitTermination(TIMEOUT), "availableNow query did not finish"
    assert q.exception() is None


def settled(d: Daemon, topic: str = "ev") -> dict[str, Any]:
    """The channel once the query's reader process is gone (no consumer left)."""
    return wait_for(lambda: (s := channel_stats(d, topic, "spark")) and s["client_count"] == 0 and s,
                    what="the reader to disconnect")


def test_available_now_delivers_each_message_once(spark: Any, nsqd: Daemon, tmp_path: Path) -> None:
    """3000 messages through an availableNow query: each arrives once, nothing is left in flight."""
    sent = [b"e%04d" % i for i in range(3000)]
    for i in range(0, 3000, 500):
        publish(nsqd, "ev", sent[i:i + 500])
    rows: list[Any] = []
    run_available_now(reader(spark, nsqd), collecting(rows), tmp_path / "ck")
    assert sorted(body for _b, body, _a in rows) == sent
    assert {a for _b, _body, a in rows} == {1}
    s = settled(nsqd)
    assert (s["depth"], s["in_flight_count"], s["requeue_count"], s["timeout_count"]) == (0, 0, 0, 0)
    assert s["message_count"] == 3000


def test_sink_failure_then_restart_loses_nothing(spark: Any, nsqd: Daemon, tmp_path: Path) -> None:
    """A batch that fails in the sink comes back after a restart from the checkpoint; nothing doubles."""
    sent = [b"f%04d" % i for i in range(1000)]
    publish(nsqd, "ev", sent)
    rows: list[Any] = []
    df = reader(spark, nsqd, max_messages_per_batch="300")
    q = (df.writeStream.foreachBatch(collecting(rows, fail_after=1))
         .option("checkpointLocation", str(tmp_path / "ck")).start())
    with pytest.raises(Exception, match="the sink is down"):
        q.awaitTermination(TIMEOUT)
    assert len(rows) == 300  # the first batch made it, the second failed
    settled(nsqd)
    run_available_now(reader(spark, nsqd, max_messages_per_batch="300"), collecting(rows), tmp_path / "ck")
    assert sorted(body for _b, body, _a in rows) == sent
    s = settled(nsqd)
    assert (s["depth"], s["in_flight_count"]) == (0, 0)


def test_idle_longer_than_msg_timeout_then_restart(spark: Any, nsqd: Daemon, tmp_path: Path) -> None:
    """Batches held past msg_timeout (slow trigger, idle time) are not redelivered, nor after a restart."""
    rows: list[Any] = []
    df = reader(spark, nsqd, msg_timeout_ms="1000")
    q = (df.writeStream.foreachBatch(collecting(rows)).option("checkpointLocation", str(tmp_path / "ck"))
         .trigger(processingTime="3 seconds").start())
    try:
        publish(nsqd, "ev", [b"i%03d" % i for i in range(50)])
        wait_for(lambda: len(rows) >= 50, timeout=TIMEOUT, what="the first 50")
        time.sleep(4)  # idle: four msg timeouts with the last batch committed but not yet FINed
        publish(nsqd, "ev", [b"i%03d" % i for i in range(50, 100)])
        wait_for(lambda: len(rows) >= 100, timeout=TIMEOUT, what="the next 50")
        # Spark writes its commit log after the sink returns; stopping before that
        # would make it replay the batch on restart (its own at-least-once)
        last = max(b for b, _body, _a in rows)
        wait_for(lambda: (tmp_path / "ck" / "commits" / str(last)).exists(), timeout=TIMEOUT,
                 what=f"Spark to commit batch {last}")
        s = channel_stats(nsqd, "ev", "spark")
        assert (s["timeout_count"], s["requeue_count"]) == (0, 0)
    finally:
        q.stop()
    settled(nsqd)
    # the last batch may have been committed by Spark but never FINed: it must not come again
    run_available_now(reader(spark, nsqd, drain_timeout_ms="1000"), collecting(rows), tmp_path / "ck")
    assert sorted(body for _b, body, _a in rows) == [b"i%03d" % i for i in range(100)]
    assert {a for _b, _body, a in rows} == {1}
    s = settled(nsqd)
    assert (s["depth"], s["in_flight_count"], s["timeout_count"]) == (0, 0, 0)


def test_batch_write(spark: Any, nsqd: Daemon) -> None:
    """df.write.format("nsq").mode("append").save() publishes every row; a topic column routes rows.

    (Spark allows Python data sources only the append and overwrite modes, so
    the default mode, errorifexists, is refused by Spark itself.)
    """
    df = spark.createDataFrame([(f"row{i}",) for i in range(500)], "value STRING")
    df.write.format("nsq").mode("append").option("nsqd_tcp_addresses", nsqd.tcp_address).option(
        "topic", "out").save()
    assert topic_stats(nsqd, "out")["message_count"] == 500
    routed = spark.createDataFrame([(b"x", "left"), (b"y", "right"), (b"z", "left")], "value BINARY, topic STRING")
    routed.write.format("nsq").option("nsqd_tcp_addresses", nsqd.tcp_address).mode("append").save()
    assert topic_stats(nsqd, "left")["message_count"] == 2
    assert topic_stats(nsqd, "right")["message_count"] == 1


def test_stream_to_stream(spark: Any, nsqd: Daemon, tmp_path: Path) -> None:
    """A streaming query reads one topic and publishes to another through the nsq sink."""
    publish(nsqd, "ev", [b"s%d" % i for i in range(200)])
    q = (reader(spark, nsqd).selectExpr("upper(cast(body AS STRING)) AS value")
         .writeStream.format("nsq").option("nsqd_tcp_addresses", nsqd.tcp_address).option("topic", "copy")
         .option("checkpointLocation", str(tmp_path / "ck")).trigger(availableNow=True).start())
    assert q.awaitTermination(TIMEOUT)
    assert topic_stats(nsqd, "copy")["message_count"] == 200
    assert settled(nsqd)["depth"] == 0


def test_clear_errors(spark: Any, nsqd: Daemon) -> None:
    """Missing options and a missing value column fail with messages that say what to fix."""
    with pytest.raises(Exception, match="option topic is required"):
        spark.readStream.format("nsq").option("nsqd_tcp_addresses", nsqd.tcp_address).option(
            "channel", "c").load()
    df = spark.createDataFrame([(1,)], "n INT")
    with pytest.raises(Exception, match="needs a 'value' column"):
        df.write.format("nsq").mode("append").option("nsqd_tcp_addresses", nsqd.tcp_address).option(
            "topic", "t").save()
    empty = spark.createDataFrame([("",)], "value STRING")
    with pytest.raises(Exception, match="empty value"):
        empty.write.format("nsq").mode("append").option("nsqd_tcp_addresses", nsqd.tcp_address).option(
            "topic", "t").save()
    with pytest.raises(Exception, match="can only append"):
        empty.write.format("nsq").mode("overwrite").option("nsqd_tcp_addresses", nsqd.tcp_address).option(
            "topic", "t").save()
