"""The consumer: one topic/channel from many nsqd nodes, with go-nsq's flow control.

How it behaves, and where it follows go-nsq (``consumer.go``):

- **Connections.** One per nsqd. Addresses given directly are kept connected
  (reconnecting after 1 s, 2 s, 4 s ... at most ``lookupd_poll_interval``);
  addresses found through nsqlookupd are polled every
  ``lookupd_poll_interval`` (plus up to ``lookupd_poll_jitter`` of it at
  start, one lookupd per poll in turn, the next one on failure) and a lost
  one triggers a poll at once.
- **RDY.** ``max_in_flight`` is shared: each connection gets
  ``max(1, max_in_flight / connections)``, never more than nsqd's
  ``max_rdy_count`` nor than what is left of ``max_in_flight``. When a
  connection comes or goes the others are re-balanced (connections giving
  up RDY first). With more connections than ``max_in_flight`` (or in
  backoff) a timer every ``rdy_redistribute_interval`` takes RDY from
  connections idle for ``low_rdy_idle_timeout`` and hands single RDYs to
  others at random.
- **Backoff.** A handler failure (or ``requeue(backoff=True)``) raises the
  backoff level; all connections go to RDY 0 for ``backoff_multiplier *
  2**level`` (at most ``max_backoff_duration``), then one random connection
  gets RDY 1 to test the water. Each success lowers the level; at 0 every
  connection gets its full RDY back.
- **Messages.** The handler is called with a :class:`Message`. Returning
  (or its Deferred/coroutine succeeding) FINs it, raising (or failing)
  REQs it with ``default_requeue_delay * attempts`` (at most
  ``max_requeue_delay``) and backoff. Messages past ``max_attempts`` are
  given to ``on_give_up`` and FINed without the handler. Heartbeats are
  answered by the connection.
- **Stopping.** :meth:`Consumer.stop` sends CLS everywhere, REQs (without
  handling) whatever arrives after it, waits up to ``drain_timeout`` for the
  handlers to answer what they hold, REQs what they still hold, then closes.
  Nothing handed to the handler is left unanswered.
"""

from __future__ import annotations

import inspect
import random
import struct
from collections.abc import Callable, Sequence
from typing import Any

from twisted.internet.defer import Deferred, DeferredList, gatherResults, succeed
from twisted.internet.interfaces import IDelayedCall
from twisted.internet.task import LoopingCall
from twisted.python.failure import Failure
from zope.interface import implementer

from nsqtw._go.duration import format_duration
from nsqtw.client.config import Config, ConfigError
from nsqtw.client.conn import Dialer, NSQClientProtocol, connect
from nsqtw.client.errors import NSQClientError, NSQErrorResponse
from nsqtw.client.lookup import lookup_producers, lookup_url
from nsqtw.client.message import Message
from nsqtw.interfaces import IConnectionDelegate
from nsqtw.log import Logger
from nsqtw.names import is_valid_name
from nsqtw.protocol.wire import CLS, encode_command, fin, rdy, req, touch

__all__ = ["Consumer", "ConsumerStats", "Handler"]

#: what the handler may return: nothing (FIN now), or a Deferred/awaitable (FIN when it succeeds)
Handler = Callable[[Message], Any]

_MSG_HEADER = struct.Struct(">qH")
#: go-nsq retries a RDY it could not give (max_in_flight used up elsewhere) after this long
_RDY_RETRY = 5.0

(_RESUME, _BACKOFF, _CONTINUE) = range(3)


class ConsumerStats:
    """Counters of one consumer (go-nsq's ``ConsumerStats``)."""

    def __init__(self) -> None:
        self.messages_received = 0
        self.messages_finished = 0
        self.messages_requeued = 0
        self.connections = 0

    def __repr__(self) -> str:
        return (f"<ConsumerStats received={self.messages_received} finished={self.messages_finished}"
                f" requeued={self.messages_requeued} connections={self.connections}>")


class _ConsumerConn:
    """The consumer's view of one subscribed connection: its RDY, what it holds, its closing."""

    def __init__(self, consumer: Consumer, proto: NSQClientProtocol) -> None:
        self.consumer = consumer
        self.proto = proto
        self.address = proto.address
        self.rdy = 0
        self.max_rdy = int(proto.settings.get("max_rdy_count") or 2500)
        self.held: dict[bytes, Message] = {}
        self.last_msg_time = 0.0
        self.last_rdy_time = 0.0
        self.rdy_retry: IDelayedCall | None = None
        #: CLS sent; CLOSE_WAIT received
        self.closing = False
        self.close_wait = False
        self.subscribed: Deferred[None] | None = None

    def __str__(self) -> str:
        return self.address

    @property
    def in_flight(self) -> int:
        return len(self.held)

    def finish(self, msg: Message) -> None:
        held = self.held
        mid = msg.id
        if held.get(mid) is msg:  # _answered(), inline: this runs for every message
            del held[mid]
            self.proto.write(fin(mid))
            self.consumer._finished(self)

    def requeue(self, msg: Message, delay: float | None, backoff: bool) -> None:
        if not self._answered(msg):
            return
        config = self.consumer.config
        if delay is None or delay < 0:
            delay = min(config.default_requeue_delay * msg.attempts, config.max_requeue_delay)
        self.proto.write(req(msg.id, int(delay * 1000)))
        self.consumer._requeued(self, backoff)

    def touch(self, msg: Message) -> None:
        if self.held.get(msg.id) is msg:
            self.proto.write(touch(msg.id))

    def _answered(self, msg: Message) -> bool:
        """Forget ``msg``; False when this connection no longer holds it.

        That is after the connection closed, or when nsqd timed it out and
        delivered it again (same ID) meanwhile: the newer delivery's
        handler answers for it, so a stale answer is not sent.
        """
        if self.held.get(msg.id) is not msg:
            return False
        del self.held[msg.id]
        return True


@implementer(IConnectionDelegate)
class Consumer:
    """Consume ``topic``/``channel`` with ``handler`` (see the module docstring for the behaviour).

    Give nsqd TCP addresses, nsqlookupd HTTP addresses, or both; call
    :meth:`start`, and :meth:`stop` (a Deferred) to leave cleanly.
    ``on_give_up(message)`` hears of messages given up after ``max_attempts``.
    """

    def __init__(self, topic: str, channel: str, handler: Handler, config: Config | None = None, *,
                 nsqd_tcp_addresses: Sequence[str] = (), lookupd_http_addresses: Sequence[str] = (),
                 reactor: Any = None, on_give_up: Callable[[Message], Any] | None = None,
                 drain_timeout: float = 30.0) -> None:
        if reactor is None:
            from twisted.internet import reactor as global_reactor
            reactor = global_reactor
        self.config = config if config is not None else Config()
        self.config.validate()
        if not is_valid_name(topic):
            raise ConfigError("invalid topic name")
        if not is_valid_name(channel):
            raise ConfigError("invalid channel name")
        self.topic = topic
        self.channel = channel
        self.handler = handler
        self.on_give_up = on_give_up
        self.drain_timeout = drain_timeout
        self.reactor = reactor
        self.stats = ConsumerStats()
        self.log = Logger(source=self)
        self._nsqd_addresses = list(dict.fromkeys(nsqd_tcp_addresses))
        self._lookupd_addresses = list(dict.fromkeys(lookupd_http_addresses))
        self._max_in_flight = self.config.max_in_flight
        self._conns: dict[NSQClientProtocol, _ConsumerConn] = {}
        self._by_address: dict[str, _ConsumerConn] = {}
        self._pending: dict[str, Deferred[Any]] = {}
        self._dialers: dict[str, Dialer] = {}
        self._total_rdy = 0
        self._backoff_counter = 0
        self._backoff_timer: IDelayedCall | None = None
        self._need_redistribute = False
        self._redistribute = LoopingCall(self._redistribute_rdy)
        self._redistribute.clock = reactor
        self._lookupd_index = 0
        self._lookupd_loop: LoopingCall | None = None
        self._lookupd_start: IDelayedCall | None = None
        self._lookupd_querying = False
        self._lookupd_recheck = False
        self._started = False
        self._stopping = False
        self._drain_timer: IDelayedCall | None = None
        self._stopped: Deferred[None] | None = None
        self._waiters: list[Deferred[None]] = []

    def logPrefix(self) -> str:
        return f"[{self.topic}/{self.channel}]"

    def __str__(self) -> str:
        return self.logPrefix()

    # -- public ------------------------------------------------------------

    def start(self) -> None:
        """Connect to the nsqd addresses and start polling the lookupd addresses."""
        if self._started:
            return
        if not self._nsqd_addresses and not self._lookupd_addresses:
            raise ConfigError("give nsqd_tcp_addresses or lookupd_http_addresses")
        self._started = True
        self._redistribute.start(self.config.rdy_redistribute_interval, now=False)
        for address in self._nsqd_addresses:
            self._connect_direct(address)
        if self._lookupd_addresses:
            self._query_lookupd()
            jitter = random.random() * self.config.lookupd_poll_jitter * self.config.lookupd_poll_interval
            self._lookupd_start = self.reactor.callLater(jitter, self._start_lookupd_loop)

    def when_connected(self) -> Deferred[None]:
        """Fires once at least one connection is subscribed."""
        if self._conns:
            return succeed(None)
        d: Deferred[None] = Deferred()
        self._waiters.append(d)
        return d

    @property
    def connections(self) -> list[str]:
        """Addresses of the nsqd nodes this consumer is subscribed on."""
        return [c.address for c in self._conns.values()]

    def rdy_counts(self) -> dict[str, int]:
        """The RDY count last sent on each connection."""
        return {c.address: c.rdy for c in self._conns.values()}

    @property
    def max_in_flight(self) -> int:
        return self._max_in_flight

    @property
    def backoff_level(self) -> int:
        return self._backoff_counter

    def change_max_in_flight(self, count: int) -> None:
        """A new ``max_in_flight`` for every connection (0 pauses the flow, as go-nsq's)."""
        if count == self._max_in_flight:
            return
        self._max_in_flight = count
        self._rebalance()

    def is_starved(self) -> bool:
        """Some connection holds nearly all it may (go-nsq's ``IsStarved``): time to flush a batch."""
        for c in self._conns.values():
            if c.in_flight > 0 and c.in_flight >= int(c.rdy * 0.85) and not c.closing:
                return True
        return False

    def stop(self) -> Deferred[None]:
        """Leave cleanly (CLS, drain, close); fires when every connection is closed."""
        if self._stopped is not None:
            return self._stopped
        self._stopped = Deferred()
        self._stopping = True
        self.log.info("{prefix} stopping...", prefix=self)
        for call in (self._lookupd_start, self._backoff_timer):
            if call is not None and call.active():
                call.cancel()
        if self._lookupd_loop is not None and self._lookupd_loop.running:
            self._lookupd_loop.stop()
        if self._redistribute.running:
            self._redistribute.stop()
        for d in list(self._pending.values()):
            d.cancel()
        for c in list(self._conns.values()):
            if c.rdy_retry is not None and c.rdy_retry.active():
                c.rdy_retry.cancel()
            c.closing = True
            c.proto.write(CLS)
        self._drain_timer = self.reactor.callLater(self.drain_timeout, self._drain_expired)
        for c in list(self._conns.values()):
            self._maybe_close(c)
        self._check_stopped()
        return self._stopped

    # -- connections ---------------------------------------------------------

    def _connect_direct(self, address: str) -> None:
        def failed(f: Failure) -> None:
            if not self._stopping:
                self.log.error("{prefix} ({address}) error connecting to nsqd - {error}",
                               prefix=self, address=address, error=f.getErrorMessage())

        dialer = Dialer(self.reactor, address, self.config, self, self._subscribe, failed)
        self._dialers[address] = dialer
        self.log.info("{prefix} ({address}) connecting to nsqd", prefix=self, address=address)
        dialer.start()

    def first_attempts(self) -> Deferred[None]:
        """Fires once each nsqd address given has been tried: None when every one subscribed, else the
        first failure, as go-nsq's ``ConnectToNSQDs`` returns (the consumer keeps retrying either way;
        Go's tools exit on it)."""
        d: Deferred[Any] = gatherResults([s.first_attempt() for s in self._dialers.values()],
                                         consumeErrors=True)
        d.addCallbacks(lambda _: None, lambda f: f.value.subFailure)
        return d

    def _connect_discovered(self, address: str) -> None:
        if self._stopping or address in self._by_address or address in self._pending \
                or address in self._dialers:
            return
        self.log.info("{prefix} ({address}) connecting to nsqd", prefix=self, address=address)
        d: Deferred[Any] = connect(self.reactor, address, self.config, self)
        self._pending[address] = d
        d.addCallback(self._subscribe)

        def failed(f: Failure) -> None:
            if not self._stopping:
                self.log.error("{prefix} ({address}) error connecting to nsqd - {error}",
                               prefix=self, address=address, error=f.getErrorMessage())

        def done(_: Any) -> None:
            self._pending.pop(address, None)
            self._check_stopped()

        d.addErrback(failed)
        d.addBoth(done)

    def _subscribe(self, proto: NSQClientProtocol) -> Deferred[None]:
        """After the handshake: SUB, then join the RDY sharing."""
        if self._stopping:
            proto.close()
            raise NSQClientError("consumer stopping")
        max_rdy = int(proto.settings.get("max_rdy_count") or 2500)
        if max_rdy < self._max_in_flight:
            self.log.warn("{prefix} ({address}) max RDY count {max_rdy} < consumer max in flight"
                          " {mif}, truncation possible", prefix=self, address=proto.address,
                          max_rdy=max_rdy, mif=self._max_in_flight)
        c = _ConsumerConn(self, proto)
        c.subscribed = Deferred()
        self._conns[proto] = c
        proto.write(encode_command(b"SUB", self.topic.encode(), self.channel.encode()))

        def joined(_: None) -> None:
            self._by_address[c.address] = c
            self.stats.connections = len(self._by_address)
            self._rebalance()
            waiters, self._waiters = self._waiters, []
            for w in waiters:
                w.callback(None)

        def refused(f: Failure) -> Failure:
            self._conns.pop(proto, None)
            proto.abort()
            self.log.error("{prefix} ({address}) failed to subscribe to {topic}:{channel} - {error}",
                           prefix=self, address=proto.address, topic=self.topic, channel=self.channel,
                           error=f.getErrorMessage())
            return f

        return c.subscribed.addCallbacks(joined, refused)

    # -- IConnectionDelegate -----------------------------------------------------

    def on_response(self, conn: Any, data: bytes) -> None:
        c = self._conns.get(conn)
        if c is None:
            return
        if c.subscribed is not None and not c.subscribed.called:
            c.subscribed.callback(None)
        elif data == b"CLOSE_WAIT":
            self.log.info("{prefix} ({address}) received CLOSE_WAIT from nsqd", prefix=self, address=c.address)
            c.close_wait = True
            self._maybe_close(c)

    def on_error(self, conn: Any, data: bytes) -> None:
        c = self._conns.get(conn)
        if c is not None and c.subscribed is not None and not c.subscribed.called:
            c.subscribed.errback(NSQErrorResponse(data))
            return
        self.log.error("{prefix} ({address}) protocol error - {error}", prefix=self,
                       address=getattr(conn, "address", "?"), error=data.decode("utf-8", "replace"))

    def on_message(self, conn: Any, data: bytes) -> None:
        c = self._conns.get(conn)
        if c is None:
            return
        timestamp, attempts = _MSG_HEADER.unpack_from(data)
        mid = data[10:26]
        msg = Message(mid, data[26:], timestamp, attempts, c)
        self.stats.messages_received += 1
        c.held[mid] = msg
        c.last_msg_time = self.reactor.seconds()
        if c.closing:  # arrived after CLS: give it back untouched
            msg.requeue(0, backoff=False)
            return
        max_attempts = self.config.max_attempts
        if max_attempts > 0 and attempts > max_attempts:
            self.log.warn("{prefix} msg {id} attempted {attempts} times, giving up", prefix=self,
                          id=msg.id.decode("ascii", "replace"), attempts=attempts)
            if self.on_give_up is not None:
                self.on_give_up(msg)
            msg.finish()
            return
        try:
            result = self.handler(msg)
        except Exception:
            self._handler_failed(Failure(), msg)
            return
        if result is not None:
            self._handled_result(result, msg)
        elif msg._auto and not msg._responded:
            # msg.finish(), inline: this runs for every message a plain handler returns from
            msg._responded = True
            held = c.held
            if held.get(mid) is msg:
                del held[mid]
                c.proto.write(fin(mid))
                self.stats.messages_finished += 1
                if self._backoff_counter or c.closing:
                    self._after_answer(c, _RESUME)

    def on_close(self, conn: Any, reason: Exception) -> None:
        c = self._conns.pop(conn, None)
        if c is None:
            return
        if self._by_address.get(c.address) is c:
            del self._by_address[c.address]
        self.stats.connections = len(self._by_address)
        if c.rdy_retry is not None and c.rdy_retry.active():
            c.rdy_retry.cancel()
        had_rdy = c.rdy > 0
        self._total_rdy -= c.rdy
        c.rdy = 0
        c.held.clear()  # nsqd requeues what it had sent us when it times out
        left = len(self._conns)
        if self._stopping:
            self._check_stopped()
            return
        self.log.warn("{prefix} ({address}) connection closed: {reason}; {left} connections left alive",
                      prefix=self, address=c.address, reason=reason, left=left)
        if had_rdy and (left == self._max_in_flight or self._backoff_counter > 0):
            self._need_redistribute = True
        self._rebalance()
        if self._lookupd_addresses and c.address not in self._dialers:
            self._query_lookupd()

    # -- handler ---------------------------------------------------------------

    def _handled_result(self, result: Any, msg: Message) -> None:
        """The handler returned something other than None: a Deferred or awaitable, or a value."""
        if isinstance(result, Deferred) or inspect.isawaitable(result):
            d = result if isinstance(result, Deferred) else Deferred.fromCoroutine(result)  # type: ignore[arg-type]
            d.addCallbacks(self._handled, self._handler_failed, callbackArgs=(msg,), errbackArgs=(msg,))
        elif msg._auto:
            msg.finish()

    def _handled(self, _: Any, msg: Message) -> None:
        if msg._auto:
            msg.finish()

    def _handler_failed(self, failure: Failure, msg: Message) -> None:
        self.log.failure("{prefix} Handler returned error for msg {id}", failure, prefix=self,
                         id=msg.id.decode("ascii", "replace"))
        if msg._auto:
            msg.requeue()

    def _finished(self, c: _ConsumerConn) -> None:
        self.stats.messages_finished += 1
        if self._backoff_counter or c.closing:  # else a success changes nothing
            self._after_answer(c, _RESUME)

    def _requeued(self, c: _ConsumerConn, backoff: bool) -> None:
        self.stats.messages_requeued += 1
        self._after_answer(c, _BACKOFF if backoff else _CONTINUE)

    def _after_answer(self, c: _ConsumerConn, signal: int) -> None:
        if c.closing:
            self._maybe_close(c)
        elif not self._stopping and self._conns.get(c.proto) is c:
            self._backoff_signal(signal)

    # -- RDY -------------------------------------------------------------------

    def _per_conn_max_in_flight(self) -> int:
        total = self._max_in_flight
        n = len(self._by_address) or 1
        return int(min(max(1, total / n), total))

    def _rebalance(self) -> None:
        """Give every connection its share; those over their share go first, freeing RDY."""
        if self._stopping:
            return
        for c in sorted(self._by_address.values(), key=lambda c: -c.rdy):
            self._maybe_update_rdy(c)

    def _maybe_update_rdy(self, c: _ConsumerConn) -> None:
        if self._backoff_counter > 0 or self._in_backoff_timeout():
            return
        self._update_rdy(c, self._per_conn_max_in_flight())

    def _update_rdy(self, c: _ConsumerConn, count: int) -> None:
        if c.closing or self._stopping:
            return
        count = min(count, c.max_rdy)
        if c.rdy_retry is not None and c.rdy_retry.active():
            c.rdy_retry.cancel()
        c.rdy_retry = None
        max_possible = self._max_in_flight - self._total_rdy + c.rdy
        if 0 < max_possible < count:
            count = max_possible
        if max_possible <= 0 and count > 0:
            if c.rdy == 0:  # could not leave RDY 0: try again later so it never starves
                c.rdy_retry = self.reactor.callLater(_RDY_RETRY, self._update_rdy, c, count)
            return
        self._send_rdy(c, count)

    def _send_rdy(self, c: _ConsumerConn, count: int) -> None:
        if count == c.rdy:
            return
        self._total_rdy += count - c.rdy
        c.rdy = count
        c.last_rdy_time = self.reactor.seconds()
        self.log.debug("{prefix} ({address}) sending RDY {count}", prefix=self, address=c.address, count=count)
        c.proto.write(rdy(count))

    def _redistribute_rdy(self) -> None:
        if self._in_backoff_timeout() or not self._by_address:
            return
        conns = list(self._by_address.values())
        if len(conns) > self._max_in_flight:
            self._need_redistribute = True
        if self._backoff_counter > 0 and len(conns) > 1:
            self._need_redistribute = True
        if not self._need_redistribute:
            return
        self._need_redistribute = False
        now = self.reactor.seconds()
        for c in conns:
            if c.rdy > 0:
                if now - c.last_msg_time > self.config.low_rdy_idle_timeout:
                    self.log.debug("{prefix} ({address}) idle connection, giving up RDY", prefix=self,
                                   address=c.address)
                    self._update_rdy(c, 0)
                elif now - c.last_rdy_time > self.config.low_rdy_timeout:
                    self.log.debug("{prefix} ({address}) RDY timeout, giving up RDY", prefix=self,
                                   address=c.address)
                    self._update_rdy(c, 0)
        available = self._max_in_flight - self._total_rdy
        if self._backoff_counter > 0:
            available = 1 - self._total_rdy
        possible = [c for c in conns if c.rdy == 0]
        random.shuffle(possible)
        while possible and available > 0:
            available -= 1
            self._update_rdy(possible.pop(), 1)

    # -- backoff ----------------------------------------------------------------

    def _in_backoff_timeout(self) -> bool:
        return self._backoff_timer is not None and self._backoff_timer.active()

    def _backoff_duration(self, level: int) -> float:
        full = self.config.backoff_multiplier * (2.0 ** level)
        if self.config.backoff_strategy == "full_jitter":
            return random.random() * full
        return full

    def _backoff_signal(self, signal: int) -> None:
        if self._in_backoff_timeout():
            return  # many answers during one backoff period count once
        counter = self._backoff_counter
        updated = False
        if signal == _RESUME and counter > 0:
            counter -= 1
            updated = True
        elif signal == _BACKOFF and self._backoff_duration(counter + 1) <= self.config.max_backoff_duration:
            counter += 1
            updated = True
        self._backoff_counter = counter
        if counter == 0 and updated:
            count = self._per_conn_max_in_flight()
            self.log.warn("{prefix} exiting backoff, returning all to RDY {count}", prefix=self, count=count)
            for c in list(self._by_address.values()):
                self._update_rdy(c, count)
        elif counter > 0:
            duration = min(self._backoff_duration(counter), self.config.max_backoff_duration)
            self.log.warn("{prefix} backing off for {duration} (backoff level {backoff_level}), setting all to RDY 0",
                          prefix=self, duration=format_duration(duration), backoff_level=counter)
            for c in list(self._by_address.values()):
                self._update_rdy(c, 0)
            self._backoff_timer = self.reactor.callLater(duration, self._resume)

    def _resume(self) -> None:
        self._backoff_timer = None
        if self._stopping:
            return
        conns = list(self._by_address.values())
        if not conns:
            self.log.warn("{prefix} no connection available to resume; backing off for 1s", prefix=self)
            self._backoff_timer = self.reactor.callLater(1.0, self._resume)
            return
        choice = random.choice(conns)
        self.log.warn("{prefix} ({address}) backoff timeout expired, sending RDY 1", prefix=self,
                      address=choice.address)
        self._update_rdy(choice, 1)

    # -- lookupd -----------------------------------------------------------------

    def _start_lookupd_loop(self) -> None:
        self._lookupd_start = None
        loop = LoopingCall(self._query_lookupd)
        loop.clock = self.reactor
        self._lookupd_loop = loop
        loop.start(self.config.lookupd_poll_interval, now=False)

    def _query_lookupd(self, retries: int = 0) -> None:
        """Ask the next lookupd who has the topic, and connect to the nodes not connected yet."""
        if self._stopping:
            return
        if self._lookupd_querying:
            self._lookupd_recheck = True
            return
        self._lookupd_querying = True
        address = self._lookupd_addresses[self._lookupd_index % len(self._lookupd_addresses)]
        self._lookupd_index = (self._lookupd_index + 1) % len(self._lookupd_addresses)
        url = lookup_url(address, "/lookup", topic=self.topic)
        self.log.info("{prefix} querying nsqlookupd {url}", prefix=self, url=url)
        d = lookup_producers(self.reactor, address, self.topic, max(self.config.dial_timeout, 5.0))

        def found(addresses: list[str]) -> None:
            for a in addresses:
                self._connect_discovered(a)

        def failed(f: Failure) -> None:
            self.log.error("{prefix} error querying nsqlookupd ({url}) - {error}", prefix=self, url=url,
                           error=f.getErrorMessage())
            if retries + 1 < 3 and len(self._lookupd_addresses) > 1:
                self.log.info("{prefix} retrying with next nsqlookupd", prefix=self)
                self._lookupd_recheck = True

        def done(_: Any) -> None:
            self._lookupd_querying = False
            if self._lookupd_recheck:
                self._lookupd_recheck = False
                self._query_lookupd(retries + 1)

        d.addCallbacks(found, failed)
        d.addBoth(done)

    # -- stopping ------------------------------------------------------------------

    def _maybe_close(self, c: _ConsumerConn) -> None:
        """While stopping: close a connection once nsqd said CLOSE_WAIT and nothing is held."""
        if self._stopping and c.close_wait and c.in_flight == 0:
            self._close_conn(c)

    def _close_conn(self, c: _ConsumerConn) -> None:
        dialer = self._dialers.get(c.address)
        if dialer is not None and dialer.running:
            dialer.stop()
        else:
            c.proto.close()

    def _drain_expired(self) -> None:
        self._drain_timer = None
        for c in list(self._conns.values()):
            if c.held:
                self.log.warn("{prefix} ({address}) handlers still hold {count} messages after {timeout};"
                              " requeueing them", prefix=self, address=c.address, count=len(c.held),
                              timeout=format_duration(self.drain_timeout))
                for msg in list(c.held.values()):
                    msg.requeue(0, backoff=False)
            self._close_conn(c)

    def _check_stopped(self) -> None:
        if self._stopped is None or self._stopped.called or self._conns or self._pending:
            return
        d: Deferred[Any] = DeferredList([s.stop() for s in self._dialers.values() if s.running],
                                        consumeErrors=True)

        def finished(_: Any) -> None:
            if self._drain_timer is not None and self._drain_timer.active():
                self._drain_timer.cancel()
            self._drain_timer = None
            self.log.info("{prefix} stopped", prefix=self)
            assert self._stopped is not None
            if not self._stopped.called:
                self._stopped.callback(None)

        d.addCallback(finished)
