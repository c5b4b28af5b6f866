"""Logging with nsqd's ``--log-level``: one filter every nsqtw logger goes through.

twistd owns the log file and its observer; nsqtw's loggers publish through a
level filter first, so ``--log-level`` and ``PUT /config/log_level`` decide
what reaches it, at run time too.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
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


def start_daemon(program: str, show_version: bool, level: str, prefix: str,
                 twistd_options: Mapping[str, Any] | None = None) -> None:
    """What every nsqtw daemon does first: ``--version``, then logging.

    ``twistd_options`` are twistd's own (the plugin options' ``parent``):
    see :func:`log_to_stderr_by_default`.
    """
    if show_version:
        from nsqtw import version_banner

        print(version_banner(program))  # to stdout, exit 0: as Go's -version
        raise SystemExit(0)
    set_level(level)
    set_prefix(prefix)
    if twistd_options is not None:
        log_to_stderr_by_default(twistd_options)


def log_to_stderr_by_default(twistd_options: Mapping[str, Any]) -> None:
    """Under ``twistd -n`` without ``--logfile``, log to stderr as Go's NSQ programs do.

    twistd would write its log to stdout; client libraries' test harnesses
    (gnsq's, for one) read the child's stderr for ``TCP: listening on``.
    twistd picks its log file object *after* the plugin made its service,
    from ``sys.stdout``, so pointing ``sys.stdout`` at stderr here is the
    one place that can decide it. ``--logfile=FILE`` (a file) and
    ``--logfile=-`` (stdout, twistd's own spelling) are left as they are.
    """
    if twistd_options.get("nodaemon") and not twistd_options.get("logfile"):
        sys.stdout = sys.stderr
