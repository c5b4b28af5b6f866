"""Which reactor a daemon runs on: nsqtw's own where it can, any other unchanged.

Each daemon's tap calls :func:`install_for_daemon` in ``makeService``,
before anything imports ``twisted.internet.reactor``: with no reactor
installed yet, it installs :class:`nsqtw.net.epollreactor.NSQTWReactor`
(Linux). A reactor already installed (``twistd --reactor=NAME`` installs
it while parsing the options) is the user's choice and is kept; so is
Twisted's default where epoll is missing. Either runs without nsqtw's poll
step (its events dispatched the way Twisted does, ``--busy-poll`` without
effect), and the daemon says so in one log line.

``twistd --reactor=nsqtw`` names nsqtw's reactor itself (the plugin in
``twisted/plugins/nsqtw_reactor.py``).
"""

from __future__ import annotations

import sys

from nsqtw.log import Logger
from nsqtw.net.busypoll import busy_poll_of
from nsqtw.net.exit import interrupt_stops

__all__ = ["install", "install_for_daemon"]

log = Logger(namespace="nsqtw")


def install() -> None:
    """Install nsqtw's reactor (``twistd --reactor=nsqtw``); ImportError where epoll is missing."""
    from nsqtw.net.epollreactor import install as install_epoll

    install_epoll()


def install_for_daemon() -> bool:
    """Install nsqtw's reactor unless a reactor is installed already; True if nsqtw's is the one in use.

    The reactor's SIGINT handler is installed only over Python's default:
    an inherited ignore is taken back first (:func:`~nsqtw.net.exit.interrupt_stops`).
    """
    interrupt_stops()
    if "twisted.internet.reactor" not in sys.modules:
        try:
            install()
        except ImportError:  # no epoll here: Twisted picks its default below
            pass
    from twisted.internet import reactor

    if busy_poll_of(reactor) is not None:
        return True
    # said once the reactor runs: after twistd's "reactor class" line, with the daemon's log prefix
    reactor.callWhenRunning(_say_other_reactor, type(reactor))
    return False


def _say_other_reactor(cls: type) -> None:
    log.info("reactor: {reactor}, not nsqtw's (chosen with twistd --reactor, or no epoll here): events are"
             " dispatched as Twisted does and --busy-poll has no effect",
             reactor=f"{cls.__module__}.{cls.__qualname__}")
