"""How a daemon run by twistd ends: exit status 1 after a failed start, 0 after SIGTERM.

twistd gives an application no way to choose its exit status (Twisted's
issue 11335, open): the process exits 0 whenever the reactor stops, and
re-raises the signal that stopped it. So a start that fails after twistd
took over (a port that cannot be bound, a data directory that cannot be
written) is recorded here, the reactor stops (every service closes what it
opened), twistd finishes (the pid file removed, the log closed), and at
interpreter exit the recorded status is the one the process exits with.

Twisted's private state about the exit (the signal twistd re-raises) is
read and cleared through :mod:`nsqtw.net.twisted_privates`, whose test
fails when Twisted changes it.
"""

from __future__ import annotations

import atexit
import os
import signal
import sys
from collections.abc import Callable
from typing import Any

from nsqtw.log import Logger
from nsqtw.net import launch
from nsqtw.net.twisted_privates import clear_exit_signal, exit_signal

__all__ = ["FAILED", "ProcessExit", "exit_cleanly_after_signal", "fail_start", "process_exit"]

#: the status of a failed start, as Go's nsqd, nsqlookupd and nsqadmin exit with
FAILED = 1


class ProcessExit:
    """The status the process will exit with, and the one FATAL line that says why.

    ``register`` and ``terminate`` are :func:`atexit.register` and
    :func:`os._exit` in a daemon; tests pass their own.
    """

    log = Logger(namespace="nsqtw")

    def __init__(self, register: Callable[[Callable[[], None]], Any] = atexit.register,
                 terminate: Callable[[int], Any] = os._exit) -> None:
        self._register = register
        self._terminate = terminate
        #: None while nothing failed
        self.status: int | None = None

    def fail(self, reactor: Any, reason: str, status: int = FAILED) -> None:
        """Log ``FATAL: <reason>``, stop the reactor, and exit with ``status`` once twistd is done.

        Only the first failure is FATAL (and stops the reactor): a second
        listener failing while the first failure stops the process is
        logged as an error, in the log alone (Go's programs stop at the
        first listener that fails).
        """
        if self.status is not None:
            self.log.error("{reason}", reason=reason)
            return
        self.status = status
        # the terminal shows this line alone: under -n the held start-up lines are dropped,
        # and a daemon's starter writes it to its own stderr (nsqtw.net.launch)
        launch.failed(reason)
        self.log.critical("FATAL: {reason}", reason=reason)
        self._register(self._exit_now)
        # the stop re-raises no signal: the status above is the one that counts
        clear_exit_signal(reactor)
        if getattr(reactor, "running", False):
            reactor.stop()
        else:  # start-up before ``reactor.run()``: stop as soon as it runs
            reactor.callWhenRunning(reactor.stop)

    def _exit_now(self) -> None:
        """At interpreter exit: write out what the logs hold, then exit with the status."""
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:
                pass  # a closed or broken stream: nothing more can be said
        assert self.status is not None
        self._terminate(self.status)


#: the process's own
process_exit = ProcessExit()


def fail_start(reactor: Any, reason: str) -> None:
    """The daemon cannot run: ``FATAL: <reason>``, stop, exit status 1 (see :class:`ProcessExit`)."""
    process_exit.fail(reactor, reason)


def exit_cleanly_after_signal(reactor: Any) -> None:
    """nsqd and nsqlookupd exit 0 after a graceful SIGTERM/SIGINT.

    twistd would re-raise the signal (exit status -15) unless told the stop
    was handled.
    """
    if exit_signal(reactor) in (signal.SIGTERM, signal.SIGINT):
        clear_exit_signal(reactor)


def interrupt_stops() -> None:
    """Ctrl-C (SIGINT) stops this program even if it was started with SIGINT ignored.

    A process started in the background by a script (``nsqd &``,
    ``nohup``) inherits SIGINT ignored, and Twisted installs its SIGINT
    handler only over Python's default one, so such a daemon or tool
    ignored Ctrl-C and ``kill -INT``. Go's programs ask for SIGINT with
    ``signal.Notify``, which takes it back from an inherited ignore: Go
    nsqd, nsqlookupd, nsqadmin and the tools stop on it. Called before the
    reactor installs its handlers; a handler someone installed on purpose
    (a debugger's) is left alone.
    """
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
