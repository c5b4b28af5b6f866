"""The core's worker processes (``--workers=N``): forked from the loaded core, handed the node's
TCP connections one by one, restarted when they die, stopped before the core flushes.

- In ``privilegedStartService`` (twistd has daemonized; no listener is bound
  and no thread runs yet) the pool imports what a worker needs, freezes the
  heap and forks the fork server (:mod:`nsqtw.workers.forkserver`), which
  forks each worker on request: the workers share the core's pages.
- The core binds the TCP address as one process does (the same log line,
  the same errors), and accepts on it itself, only while some worker is
  ready: each connection goes, as a descriptor over that worker's hand-off
  socket (``SCM_RIGHTS``), to the ready worker holding the fewest (ties
  in turn); the core closes its copy. At the start connections wait in the
  kernel's backlog until every worker is ready (``HTTP_HOLD`` at most), so
  the first clients are spread over all of them, not all given to the
  first worker ready; after that, while at least one worker is ready.
- ``serving`` fires once every worker said READY: only then does ``/ping``
  answer OK and the service manager hear ``READY=1``.
- Until then the HTTP and HTTPS listeners (gated by ``http_gate``) are
  bound but not read either: a request made as soon as the ``listening on``
  lines are out (client libraries' test harnesses do that: gnsq's pings at
  once) waits in the backlog and is answered by a ready node, as Go nsqd's,
  whose listeners are served from the start. The wait is bounded
  (``HTTP_HOLD``): workers that cannot start leave ``/ping`` answering
  ``500 NOK - worker processes starting`` after it.
"""

from __future__ import annotations

import os
import signal
import socket
from functools import partial
from typing import Any

from twisted.application.service import Service
from twisted.internet.defer import Deferred, DeferredList
from twisted.internet.interfaces import IReadDescriptor
from twisted.internet.protocol import Factory, Protocol, connectionDone
from twisted.python.failure import Failure
from zope.interface import implementer

from nsqtw import log as nsqtw_log
from nsqtw.core.nsqd import NSQD
from nsqtw.log import Logger
from nsqtw.net.exit import fail_start
from nsqtw.net.listen import ListenerService
from nsqtw.workers.forkserver import ForkServer
from nsqtw.workers.link import LinkFactory
from nsqtw.workers.peer import WorkerPeer

#: how long a stopping worker may take to close its clients before it is killed
STOP_TIMEOUT = 10.0
#: the link's socket send buffer asked for, each way
LINK_BUFFER = 4 * 1024 * 1024
#: the wait before a worker that died is started again (a worker that dies at once, again
#: and again, costs a process start a second, not a loop)
RESTART_DELAY = 1.0
#: the most connections the core accepts in one reactor turn
ACCEPTS_PER_TURN = 64
#: /ping's answer (and /stats' health) until every worker is ready
STARTING = "worker processes starting"
#: the longest the HTTP listeners wait for every worker's READY before they answer anyway
HTTP_HOLD = 5.0


class WorkerLog(Protocol):
    """The core's end of a worker's log: each line it sends is logged here (``emit_relayed``)."""

    #: a longer line (a huge traceback) is logged in pieces of this length
    MAX_LENGTH = 1 << 20

    def __init__(self, index: int) -> None:
        self.source = f"WORKER({index})"
        self._partial = b""

    def dataReceived(self, data: bytes) -> None:
        *lines, self._partial = (self._partial + data).split(b"\n")
        if len(self._partial) > self.MAX_LENGTH:
            lines.append(self._partial)
            self._partial = b""
        for line in lines:
            nsqtw_log.emit_relayed(line.decode("utf-8", "backslashreplace"), self.source)

    def connectionLost(self, reason: Failure = connectionDone) -> None:
        if self._partial:  # the worker's last words, without their newline
            self.dataReceived(b"\n")


class WorkerLogFactory(Factory):
    """Makes the :class:`WorkerLog` of worker ``index``."""

    noisy = False

    def __init__(self, index: int) -> None:
        self.index = index

    def buildProtocol(self, addr: Any) -> WorkerLog:
        return WorkerLog(self.index)


class _Worker:
    """One worker as the pool sees it: its link's peer, its hand-off socket, its process."""

    def __init__(self, index: int, peer: WorkerPeer, handoff: socket.socket) -> None:
        self.index = index
        self.peer = peer
        self.handoff = handoff
        self.pid: int | None = None
        #: fires when its process ended
        self.ended: Deferred[None] = Deferred()


@implementer(IReadDescriptor)
class _Acceptor:
    """Accepts on the node's TCP socket (a duplicate of the listener's) and hands each connection
    to the pool; read only while some worker is ready."""

    def __init__(self, sock: socket.socket, hand: Any) -> None:
        self.sock = sock
        self.hand = hand

    def fileno(self) -> int:
        return self.sock.fileno()

    def logPrefix(self) -> str:
        return "Acceptor"

    def doRead(self) -> None:
        for _ in range(ACCEPTS_PER_TURN):
            try:
                conn, _ = self.sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError:  # ECONNABORTED, EMFILE: the next turn tries again
                return
            with conn:
                if not self.hand(conn.fileno()):
                    return

    def connectionLost(self, reason: Failure) -> None:
        pass


class WorkerPool(Service):
    """``--workers=N``: N worker processes serving the TCP clients of the core's node."""

    log = Logger()

    def __init__(self, nsqd: NSQD, options: Any, reactor: Any, listener: ListenerService) -> None:
        self.nsqd = nsqd
        self.options = options
        self.reactor = reactor
        self.listener = listener
        self.count = int(options.workers)
        self.fork_server: ForkServer | None = None
        self.workers: dict[int, _Worker] = {}
        #: fires once every worker has said READY (``/ping`` OK, ``READY=1``)
        self.serving: Deferred[None] = Deferred()
        self._acceptor: _Acceptor | None = None
        self._reading = False
        self._turn = 0
        #: fires once every worker is ready, ``HTTP_HOLD`` seconds after the start at the latest,
        #: or at the stop: the HTTP(S) listeners read their connections only from then on, and the
        #: core accepts TCP connections only from then on too
        self.http_gate: Deferred[None] = Deferred()
        self._hold_timer: Any = None

    def _open_gate(self) -> None:
        if self._hold_timer is not None and self._hold_timer.active():
            self._hold_timer.cancel()
        self._hold_timer = None
        if not self.http_gate.called:
            self.http_gate.callback(None)
        self._read_if_ready()

    def privilegedStartService(self) -> None:
        super().privilegedStartService()  # type: ignore[no-untyped-call]
        # the workers' modules, imported here: the fork server and its workers share them
        from nsqtw.workers import child

        run = partial(child.run, self.options, self.nsqd.tls)
        self.fork_server = ForkServer.start(lambda index, fds: run(index, fds), self.reactor)

    def startService(self) -> None:
        super().startService()  # type: ignore[no-untyped-call]
        if self.fork_server is None:  # started without twistd's privileged step (tests)
            self.privilegedStartService()
        assert self.fork_server is not None
        self.nsqd.set_health("workers", STARTING, quiet=True)
        self._hold_timer = self.reactor.callLater(HTTP_HOLD, self._open_gate)
        self.fork_server.on_started = self._started
        self.fork_server.on_exited = self._exited
        self.fork_server.on_lost = self._fork_server_lost
        self.fork_server.attach(self.reactor)
        assert self.listener.ready is not None, "the TCP listener starts first"
        self.listener.ready.addCallback(self._bound)

    def _bound(self, port: Any) -> Any:
        if port is None or not self.running:
            return port
        # the core accepts, and only while a worker is ready; the listener keeps the socket bound
        port.stopReading()
        sock = socket.socket(fileno=os.dup(port.fileno()))
        sock.setblocking(False)
        self._acceptor = _Acceptor(sock, self._hand)
        for index in range(self.count):
            self._start(index)
        return port

    def _start(self, index: int) -> None:
        if not self.running or self.fork_server is None or self.fork_server.closed:
            return
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        for end in (ours, theirs):
            # deliveries outrun a busy worker: a deeper buffer takes a turn's frames in one
            # sendmsg where the default's 208 KiB fills and the rest takes Twisted's slower path
            # (the kernel caps it at net.core.wmem_max)
            end.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, LINK_BUFFER)
        hand_ours, hand_theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        hand_ours.setblocking(False)
        peer = WorkerPeer(self.nsqd, self.reactor, index)
        peer.on_ready = self._ready
        self.reactor.adoptStreamConnection(ours.fileno(), socket.AF_UNIX, LinkFactory(peer.link))
        ours.close()
        self.workers[index] = _Worker(index, peer, hand_ours)
        given = [theirs, hand_theirs]
        if not nsqtw_log.logs_to_stderr():
            # the log is the core's alone (a file twistd rotates, a daemon's, syslog): the worker
            # sends its events here, to be logged as its own (nsqtw.log.relay_to_core)
            log_ours, log_theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
            self.reactor.adoptStreamConnection(log_ours.fileno(), socket.AF_UNIX, WorkerLogFactory(index))
            log_ours.close()
            given.append(log_theirs)
        self.fork_server.fork(index, [end.fileno() for end in given])
        for end in given:
            end.close()

    def _started(self, index: int, pid: int) -> None:
        worker = self.workers.get(index)
        if worker is not None and worker.pid is None:
            worker.pid = pid
            self.log.info("WORKER({index}): started, pid {pid}", index=index, pid=pid)

    def _ready(self, peer: WorkerPeer) -> None:
        if all(w.peer.ready for w in self.workers.values()) and len(self.workers) == self.count:
            if not self.serving.called:
                self.nsqd.set_health("workers", None, quiet=True)
                self._open_gate()
                self.serving.callback(None)
        self._read_if_ready()

    def _read_if_ready(self) -> None:
        """Accept while some worker is ready; leave connections in the backlog otherwise."""
        if self._acceptor is None:
            return
        # at the start, not before every worker is ready (or the hold is over): the first worker
        # ready would take every connection waiting in the backlog (64 of 64 were seen)
        want = bool(self.running) and self.http_gate.called and any(w.peer.ready for w in self.workers.values())
        if want and not self._reading:
            self.reactor.addReader(self._acceptor)
        elif not want and self._reading:
            self.reactor.removeReader(self._acceptor)
        self._reading = want

    def _hand(self, fd: int) -> bool:
        """Hand the accepted connection ``fd`` to the ready worker with the fewest (ties in turn);
        the caller closes the core's copy. False when no worker could take it."""
        ready = sorted((w for w in self.workers.values() if w.peer.ready), key=lambda w: w.index)
        n = len(ready)
        start = self._turn
        # the fewest first; among equals, the first at or after the turn's index
        for worker in sorted(ready, key=lambda w: (w.peer.connections, (w.index - start) % self.count)):
            try:
                socket.send_fds(worker.handoff, [b"c"], [fd])
            except OSError as e:  # its hand-off queue is full (a stuck worker), or it is gone
                self.log.warn("WORKER({index}): could not hand it a connection - {error}",
                              index=worker.index, error=e)
                continue
            worker.peer.connections += 1
            self._turn = (worker.index + 1) % self.count
            return True
        return n > 0  # none took it: it is closed; with none ready, stop accepting

    def _exited(self, pid: int, status: int) -> None:
        for index, worker in list(self.workers.items()):
            if worker.pid == pid:
                self._ended(index, _describe(status))
                return

    def _ended(self, index: int, why: str) -> None:
        """A worker's process ended: expected when stopping, else started again."""
        worker = self.workers.pop(index, None)
        if worker is None:
            return
        # its clients' in-flight messages go back to their channels now, whether or not
        # the link reported its end yet
        worker.peer.ready = False
        worker.peer.lost(Failure(ConnectionError(why)))
        worker.handoff.close()
        self._read_if_ready()
        worker.ended.callback(None)
        if self.running:
            self.log.error("WORKER({index}): exited ({why}) - starting it again", index=index, why=why)
            self.reactor.callLater(RESTART_DELAY, self._start, index)

    def _fork_server_lost(self) -> None:
        """The fork server died while the core lives (someone killed it): its workers died with
        it. The core cannot fork new ones safely from a process with threads, so the node stops
        (exit status 1) for its supervisor to start again."""
        for index in list(self.workers):
            self._ended(index, "its fork server is gone")
        if self.running:
            fail_start(self.reactor, "worker processes: the fork server exited; TCP clients cannot be served")

    def stopService(self) -> Deferred[Any]:
        super().stopService()  # type: ignore[no-untyped-call]
        self._open_gate()
        self._read_if_ready()
        if self._acceptor is not None:
            self._acceptor.sock.close()
        waits = []
        for worker in list(self.workers.values()):
            worker.peer.stop()
            timer = self.reactor.callLater(STOP_TIMEOUT, _kill, worker.pid)
            worker.ended.addBoth(_cancel, timer)
            waits.append(worker.ended)
            # and everything on its link read: publishes it answered are in the core before it flushes
            waits.append(worker.peer.done)
        done = DeferredList(waits)
        done.addBoth(self._close_fork_server)
        return done

    def _close_fork_server(self, result: object) -> object:
        if self.fork_server is not None:
            self.fork_server.close()
        return result


def _describe(status: int) -> str:
    if os.WIFSIGNALED(status):
        return f"killed by signal {os.WTERMSIG(status)}"
    return f"exit status {os.waitstatus_to_exitcode(status)}"


def _kill(pid: int | None) -> None:
    if pid is None:
        return
    try:
        os.kill(pid, signal.SIGKILL)
    except OSError:  # already gone
        pass


def _cancel(result: object, timer: Any) -> object:
    if timer.active():
        timer.cancel()
    return result
