"""Listening and connecting for every nsqtw daemon: Go's address syntax, endpoints, the start-up line."""

from __future__ import annotations

import signal
import socket
from typing import Any

from twisted.application.service import Service
from twisted.internet.defer import Deferred
from twisted.internet.endpoints import HostnameEndpoint
from twisted.internet.interfaces import IListeningPort, IStreamClientEndpoint, IStreamServerEndpoint

from nsqtw.log import Logger
from nsqtw.net.dispatch import direct_dispatch
from nsqtw.net.eager import EagerTCPServerEndpoint, speed_up_accepts


def split_host_port(address: str) -> tuple[str, int]:
    """``host:port``, ``[v6]:port`` or ``:port`` (all interfaces), as Go accepts them."""
    host, sep, port = address.rpartition(":")
    if not sep:
        raise ValueError(f"missing port in address {address!r}")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    return host, int(port)


def join_host_port(host: str, port: int | str) -> str:
    """Go's ``net.JoinHostPort``: brackets around a host with a colon (an IPv6 address)."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def listen_backlog() -> int:
    """The kernel's somaxconn, as Go's net.Listen uses for nsqd's listeners.

    Twisted's default backlog of 50 overflows when hundreds of clients
    connect at once (a reconnect storm after a restart): the kernel drops
    their SYNs and each one waits a second or more to retry.
    """
    try:
        with open("/proc/sys/net/core/somaxconn") as f:
            n = int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return socket.SOMAXCONN
    return max(1, min(n, 65535))


def server_endpoint(reactor: Any, address: str) -> IStreamServerEndpoint:
    """Listen on ``host:port`` (IPv4 or IPv6) with connections that send at once when idle.

    Every listener, TCP and HTTP, gets :mod:`nsqtw.net.eager`'s connections:
    an answer leaves within the reactor turn that made it, in one ``send``,
    instead of a turn later after two ``epoll_ctl`` calls.
    """
    host, port = split_host_port(address)
    return EagerTCPServerEndpoint(reactor, port, backlog=listen_backlog(), interface=host or "0.0.0.0")


def client_endpoint(reactor: Any, address: str, timeout: float) -> IStreamClientEndpoint:
    """An endpoint that connects to ``host:port`` (a name is resolved on each attempt)."""
    host, port = split_host_port(address)
    return HostnameEndpoint(reactor, host or "127.0.0.1", port, timeout=timeout)


def format_address(port: IListeningPort) -> str:
    addr = port.getHost()
    host = getattr(addr, "host", "")
    if ":" in host:
        host = f"[{host}]"
    return f"{host}:{getattr(addr, 'port', '')}"


class ListenerService(Service):
    """Listens on one address and logs nsqd's start-up line with the bound address.

    Tools that start nsqd on port 0 read ``TCP: listening on HOST:PORT`` from
    its log to learn the port, so the line carries the real address.
    """

    log = Logger()

    def __init__(self, label: str, endpoint: IStreamServerEndpoint, factory: Any,
                 on_bound: Any = None) -> None:
        self.label = label
        self.endpoint = endpoint
        self.factory = factory
        self.on_bound = on_bound
        self.port: IListeningPort | None = None
        self.ready: Deferred[IListeningPort] | None = None

    def startService(self) -> None:
        super().startService()  # type: ignore[no-untyped-call]
        self.ready = self.endpoint.listen(self.factory)
        self.ready.addCallbacks(self._bound, self._failed)

    def _bound(self, port: IListeningPort) -> IListeningPort:
        from twisted.internet import reactor

        self.port = port
        speed_up_accepts(port)
        direct_dispatch(reactor)  # once per reactor: the first listener does it
        # twistd starts services before the reactor runs and installs its signal
        # handlers; a harness that sends SIGTERM as soon as it reads this line
        # must find them installed (else the process dies of the signal, -15)
        reactor.callWhenRunning(
            self.log.info, "{label}: listening on {address}", label=self.label,
            address=format_address(port))
        if self.on_bound is not None:
            self.on_bound(getattr(port.getHost(), "port", 0))
        return port

    def _failed(self, failure: Any) -> None:
        from twisted.internet import reactor

        self.log.critical("FATAL: {label}: listen failed - {error}", label=self.label,
                          error=failure.getErrorMessage())
        reactor.stop()

    def stopService(self) -> Deferred[None] | None:
        super().stopService()  # type: ignore[no-untyped-call]
        if self.port is not None:
            port, self.port = self.port, None
            self.log.info("{label}: closing {address}", label=self.label, address=format_address(port))
            return port.stopListening()
        return None


def exit_cleanly_after_signal(reactor: Any) -> None:
    """nsqd and nsqlookupd exit 0 after a graceful SIGTERM/SIGINT.

    twistd would re-raise the signal (exit status -15) unless told the stop
    was handled.
    """
    if getattr(reactor, "_exitSignal", None) in (signal.SIGTERM, signal.SIGINT):
        reactor._exitSignal = None
