"""The fork server: a small process forked from the loaded core that forks the workers.

The core forks it once, in ``privilegedStartService`` (after twistd
daemonized, before any listener binds or any thread starts), with every
module a worker needs imported and the heap frozen (``gc.freeze``): each
worker forked from it shares those pages with the core and with each other,
as gunicorn's ``--preload`` workers do. It holds nothing of the node: no
listening socket existed when it was forked, and it never touches the
core's reactor (it closes that reactor's epoll and waker descriptors at
once, so no worker inherits them).

It is single-threaded and runs no reactor: it waits (``select``) on its
control socket with the core and on a signal wake-up pipe. On a FORK
request, which carries the worker's link sockets as ``SCM_RIGHTS``, it
forks the worker and answers STARTED with the worker's pid; on SIGCHLD it
reaps and answers EXITED (pid, wait status) for each worker that ended.
The end of the control socket (the core closed it, or died) ends it.

A process left behind is never possible: the fork server asks the kernel
for SIGKILL when the core dies (``PR_SET_PDEATHSIG``, its very first act,
then a check that the core is still its parent), and each worker does the
same about the fork server. So whatever kills the core, at any moment, the
fork server dies with it, and the workers with the fork server.
"""

from __future__ import annotations

import ctypes
import errno
import gc
import os
import select
import signal
import socket
import struct
import sys
from collections.abc import Callable
from typing import Any, NoReturn

from twisted.internet.interfaces import IReadDescriptor
from twisted.python.failure import Failure
from zope.interface import implementer

from nsqtw.log import Logger

#: prctl's option that has the kernel signal a process when its parent dies
_PR_SET_PDEATHSIG = 1

#: the core's request: fork worker INDEX (its sockets ride along as SCM_RIGHTS)
FORK = 1
#: the fork server's answers: worker INDEX started as PID; PID ended with STATUS (a wait status)
STARTED, EXITED = 2, 3
_REQUEST = struct.Struct(">BI")
_ANSWER = struct.Struct(">BIii")
#: the most descriptors one request carries
MAX_FDS = 4


def die_with_parent(parent: int) -> None:
    """Be killed (SIGKILL) when ``parent`` dies; exit now if it is already gone.

    The first thing a forked child does: the request is checked against
    ``getppid()`` after it took hold, so a parent that died in between (its
    child reparented) is seen too.
    """
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):  # not Linux: the link's end stops a worker instead
        pass
    if os.getppid() != parent:
        os._exit(1)


def close_inherited(fds: list[int]) -> None:
    for fd in fds:
        try:
            os.close(fd)
        except OSError:
            pass


# -- the fork server's side: a loop without a reactor ----------------------------------------


def serve(control: socket.socket, run_worker: Callable[[int, list[int]], NoReturn]) -> NoReturn:
    """Fork a worker per request, report each one's pid and end; exits when the core is gone."""
    me = os.getpid()
    wake_r, wake_w = os.pipe()
    for fd in (wake_r, wake_w):
        os.set_blocking(fd, False)
    signal.signal(signal.SIGCHLD, lambda *_: None)  # a handler, so the wake-up fd is written
    signal.set_wakeup_fd(wake_w)
    # SIGTERM and SIGINT (a terminal's ^C, a service manager's stop) are the core's to act on
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    while True:
        try:
            ready, _, _ = select.select([control.fileno(), wake_r], [], [])
        except InterruptedError:
            continue
        if wake_r in ready:
            try:
                while os.read(wake_r, 512):
                    pass
            except BlockingIOError:
                pass
            _reap(control)
        if control.fileno() in ready:
            try:
                data, fds, _, _ = socket.recv_fds(control, 64, MAX_FDS)
            except InterruptedError:
                continue
            except OSError:
                data, fds = b"", []
            if not data:  # the core closed it, or is gone
                os._exit(0)
            if len(data) < _REQUEST.size or data[0] != FORK:
                close_inherited(fds)
                continue
            _, index = _REQUEST.unpack_from(data)
            pid = os.fork()
            if pid == 0:
                die_with_parent(me)
                signal.set_wakeup_fd(-1)
                signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                close_inherited([wake_r, wake_w, control.fileno()])
                run_worker(index, fds)
            close_inherited(fds)
            _answer(control, STARTED, index, pid, 0)


def _reap(control: socket.socket) -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        _answer(control, EXITED, 0, pid, status)


def _answer(control: socket.socket, kind: int, index: int, pid: int, status: int) -> None:
    try:
        control.send(_ANSWER.pack(kind, index, pid, status))
    except OSError:  # the core is gone: the end of the control socket ends this process
        pass


# -- the core's side -------------------------------------------------------------------------


@implementer(IReadDescriptor)
class ForkServer:
    """The core's handle on its fork server: ask for workers, hear of their starts and ends.

    ``on_started(index, pid)`` and ``on_exited(pid, status)`` are called as
    the answers arrive; ``on_lost()`` when the fork server is gone.
    """

    log = Logger()

    def __init__(self, control: socket.socket, pid: int) -> None:
        self.control = control
        self.pid = pid
        self.reactor: Any = None
        self.on_started: Callable[[int, int], None] = lambda index, pid: None
        self.on_exited: Callable[[int, int], None] = lambda pid, status: None
        self.on_lost: Callable[[], None] = lambda: None
        self.closed = False

    @classmethod
    def start(cls, run_worker: Callable[[int, list[int]], NoReturn], inherited_reactor: Any) -> ForkServer:
        """Fork the fork server from this process (the core, single-threaded still).

        ``run_worker(index, fds)`` runs in each worker, never returning.
        Call it once everything a worker needs is imported: the heap is
        frozen here, so those objects' pages stay shared.
        """
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        core = os.getpid()
        _flush_std_streams()
        gc.collect()
        gc.freeze()
        pid = os.fork()
        if pid == 0:
            try:
                die_with_parent(core)
                ours.close()
                from nsqtw.net.twisted_privates import close_reactor_descriptors

                close_reactor_descriptors(inherited_reactor)
                serve(theirs, run_worker)
            finally:
                os._exit(70)
        theirs.close()
        ours.setblocking(False)
        return cls(ours, pid)

    def attach(self, reactor: Any) -> None:
        """Read answers on ``reactor`` from now on."""
        self.reactor = reactor
        reactor.addReader(self)

    def fork(self, index: int, fds: list[int]) -> bool:
        """Ask for worker ``index`` with ``fds`` as its sockets; False when the fork server is gone."""
        if self.closed:
            return False
        try:
            socket.send_fds(self.control, [_REQUEST.pack(FORK, index)], fds)
        except OSError as e:
            self.log.error("WORKER({index}): could not ask the fork server for it - {error}", index=index, error=e)
            return False
        return True

    def close(self) -> None:
        """End the fork server (its workers have ended): it exits when the control socket closes."""
        if not self.closed:
            self.closed = True
            if self.reactor is not None:
                self.reactor.removeReader(self)
            self.control.close()

    # -- IReadDescriptor ---------------------------------------------------

    def fileno(self) -> int:
        return -1 if self.closed else self.control.fileno()

    def logPrefix(self) -> str:
        return "ForkServer"

    def doRead(self) -> None:
        while not self.closed:
            try:
                data = self.control.recv(64)
            except BlockingIOError:
                return
            except OSError as e:
                if e.errno == errno.EINTR:
                    continue
                data = b""
            if not data:
                self._lost()
                return
            kind, index, pid, status = _ANSWER.unpack_from(data)
            if kind == STARTED:
                self.on_started(index, pid)
            elif kind == EXITED:
                self.on_exited(pid, status)

    def connectionLost(self, reason: Failure) -> None:
        self._lost()

    def _lost(self) -> None:
        if self.closed:
            return
        self.close()
        try:  # it was our child: reap it, so no zombie is left
            os.waitpid(self.pid, os.WNOHANG)
        except OSError:
            pass
        self.on_lost()


def _flush_std_streams() -> None:
    """Write out what the core buffered for stdout and stderr, so no child writes it again."""
    for stream in (sys.stdout, sys.stderr):
        try:
            flush_now = getattr(stream, "flush_now", None)
            if flush_now is not None:
                flush_now()
            else:
                stream.flush()
        except Exception:
            pass
