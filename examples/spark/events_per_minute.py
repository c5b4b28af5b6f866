"""Count the events of each minute on topic "events" and publish the counts to "events_per_minute"."""

import os

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from nsqtw.spark import NSQDataSource

NSQD = os.environ.get("NSQD_TCP_ADDRESS", "127.0.0.1:4150")
CHECKPOINT = os.environ.get("CHECKPOINT", "events-per-minute-checkpoint")

spark = (SparkSession.builder.appName("events-per-minute").master("local[2]")
         .config("spark.sql.shuffle.partitions", "2")
         .config("spark.ui.showConsoleProgress", "false")
         .getOrCreate())
spark.sparkContext.setLogLevel("WARN")
spark.dataSource.register(NSQDataSource)

events = (spark.readStream.format("nsq")
          .option("nsqd_tcp_addresses", NSQD)
          .option("topic", "events")
          .option("channel", "per_minute")
          .load())

# the timestamp column is the time nsqd received the message
counts = (events
          .groupBy(F.window("timestamp", "1 minute").start.alias("minute"))
          .agg(F.count("*").alias("events"))
          .select(F.to_json(F.struct("minute", "events")).alias("value")))

query = (counts.writeStream.format("nsq")
         .option("nsqd_tcp_addresses", NSQD)
         .option("topic", "events_per_minute")
         .option("checkpointLocation", CHECKPOINT)
         .outputMode("complete")           # every trigger publishes the count of every minute
         .trigger(availableNow=True)       # or .trigger(processingTime="1 minute") to keep running
         .start())
query.awaitTermination()
print("published", query.lastProgress["sink"]["numOutputRows"], "counts to events_per_minute")
