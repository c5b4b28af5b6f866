"""Publishing from Spark executors: MPUB in chunks that nsqd accepts."""

from __future__ import annotations

import logging
import struct
from collections.abc import Iterable

import pyarrow as pa

from nsqtw.spark.blocks import mpub_body, mpub_chunks
from nsqtw.spark.client import NSQClientError, NSQConnection
from nsqtw.spark.discovery import LookupdUnavailable, all_nodes, lookup_topic
from nsqtw.spark.options import WriterOptions, lookupd_url

log = logging.getLogger("nsqtw.spark")

#: MPUBs sent before waiting for the first OK (nsqd answers them in order)
PIPELINE = 2
#: how long to wait for nsqd's OK to one MPUB
PUBLISH_TIMEOUT = 30.0


class NSQWriteError(ValueError):
    """A row cannot become an NSQ message (no body, too big, bad topic)."""


class Producer:
    """One connection to one nsqd, picked by partition so executors spread their load."""

    def __init__(self, options: WriterOptions, partition_id: int = 0) -> None:
        self.options = options
        self.partition_id = partition_id
        self.conn: NSQConnection | None = None
        #: messages and body bytes nsqd has confirmed
        self.count = 0
        self.bytes = 0
        self._waiting = 0  # MPUBs sent, not yet answered
        self._unconfirmed: list[tuple[int, int]] = []

    def _candidates(self, topic: str) -> list[str]:
        ep = self.options.endpoints
        if ep.nsqd_tcp_addresses:
            return list(ep.nsqd_tcp_addresses)
        urls = [lookupd_url(a) for a in ep.lookupd_http_addresses]
        try:
            found = lookup_topic(urls, topic, ep.connect.connect_timeout) or all_nodes(
                urls, ep.connect.connect_timeout)
        except LookupdUnavailable as e:
            raise NSQClientError(str(e)) from e
        if not found:
            raise NSQClientError("no nsqd is registered with the lookupds " + ", ".join(urls))
        return sorted(found)

    def _connection(self, topic: str) -> NSQConnection:
        if self.conn is not None and not self.conn.closed:
            return self.conn
        candidates = self._candidates(topic)
        first = self.partition_id % len(candidates)
        errors = []
        for address in candidates[first:] + candidates[:first]:
            conn = NSQConnection(address, self.options.endpoints.connect)
            try:
                self.conn = conn.connect()
                return self.conn
            except NSQClientError as e:
                errors.append(str(e))
        raise NSQClientError("cannot connect to any nsqd: " + "; ".join(errors))

    def publish(self, topic: str, bodies: Iterable[bytes]) -> int:
        """Publish every body to ``topic`` and wait for nsqd's OKs; returns how many."""
        n = self.publish_array(topic, pa.array(list(bodies), pa.binary()))
        self.flush()
        return n

    def publish_array(self, topic: str, values: pa.Array) -> int:
        """Publish every value of a binary (or string) Arrow array to ``topic``; returns how many.

        The values go out in MPUBs under ``max_body_size``, built without a
        per-row loop; up to :data:`PIPELINE` MPUBs are on the wire at once,
        across calls: :meth:`flush` waits for nsqd's OK to all. Raises
        :class:`NSQWriteError` for a null, empty or too large value before
        anything of ``values`` is sent.
        """
        if pa.types.is_string(values.type):
            values = values.cast(pa.binary())
        elif pa.types.is_large_string(values.type):
            values = values.cast(pa.large_binary())
        if values.null_count:
            raise NSQWriteError("column 'value' is null in some row: every message needs a body")
        o = self.options
        try:
            runs = mpub_chunks(values, o.max_msg_size, o.max_body_size)
        except ValueError as e:
            raise NSQWriteError(str(e)) from None
        if not runs:
            return 0
        conn = self._connection(topic)
        head = b"MPUB " + topic.encode() + b"\n"
        for start, stop in runs:
            while self._waiting >= PIPELINE:
                self._confirm(conn)
            body = mpub_body(values.slice(start, stop - start))
            conn.send(head + struct.pack(">I", len(body)) + body)
            self._waiting += 1
            self._unconfirmed.append((stop - start, len(body) - 4 - 4 * (stop - start)))
        return len(values)

    def _confirm(self, conn: NSQConnection) -> None:
        conn.expect_response(PUBLISH_TIMEOUT)
        self._waiting -= 1
        n, size = self._unconfirmed.pop(0)
        self.count += n
        self.bytes += size

    def flush(self) -> None:
        """Wait for nsqd's OK to every MPUB sent (raises NSQClientError on an error answer)."""
        while self._waiting:
            assert self.conn is not None
            self._confirm(self.conn)

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()
            self.conn = None
