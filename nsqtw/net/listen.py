"""Listening and connecting for every nsqtw daemon: Go's address syntax, endpoints, the start-up line."""

from __future__ import annotations

import socket
from collections.abc import Iterable
from typing import Any

from twisted.application.service import Service
from twisted.internet.defer import Deferred, fail, gatherResults
from twisted.internet.endpoints import HostnameEndpoint
from twisted.internet.error import CannotListenError
from twisted.internet.interfaces import IListeningPort, IStreamClientEndpoint, IStreamServerEndpoint
from twisted.python.failure import Failure

from nsqtw import log
from nsqtw.log import Logger
from nsqtw.net import launch
from nsqtw.net.eager import EagerTCPServerEndpoint
from nsqtw.net.exit import fail_start, process_exit
from nsqtw.net.notify import notify


def split_host_port(address: str) -> tuple[str, int]:
    """``host:port``, ``[v6]:port`` or ``:port`` (all interfaces), as Go accepts them.

    A malformed address raises ValueError with Go's words (``address X:
    missing port in address``, ``address X: invalid port``).
    """
    host, sep, port = address.rpartition(":")
    if not sep:
        raise ValueError(f"address {address}: missing port in address")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if not port:
        return host, 0  # Go: an empty port picks one, as 0 does
    if not (port.isascii() and port.isdigit()) or int(port) > 65535:
        raise ValueError(f"address {port}: invalid port")
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
    return join_host_port(getattr(addr, "host", ""), getattr(addr, "port", ""))


def listen_error(address: str, error: object) -> str:
    """Why a listener could not open, in Go's words (``listen tcp ADDR: bind: address already in use``)."""
    if isinstance(error, CannotListenError) and isinstance(error.socketError, OSError):
        cause = error.socketError
        reason = (cause.strerror or str(cause)).lower()
        if isinstance(cause, socket.gaierror):
            return f"listen tcp: lookup {error.interface}: {reason}"
        return f"listen tcp {address}: bind: {reason}"
    return f"listen tcp: {error}"


class ListenerService(Service):
    """Listens on one address and logs nsqd's start-up line with the bound address.

    Tools that start nsqd on port 0 read ``TCP: listening on HOST:PORT`` from
    its log to learn the port, so the line carries the real address. An
    address that cannot be listened on (malformed, out of range, a name
    that does not resolve, a port taken) ends the process: one FATAL line
    naming the address, exit status 1 (:mod:`nsqtw.net.exit`), as
    ``program`` (nsqd, nsqlookupd, nsqadmin) would. With ``gate``, the bound
    port is not read until that Deferred fires: its connections wait in the
    backlog (nsqd's HTTP listeners while ``--workers`` start).
    """

    log = Logger()

    def __init__(self, label: str, address: str, factory: Any, on_bound: Any = None, *,
                 program: str, reactor: Any, gate: Deferred[None] | None = None) -> None:
        self.label = label
        self.address = address
        self.factory = factory
        self.on_bound = on_bound
        self.program = program
        self.reactor = reactor
        self.gate = gate
        self.port: IListeningPort | None = None
        #: fires once the listener is bound (with its port) or failed (with None)
        self.ready: Deferred[IListeningPort | None] | None = None

    def startService(self) -> None:
        super().startService()  # type: ignore[no-untyped-call]
        try:
            listening: Deferred[IListeningPort] = server_endpoint(self.reactor, self.address).listen(self.factory)
        except ValueError as e:  # a malformed address
            listening = fail(e)
        self.ready = listening.addCallbacks(self._bound, self._failed)

    def _bound(self, port: IListeningPort) -> IListeningPort:
        reactor = self.reactor
        self.port = port
        if self.gate is not None and not self.gate.called:
            port.stopReading()  # type: ignore[attr-defined]
            self.gate.addCallback(self._open, port)
        # twistd starts services before the reactor runs and installs its signal
        # handlers; a harness that sends SIGTERM as soon as it reads this line
        # must find them installed (else the process dies of the signal, -15)
        reactor.callWhenRunning(self._log_listening, format_address(port))
        if self.on_bound is not None:
            self.on_bound(getattr(port.getHost(), "port", 0))
        return port

    def _open(self, result: object, port: Any) -> object:
        if self.port is port:  # still listening
            port.startReading()  # type: ignore[union-attr]
        return result

    def _log_listening(self, address: str) -> None:
        if process_exit.status is None:  # no line for a port that closes at once: another listener failed
            self.log.info("{label}: listening on {address}", label=self.label, address=address)

    def _failed(self, failure: Failure) -> None:
        # nsqd: "failed to instantiate nsqd - listen (ADDR) failed - listen tcp ADDR: bind: ..."
        fail_start(self.reactor, f"failed to instantiate {self.program} - listen ({self.address}) failed"
                                 f" - {listen_error(self.address, failure.value)}")

    def stopService(self) -> Deferred[None] | None:
        super().stopService()  # type: ignore[no-untyped-call]
        if self.port is not None:
            port, self.port = self.port, None
            self.log.info("{label}: closing {address}", label=self.label, address=format_address(port))
            return port.stopListening()
        return None


def notify_ready_when_bound(reactor: Any, services: Iterable[Any]) -> Deferred[Any]:
    """Tell the service manager ``READY=1`` once every listener among ``services`` is bound,
    and every service with a ``serving`` Deferred (nsqd's worker processes) serves.

    The start is settled once every listener is bound: under ``twistd -n``
    the start-up lines (the ``listening on`` lines among them) are written
    out then, while worker processes may still be starting (connections
    wait for them: the TCP ones in the kernel's backlog, the HTTP ones in
    the listener's, the worker pool's ``http_gate``). A daemonized
    start's launching process exits 0 with ``READY=1``
    (:mod:`nsqtw.net.launch`).

    Sent when the reactor runs (the listeners answer), and never when one
    of them failed: that process is on its way out with status 1.
    """
    services = list(services)
    listeners = [s for s in services if isinstance(s, ListenerService)]
    serving = [s.serving for s in services if isinstance(getattr(s, "serving", None), Deferred)]

    def bound() -> bool:
        return process_exit.status is None and all(s.port is not None for s in listeners)

    def all_bound(_: object) -> None:
        if bound():
            log.start_settled(failed=False)

    def all_serving(_: object) -> None:
        if bound():
            notify("READY=1")
            launch.started()

    listening = gatherResults([s.ready for s in listeners if s.ready is not None])
    listening.addCallback(lambda _: reactor.callWhenRunning(all_bound, None))
    done = gatherResults([listening] + serving)
    return done.addCallback(lambda _: reactor.callWhenRunning(all_serving, None))
