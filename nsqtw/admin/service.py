"""Assembly: the admin's HTTP listener, its cluster client and the history poller, as one twistd service."""

from __future__ import annotations

from typing import Any

from twisted.application.service import MultiService
from twisted.internet.defer import Deferred, ensureDeferred

from nsqtw import version_banner
from nsqtw.admin.client import AdminHTTPClient, client_tls_policy
from nsqtw.admin.cluster import ClusterInfo
from nsqtw.admin.history import History
from nsqtw.admin.http import AdminHTTPAPI
from nsqtw.admin.options import AdminOptions
from nsqtw.log import Logger
from nsqtw.net.exit import exit_cleanly_after_signal
from nsqtw.net.listen import ListenerService, notify_ready_when_bound
from nsqtw.net.notify import notify

__all__ = ["AdminService"]


class AdminService(MultiService):
    """The daemon: ``HTTP: listening on ...`` like nsqadmin, then the pages and the API."""

    log = Logger()

    def __init__(self, options: AdminOptions, reactor: Any = None) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        if reactor is None:
            from twisted.internet import reactor as default_reactor

            reactor = default_reactor
        self.reactor = reactor
        self.options = options
        self.client = AdminHTTPClient(
            reactor, options.http_client_connect_timeout, options.http_client_request_timeout,
            client_tls_policy(options), user_agent="nsqadmin/v1.3.0 (nsqtw)")
        self.cluster = ClusterInfo(self.client, reactor)
        self.history: History | None = None
        if options.history_interval > 0:
            self.history = History(reactor, options.history_interval, options.history_window,
                                   self._poll)
        self.api = AdminHTTPAPI(options, self.client, self.cluster, self.history, reactor)
        site = self.api.site()
        site.noisy = False
        ListenerService("HTTP", options.http_address, site,  # type: ignore[no-untyped-call]
                        program="nsqadmin", reactor=reactor).setServiceParent(self)

    async def _poll(self) -> list[dict[str, Any]]:
        """One history sample: every node's topics and channels, without clients."""
        producers, _ = await self.cluster.producers(self.api.lookupds, self.api.nsqds)
        entries, _ = await self.cluster.nsqd_stats(producers, include_clients=False)
        return entries

    def startService(self) -> None:
        self.log.info("{banner}", banner=version_banner("nsqadmin"))
        super().startService()  # type: ignore[no-untyped-call]
        notify_ready_when_bound(self.reactor, self)
        if self.history is not None:
            self.history.start()

    def stopService(self) -> Deferred[None]:
        return ensureDeferred(self._stop())

    async def _stop(self) -> None:
        notify("STOPPING=1")
        if self.history is not None:
            self.history.stop()
        await super().stopService()  # type: ignore[no-untyped-call]
        await self.client.close()
        exit_cleanly_after_signal(self.reactor)
