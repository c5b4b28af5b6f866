"""Publishing from Spark executors: MPUB in chunks that nsqd accepts."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator

from nsqtw.spark.client import NSQClientError, NSQConnection
from nsqtw.spark.discovery import LookupdUnavailable, all_nodes, lookup_topic
from nsqtw.spark.options import WriterOptions, lookupd_url

log = logging.getLogger("nsqtw.spark")


class NSQWriteError(ValueError):
    """A row cannot become an NSQ message (no body, too big, bad topic)."""


def chunks(bodies: Iterable[bytes], max_msg_size: int, max_body_size: int) -> Iterator[list[bytes]]:
    """Group bodies into MPUBs whose body (count + sizes + messages) fits ``max_body_size``.

    Raises :class:`NSQWriteError` for an empty body or one over ``max_msg_size``,
    which nsqd would refuse (and close the connection over).
    """
    chunk: list[bytes] = []
    size = 4
    for i, body in enumerate(bodies):
        n = len(body)
        if n == 0:
            raise NSQWriteError(f"row {i}: empty value (NSQ messages need a body of at least one byte)")
        if n > max_msg_size:
            raise NSQWriteError(f"row {i}: value of {n} bytes is over max_msg_size ({max_msg_size})")
        if chunk and size + 4 + n > max_body_size:
            yield chunk
            chunk, size = [], 4
        chunk.append(body)
        size += 4 + n
    if chunk:
        yield chunk


class Producer:
    """One connection to one nsqd, picked by partition so executors spread their load."""

    def __init__(self, options: WriterOptions, partition_id: int = 0) -> None:
        self.options = options
        self.partition_id = partition_id
        self.conn: NSQConnection | None = None
        self.count = 0
        self.bytes = 0

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
        """Publish every body to ``topic``; returns how many. Blocks until nsqd said OK to each MPUB."""
        o = self.options
        n = 0
        for chunk in chunks(bodies, o.max_msg_size, o.max_body_size):
            self._connection(topic).publish(topic, chunk)
            n += len(chunk)
            self.bytes += sum(len(b) for b in chunk)
        self.count += n
        return n

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()
            self.conn = None
