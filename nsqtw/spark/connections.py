"""The streaming source's connections to its nsqds: found, kept, and as many to each as RDY needs.

The nsqds are fixed (``nsqd_tcp_addresses``) or found through lookupd
(asked again for ``connect_timeout_ms`` at the start, then every
``lookupd_poll_interval``). Each nsqd gets ``connections_per_nsqd``
connections, or, left to the consumer, as many as ``max_in_flight`` needs
at the ``--max-rdy-count`` its first connection's IDENTIFY answer gives
(at most :data:`MAX_AUTO_CONNECTIONS`). The discovery thread makes the
missing ones again: a lost nsqd after a second. What the connections carry
is :class:`nsqtw.spark.consumer.Consumer`'s.
"""

from __future__ import annotations

import logging
import math
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable

from nsqtw.spark.client import NSQClientError, NSQConnection
from nsqtw.spark.discovery import LookupdUnavailable, lookup_topic
from nsqtw.spark.options import ReaderOptions, lookupd_url

__all__ = ["DEFAULT_MAX_RDY", "MAX_AUTO_CONNECTIONS", "Connections", "max_rdy"]

log = logging.getLogger("nsqtw.spark")

#: connections per nsqd when ``connections_per_nsqd`` is left to the consumer
MAX_AUTO_CONNECTIONS = 64
#: nsqd's default --max-rdy-count, for an nsqd that does not say
DEFAULT_MAX_RDY = 2500


class Connections(ABC):
    """The connections of one consumer, per nsqd address, and the discovery that keeps them.

    ``_cond`` is the one lock of the consumer (its threads and Spark's calls
    take it); ``_stopped`` ends its threads. Commands go out through
    :meth:`_send_all`, outside the lock. A subclass says what RDY each
    connection gets (:meth:`_rdy_updates`, asked under the lock whenever a
    connection is added) and what a lost connection means for what it held
    (:meth:`_lost`, which must also close it and take it out of ``_conns``).
    """

    def __init__(self, options: ReaderOptions, discover: Callable[[], set[str]] | None,
                 clock: Callable[[], float]) -> None:
        self.options = options
        self.clock = clock
        self._discover = discover or self._default_discover
        self._cond = threading.Condition()
        self._conns: dict[str, list[NSQConnection]] = {}
        self._per_nsqd: dict[str, int] = {}   # connections wanted per nsqd address
        self._stopped = threading.Event()
        self._wake_discovery = threading.Event()

    @abstractmethod
    def _rdy_updates(self) -> list[tuple[NSQConnection, bytes]]:
        """The RDY commands the connections need now (called holding ``_cond``)."""

    @abstractmethod
    def _lost(self, conn: NSQConnection) -> None:
        """``conn`` failed: close it and forget it (called without ``_cond``)."""

    def addresses(self) -> list[str]:
        """The nsqds this consumer is connected to."""
        with self._cond:
            return sorted(a for a, cs in self._conns.items() if cs)

    def connection_count(self) -> int:
        with self._cond:
            return sum(len(cs) for cs in self._conns.values())

    def _send_all(self, sends: Iterable[tuple[NSQConnection, bytes]]) -> None:
        """Send grouped per connection, outside the lock (nsqd may be waiting on our reads)."""
        grouped: dict[NSQConnection, list[bytes]] = {}
        for conn, data in sends:
            grouped.setdefault(conn, []).append(data)
        for conn, parts in grouped.items():
            try:
                conn.send(b"".join(parts))
            except NSQClientError as e:
                log.warning("NSQ %s: %s", conn.address, e)
                self._lost(conn)

    # -- discovery -------------------------------------------------------

    def _default_discover(self) -> set[str]:
        ep = self.options.endpoints
        if ep.nsqd_tcp_addresses:
            return set(ep.nsqd_tcp_addresses)
        urls = [lookupd_url(a) for a in ep.lookupd_http_addresses]
        return lookup_topic(urls, self.options.topic, timeout=ep.connect.connect_timeout)

    def _discover_at_start(self) -> set[str]:
        """The first discovery: lookupd is asked again for ``connect_timeout_ms`` before it is an error.

        A query (re)started while nsqlookupd restarts would otherwise fail
        at once; an address that never answers is still a clear error.
        """
        deadline = self.clock() + self.options.endpoints.connect.connect_timeout
        while True:
            try:
                return self._discover()
            except LookupdUnavailable as e:
                if self.clock() >= deadline or self._stopped.is_set():
                    raise
                log.warning("NSQ discovery: %s; asking again", e)
                self._stopped.wait(0.5)

    def _wanted_connections(self, address: str, first: NSQConnection | None) -> int:
        """How many connections to keep to one nsqd (decided once, from its first IDENTIFY answer)."""
        n = self._per_nsqd.get(address)
        if n is None:
            n = self.options.connections_per_nsqd
            if not n:
                most = max_rdy(first) if first is not None else DEFAULT_MAX_RDY
                n = min(MAX_AUTO_CONNECTIONS, max(1, math.ceil(self.options.max_in_flight / most)))
            self._per_nsqd[address] = n
        return n

    def _connect_missing(self, initial: bool = False) -> None:
        try:
            wanted = self._discover_at_start() if initial else self._discover()
        except LookupdUnavailable as e:
            if initial:
                raise NSQClientError(str(e)) from e
            log.warning("NSQ discovery: %s", e)
            return
        errors = []
        with self._cond:
            for gone in [a for a in self._per_nsqd if a not in wanted and not self._conns.get(a)]:
                del self._per_nsqd[gone]  # lookupd dropped it: no more reconnecting every second
        for address in sorted(wanted):
            while not self._stopped.is_set():
                with self._cond:
                    have = [c for c in self._conns.get(address, []) if not c.closed]
                    want = self._per_nsqd.get(address)
                if want is not None and len(have) >= want:
                    break
                conn = NSQConnection(address, self.options.endpoints.connect)
                try:
                    conn.connect()
                    conn.subscribe(self.options.topic, self.options.channel)
                except NSQClientError as e:
                    conn.close()
                    errors.append(str(e))
                    log.warning("NSQ %s: %s", address, e)
                    break
                with self._cond:
                    want = self._wanted_connections(address, conn)
                    conns = self._conns.setdefault(address, [])
                    conns.append(conn)
                    sends = self._rdy_updates()
                    if len(conns) == 1 or len(conns) == want:
                        log.info("NSQ %s: subscribed to %s/%s (%d of %d connections)", address,
                                 self.options.topic, self.options.channel, len(conns), want)
                self._send_all(sends)
        if initial and errors and not self.connection_count():
            raise NSQClientError("cannot subscribe to any nsqd: " + "; ".join(errors))

    def _discovery_loop(self) -> None:
        ep = self.options.endpoints
        interval = ep.lookupd_poll_interval
        while not self._stopped.is_set():
            with self._cond:
                complete = all(len(self._conns.get(a, [])) >= n for a, n in self._per_nsqd.items())
                have_all = bool(self._conns) and complete and (
                    not ep.nsqd_tcp_addresses or set(self._conns) >= set(ep.nsqd_tcp_addresses))
            # reconnect lost nsqds after a second; ask lookupd every poll interval
            self._wake_discovery.wait(interval if have_all else 1.0)
            self._wake_discovery.clear()
            if self._stopped.is_set():
                return
            try:
                self._connect_missing()
            except Exception:  # keep discovering whatever happens
                log.exception("NSQ discovery failed")


def max_rdy(conn: NSQConnection) -> int:
    """The most RDY ``conn``'s nsqd takes (its ``--max-rdy-count``, as its IDENTIFY answer says)."""
    return int(conn.settings.get("max_rdy_count") or DEFAULT_MAX_RDY)
