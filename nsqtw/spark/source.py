"""The ``nsq`` PySpark data source: a streaming reader and batch/streaming writers."""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.datasource import (
    DataSource,
    DataSourceArrowWriter,
    DataSourceReader,
    DataSourceStreamArrowWriter,
    DataSourceStreamReader,
    InputPartition,
    WriterCommitMessage,
)
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import BinaryType, StringType, StructType

from nsqtw.names import is_valid_topic_name
from nsqtw.spark.blocks import from_ipc, to_ipc, to_record_batch
from nsqtw.spark.consumer import Consumer
from nsqtw.spark.offsets import Offset
from nsqtw.spark.options import NSQOptionError, ReaderOptions, WriterOptions
from nsqtw.spark.producer import NSQWriteError, Producer

log = logging.getLogger("nsqtw.spark")

SCHEMA = ("id STRING, body BINARY, timestamp TIMESTAMP, attempts INT, "
          "topic STRING, channel STRING, nsqd_address STRING")

#: a batch is split into at most ``num_partitions`` partitions of at least this many rows
MIN_PARTITION_ROWS = 1000


class NSQDataSource(DataSource):
    """``spark.readStream.format("nsq")`` and ``df.write.format("nsq")``."""

    @classmethod
    def name(cls) -> str:
        return "nsq"

    def schema(self) -> str:
        # Spark asks for the schema in load(), for reads only: check the reader's
        # options here so mistakes fail at load() instead of inside the query
        ReaderOptions.parse(self.options)
        return SCHEMA

    def reader(self, schema: StructType) -> DataSourceReader:
        raise NSQOptionError("nsq is a streaming source: read it with spark.readStream.format('nsq')")

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return NSQStreamReader(ReaderOptions.parse(self.options))

    def writer(self, schema: StructType, overwrite: bool) -> NSQWriter:
        if overwrite:
            raise NSQOptionError("the nsq sink can only append (publish); mode 'overwrite' is not supported")
        return NSQWriter(_writer_options(self.options, schema), _columns(schema))

    def streamWriter(self, schema: StructType, overwrite: bool) -> NSQStreamWriter:
        # overwrite is the complete output mode: each trigger publishes the whole result
        return NSQStreamWriter(_writer_options(self.options, schema), _columns(schema))


# -- reading ---------------------------------------------------------------


class NSQPartition(InputPartition):
    """Some rows of one batch, as an Arrow IPC stream, carried to the executor that emits them."""

    def __init__(self, index: int, rows: int, data: bytes) -> None:
        super().__init__(index)
        self.index = index
        self.rows = rows
        self.data = data


class NSQStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Spark's side of :class:`Consumer`.

    Spark builds this object in several processes (planner, executors); only
    the stream's long-lived driver-side process calls the offset methods, so
    the consumer connects on the first of those calls, never in ``__init__``.
    """

    def __init__(self, options: ReaderOptions) -> None:
        self.options = options
        self._consumer: Consumer | None = None
        self._available_now = False

    def __getstate__(self) -> dict[str, Any]:
        return {"options": self.options, "_consumer": None, "_available_now": False}

    @property
    def consumer(self) -> Consumer:
        if self._consumer is None:
            consumer = Consumer(self.options)
            if self._available_now:
                consumer.available_now()
            consumer.start()
            self._consumer = consumer
        return self._consumer

    def initialOffset(self) -> dict[str, Any]:
        return Offset(0).to_json()

    def prepareForTriggerAvailableNow(self) -> None:
        self._available_now = True
        if self._consumer is not None:
            self._consumer.available_now()

    def getDefaultReadLimit(self) -> ReadLimit:
        n = self.options.max_messages_per_batch
        return ReadMaxRows(n) if n else ReadAllAvailable()

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        max_rows = limit.max_rows if isinstance(limit, ReadMaxRows) else None
        begin = Offset.from_json(start)
        end = self.consumer.plan(begin, max_rows)
        return start if end == begin else end.to_json()

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        blocks = self.consumer.messages(Offset.from_json(start), Offset.from_json(end))
        batch = to_record_batch(blocks, self.options.topic, self.options.channel)
        n = batch.num_rows
        if not n:
            return []
        # as many partitions as the executors have cores, unless that makes them tiny
        parts = max(1, min(self.options.num_partitions, n // MIN_PARTITION_ROWS))
        out: list[InputPartition] = []
        for i in range(parts):
            lo, hi = n * i // parts, n * (i + 1) // parts
            out.append(NSQPartition(i, hi - lo, to_ipc(batch.slice(lo, hi - lo))))
        return out

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, NSQPartition)
        yield from from_ipc(partition.data)

    def commit(self, end: dict[str, Any]) -> None:
        self.consumer.acknowledge(Offset.from_json(end))

    def stop(self) -> None:
        if self._consumer is not None:
            self._consumer.close()
            self._consumer = None


# -- writing ---------------------------------------------------------------


@dataclass
class NSQCommitMessage(WriterCommitMessage):
    """What one task published."""

    messages: int
    bytes: int
    nsqd_address: str


@dataclass(frozen=True)
class Columns:
    """Where the message body and the optional per-row topic are in the input."""

    value: str
    value_is_binary: bool
    topic: str | None


def _columns(schema: StructType) -> Columns:
    fields = {f.name.lower(): f for f in schema.fields}
    value = fields.get("value")
    if value is None:
        raise NSQOptionError(
            "the nsq sink needs a 'value' column (BINARY or STRING) holding the message bodies; "
            f"the columns are {schema.fieldNames()}")
    if not isinstance(value.dataType, (BinaryType, StringType)):
        raise NSQOptionError(f"column 'value' must be BINARY or STRING, not {value.dataType.simpleString()}")
    topic = fields.get("topic")
    if topic is not None and not isinstance(topic.dataType, StringType):
        raise NSQOptionError(f"column 'topic' must be STRING, not {topic.dataType.simpleString()}")
    return Columns(value.name, isinstance(value.dataType, BinaryType), topic.name if topic else None)


def _writer_options(options: Any, schema: StructType) -> WriterOptions:
    parsed = WriterOptions.parse(options)
    if not parsed.topic and "topic" not in {f.name.lower() for f in schema.fields}:
        raise NSQOptionError("set the option topic or give the DataFrame a 'topic' column")
    return parsed


def _publish_batches(options: WriterOptions, columns: Columns,
                     batches: Iterator[pa.RecordBatch]) -> NSQCommitMessage:
    from pyspark import TaskContext

    ctx = TaskContext.get()
    producer = Producer(options, ctx.partitionId() if ctx is not None else 0)
    try:
        for batch in batches:
            values = batch.column(columns.value)
            if values.null_count:
                raise NSQWriteError("column 'value' is null in some row: every message needs a body")
            if columns.topic is None:
                producer.publish_array(options.topic, values)
                continue
            topics = batch.column(columns.topic)
            if options.topic:
                topics = pc.if_else(pc.equal(pc.fill_null(topics, ""), ""), options.topic, topics)
            for topic in pc.unique(topics).to_pylist():
                if not topic:
                    raise NSQWriteError("row without a topic: fill the 'topic' column or set the topic option")
                if not is_valid_topic_name(topic):
                    raise NSQWriteError(f"invalid topic name {topic!r} in column 'topic'")
                producer.publish_array(topic, values.filter(pc.equal(topics, topic)))
        producer.flush()
        address = producer.conn.address if producer.conn is not None else ""
        return NSQCommitMessage(producer.count, producer.bytes, address)
    finally:
        producer.close()


def _report(what: str, messages: Sequence[WriterCommitMessage | None], batch_id: int | None = None) -> None:
    done = [m for m in messages if isinstance(m, NSQCommitMessage)]
    total = sum(m.messages for m in done)
    size = sum(m.bytes for m in done)
    where = "" if batch_id is None else f" (batch {batch_id})"
    if what == "commit":
        log.info("nsq sink%s: published %d messages, %d bytes, from %d tasks", where, total, size, len(done))
    else:
        # NSQ cannot take messages back: what finished tasks published stays published
        log.warning("nsq sink%s: aborted; %d tasks had already published %d messages (%d bytes)",
                    where, len(done), total, size)


class NSQWriter(DataSourceArrowWriter):
    """Batch writes: every task publishes its rows with MPUB."""

    def __init__(self, options: WriterOptions, columns: Columns) -> None:
        self.options = options
        self.columns = columns

    def write(self, iterator: Iterator[pa.RecordBatch]) -> NSQCommitMessage:
        return _publish_batches(self.options, self.columns, iterator)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        _report("commit", messages)

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        _report("abort", messages)


class NSQStreamWriter(DataSourceStreamArrowWriter):
    """Streaming writes: each micro-batch's tasks publish with MPUB (at least once)."""

    def __init__(self, options: WriterOptions, columns: Columns) -> None:
        self.options = options
        self.columns = columns

    def write(self, iterator: Iterator[pa.RecordBatch]) -> NSQCommitMessage:
        return _publish_batches(self.options, self.columns, iterator)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        _report("commit", messages, batchId)

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        _report("abort", messages, batchId)
