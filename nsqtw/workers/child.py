"""A worker process: forked by the fork server (:mod:`nsqtw.workers.forkserver`) from the loaded
core, it serves the V2 clients whose connections the core hands it.

It starts from the core's memory as it was when the fork server was forked:
every module it needs imported (this module imports them, so the core
importing it is the preload), the core's options, its TLS context. It must
not touch the core's reactor object (its epoll descriptor was the core's):
:func:`run` installs a reactor of its own in its place, logs to stderr,
and runs a small service tree (:class:`WorkerService`): the link to the
core, and the receiver of the connections the core hands over. The core's
STOP record, or the end of the link, stops the tree, which closes the
clients as nsqd does and exits.
"""

from __future__ import annotations

import itertools
import os
import socket
import sys
import time
import traceback
from typing import Any, NoReturn

import twisted.internet
from twisted.application.service import MultiService, Service
from twisted.internet.defer import Deferred, succeed
from twisted.internet.interfaces import IReadDescriptor
from twisted.logger import globalLogPublisher
from twisted.python.failure import Failure
from zope.interface import implementer

from nsqtw import log as nsqtw_log
from nsqtw.heap import keep_long_lived_old, return_big_blocks
from nsqtw.log import Logger
from nsqtw.net.busypoll import busy_poll_of
from nsqtw.net.eager import adopt_connection
from nsqtw.net.twisted_privates import log_observers
from nsqtw.protocol import compress  # noqa: F401 - preloaded: snappy and deflate in every worker
from nsqtw.protocol.auth import authorizer_for
from nsqtw.protocol.v2 import V2Factory
from nsqtw.workers import link
from nsqtw.workers.link import LinkFactory
from nsqtw.workers.remote import RemoteNode

#: how long a stopping worker waits for its clients' connections to close
CLOSE_WAIT = 5.0
#: a test hook: a worker waits, before it serves, until this file exists (tests/integration);
#: ``{index}`` in it is the worker's index, so a test can let workers start one by one
HOLD_ENV = "NSQTW_TEST_HOLD_WORKERS"

#: the reactor this process inherited from the core, kept referenced so nothing closes its
#: (closed, maybe reused) descriptor numbers again
_inherited: list[Any] = []


@implementer(IReadDescriptor)
class HandOffReceiver(Service):
    """The worker's end of its hand-off socket: each message carries one accepted TCP
    connection (``SCM_RIGHTS``), served as the listener's own connections are."""

    log = Logger()

    def __init__(self, node: RemoteNode, reactor: Any, sock: socket.socket) -> None:
        self.node = node
        self.reactor = reactor
        self.sock = sock
        self.factory = V2Factory(node, reactor)
        self._sessions = itertools.count(1)

    def startService(self) -> None:
        super().startService()  # type: ignore[no-untyped-call]
        self.reactor.addReader(self)
        self.node.send(link.encode(link.READY))

    def stopService(self) -> None:
        super().stopService()  # type: ignore[no-untyped-call]
        if self.sock.fileno() >= 0:
            self.reactor.removeReader(self)
            self.sock.close()

    def fileno(self) -> int:
        return self.sock.fileno()

    def logPrefix(self) -> str:
        return "HandOff"

    def doRead(self) -> None:
        while self.sock.fileno() >= 0:
            try:
                data, fds, _, _ = socket.recv_fds(self.sock, 16, 1)
            except (BlockingIOError, InterruptedError):
                return
            if not data:  # the core is gone: the link's end stops this worker
                self.reactor.removeReader(self)
                self.sock.close()
                return
            for fd in fds:
                try:
                    conn = adopt_connection(self.reactor, fd, self.factory, next(self._sessions))
                finally:
                    os.close(fd)
                if conn is None:
                    self.node.send(link.encode(link.DROPPED))

    def connectionLost(self, reason: Failure) -> None:
        if self.sock.fileno() >= 0:
            self.sock.close()


class LinkService(Service):
    """The worker's link to the core, adopted from its socket."""

    def __init__(self, node: RemoteNode, reactor: Any, sock: socket.socket) -> None:
        self.node = node
        self.reactor = reactor
        self.sock = sock

    def startService(self) -> None:
        super().startService()  # type: ignore[no-untyped-call]
        self.reactor.adoptStreamConnection(self.sock.fileno(), socket.AF_UNIX, LinkFactory(self.node.link))
        self.sock.close()

    def stopService(self) -> None:
        super().stopService()  # type: ignore[no-untyped-call]
        self.node.link.flush()  # what the clients' last records said, before the process ends


class WorkerService(MultiService):
    """One worker: the link first, the hand-off receiver after (so it stops first: no new
    connection arrives while the clients close)."""

    def __init__(self, node: RemoteNode, reactor: Any, link_sock: socket.socket,
                 handoff_sock: socket.socket) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.node = node
        self.reactor = reactor
        LinkService(node, reactor, link_sock).setServiceParent(self)  # type: ignore[no-untyped-call]
        self.receiver = HandOffReceiver(node, reactor, handoff_sock)
        self.receiver.setServiceParent(self)  # type: ignore[no-untyped-call]

    def stopService(self) -> Deferred[None]:
        # no new connection from now on; the clients were closed as the core asked (STOP)
        self.receiver.stopService()
        d = self.node.idle(CLOSE_WAIT)
        d.addCallback(lambda _: MultiService.stopService(self))
        return d


def run(options: Any, tls: Any, index: int, fds: list[int]) -> NoReturn:
    """The worker, in the process the fork server just forked; never returns."""
    code = 0
    try:
        _serve(options, tls, index, fds)
    except BaseException:
        traceback.print_exc()
        code = 1
    finally:
        try:
            nsqtw_log.flush_direct()
            sys.stderr.flush()
        finally:
            os._exit(code)


def _fresh_reactor() -> Any:
    """Install a new reactor of the core's reactor's class in place of the inherited one."""
    old: Any = sys.modules.pop("twisted.internet.reactor", None)
    if old is not None:
        _inherited.append(old)
        if hasattr(twisted.internet, "reactor"):
            del twisted.internet.reactor
    from twisted.internet.main import installReactor

    made: Any = type(old)() if old is not None else None
    if made is None:
        from nsqtw.net.reactor import install_for_daemon

        install_for_daemon()
    else:
        installReactor(made)
    from twisted.internet import reactor

    return reactor


def _serve(options: Any, tls: Any, index: int, fds: list[int]) -> None:
    link_fd, handoff_fd = fds[0], fds[1]
    link_sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM, 0, link_fd)
    handoff_sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET, 0, handoff_fd)
    handoff_sock.setblocking(False)
    r = _fresh_reactor()
    if len(fds) > 2:  # the core's log is not stderr: events go to the core, which logs them
        nsqtw_log.relay_to_core(r, fds[2], log_observers(globalLogPublisher))
    else:
        nsqtw_log.log_to_stderr(r)
    hold = os.environ.get(HOLD_ENV, "").replace("{index}", str(index))
    while hold and not os.path.exists(hold):
        time.sleep(0.01)
    node = RemoteNode(options, r, index)
    node.tls = tls
    node.auth = authorizer_for(options, r)
    poll = busy_poll_of(r)
    if poll is not None:
        poll.limit = options.busy_poll
    keep_long_lived_old()
    return_big_blocks()
    service = WorkerService(node, r, link_sock, handoff_sock)

    def stop() -> None:
        d: Deferred[Any] = succeed(None) if not service.running else service.stopService()
        d.addBoth(lambda _: r.callLater(0, r.stop))

    node.on_stop = stop
    r.callWhenRunning(service.startService)
    r.run(installSignalHandlers=False)
