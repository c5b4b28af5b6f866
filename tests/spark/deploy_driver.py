"""The driver tests/spark/test_spark_deploy.py runs against a standalone cluster or a Spark Connect server.

Usage: python deploy_driver.py URL NSQD_TCP_ADDRESS WORKDIR BATCH_ROWS

URL is a standalone master's (``spark://``: this process is the driver, the
executors run on the workers) or a Spark Connect server's (``sc://``: this
process is a client, the server runs the queries and its Python workers the
data source).

1. A batch write: BATCH_ROWS rows, in four partitions run by the executors, published to topic ``ev``.
2. Two streaming queries on topic ``ev``: channel ``archive`` into a JSON file sink with a checkpoint,
   and channel ``copy`` published to topic ``ev_copy`` through the nsq sink.
3. Once WORKDIR/stop exists: both queries stop, and the file sink's committed rows (Spark reads only
   the files its log lists) are written to WORKDIR/result, one body a line.

It prints ``running`` once both queries run and ``done`` at the end. On the cluster the executors
import nsqtw from PYTHONPATH (``spark.executorEnv``), as hosts without nsqtw installed need; a
Connect server's Python workers import it from the server's own environment.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from pyspark.sql import SparkSession

from nsqtw.spark import NSQDataSource


def main() -> None:
    url, nsqd, workdir, batch_rows = sys.argv[1], sys.argv[2], Path(sys.argv[3]), int(sys.argv[4])
    if url.startswith("sc://"):
        spark = SparkSession.builder.remote(url).getOrCreate()
    else:
        spark = (SparkSession.builder.master(url).appName("nsqtw-deploy-test")
                 .config("spark.driver.host", "127.0.0.1").config("spark.driver.bindAddress", "127.0.0.1")
                 .config("spark.ui.enabled", "false")
                 .config("spark.pyspark.python", sys.executable)
                 .config("spark.executorEnv.PYTHONPATH", os.environ.get("PYTHONPATH", ""))
                 .config("spark.executor.memory", "512m").config("spark.executor.cores", "1")
                 .config("spark.sql.shuffle.partitions", "2")
                 .getOrCreate())
        spark.sparkContext.setLogLevel("ERROR")
    spark.dataSource.register(NSQDataSource)

    (spark.range(batch_rows, numPartitions=4).selectExpr("format_string('b%05d', id) AS value")
     .write.format("nsq").mode("append").option("nsqd_tcp_addresses", nsqd).option("topic", "ev").save())

    def source(channel: str):  # type: ignore[no-untyped-def]
        return (spark.readStream.format("nsq").option("nsqd_tcp_addresses", nsqd).option("topic", "ev")
                .option("channel", channel).option("num_partitions", "2").load())

    archive = (source("archive").selectExpr("CAST(body AS STRING) AS body").writeStream.format("json")
               .option("path", str(workdir / "sink")).option("checkpointLocation", str(workdir / "ck-archive"))
               .trigger(processingTime="1 second").start())
    copy = (source("copy").selectExpr("body AS value").writeStream.format("nsq")
            .option("nsqd_tcp_addresses", nsqd).option("topic", "ev_copy")
            .option("checkpointLocation", str(workdir / "ck-copy"))
            .trigger(processingTime="1 second").start())
    print("running", flush=True)
    while not (workdir / "stop").exists():
        for q in (archive, copy):
            if q.exception() is not None:
                raise SystemExit(f"query failed: {q.exception()}")
        time.sleep(0.2)
    archive.stop()
    copy.stop()
    bodies = [r.body for r in spark.read.json(str(workdir / "sink")).select("body").collect()]
    (workdir / "result").write_text("".join(b + "\n" for b in bodies))
    print("done", flush=True)
    spark.stop()


if __name__ == "__main__":
    main()
