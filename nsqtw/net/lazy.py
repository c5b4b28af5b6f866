"""A listener's factory made at the listener's first connection, not at start-up.

The HTTP listeners serve with the HTTP API's modules and twisted.web's HTTP
channel, which a node nobody has sent an HTTP request yet never uses (and
twisted.web's server, Klein and werkzeug come later still, when a request
first needs them: :class:`nsqtw.http.base.GoSite`).
:class:`FirstConnectionFactory` listens in the real factory's place and
makes it (importing what it needs) when the first connection is accepted;
from then on every connection is the real factory's, exactly as if it had
listened itself (``docs/performance.md``, Memory).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from twisted.internet.interfaces import IAddress
from twisted.internet.protocol import Factory

__all__ = ["FirstConnectionFactory"]


class FirstConnectionFactory(Factory[Any]):
    """Stands in for the factory ``make()`` returns until the first connection, which makes it.

    The real factory is started (``doStart``) as it is made and stopped
    when this one stops, as a port would have done. ``log_prefix`` is the
    real factory's, so Twisted's ``... starting on PORT`` line reads the same.
    """

    noisy = False

    def __init__(self, make: Callable[[], Factory[Any]], log_prefix: str) -> None:
        self._make = make
        self._log_prefix = log_prefix
        #: the real factory, once a connection asked for it
        self.made: Factory[Any] | None = None

    def logPrefix(self) -> str:
        return self._log_prefix

    def real(self) -> Factory[Any]:
        """The real factory: made and started on the first call."""
        if self.made is None:
            factory = self._make()
            factory.doStart()
            self.made = factory
        return self.made

    def buildProtocol(self, addr: IAddress | None) -> Any:
        return self.real().buildProtocol(addr)

    def stopFactory(self) -> None:
        if self.made is not None:
            self.made.doStop()
