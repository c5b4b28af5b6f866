"""FirstConnectionFactory: the real factory is made at the first connection and then does everything."""

from __future__ import annotations

from twisted.internet.address import IPv4Address
from twisted.internet.interfaces import ILoggingContext
from twisted.internet.protocol import Factory, Protocol
from twisted.trial.unittest import SynchronousTestCase

from nsqtw.net.lazy import FirstConnectionFactory

ADDR = IPv4Address("TCP", "127.0.0.1", 4151)


class RealFactory(Factory[Protocol]):
    protocol = Protocol
    noisy = False

    def __init__(self) -> None:
        self.started = 0
        self.stopped = 0

    def startFactory(self) -> None:
        self.started += 1

    def stopFactory(self) -> None:
        self.stopped += 1


class FirstConnectionFactoryTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.made: list[RealFactory] = []
        self.lazy = FirstConnectionFactory(self.make, "GoSite")

    def make(self) -> RealFactory:
        factory = RealFactory()
        self.made.append(factory)
        return factory

    def test_nothing_is_made_until_a_connection(self) -> None:
        """Listening (doStart) makes nothing; the first connection makes the real factory, once."""
        self.lazy.doStart()
        self.assertEqual(self.made, [])
        first = self.lazy.buildProtocol(ADDR)
        second = self.lazy.buildProtocol(ADDR)
        [real] = self.made
        self.assertIsInstance(first, Protocol)
        self.assertIs(first.factory, real)  # type: ignore[union-attr]
        self.assertIs(second.factory, real)  # type: ignore[union-attr]
        self.assertIsNot(first, second)

    def test_real_factory_is_started_and_stopped(self) -> None:
        """The real factory starts when made and stops with the listener, as if it had listened itself."""
        self.lazy.doStart()
        self.lazy.buildProtocol(ADDR)
        [real] = self.made
        self.assertEqual((real.started, real.stopped), (1, 0))
        self.lazy.doStop()
        self.assertEqual((real.started, real.stopped), (1, 1))

    def test_stop_without_a_connection_makes_nothing(self) -> None:
        """A listener that never had a connection stops without making the real factory."""
        self.lazy.doStart()
        self.lazy.doStop()
        self.assertEqual(self.made, [])

    def test_port_logs_the_real_factory_name(self) -> None:
        """Twisted's "... starting on PORT" line names the real factory, not the stand-in."""
        # what a port's _getLogPrefix asks of its factory
        self.assertTrue(ILoggingContext.providedBy(self.lazy))
        self.assertEqual(self.lazy.logPrefix(), "GoSite")
