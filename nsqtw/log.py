"""Logging with nsqd's ``--log-level``: one filter every nsqtw logger goes through.

twistd owns the log file and its observer; nsqtw's loggers publish through a
level filter first, so ``--log-level`` and ``PUT /config/log_level`` decide
what reaches it, at run time too.
"""

from __future__ import annotations

from typing import Any

from twisted.logger import (
    FilteringLogObserver,
    ILogObserver,
    LogLevel,
    LogLevelFilterPredicate,
    globalLogPublisher,
)
from zope.interface import provider

from twisted import logger as _tw

#: nsqd's level names and their numbers (GET /config/log_level answers the number)
LEVELS: dict[str, tuple[LogLevel, int]] = {
    "debug": (LogLevel.debug, 1),
    "info": (LogLevel.info, 2),
    "warn": (LogLevel.warn, 3),
    "error": (LogLevel.error, 4),
    "fatal": (LogLevel.critical, 5),
}

_prefix = ""


@provider(ILogObserver)
def _publish(event: dict[str, Any]) -> None:
    """Forward to twistd's observer, with nsqd's ``--log-prefix`` in front of the text."""
    if _prefix and event.get("log_format") is not None:
        event["log_format"] = _prefix + event["log_format"]
    globalLogPublisher(event)


_predicate = LogLevelFilterPredicate(defaultLogLevel=LogLevel.info)
_observer = FilteringLogObserver(_publish, [_predicate])
_current = "info"


def set_prefix(prefix: str) -> None:
    """nsqd's ``--log-prefix`` (``[nsqd] `` by default), put before every nsqtw log line."""
    global _prefix
    _prefix = prefix.replace("{", "{{").replace("}", "}}")


def set_level(name: str) -> None:
    """Apply an nsqd level name (debug, info, warn, error, fatal)."""
    global _current
    level, _ = LEVELS[name.lower()]
    _predicate.setLogLevelForNamespace(None, level)  # type: ignore[arg-type]
    _current = name.lower()


def level_name() -> str:
    return _current


def level_number() -> int:
    return LEVELS[_current][1]


class Logger(_tw.Logger):
    """A twisted Logger that publishes through nsqtw's level filter."""

    def __init__(self, namespace: str | None = None, source: Any = None,
                 observer: Any = None) -> None:
        super().__init__(namespace, source, observer if observer is not None else _observer)


def start_daemon(program: str, show_version: bool, level: str, prefix: str) -> None:
    """What ``twistd nsqtw`` and ``twistd nsqtw-lookupd`` do first: ``--version``, then logging."""
    if show_version:
        from nsqtw import NSQD_VERSION, __version__

        print(f"{program} v{NSQD_VERSION} (nsqtw {__version__})")
        raise SystemExit(0)
    set_level(level)
    set_prefix(prefix)
