"""Assembly: NSQLookupd plus its TCP and HTTP listeners, as one twistd service."""

from __future__ import annotations

from typing import Any

from twisted.application.service import MultiService
from twisted.internet.defer import Deferred, ensureDeferred
from twisted.internet.protocol import Factory

from nsqtw import version_banner
from nsqtw.heap import keep_long_lived_old, release_free_heap
from nsqtw.log import Logger
from nsqtw.lookupd.lookupd import NSQLookupd
from nsqtw.lookupd.protocol import LookupFactory
from nsqtw.net.exit import exit_cleanly_after_signal
from nsqtw.net.lazy import FirstConnectionFactory
from nsqtw.net.listen import ListenerService, notify_ready_when_bound
from nsqtw.net.notify import notify

__all__ = ["LookupdService"]


class LookupdService(MultiService):
    """The daemon: ``TCP: listening on ...`` and ``HTTP: listening on ...`` like nsqlookupd."""

    log = Logger()

    def __init__(self, options: Any, reactor: Any = None) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        if reactor is None:
            from twisted.internet import reactor as default_reactor

            reactor = default_reactor
        self.reactor = reactor
        self.lookupd = NSQLookupd(options, reactor)
        ListenerService("TCP", options.tcp_address, LookupFactory(self.lookupd),  # type: ignore[no-untyped-call]
                        self._tcp_bound, program="nsqlookupd", reactor=reactor).setServiceParent(self)
        # the API (twisted.web, Klein) is imported and made at the first HTTP connection
        ListenerService("HTTP", options.http_address,  # type: ignore[no-untyped-call]
                        FirstConnectionFactory(self._http_site, "GoSite"), self._http_bound,
                        program="nsqlookupd", reactor=reactor).setServiceParent(self)

    def _http_site(self) -> Factory[Any]:
        """The HTTP listener's factory, made at its first connection."""
        from nsqtw.lookupd.http import LookupdHTTPAPI

        site = LookupdHTTPAPI(self.lookupd).site()
        site.noisy = False
        return site

    def _tcp_bound(self, port: int) -> None:
        self.lookupd.tcp_port = port

    def _http_bound(self, port: int) -> None:
        self.lookupd.http_port = port

    def startService(self) -> None:
        self.log.info("{banner}", banner=version_banner("nsqlookupd"))
        super().startService()  # type: ignore[no-untyped-call]
        keep_long_lived_old()  # registrations are long-lived
        notify_ready_when_bound(self.reactor, self)
        release_free_heap()  # what start-up freed goes back to the system

    def stopService(self) -> Deferred[None]:
        return ensureDeferred(self._stop())

    async def _stop(self) -> None:
        notify("STOPPING=1")
        await super().stopService()  # type: ignore[no-untyped-call]
        self.log.info("LOOKUPD: stopped")
        exit_cleanly_after_signal(self.reactor)
