"""The core's worker processes (``--workers=N``): started on the node's TCP socket, restarted when
they die, stopped before the core flushes.

The core binds the TCP address as one process does (the same log line,
the same errors), then stops accepting on it: each worker is handed the
listening socket and accepts from it, and a link (a Unix socket pair) to
the core. Workers are separate interpreters (``python -m
nsqtw.workers.child``), started with the core's own options and the same
``nsqtw`` package, and killed by the kernel if the core dies
(``PR_SET_PDEATHSIG``).
"""

from __future__ import annotations

import base64
import os
import pickle
import socket
import sys
from typing import Any

from twisted.application.service import Service
from twisted.internet.defer import Deferred, DeferredList
from twisted.internet.protocol import ProcessProtocol
from twisted.python.failure import Failure

import nsqtw
from nsqtw.core.nsqd import NSQD
from nsqtw.log import Logger
from nsqtw.net.listen import ListenerService
from nsqtw.workers.link import LinkFactory
from nsqtw.workers.peer import WorkerPeer

#: the environment variable that carries the core's options to a worker
OPTIONS_ENV = "NSQTW_WORKER_OPTIONS"
#: a worker's file descriptors: the node's listening TCP socket, its link to the core
LISTEN_FD, LINK_FD = 3, 4
#: how long a stopping worker may take to close its clients before it is killed
STOP_TIMEOUT = 10.0
#: the link's socket send buffer asked for, each way
LINK_BUFFER = 4 * 1024 * 1024

#: the wait before a worker that died is started again (a worker that dies at once, again
#: and again, costs a process start a second, not a loop)
RESTART_DELAY = 1.0


def encode_options(options: Any) -> str:
    return base64.b64encode(pickle.dumps(options)).decode("ascii")


def decode_options(text: str) -> Any:
    return pickle.loads(base64.b64decode(text))  # noqa: S301 - written by the core, our parent


class _WorkerProcess(ProcessProtocol):
    """One worker's process: tells the pool when it ended."""

    def __init__(self, pool: WorkerPool, index: int) -> None:
        self.pool = pool
        self.index = index
        self.ended: Deferred[None] = Deferred()

    def processEnded(self, reason: Failure) -> None:
        self.pool.ended(self.index, reason)
        self.ended.callback(None)


class WorkerPool(Service):
    """``--workers=N``: N worker processes serving the TCP clients of the core's node."""

    log = Logger()

    def __init__(self, nsqd: NSQD, options: Any, reactor: Any, listener: ListenerService) -> None:
        self.nsqd = nsqd
        self.options = options
        self.reactor = reactor
        self.listener = listener
        self.count = int(options.workers)
        self._fd: int | None = None
        #: the running workers: their link's peer and process
        self.workers: dict[int, tuple[WorkerPeer, _WorkerProcess, Any]] = {}

    def startService(self) -> None:
        super().startService()  # type: ignore[no-untyped-call]
        assert self.listener.ready is not None, "the TCP listener starts first"
        self.listener.ready.addCallback(self._bound)

    def _bound(self, port: Any) -> Any:
        if port is None or not self.running:
            return port
        # the workers accept; the core keeps the socket open and bound for them, never reading it
        port.stopReading()
        self._fd = port.fileno()
        for index in range(self.count):
            self._start(index)
        return port

    def _start(self, index: int) -> None:
        if not self.running or self._fd is None:
            return
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        for end in (ours, theirs):
            # deliveries outrun a busy worker: a deeper buffer takes a turn's frames in one
            # sendmsg where the default's 208 KiB fills and the rest takes Twisted's slower path
            # (the kernel caps it at net.core.wmem_max)
            end.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, LINK_BUFFER)
        peer = WorkerPeer(self.nsqd, self.reactor, index)
        self.reactor.adoptStreamConnection(ours.fileno(), socket.AF_UNIX, LinkFactory(peer.link))
        ours.close()
        env = dict(os.environ)
        env[OPTIONS_ENV] = encode_options(self.options)
        # the same nsqtw as the core's, whatever the interpreter's own path would find
        root = os.path.dirname(os.path.dirname(os.path.abspath(nsqtw.__file__)))
        env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH", "")) if p)
        process = _WorkerProcess(self, index)
        transport = self.reactor.spawnProcess(
            process, sys.executable, [sys.executable, "-m", "nsqtw.workers.child", str(index)], env=env,
            childFDs={1: 1, 2: 2, LISTEN_FD: self._fd, LINK_FD: theirs.fileno()})
        theirs.close()
        self.workers[index] = (peer, process, transport)
        self.log.info("WORKER({index}): started, pid {pid}", index=index, pid=transport.pid)

    def ended(self, index: int, reason: Failure) -> None:
        """A worker's process ended: expected when stopping, else started again."""
        entry = self.workers.pop(index, None)
        if entry is not None:
            # its clients' in-flight messages go back to their channels now, whether or not
            # the link reported its end yet
            entry[0].lost(reason)
        if self.running:
            self.log.error("WORKER({index}): exited ({why}) - starting it again",
                           index=index, why=reason.getErrorMessage())
            self.reactor.callLater(RESTART_DELAY, self._start, index)

    def stopService(self) -> Deferred[Any]:
        super().stopService()  # type: ignore[no-untyped-call]
        waits = []
        for peer, process, transport in list(self.workers.values()):
            peer.stop()
            timer = self.reactor.callLater(STOP_TIMEOUT, _kill, transport)
            process.ended.addBoth(_cancel, timer)
            waits.append(process.ended)
            # and everything on its link read: publishes it answered are in the core before it flushes
            waits.append(peer.done)
        return DeferredList(waits)


def _kill(transport: Any) -> None:
    try:
        transport.signalProcess("KILL")
    except Exception:  # already gone
        pass


def _cancel(result: object, timer: Any) -> object:
    if timer.active():
        timer.cancel()
    return result
