"""The V2 listener's transport delivers every byte in order, eager or on the fallback path."""

from __future__ import annotations

import pytest
import pytest_twisted
from twisted.internet import defer, reactor
from twisted.internet.endpoints import TCP4ClientEndpoint
from twisted.internet.protocol import Factory, Protocol

from nsqtw.net import eager

CHUNKS = [bytes([i % 251]) * (1 + (i * 37) % 9000) for i in range(400)]


class Blaster(Protocol):
    """Writes every chunk at once on connect, then closes."""

    def connectionMade(self) -> None:
        for chunk in CHUNKS:
            self.transport.write(chunk)
        self.transport.loseConnection()


class Collector(Protocol):
    def __init__(self) -> None:
        self.data = bytearray()
        self.done: defer.Deferred[bytes] = defer.Deferred()

    def dataReceived(self, data: bytes) -> None:
        self.data += data

    def connectionLost(self, reason: object = None) -> None:
        self.done.callback(bytes(self.data))


@pytest.mark.parametrize("fallback", [False, True], ids=["eager", "fallback"])
@pytest_twisted.ensureDeferred
async def test_bytes_arrive_in_order(fallback: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every byte written arrives in order, whether or not Twisted's buffers are understood."""
    if fallback:
        monkeypatch.setattr(eager.EagerPort, "transport", eager._NoDelayServer)
    endpoint = eager.EagerTCPServerEndpoint(reactor, 0, interface="127.0.0.1")
    port = await endpoint.listen(Factory.forProtocol(Blaster))
    try:
        collector = Collector()
        client = TCP4ClientEndpoint(reactor, "127.0.0.1", port.getHost().port)
        await client.connect(Factory.forProtocol(lambda: collector))
        received = await collector.done
        assert received == b"".join(CHUNKS)
    finally:
        await port.stopListening()
