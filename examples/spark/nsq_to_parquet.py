"""Archive an NSQ topic to Parquet files: a streaming pipeline to run with spark-submit.

    spark-submit --master 'local[2]' examples/spark/nsq_to_parquet.py \\
        --nsqd-tcp-address 127.0.0.1:4150 --topic events --channel archive \\
        --output /tmp/events-parquet --checkpoint /tmp/events-checkpoint

Every message of the topic's channel becomes one row (``id``, ``body``,
``timestamp``, ``attempts``, ``nsqd_address``) in Spark's Parquet file sink,
whose log and the checkpoint let a restarted run carry on where the last
one stopped. It runs until stopped: SIGTERM (or SIGINT) to this Python
driver process waits for the running micro-batch to finish and stops the
query cleanly; the driver prints its process id when it starts.

See docs/spark.md, "Running a pipeline with spark-submit".
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from types import FrameType

from pyspark.sql import SparkSession

from nsqtw.spark import NSQDataSource


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="Archive an NSQ topic to Parquet files.")
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument("--nsqd-tcp-address", help="HOST:PORT[,HOST:PORT...] of the nsqds")
    where.add_argument("--lookupd-http-address", help="HOST:PORT[,HOST:PORT...] of the nsqlookupds")
    p.add_argument("--topic", required=True)
    p.add_argument("--channel", default="parquet_archive")
    p.add_argument("--output", required=True, help="directory of the Parquet files")
    p.add_argument("--checkpoint", required=True, help="the query's checkpoint directory")
    p.add_argument("--trigger", default="10 seconds", help="processingTime trigger interval")
    p.add_argument("--option", action="append", default=[], metavar="KEY=VALUE",
                   help="another option of the nsq source (max_in_flight=50000, ...)")
    return p.parse_args(argv)


def main(argv: list[str]) -> int:
    a = parse_args(argv)
    spark = SparkSession.builder.appName(f"nsq-to-parquet-{a.topic}").getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    spark.dataSource.register(NSQDataSource)

    reader = spark.readStream.format("nsq").option("topic", a.topic).option("channel", a.channel)
    if a.nsqd_tcp_address:
        reader = reader.option("nsqd_tcp_addresses", a.nsqd_tcp_address)
    else:
        reader = reader.option("lookupd_http_addresses", a.lookupd_http_address)
    for item in a.option:
        key, _, value = item.partition("=")
        reader = reader.option(key, value)

    query = (reader.load()
             .select("id", "body", "timestamp", "attempts", "nsqd_address")
             .writeStream.format("parquet")
             .option("path", a.output)
             .option("checkpointLocation", a.checkpoint)
             .trigger(processingTime=a.trigger)
             .start())

    stopping: list[int] = []

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stopping.append(signum)

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    print(f"nsq_to_parquet: driver pid {os.getpid()}; reading {a.topic}/{a.channel} into {a.output} "
          f"every {a.trigger}; stop cleanly with: kill -TERM {os.getpid()}", flush=True)

    while query.isActive and not stopping:
        query.awaitTermination(1)
    if stopping:
        # let the running micro-batch finish (written and committed), then stop between
        # triggers: nothing is left half done, so a restart neither loses nor repeats
        while query.isActive and query.status["isTriggerActive"]:
            time.sleep(0.05)
        query.stop()
    error = query.exception()
    last = query.lastProgress or {}
    print(f"nsq_to_parquet: {'failed: ' + str(error) if error else 'stopped'}; "
          f"last batch {last.get('batchId', '-')}", flush=True)
    spark.stop()
    return 1 if error else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
