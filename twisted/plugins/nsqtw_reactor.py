"""``twistd --reactor=nsqtw``: nsqtw's epoll reactor (nsqtw.net.epollreactor), chosen by name."""

from twisted.application.reactors import Reactor

nsqtw = Reactor(
    "nsqtw",
    "nsqtw.net.reactor",
    "nsqtw's epoll reactor: events dispatched without the legacy log context, optional busy polling (Linux).",
)
