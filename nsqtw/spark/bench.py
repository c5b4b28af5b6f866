"""Measure the nsq data source on a local Spark: sink (batch write) and source (availableNow read).

    python -m nsqtw.spark.bench --nsqd-tcp-address=127.0.0.1:4150 --messages=100000 --size=100

Each figure is wall time for one Spark job/query, start-up included, so it
is a floor for what a long-running query sustains.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

from nsqtw.spark.options import WriterOptions
from nsqtw.spark.producer import Producer


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m nsqtw.spark.bench", description=__doc__.split("\n")[0])
    p.add_argument("--nsqd-tcp-address", default="127.0.0.1:4150")
    p.add_argument("--messages", type=int, default=100000)
    p.add_argument("--size", type=int, default=100, help="message body size in bytes")
    p.add_argument("--max-in-flight", type=int, default=2500)
    p.add_argument("--master", default="local[2]")
    a = p.parse_args(argv)
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

    from pyspark.sql import SparkSession

    from nsqtw.spark import NSQDataSource

    spark = (SparkSession.builder.master(a.master).appName("nsqtw-spark-bench")
             .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
             .config("spark.sql.shuffle.partitions", "2").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    spark.dataSource.register(NSQDataSource)
    run = str(int(time.time()))

    # sink: a DataFrame of N rows published with MPUB by the executors
    df = spark.range(a.messages).selectExpr(f"repeat('x', {a.size}) AS value")
    t = time.monotonic()
    (df.write.format("nsq").mode("append").option("nsqd_tcp_addresses", a.nsqd_tcp_address)
     .option("topic", f"bench_sink_{run}").save())
    sink = time.monotonic() - t
    print(f"sink:   {a.messages} messages of {a.size} B in {sink:.1f}s = {a.messages / sink:,.0f} msg/s")

    # source: N messages already in nsqd, read by one availableNow query into a no-op sink
    topic = f"bench_source_{run}"
    producer = Producer(WriterOptions.parse({"nsqd_tcp_addresses": a.nsqd_tcp_address}))
    body = b"x" * a.size
    for i in range(0, a.messages, 1000):
        producer.publish(topic, [body] * min(1000, a.messages - i))
    producer.close()
    with tempfile.TemporaryDirectory() as checkpoint:
        t = time.monotonic()
        q = (spark.readStream.format("nsq").option("nsqd_tcp_addresses", a.nsqd_tcp_address)
             .option("topic", topic).option("channel", "bench").option("max_in_flight", str(a.max_in_flight))
             .load().writeStream.format("noop").option("checkpointLocation", checkpoint)
             .trigger(availableNow=True).start())
        q.awaitTermination()
        source = time.monotonic() - t
        rows = sum(p["numInputRows"] for p in q.recentProgress)
        batches = sum(1 for p in q.recentProgress if p["numInputRows"])
    print(f"source: {rows} messages of {a.size} B in {source:.1f}s ({batches} batches) "
          f"= {rows / source:,.0f} msg/s")
    spark.stop()


if __name__ == "__main__":
    main()
