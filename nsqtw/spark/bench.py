"""Measure the nsq data source on a Spark: the writer, and long-running streaming reads.

    python -m nsqtw.spark.bench --nsqd-tcp-address=127.0.0.1:4150 --nsqd-http-address=127.0.0.1:4151

* ``writer``: ``df.write.format("nsq")`` publishes ``--messages`` rows;
  counted by nsqd (the topic's ``message_count``), timed from the call to
  its return (job start-up included).
* ``rate``: Spark's own ``rate`` source into the ``noop`` sink for
  ``--rate-seconds``, the ceiling of what Spark itself moves through a
  streaming query on this machine (its rows are two narrow columns);
  counted from the query's progress over the second half of the run.
* ``noop`` and ``parquet``: ``--messages`` are published first, then a
  streaming query with a processingTime trigger reads them into the
  ``noop`` sink or a Parquet file sink. Counted by nsqd: a message is done
  when the channel no longer holds it (FINed after Spark committed its
  batch); the Parquet sink's rows are counted too, once the query stops.
  "sustained" is the rate between 10% and 90% of the messages done, so
  the query's start-up is left out; "overall" includes it.

Nothing of the nsq runs is read from ``query.recentProgress``, which keeps
only the last 100 batches (the ``rate`` run polls it twice a second).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from typing import Any

import numpy as np
import pyarrow as pa

from nsqtw.spark.options import WriterOptions
from nsqtw.spark.producer import Producer

#: what ``--runs`` runs unless told: the connector's own figures (``rate`` is Spark's ceiling, on request)
DEFAULT_RUNS = ("writer", "noop", "parquet")
RUNS = (*DEFAULT_RUNS, "rate")


def stats(http: str, topic: str, channel: str | None = None) -> dict[str, Any]:
    """nsqd's /stats for one topic (and channel): the topic's entry, or the channel's."""
    query = {"format": "json", "topic": topic, **({"channel": channel} if channel else {})}
    with urllib.request.urlopen(f"http://{http}/stats?{urllib.parse.urlencode(query)}", timeout=30) as r:
        data = json.load(r)
    for t in data["topics"]:
        if t["topic_name"] != topic:
            continue
        if channel is None:
            return t  # type: ignore[no-any-return]
        for c in t["channels"]:
            if c["channel_name"] == channel:
                return c  # type: ignore[no-any-return]
    return {}


def delete_topic(http: str, topic: str) -> None:
    """Drop a bench topic, so repeated runs do not pile messages up in nsqd."""
    request = urllib.request.Request(f"http://{http}/topic/delete?topic={urllib.parse.quote(topic)}", method="POST")
    try:
        urllib.request.urlopen(request, timeout=30).close()
    except OSError as e:
        print(f"(could not delete topic {topic}: {e})", flush=True)


def done(channel: dict[str, Any]) -> int:
    """Messages the channel no longer holds: FINed (nothing else removes them here)."""
    if not channel:
        return 0
    held = channel["depth"] + channel["in_flight_count"] + channel["deferred_count"]
    return int(channel["message_count"]) - int(held)


def bodies(n: int, size: int, start: int = 0) -> pa.Array:
    """``n`` distinct bodies of ``size`` bytes (a number padded with x), built without a Python loop."""
    digits = np.char.zfill(np.arange(start, start + n).astype("U20"), min(size, 20))
    text = np.char.add(digits, "x" * max(0, size - 20)) if size > 20 else digits
    return pa.array(text.astype(f"S{size}"), pa.binary(size)).cast(pa.binary())


def publish(tcp: str, topic: str, n: int, size: int) -> None:
    producer = Producer(WriterOptions.parse({"nsqd_tcp_addresses": tcp}))
    try:
        for i in range(0, n, 200000):
            producer.publish_array(topic, bodies(min(200000, n - i), size, i))
        producer.flush()
    finally:
        producer.close()


def crossing(samples: list[tuple[float, int]], target: float) -> float:
    """When the count reached ``target``, interpolated between the polls around it."""
    prev = samples[0]
    for t, n in samples:
        if n >= target:
            if n == prev[1]:
                return t
            return prev[0] + (t - prev[0]) * (target - prev[1]) / (n - prev[1])
        prev = (t, n)
    return samples[-1][0]


def run_writer(spark: Any, a: argparse.Namespace, tag: str) -> None:
    # the session's first Python job starts Spark's Python workers (seconds); a long-running
    # pipeline pays that once, so a small job goes first and is reported apart
    for what, n in (("warm-up", min(10000, a.messages)), ("writer", a.messages)):
        topic = f"bench_{what.replace('-', '')}_{tag}"
        df = spark.range(0, n, numPartitions=a.partitions).selectExpr(
            f"lpad(cast(id AS STRING), {a.size}, 'x') AS value")
        if what == "writer":
            print(f"writer: spark.range(0, {n}, numPartitions={a.partitions}).selectExpr(\"lpad(cast(id AS STRING), "
                  f"{a.size}, 'x') AS value\").write.format(\"nsq\").mode(\"append\").option(\"topic\", "
                  f"\"{topic}\").save()", flush=True)
        t0 = time.monotonic()
        (df.write.format("nsq").mode("append").option("nsqd_tcp_addresses", a.nsqd_tcp_address)
         .option("topic", topic).save())
        elapsed = time.monotonic() - t0
        published = int(stats(a.nsqd_http_address, topic).get("message_count", 0))
        print(f"{what}: {published:,} messages of {a.size} B published (nsqd's message_count of {topic}) "
              f"in {elapsed:.1f}s = {published / elapsed:,.0f} msg/s ({a.partitions} tasks)", flush=True)
        delete_topic(a.nsqd_http_address, topic)


def run_reader(spark: Any, a: argparse.Namespace, tag: str, sink: str) -> None:
    topic, channel = f"bench_{sink}_{tag}", "bench"
    t = time.monotonic()
    publish(a.nsqd_tcp_address, topic, a.messages, a.size)
    print(f"{sink}: published {a.messages:,} messages to {topic} in {time.monotonic() - t:.1f}s", flush=True)
    with tempfile.TemporaryDirectory(prefix="nsq-bench-") as work:
        reader = (spark.readStream.format("nsq").option("nsqd_tcp_addresses", a.nsqd_tcp_address)
                  .option("topic", topic).option("channel", channel))
        if a.max_in_flight:
            reader = reader.option("max_in_flight", str(a.max_in_flight))
        writer = reader.load().writeStream.format(sink).option("checkpointLocation", f"{work}/checkpoint")
        if sink == "parquet":
            writer = writer.option("path", f"{work}/out")
        opts = f'.option("max_in_flight", "{a.max_in_flight}")' if a.max_in_flight else ""
        print(f'{sink}: spark.readStream.format("nsq").option("topic", "{topic}").option("channel", '
              f'"{channel}"){opts}.load().writeStream.format("{sink}")'
              f'.trigger(processingTime="{a.trigger}").start()', flush=True)
        t0 = time.monotonic()
        q = writer.trigger(processingTime=a.trigger).start()
        samples = [(t0, 0)]
        try:
            deadline = t0 + a.timeout
            while samples[-1][1] < a.messages:
                if time.monotonic() > deadline:
                    raise SystemExit(f"{sink}: only {samples[-1][1]:,} of {a.messages:,} done in {a.timeout}s")
                if q.exception() is not None:
                    raise SystemExit(f"{sink}: the query failed: {q.exception()}")
                time.sleep(0.25)
                samples.append((time.monotonic(), done(stats(a.nsqd_http_address, topic, channel))))
            batches = (q.lastProgress or {}).get("batchId", -1) + 1
        finally:
            q.stop()
        end = samples[-1][0]
        t10, t90 = crossing(samples, 0.1 * a.messages), crossing(samples, 0.9 * a.messages)
        c = stats(a.nsqd_http_address, topic, channel)
        print(f"{sink}: {a.messages:,} messages of {a.size} B FINed (nsqd's channel {topic}/{channel}) "
              f"in {end - t0:.1f}s, about {batches} batches; sustained (10%-90%) "
              f"{0.8 * a.messages / (t90 - t10):,.0f} msg/s, overall {a.messages / (end - t0):,.0f} msg/s; "
              f"requeued {c.get('requeue_count')}, timed out {c.get('timeout_count')}", flush=True)
        if sink == "parquet":
            rows = spark.read.parquet(f"{work}/out").count()
            print(f"parquet: the sink holds {rows:,} rows", flush=True)
    delete_topic(a.nsqd_http_address, topic)


def run_rate(spark: Any, a: argparse.Namespace) -> None:
    print(f'rate: spark.readStream.format("rate").option("rowsPerSecond", {a.rate_rows}).load()'
          f'.writeStream.format("noop").trigger(processingTime="{a.trigger}").start(), {a.rate_seconds:.0f}s',
          flush=True)
    q = (spark.readStream.format("rate").option("rowsPerSecond", str(a.rate_rows)).load()
         .writeStream.format("noop").trigger(processingTime=a.trigger).start())
    seen: dict[int, dict[str, Any]] = {}
    t0 = time.monotonic()
    try:
        while time.monotonic() - t0 < a.rate_seconds:
            if q.exception() is not None:
                raise SystemExit(f"rate: the query failed: {q.exception()}")
            time.sleep(0.5)
            for progress in q.recentProgress:
                seen[progress["batchId"]] = progress
    finally:
        q.stop()
    batches = [seen[b] for b in sorted(seen)][len(seen) // 2:]
    rows = sum(p["numInputRows"] for p in batches)
    took = sum(p["durationMs"].get("triggerExecution", 0) for p in batches) / 1000
    print(f"rate: {rows:,} rows in the last {len(batches)} batches, {took:.1f}s of batch time = "
          f"{rows / max(took, 1e-9):,.0f} rows/s", flush=True)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m nsqtw.spark.bench",
                                description=(__doc__ or "").split("\n")[0])
    p.add_argument("--nsqd-tcp-address", default="127.0.0.1:4150")
    p.add_argument("--nsqd-http-address", default="127.0.0.1:4151")
    p.add_argument("--messages", type=int, default=1000000)
    p.add_argument("--size", type=int, default=100, help="message body size in bytes")
    p.add_argument("--runs", default=",".join(DEFAULT_RUNS), help=f"which of {','.join(RUNS)} to run")
    p.add_argument("--rate-rows", type=int, default=2000000, help="the rate run's rowsPerSecond")
    p.add_argument("--rate-seconds", type=float, default=60, help="how long the rate run runs")
    p.add_argument("--trigger", default="0 seconds", help="the readers' processingTime trigger")
    p.add_argument("--max-in-flight", type=int, default=0, help="the reader's max_in_flight (0: its default)")
    p.add_argument("--partitions", type=int, default=2, help="the writer's tasks")
    p.add_argument("--master", default="local[2]")
    p.add_argument("--timeout", type=float, default=600)
    a = p.parse_args(argv)
    runs = [r for r in a.runs.split(",") if r]
    if set(runs) - set(RUNS):
        p.error(f"--runs: unknown {sorted(set(runs) - set(RUNS))}")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    print("$ python -m nsqtw.spark.bench " + " ".join(shlex.quote(x) for x in (argv or sys.argv[1:])), flush=True)

    from pyspark.sql import SparkSession

    from nsqtw.spark import NSQDataSource

    spark = (SparkSession.builder.master(a.master).appName("nsqtw-spark-bench")
             .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
             .config("spark.sql.shuffle.partitions", str(a.partitions)).getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    spark.dataSource.register(NSQDataSource)
    tag = str(int(time.time()))
    try:
        for run in runs:
            if run == "writer":
                run_writer(spark, a, tag)
            elif run == "rate":
                run_rate(spark, a)
            else:
                run_reader(spark, a, tag, run)
    finally:
        spark.stop()


if __name__ == "__main__":
    main()
