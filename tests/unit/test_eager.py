"""The eager V2 transport's reliance on Twisted's private write buffers, and its fallback."""

from __future__ import annotations

from twisted.internet import abstract
from twisted.trial.unittest import SynchronousTestCase

from nsqtw.net import eager


class TwistedBuffersTests(SynchronousTestCase):
    def test_installed_twisted_is_understood(self) -> None:
        """The installed Twisted keeps FileDescriptor's buffers as EagerServer reads them.

        If this fails, a Twisted release renamed or changed ``_tempDataLen``,
        ``offset``, ``dataBuffer`` or ``_writeDisconnected``: nsqtw still works
        (it falls back to Twisted's write path) but loses the eager send.
        """
        self.assertTrue(eager.twisted_buffers_understood(),
                        f"Twisted changed {eager.PRIVATE_ATTRIBUTES}: see nsqtw/net/eager.py")
        self.assertIs(eager.SERVER_CLASS, eager.EagerServer)
        self.assertIs(eager.EagerPort.transport, eager.EagerServer)

    def test_missing_attribute_is_detected(self) -> None:
        """A FileDescriptor without one of the attributes is not trusted."""

        class Renamed(abstract.FileDescriptor):
            def __init__(self, reactor: object = None) -> None:
                super().__init__(reactor)  # type: ignore[arg-type]
                del self._tempDataLen

        self.assertFalse(eager.twisted_buffers_understood(Renamed))

    def test_changed_meaning_is_detected(self) -> None:
        """A FileDescriptor whose buffered write does not show in ``_tempDataLen`` is not trusted."""

        class Different(abstract.FileDescriptor):
            def write(self, data: bytes) -> None:
                self.dataBuffer = data  # flushes differently: the counters mean something else

        self.assertFalse(eager.twisted_buffers_understood(Different))
