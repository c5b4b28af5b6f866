"""The producer: PUB, MPUB and DPUB over a pool of connections, a Deferred per publish.

Each nsqd address gets one connection, kept up by a :class:`~nsqtw.client.conn.Dialer`
(reconnecting after 1 s, 2 s, 4 s ... at most ``lookupd_poll_interval``).
Publishes go round-robin to the connections that are ready; nsqd answers a
connection's commands in order, so each connection keeps the Deferreds of
its publishes in a FIFO and fires the oldest on ``OK`` or fails it with
:class:`NSQErrorResponse` on ``E_*``. A connection that closes fails the
publishes it had not heard back about with :class:`ConnectionClosed` (nsqd
may or may not have taken them). While no connection is ready, publishes
wait up to ``connect_wait`` seconds, then fail with :class:`NoConnection`.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from functools import partial
from typing import Any

from twisted.internet.defer import Deferred, DeferredList, fail, gatherResults, succeed
from twisted.internet.interfaces import IDelayedCall
from twisted.python.failure import Failure
from zope.interface import implementer

from nsqtw.client.config import Config
from nsqtw.client.conn import Dialer, NSQClientProtocol
from nsqtw.client.errors import ConnectionClosed, NoConnection, NSQClientError, NSQErrorResponse
from nsqtw.interfaces import IConnectionDelegate
from nsqtw.log import Logger
from nsqtw.protocol.wire import encode_dpub, encode_mpub, encode_pub

__all__ = ["Producer"]


@implementer(IConnectionDelegate)
class Producer:
    """Publish to the nsqd nodes at ``addresses`` (one or more ``host:port``)."""

    def __init__(self, addresses: Sequence[str] | str, config: Config | None = None, *,
                 reactor: Any = None, connect_wait: float = 10.0) -> None:
        if reactor is None:
            from twisted.internet import reactor as global_reactor
            reactor = global_reactor
        self.config = config if config is not None else Config()
        self.config.validate()
        self.addresses = [addresses] if isinstance(addresses, str) else list(dict.fromkeys(addresses))
        if not self.addresses:
            raise ValueError("a Producer needs at least one nsqd address")
        self.reactor = reactor
        self.connect_wait = connect_wait
        self.log = Logger(source=self)
        self._dialers: list[Dialer] = []
        #: ready connections, in the order they became ready
        self._ready: list[NSQClientProtocol] = []
        self._inflight: dict[NSQClientProtocol, deque[Deferred[None]]] = {}
        self._waiting: deque[tuple[bytes, Deferred[None], float]] = deque()
        self._wait_timer: IDelayedCall | None = None
        self._next = 0
        self._started = False
        self._stopping = False
        self._stopped: Deferred[None] | None = None
        self._waiters: list[Deferred[None]] = []

    def __str__(self) -> str:
        return "[producer]"

    # -- public ------------------------------------------------------------

    def start(self) -> None:
        """Start connecting (publishing before this starts it too)."""
        if self._started:
            return
        self._started = True
        for address in self.addresses:
            dialer = Dialer(self.reactor, address, self.config, self, self._connected,
                            partial(self._failed, address))
            self._dialers.append(dialer)
            dialer.start()

    def first_attempts(self) -> Deferred[None]:
        """Fires once each address has been tried (and starts the producer): None when every one is
        ready, else the first failure (Go's tools exit on it; the producer keeps retrying)."""
        self.start()
        d: Deferred[Any] = gatherResults([s.first_attempt() for s in self._dialers], consumeErrors=True)
        d.addCallbacks(lambda _: None, lambda f: f.value.subFailure)
        return d

    def when_connected(self) -> Deferred[None]:
        """Fires once some connection is ready (and starts the producer)."""
        self.start()
        if self._ready:
            return succeed(None)
        d: Deferred[None] = Deferred()
        self._waiters.append(d)
        return d

    @property
    def connected(self) -> list[str]:
        """Addresses of the connections ready to publish."""
        return [p.address for p in self._ready]

    @property
    def outstanding(self) -> int:
        """Publishes sent or waiting that nsqd has not answered yet (for callers that bound it)."""
        return sum(len(q) for q in self._inflight.values()) + len(self._waiting)

    def publish(self, topic: str, body: bytes) -> Deferred[None]:
        """PUB one message; fires on nsqd's OK."""
        return self._send(encode_pub(topic.encode(), body))

    def multi_publish(self, topic: str, bodies: Sequence[bytes]) -> Deferred[None]:
        """MPUB: all of ``bodies`` in one command; fires on nsqd's OK for the whole batch."""
        if not bodies:
            return fail(ValueError("MPUB needs at least one message"))
        return self._send(encode_mpub(topic.encode(), list(bodies)))

    def deferred_publish(self, topic: str, delay: float, body: bytes) -> Deferred[None]:
        """DPUB: deliver ``body`` no sooner than ``delay`` seconds from now."""
        return self._send(encode_dpub(topic.encode(), int(delay * 1000), body))

    def stop(self) -> Deferred[None]:
        """Wait for the answers to what was sent, then close; waiting publishes fail."""
        if self._stopped is not None:
            return self._stopped
        self._stopping = True
        while self._waiting:
            _, d, _ = self._waiting.popleft()
            d.errback(NSQClientError("producer stopped"))
        pending = [q[-1] for q in self._inflight.values() if q]
        answered: Deferred[Any] = DeferredList([_observe(d) for d in pending], consumeErrors=True)

        def close(_: Any) -> Deferred[Any]:
            return DeferredList([s.stop() for s in self._dialers], consumeErrors=True)

        stopped: Deferred[None] = Deferred()
        self._stopped = stopped
        answered.addCallback(close).addCallback(lambda _: stopped.callback(None))
        return stopped

    # -- sending ---------------------------------------------------------------

    def _send(self, command: bytes) -> Deferred[None]:
        if self._stopping:
            return fail(NSQClientError("producer stopped"))
        self.start()
        d: Deferred[None] = Deferred()
        conn = self._pick()
        if conn is not None:
            self._inflight[conn].append(d)
            conn.write(command)
        else:
            self._waiting.append((command, d, self.reactor.seconds() + self.connect_wait))
            if self._wait_timer is None:
                self._wait_timer = self.reactor.callLater(self.connect_wait, self._expire_waiting)
        return d

    def _pick(self) -> NSQClientProtocol | None:
        ready = self._ready
        if not ready:
            return None
        self._next = (self._next + 1) % len(ready)
        return ready[self._next]

    def _expire_waiting(self) -> None:
        self._wait_timer = None
        now = self.reactor.seconds()
        while self._waiting and self._waiting[0][2] <= now:
            _, d, _ = self._waiting.popleft()
            d.errback(NoConnection(f"no connection to nsqd ({', '.join(self.addresses)})"
                                   f" within {self.connect_wait}s"))
        if self._waiting:
            self._wait_timer = self.reactor.callLater(self._waiting[0][2] - now, self._expire_waiting)

    # -- connections -----------------------------------------------------------

    def _connected(self, proto: NSQClientProtocol) -> None:
        self.log.info("{producer} ({address}) connected", producer=self, address=proto.address)
        self._ready.append(proto)
        self._inflight[proto] = deque()
        waiting, self._waiting = self._waiting, deque()
        if self._wait_timer is not None and self._wait_timer.active():
            self._wait_timer.cancel()
        self._wait_timer = None
        for command, d, _ in waiting:
            self._inflight[proto].append(d)
            proto.write(command)
        waiters, self._waiters = self._waiters, []
        for w in waiters:
            w.callback(None)

    def _failed(self, address: str, f: Failure) -> None:
        if not self._stopping:
            self.log.error("{producer} ({address}) error connecting to nsqd - {error}", producer=self,
                           address=address, error=f.getErrorMessage())

    # -- IConnectionDelegate ---------------------------------------------------

    def on_response(self, conn: Any, data: bytes) -> None:
        queue = self._inflight.get(conn)
        if data != b"OK" or not queue:
            return
        queue.popleft().callback(None)

    def on_error(self, conn: Any, data: bytes) -> None:
        queue = self._inflight.get(conn)
        if not queue:
            self.log.error("{producer} ({address}) protocol error - {error}", producer=self,
                           address=getattr(conn, "address", "?"), error=data.decode("utf-8", "replace"))
            return
        # every error nsqd answers a PUB, MPUB or DPUB with is fatal: it closes the connection,
        # so nothing more goes on this one
        if conn in self._ready:
            self._ready.remove(conn)
        queue.popleft().errback(NSQErrorResponse(data))

    def on_message(self, conn: Any, data: bytes) -> None:
        self.log.error("{producer} unexpected message on a producer connection", producer=self)

    def on_close(self, conn: Any, reason: Exception) -> None:
        if conn in self._ready:
            self._ready.remove(conn)
        queue = self._inflight.pop(conn, None)
        if not self._stopping:
            self.log.warn("{producer} ({address}) connection lost: {reason}", producer=self,
                          address=getattr(conn, "address", "?"), reason=reason)
        while queue:
            queue.popleft().errback(ConnectionClosed(str(reason)))


def _observe(d: Deferred[None]) -> Deferred[None]:
    """A Deferred that fires when ``d`` does, leaving ``d``'s own result to its owner."""
    seen: Deferred[None] = Deferred()

    def relay(result: Any) -> Any:
        seen.callback(None)
        return result

    d.addBoth(relay)
    return seen
