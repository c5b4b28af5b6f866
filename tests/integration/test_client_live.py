"""nsqtw.client against live nsqtw daemons.

Publishing, lookupd discovery, RDY sharing over two nsqds, backoff, reconnects,
TLS, compression, AUTH, msg_timeout/TOUCH and the clean stop.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import pytest_twisted
from twisted.internet import reactor, task, threads
from twisted.internet.defer import Deferred

from nsqtw.client import Config, ConnectionClosed, Consumer, Message, NoConnection, NSQErrorResponse, Producer, get_json
from tests.certs import CertFiles, make_certs
from tests.daemon import WORKERS, Daemon
from tests.integration.test_features_live import AuthServer


@pytest.fixture(scope="module", params=WORKERS, ids=lambda n: f"workers={n}")
def workers(request) -> int:
    """Every test here runs against one process and against ``--workers=2`` (conftest.py)."""
    return int(request.param)


async def wait_until(check: Callable[[], Any], timeout: float = 15.0, what: str = "condition") -> Any:
    """Poll ``check`` on the reactor (never blocking it) until it is true."""
    for _ in range(int(timeout / 0.05)):
        value = check()
        if value:
            return value
        await task.deferLater(reactor, 0.05)
    raise AssertionError(f"timed out waiting for {what}: last {check()!r}")


async def channel_stats(d: Daemon, topic: str, channel: str) -> dict[str, Any]:
    data = await get_json(reactor, f"http://{d.http_address}/stats?format=json&topic={topic}", 5.0)
    for t in data["topics"]:
        if t["topic_name"] == topic:
            for c in t["channels"]:
                if c["channel_name"] == channel:
                    return dict(c)
    return {}


async def client_stats(d: Daemon, topic: str, channel: str) -> list[dict[str, Any]]:
    return list((await channel_stats(d, topic, channel)).get("clients", []))


class Collector:
    """A handler that keeps bodies (and may fail or hold messages)."""

    def __init__(self) -> None:
        self.bodies: list[bytes] = []
        self.messages: list[Message] = []

    def __call__(self, msg: Message) -> None:
        self.bodies.append(msg.body)
        self.messages.append(msg)


@pytest.fixture
def stoppers() -> Any:
    """Clients to stop at the end of a test, whatever happened."""
    items: list[Any] = []
    yield items
    for item in items:
        pytest_twisted.blockon(item.stop())


def consumer(stoppers: list[Any], topic: str, handler: Any, *, channel: str = "c", **kw: Any) -> Consumer:
    config = kw.pop("config", None) or Config()
    c = Consumer(topic, channel, handler, config, reactor=reactor, **kw)
    stoppers.append(c)
    c.start()
    return c


def producer(stoppers: list[Any], addresses: Any, config: Config | None = None) -> Producer:
    p = Producer(addresses, config, reactor=reactor)
    stoppers.append(p)
    return p


@pytest_twisted.ensureDeferred
async def test_publish_and_consume(nsqd, stoppers) -> None:
    """PUB, MPUB and DPUB each fire on OK; the consumer gets every body once and FINs it all."""
    p = producer(stoppers, nsqd.tcp_address)
    await p.publish("t1", b"one")
    await p.multi_publish("t1", [b"two", b"three"])
    await p.deferred_publish("t1", 0.3, b"later")
    got = Collector()
    c = consumer(stoppers, "t1", got, config=Config(max_in_flight=10), nsqd_tcp_addresses=[nsqd.tcp_address])
    await wait_until(lambda: len(got.bodies) == 4, what="4 messages")
    assert sorted(got.bodies) == [b"later", b"one", b"three", b"two"]
    assert got.bodies[-1] == b"later"  # deferred by 0.3s
    await wait_until(lambda: c.stats.messages_finished == 4)
    stats = await channel_stats(nsqd, "t1", "c")
    assert (stats["depth"], stats["in_flight_count"], stats["requeue_count"]) == (0, 0, 0)


@pytest_twisted.ensureDeferred
async def test_publish_error_and_recovery(nsqd, stoppers) -> None:
    """A refused PUB errbacks with nsqd's code; the producer reconnects and the next PUB succeeds."""
    p = producer(stoppers, nsqd.tcp_address)
    await p.publish("ok", b"x")
    with pytest.raises(NSQErrorResponse) as e:
        await p.publish("bad!topic", b"x")
    assert e.value.code == "E_BAD_TOPIC"
    await p.publish("ok", b"y")  # on a new connection once nsqd closed the old one
    assert (await channel_stats(nsqd, "ok", "c")) == {}
    data = await get_json(reactor, f"http://{nsqd.http_address}/stats?format=json&topic=ok", 5.0)
    assert data["topics"][0]["message_count"] == 2


@pytest_twisted.ensureDeferred
async def test_publishes_on_lost_connection_fail(daemon_factory, stoppers) -> None:
    """Publishes nsqd never answered fail with ConnectionClosed when the connection dies."""
    d = daemon_factory()
    p = producer(stoppers, d.tcp_address)
    await p.publish("t", b"x")
    d.proc.send_signal(19)  # SIGSTOP: nsqd accepts bytes but never answers
    try:
        pending = [p.publish("t", b"y") for _ in range(3)]
        for proto in list(p._ready):
            proto.abort()
        for pub in pending:
            with pytest.raises(ConnectionClosed):
                await pub
    finally:
        d.proc.send_signal(18)  # SIGCONT


@pytest_twisted.ensureDeferred
async def test_lookupd_discovery_two_nodes(daemon_factory, lookupd_factory, stoppers) -> None:
    """Through lookupd the consumer finds both nsqd nodes, subscribes on each, and gets all messages."""
    lookupd = lookupd_factory("--broadcast-address=127.0.0.1")
    nodes = [daemon_factory("--broadcast-address=127.0.0.1", f"--lookupd-tcp-address={lookupd.tcp_address}")
             for _ in range(2)]
    for i, n in enumerate(nodes):
        await producer(stoppers, n.tcp_address).multi_publish("disc", [f"{i}-{j}".encode() for j in range(5)])
    got = Collector()
    c = consumer(stoppers, "disc", got, config=Config(max_in_flight=10),
                 lookupd_http_addresses=[lookupd.http_address])
    await wait_until(lambda: len(got.bodies) == 10, what="10 messages")
    assert sorted(c.connections) == sorted(n.tcp_address for n in nodes)
    assert sorted(got.bodies) == sorted(f"{i}-{j}".encode() for i in range(2) for j in range(5))


@pytest_twisted.ensureDeferred
async def test_rdy_shared_and_rebalanced(daemon_factory, stoppers) -> None:
    """max_in_flight 10 over two nsqds is RDY 5 on each; when one goes, the other gets all 10."""
    nodes = [daemon_factory() for _ in range(2)]
    c = consumer(stoppers, "rdy", Collector(), config=Config(max_in_flight=10),
                 nsqd_tcp_addresses=[n.tcp_address for n in nodes])

    async def ready_counts() -> list[int]:
        return [sum(cl["ready_count"] for cl in await client_stats(n, "rdy", "c")) for n in nodes]

    await wait_until(lambda: len(c.connections) == 2)
    for _ in range(100):
        if await ready_counts() == [5, 5]:
            break
        await task.deferLater(reactor, 0.05)
    assert await ready_counts() == [5, 5]
    await threads.deferToThread(nodes[1].stop)
    await wait_until(lambda: c.rdy_counts() == {nodes[0].tcp_address: 10}, what="RDY 10 on the survivor")
    for _ in range(100):
        if [cl["ready_count"] for cl in await client_stats(nodes[0], "rdy", "c")] == [10]:
            break
        await task.deferLater(reactor, 0.05)
    assert [cl["ready_count"] for cl in await client_stats(nodes[0], "rdy", "c")] == [10]


@pytest_twisted.ensureDeferred
async def test_rdy_redistributed_when_fewer_than_connections(daemon_factory, stoppers) -> None:
    """max_in_flight 1 over two nsqds: the single RDY moves between them, so both are drained."""
    nodes = [daemon_factory() for _ in range(2)]
    for i, n in enumerate(nodes):
        await producer(stoppers, n.tcp_address).multi_publish("few", [f"{i}-{j}".encode() for j in range(3)])
    got = Collector()
    config = Config(max_in_flight=1, rdy_redistribute_interval=0.1, low_rdy_idle_timeout=0.3)
    c = consumer(stoppers, "few", got, config=config, nsqd_tcp_addresses=[n.tcp_address for n in nodes])
    await wait_until(lambda: len(got.bodies) == 6, what="6 messages")
    assert sum(c.rdy_counts().values()) <= 1  # never more than max_in_flight in total


@pytest_twisted.ensureDeferred
async def test_backoff_on_handler_failure(nsqd, stoppers) -> None:
    """A failing handler sets every connection to RDY 0 for the backoff time, then RDY 1, then recovers."""
    p = producer(stoppers, nsqd.tcp_address)
    await p.multi_publish("bo", [b"fail", b"ok1", b"ok2", b"ok3"])
    seen: list[tuple[float, bytes]] = []

    def handler(msg: Message) -> None:
        seen.append((reactor.seconds(), msg.body))
        if msg.body == b"fail" and msg.attempts == 1:
            msg.requeue(0.0)  # with backoff
            return
    config = Config(max_in_flight=1, backoff_multiplier=0.25, max_backoff_duration=2.0)
    c = consumer(stoppers, "bo", handler, config=config, nsqd_tcp_addresses=[nsqd.tcp_address])
    await wait_until(lambda: c.backoff_level == 1, what="backoff level 1")
    assert c.rdy_counts() == {nsqd.tcp_address: 0}
    failed_at = seen[0][0]
    await wait_until(lambda: len(seen) == 5, what="all messages, the failed one twice")
    assert seen[1][0] - failed_at >= 0.45  # RDY 0 for 2 * 0.25s
    await wait_until(lambda: c.backoff_level == 0)
    assert c.rdy_counts() == {nsqd.tcp_address: 1}
    assert (c.stats.messages_requeued, c.stats.messages_finished) == (1, 4)


@pytest_twisted.ensureDeferred
async def test_handler_exception_and_deferred(nsqd, stoppers) -> None:
    """A raising handler REQs (with the given delay rule); a Deferred handler FINs when it fires."""
    p = producer(stoppers, nsqd.tcp_address)
    await p.multi_publish("hx", [b"raise", b"defer"])
    later: list[Deferred[None]] = []

    def handler(msg: Message) -> Any:
        if msg.body == b"raise" and msg.attempts == 1:
            raise ValueError("boom")
        if msg.body == b"defer":
            d: Deferred[None] = Deferred()
            later.append(d)
            return d
        return None
    config = Config(max_in_flight=5, default_requeue_delay=0.0, max_backoff_duration=0.0)  # no backoff
    c = consumer(stoppers, "hx", handler, config=config, nsqd_tcp_addresses=[nsqd.tcp_address])
    await wait_until(lambda: later and c.stats.messages_finished == 1, what="raise retried and finished")
    assert c.stats.messages_requeued == 1
    stats = await channel_stats(nsqd, "hx", "c")
    assert stats["in_flight_count"] == 1  # the deferred one is still held
    later[0].callback(None)
    await wait_until(lambda: c.stats.messages_finished == 2)


@pytest_twisted.ensureDeferred
async def test_reconnect_after_daemon_restart(daemon_factory, stoppers) -> None:
    """Consumer and producer both reconnect when nsqd restarts on the same port, and carry on."""
    d = daemon_factory()
    port = d.tcp[1]
    got = Collector()
    c = consumer(stoppers, "rc", got, config=Config(max_in_flight=5), nsqd_tcp_addresses=[d.tcp_address])
    p = producer(stoppers, d.tcp_address)
    await p.publish("rc", b"before")
    await wait_until(lambda: got.bodies == [b"before"])
    await threads.deferToThread(d.stop)
    await wait_until(lambda: not c.connections, what="connection lost")
    await threads.deferToThread(d.start, f"127.0.0.1:{port}")
    await wait_until(lambda: c.connections, what="reconnected", timeout=20)
    await wait_until(lambda: p.connected, what="producer reconnected", timeout=20)
    await p.publish("rc", b"after")
    await wait_until(lambda: got.bodies == [b"before", b"after"])


@pytest.fixture(scope="module")
def certs(tmp_path_factory) -> CertFiles:
    return make_certs(str(tmp_path_factory.mktemp("certs")))


@pytest.mark.parametrize("compression", ["snappy", "deflate"])
@pytest_twisted.ensureDeferred
async def test_tls_with_compression(daemon_factory, stoppers, certs, compression) -> None:
    """TLS checked against the test CA, then snappy or deflate: nsqd's /stats shows both, and data flows."""
    d = daemon_factory(f"--tls-cert={certs.server_cert}", f"--tls-key={certs.server_key}")
    config = Config(tls_v1=True, tls_root_ca_file=certs.ca, max_in_flight=50, **{compression: True})
    p = producer(stoppers, d.tcp_address, config)
    bodies = [(b"%d-" % i) * (i * 50 + 1) for i in range(40)]  # some compress well, some are long
    await p.multi_publish("sec", bodies[:20])
    for b in bodies[20:]:
        await p.publish("sec", b)
    got = Collector()
    consumer(stoppers, "sec", got, config=config.copy(), nsqd_tcp_addresses=[d.tcp_address])
    await wait_until(lambda: len(got.bodies) == 40)
    assert sorted(got.bodies) == sorted(bodies)
    [client] = await client_stats(d, "sec", "c")
    assert client["tls"] is True and client[compression] is True


@pytest_twisted.ensureDeferred
async def test_tls_refuses_unknown_ca(daemon_factory, certs) -> None:
    """Without the test CA the server certificate is not trusted: no connection, publishes fail."""
    d = daemon_factory(f"--tls-cert={certs.server_cert}", f"--tls-key={certs.server_key}")
    p = Producer(d.tcp_address, Config(tls_v1=True), reactor=reactor, connect_wait=1.0)
    try:
        with pytest.raises(NoConnection):
            await p.publish("t", b"x")
    finally:
        await p.stop()


@pytest_twisted.ensureDeferred
async def test_auth(daemon_factory, stoppers) -> None:
    """AUTH is sent when nsqd requires it; with the right secret publishing and consuming work."""
    server = AuthServer({"s3": {"ttl": 60, "identity": "me", "authorizations": [
        {"topic": ".*", "channels": [".*"], "permissions": ["publish", "subscribe"]}]}})
    try:
        d = daemon_factory(f"--auth-http-address={server.address}")
        config = Config(auth_secret="s3")
        await producer(stoppers, d.tcp_address, config).publish("au", b"x")
        got = Collector()
        consumer(stoppers, "au", got, config=config.copy(), nsqd_tcp_addresses=[d.tcp_address])
        await wait_until(lambda: got.bodies == [b"x"])
        assert {q["secret"] for q in server.queries} == {"s3"}
    finally:
        server.close()


@pytest_twisted.ensureDeferred
async def test_msg_timeout_and_touch(nsqd, stoppers) -> None:
    """With msg_timeout 1s, TOUCH every 0.5s keeps a 2s handler's message from timing out."""
    await producer(stoppers, nsqd.tcp_address).publish("tt", b"slow")
    done: list[Message] = []

    def handler(msg: Message) -> Deferred[None]:
        toucher = task.LoopingCall(msg.touch)
        toucher.clock = reactor
        toucher.start(0.5, now=False)

        def finish() -> None:
            toucher.stop()
            done.append(msg)
        return task.deferLater(reactor, 2.0, finish)
    c = consumer(stoppers, "tt", handler, config=Config(msg_timeout=1.0), nsqd_tcp_addresses=[nsqd.tcp_address])
    await wait_until(lambda: done and c.stats.messages_finished == 1, timeout=10)
    stats = await channel_stats(nsqd, "tt", "c")
    assert (stats["timeout_count"], stats["requeue_count"], stats["depth"]) == (0, 0, 0)


@pytest_twisted.ensureDeferred
async def test_clean_stop_fins_what_it_holds(nsqd, stoppers) -> None:
    """stop() waits for held messages to be answered: the handler's FINs go out, nothing is requeued."""
    p = producer(stoppers, nsqd.tcp_address)
    await p.multi_publish("cs", [b"%d" % i for i in range(5)])
    held: list[Deferred[None]] = []

    def handler(msg: Message) -> Deferred[None]:
        d: Deferred[None] = Deferred()
        held.append(d)
        return d
    c = Consumer("cs", "c", handler, Config(max_in_flight=5), nsqd_tcp_addresses=[nsqd.tcp_address],
                 reactor=reactor)
    c.start()
    await wait_until(lambda: len(held) == 5)
    stopping = c.stop()
    await task.deferLater(reactor, 0.2)
    assert not stopping.called  # still holding
    for d in held:
        d.callback(None)
    await stopping
    stats = await channel_stats(nsqd, "cs", "c")
    assert (stats["depth"], stats["in_flight_count"], stats["requeue_count"]) == (0, 0, 0)
    assert c.stats.messages_finished == 5


@pytest_twisted.ensureDeferred
async def test_clean_stop_requeues_after_drain_timeout(nsqd, stoppers) -> None:
    """Messages a handler never answers are REQed at the drain timeout, so they go back to the channel."""
    p = producer(stoppers, nsqd.tcp_address)
    await p.multi_publish("cr", [b"a", b"b", b"c"])
    c = Consumer("cr", "c", lambda m: Deferred(), Config(max_in_flight=3), nsqd_tcp_addresses=[nsqd.tcp_address],
                 reactor=reactor, drain_timeout=0.5)
    c.start()
    await wait_until(lambda: c.stats.messages_received == 3)
    await c.stop()
    stats = await channel_stats(nsqd, "cr", "c")
    assert (stats["depth"], stats["in_flight_count"], stats["requeue_count"]) == (3, 0, 3)


@pytest_twisted.ensureDeferred
async def test_msg_timeout_is_negotiated(nsqd, stoppers) -> None:
    """msg_timeout 1s is nsqd's timeout for this client: a message held 2s untouched times out."""
    await producer(stoppers, nsqd.tcp_address).publish("to", b"slow")
    c = consumer(stoppers, "to", lambda m: task.deferLater(reactor, 2.0, lambda: None),
                 config=Config(msg_timeout=1.0), nsqd_tcp_addresses=[nsqd.tcp_address])
    await wait_until(lambda: c.stats.messages_received >= 1)
    for _ in range(80):
        if (await channel_stats(nsqd, "to", "c"))["timeout_count"] == 1:
            break
        await task.deferLater(reactor, 0.05)
    assert (await channel_stats(nsqd, "to", "c"))["timeout_count"] == 1


@pytest_twisted.ensureDeferred
async def test_producer_pool_round_robin(daemon_factory, stoppers) -> None:
    """A producer over two nsqds sends publishes to both in turn; each gets half."""
    nodes = [daemon_factory() for _ in range(2)]
    p = producer(stoppers, [n.tcp_address for n in nodes])
    p.start()
    await wait_until(lambda: len(p.connected) == 2, what="both connected")
    for i in range(10):
        await p.publish("pool", b"%d" % i)
    counts = []
    for n in nodes:
        data = await get_json(reactor, f"http://{n.http_address}/stats?format=json&topic=pool", 5.0)
        counts.append(data["topics"][0]["message_count"])
    assert counts == [5, 5]


@pytest_twisted.ensureDeferred
async def test_heartbeats_keep_an_idle_connection(nsqd, stoppers) -> None:
    """With a 1s heartbeat and a 1.5s read timeout, an idle consumer stays connected (it answers NOP)."""
    config = Config(heartbeat_interval=1.0, read_timeout=1.5)
    c = consumer(stoppers, "hb", Collector(), config=config, nsqd_tcp_addresses=[nsqd.tcp_address])
    await wait_until(lambda: c.connections)
    first = (await client_stats(nsqd, "hb", "c"))[0]["connect_ts"]
    await task.deferLater(reactor, 3.5)
    [client] = await client_stats(nsqd, "hb", "c")
    assert client["connect_ts"] == first and c.connections == [nsqd.tcp_address]
