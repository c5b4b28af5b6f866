"""Logging with nsqd's ``--log-level``: one filter every nsqtw logger goes through.

twistd owns the log file and its observer; nsqtw's loggers publish through a
level filter first, so ``--log-level`` and ``PUT /config/log_level`` decide
what reaches it, at run time too.
"""

from __future__ import annotations

import atexit
import io
import json
import os
import sys
import threading
from _thread import get_ident
from collections.abc import Mapping
from time import time
from typing import Any

from twisted.logger import (
    FilteringLogObserver,
    ILogObserver,
    LogLevel,
    LogLevelFilterPredicate,
    eventAsText,
    formatEventAsClassicLogText,
    formatTime,
    globalLogPublisher,
)
from twisted.python import threadable
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


#: under ``twistd -n`` with the log on stderr: nsqtw's own events are written here directly
_direct: Any = None
#: in a worker whose core logs elsewhere than stderr: ``_direct`` takes relay records, not lines
_relaying = False
_time_cache: tuple[int, str] = (-1, "")


def _format_time(when: float | None) -> str:
    """twisted.logger's formatTime, computed once a second (it builds a time zone and a
    datetime per event, which was a large part of a connection's cost)."""
    global _time_cache
    if when is None:
        return formatTime(when)
    second = int(when)
    if _time_cache[0] != second:
        _time_cache = (second, formatTime(second))
    return _time_cache[1]


def _classic_text(event: dict[str, Any]) -> str | None:
    """``formatEventAsClassicLogText(event, _format_time)``, the same text at a fraction of the cost.

    Twisted formats ``log_format`` with its own ``string.Formatter`` (for the
    ``{name()}`` call syntax), in Python, field by field. Any other format
    means just what ``str.format_map`` makes of it, in C: a call field is a
    key no event holds (``name()``), so ``format_map`` fails on it, and that,
    failures and flattened events take Twisted's path, so the text never
    differs (``tests/unit/test_log.py``). Two log lines per connection made
    this a fifth of the cost of a connect/close cycle; go-diskqueue's
    ``readOne() opened`` lines (a literal ``()``, once per segment) took
    Twisted's path until the check looked for calls only by their failure.
    """
    fmt = event.get("log_format")
    if type(fmt) is not str or "log_failure" in event or "log_flattened" in event:
        return formatEventAsClassicLogText(event, _format_time)
    try:
        text = fmt.format_map(event)
    except Exception:
        return formatEventAsClassicLogText(event, _format_time)
    if not text:
        return None
    line = f"{_format_time(event.get('log_time'))} [{_system(event)}] {text}"
    return line.replace("\n", "\n\t") + "\n"


def _system(event: dict[str, Any]) -> str:
    """The ``[system]`` of the event's classic line, as twisted.logger names it."""
    system = event.get("log_system")
    if system is None:
        level = event.get("log_level")
        return f"{event.get('log_namespace', '-')}#{'-' if level is None else level.name}"
    try:
        return str(system)
    except Exception:
        return "UNFORMATTABLE"


# -- a worker's log, relayed to its core -------------------------------------------------
#
# A ``--workers`` worker is forked from the core after twistd chose the log's destination.
# Under ``twistd -n`` with the log on stderr the worker writes its lines to the same stderr.
# Anywhere else (``--logfile``, a daemon's ``twistd.log``, syslog) the destination is the
# core's alone (twistd's LogFile rotates by renaming; a daemon's stderr is /dev/null), so the
# worker sends each event to the core as one JSON line on a socket, and the core emits it as
# an event of its own: the same line, rotation and syslog included.


def relay_record(event: dict[str, Any]) -> str | None:
    """The event as the core re-emits it (:func:`emit_relayed`): one JSON line of its time,
    level, system and text (a failure's traceback included); None for an empty event."""
    fmt = event.get("log_format")
    text: str | None = None
    if type(fmt) is str and "log_failure" not in event and "log_flattened" not in event:
        try:
            text = fmt.format_map(event)
        except Exception:
            text = None
    if text is None:
        text = eventAsText(event, includeTimestamp=False, includeSystem=False)
    if not text:
        return None
    level = event.get("log_level")
    return json.dumps([event.get("log_time"), None if level is None else level.name, _system(event),
                       text]) + "\n"


def emit_relayed(line: str, source: str) -> None:
    """A line a worker sent its core (:func:`relay_record`), logged here as the worker logged it.

    A line that is not a record (whatever the worker wrote to its stderr
    itself, such as a traceback at its exit) is logged as an error of
    ``source``. Not filtered again by level (the worker did that) nor
    prefixed again (its text has the prefix).
    """
    try:
        when, name, system, text = json.loads(line)
        level = LogLevel.levelWithName(name) if name else LogLevel.info
        if not isinstance(text, str) or not isinstance(system, str):
            raise ValueError(line)
    except (ValueError, TypeError, KeyError, LookupError):
        when, level, system, text = time(), LogLevel.error, source, line
    event = {"log_format": "{log_text}", "log_text": text, "log_time": when, "log_system": system,
             "log_level": level, "log_namespace": "nsqtw.workers"}
    if _direct is not None:
        classic = _classic_text(event)
        if classic:
            _direct.write_line(classic, level)
        return
    globalLogPublisher(event)


def relay_to_core(reactor: Any, fd: int, inherited: list[Any]) -> None:
    """In a worker: every event, nsqtw's and Twisted's own, goes to the core on ``fd``.

    ``fd`` becomes the worker's stdout and stderr too, so what is written
    there (a traceback, ``print``) reaches the core's log as well.
    ``inherited``, the global publisher's observers the worker inherited
    from twistd (the core's log file), are dropped: only the core writes
    its log.
    """
    global _direct, _relaying
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    stream = open(2, "w", encoding="utf-8", errors="backslashreplace", closefd=False)  # noqa: SIM115
    _direct = BufferedLogWriter(stream, reactor)
    _relaying = True
    atexit.register(_direct.flush_now)
    for observer in inherited:
        globalLogPublisher.removeObserver(observer)
    globalLogPublisher.addObserver(_relay_twisted)


@provider(ILogObserver)
def _relay_twisted(event: dict[str, Any]) -> None:
    """Twisted's own events in a relaying worker (nsqtw's come through :func:`_publish`)."""
    record = relay_record(event)
    if record and _direct is not None:
        _direct.write_line(record, event.get("log_level"))


@provider(ILogObserver)
def _publish(event: dict[str, Any]) -> None:
    """Forward to twistd's observer, with nsqd's ``--log-prefix`` in front of the text.

    When twistd's log is the stderr stream nsqtw set up
    (:func:`log_to_stderr_by_default`), nsqtw's events are formatted here,
    exactly as twistd's text observer formats them, and written straight to
    it: twistd's observer would build the same line at several times the cost.
    """
    if _prefix and event.get("log_format") is not None:
        event["log_format"] = _prefix + event["log_format"]
    if _direct is not None:
        text = relay_record(event) if _relaying else _classic_text(event)
        if text:
            _direct.write_line(text, event.get("log_level"))
        return
    globalLogPublisher(event)


_predicate = LogLevelFilterPredicate(defaultLogLevel=LogLevel.info)
_observer = FilteringLogObserver(_publish, [_predicate])
_current = "info"
#: twisted.logger's levels in their order (``LogLevel`` compares by it), as numbers
_RANK: dict[Any, int] = {level: i for i, level in enumerate(LogLevel.iterconstants())}
#: the rank of the ``--log-level``: :meth:`Logger.emit` drops events below it
_threshold = _RANK[LogLevel.info]


def set_prefix(prefix: str) -> None:
    """nsqd's ``--log-prefix`` (``[nsqd] `` by default), put before every nsqtw log line."""
    global _prefix
    _prefix = prefix.replace("{", "{{").replace("}", "}}")


def set_level(name: str) -> None:
    """Apply an nsqd level name (debug, info, warn, error, fatal)."""
    global _current, _threshold
    level, _ = LEVELS[name.lower()]
    _predicate.setLogLevelForNamespace(None, level)  # type: ignore[arg-type]
    _current = name.lower()
    _threshold = _RANK[level]


def level_name() -> str:
    return _current


def level_number() -> int:
    return LEVELS[_current][1]


class Logger(_tw.Logger):
    """A twisted Logger that publishes through nsqtw's level filter.

    As a class attribute (``log = Logger()``) it hands out one Logger per
    owning class. Twisted's ``__get__`` builds a new Logger, namespace
    string included, on every ``self.log`` access with the instance as its
    source: about 4% of a connection's connect/SUB/close cycle went there.
    nsqtw's log lines name their object in the text (``TOPIC(name)``), and no
    observer here reads ``log_source``, so the owner class is the source.
    """

    def __init__(self, namespace: str | None = None, source: Any = None,
                 observer: Any = None) -> None:
        super().__init__(namespace, source, observer if observer is not None else _observer)
        self._by_owner: dict[type, Logger] = {}

    def __get__(self, instance: object, owner: type | None = None) -> Logger:
        if owner is None:
            owner = type(instance)
        bound = self._by_owner.get(owner)
        if bound is None:
            bound = self._by_owner[owner] = self.__class__(
                f"{owner.__module__}.{owner.__name__}", owner, observer=self.observer)
        return bound

    def emit(self, level: LogLevel, format: str | None = None, **kwargs: object) -> None:
        """Twisted's ``emit``, with nsqtw's level filter applied first, in a few comparisons.

        Twisted checks the level against every ``LogLevel`` constant (a
        generator), then the filtering observer looks the namespace's level
        up segment by segment: 7.7 µs for a debug line that is then dropped,
        about half the cost of a line that is written, twice per connection.
        The event and what reaches :func:`_publish` are the same; a level
        Twisted would refuse, a traced event or another observer take
        Twisted's way.
        """
        rank = _RANK.get(level)
        if rank is None or self.observer is not _observer or "log_trace" in kwargs:
            super().emit(level, format, **kwargs)
            return
        if rank < _threshold or not self.namespace:  # what _predicate answers "no" to
            return
        kwargs.update(log_logger=self, log_level=level, log_namespace=self.namespace,
                      log_source=self.source, log_format=format, log_time=time())
        _publish(kwargs)


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
    global _direct
    if (twistd_options.get("nodaemon") and not twistd_options.get("logfile")
            and not twistd_options.get("syslog")):
        writer = BufferedLogWriter(sys.stderr)
        atexit.register(writer.at_exit)
        sys.stdout = _direct = writer


def logs_to_stderr() -> bool:
    """Whether the log is the process's stderr (``twistd -n`` without ``--logfile``)."""
    return _direct is not None


def hold_until_started() -> None:
    """Under ``twistd -n`` with the log on stderr: hold the lines back until :func:`start_settled`.

    So a failed start shows its FATAL line alone
    (:meth:`BufferedLogWriter.hold_start`). Not with ``--log-level=debug``,
    which shows every line of a start as it comes.
    """
    if _direct is not None and _current != "debug":
        _direct.hold_start()


def start_settled(failed: bool) -> None:
    """The daemon's start is over: it serves (``failed`` False), or it failed and its FATAL line comes next.

    Under ``twistd -n`` the start-up lines held back until now are written
    out, or, after a failure, dropped (see :meth:`BufferedLogWriter.hold_start`).
    """
    if _direct is not None:
        if failed:
            _direct.start_failed()
        else:
            _direct.start_succeeded()


def log_to_stderr(reactor: Any) -> None:
    """In a process forked from a daemon (a ``--workers`` worker): nsqtw's lines go to stderr,
    gathered on ``reactor`` (this process's own), as under ``twistd -n``."""
    global _direct
    _direct = BufferedLogWriter(sys.__stderr__, reactor)
    atexit.register(_direct.flush_now)


def flush_direct() -> None:
    """Write out nsqtw's buffered lines now (before a forked process's ``os._exit``)."""
    if _direct is not None:
        _direct.flush_now()


class BufferedLogWriter(io.TextIOBase):
    """The stderr stream of ``twistd -n``: log lines go out together, a few times a second.

    twistd's log observer writes and flushes every line: one system call a
    line, which made logging the largest cost of a storm of topic creates
    or connections. Writing once per reactor turn still cost a timer and a
    system call per connection when clients come one at a time. Now:

    - nsqtw's own lines (:meth:`write_line`, from :func:`_publish`) wait up
      to :attr:`interval` seconds; a ``critical`` line (nsqd's FATAL) goes
      out at once, and warnings and errors at the end of the reactor turn;
    - everything else written and flushed (twistd's own observer, Twisted's
      tracebacks, ``print``) goes out at the end of the reactor turn;
    - at once when more than :attr:`limit` characters wait, when written
      from another thread, or when the reactor is not running (start-up,
      shut-down); and at exit (``atexit``).

    Lines go out in the order they were written. When stderr cannot take
    them (a closed pipe, a vanished terminal, a full disk) they are dropped
    and the daemon goes on: Go nsqd's logger ignores such errors too.

    With :meth:`hold_start`, what is written before the start is settled
    waits for the outcome: a start that fails shows one FATAL line.
    """

    limit = 64 * 1024
    #: how long an nsqtw info or debug line may wait for the next write
    interval = 0.05

    def __init__(self, stream: Any, reactor: Any = None) -> None:
        super().__init__()
        if reactor is None:
            from twisted.internet import reactor
        self._reactor = reactor
        self._stream = stream
        self._lines: list[str] = []
        self._size = 0
        #: the pending flush: at the end of this turn (delay 0) or after :attr:`interval`
        self._call: Any = None
        self._call_soon = False
        #: reentrant: a Python signal handler runs in the main thread between two
        #: bytecodes, possibly while this thread holds the lock, and Twisted's own
        #: SIGTERM and SIGINT handlers log ("Received SIGTERM, shutting down."). With
        #: a plain lock that line waited for itself: the daemon hung in its handler,
        #: never stopping. A nested write at any point only appends (see
        #: :meth:`flush_now`), so it can reorder a line but not lose one.
        self._lock = threading.RLock()
        #: flushes whose lines could not be written (the stream raised) and were dropped
        self.lost_writes = 0
        #: while the start is not settled (:meth:`hold_start`): what was written, with the
        #: level of nsqtw's own lines (None for any other text); None when nothing is held
        self._held: list[tuple[str, int | None]] | None = None
        self._held_size = 0
        #: :meth:`hold_start` was called: a failed start drops what it held and what follows
        self._holds = False
        #: the start failed: only FATAL lines are written from here on
        self._failed = False

    @property
    def encoding(self) -> str:  # type: ignore[override]
        return str(getattr(self._stream, "encoding", "utf-8"))

    def fileno(self) -> int:
        return int(self._stream.fileno())

    def isatty(self) -> bool:
        return bool(self._stream.isatty())

    def writable(self) -> bool:
        return True

    #: held start-up text past this many characters is written out: such a start is shown as it goes
    hold_limit = 1 << 20

    def hold_start(self) -> None:
        """Hold back everything written until the start is settled, so a failed start shows one line.

        A start that fails (a port taken, a data path it cannot write)
        used to print a dozen lines around its FATAL line: twistd's
        ``starting up`` and ``reactor class``, the program's banner, the
        listeners that opened and closed again, twistd's ``Main loop
        terminated`` and ``Server Shut Down``. Held here instead:

        - :meth:`start_succeeded` (every listener bound) writes them out, in order;
        - :meth:`start_failed` drops them, but for nsqtw's own warnings and
          errors, which may say why; from then on only FATAL lines are
          written (the stop that follows says nothing on the terminal);
        - a start that holds more than :attr:`hold_limit` characters, or
          never settles before the process exits, writes them out.
        """
        with self._lock:
            self._holds = True
            self._held = []
            self._held_size = 0

    def start_succeeded(self) -> None:
        """The start is over and the daemon serves: what was held goes out."""
        self._release()
        self.flush()

    def start_failed(self) -> None:
        """The start failed (its FATAL line comes next): drop what was held, and what follows."""
        with self._lock:
            if not self._holds:
                return
            held, self._held = self._held or [], None
            self._failed = True
            for text, rank in held:
                if rank is not None and rank >= _WARN:
                    self._lines.append(text)
                    self._size += len(text)

    def _release(self) -> None:
        with self._lock:
            held, self._held = self._held, None
            if held:
                for text, _ in held:
                    self._lines.append(text)
                    self._size += len(text)

    def _keep(self, text: str, rank: int | None) -> bool:
        """Hold ``text``, or drop it after a failed start; False: write it as usual. Under the lock."""
        if self._failed:
            return rank is None or rank < _CRITICAL
        held = self._held
        if held is None:
            return False
        self._held_size += len(text)
        if self._held_size > self.hold_limit:  # a start that says this much is shown as it goes
            self._held = None
            self._lines.extend(t for t, _ in held)
            self._size += self._held_size - len(text)
            return False
        held.append((text, rank))
        return True

    def at_exit(self) -> None:
        """At interpreter exit: a start that never settled shows what it held; then everything is written."""
        self._release()
        self.flush_now()

    def write(self, text: str) -> int:
        with self._lock:
            if self._keep(text, None):
                return len(text)
            self._lines.append(text)
            self._size += len(text)
        return len(text)

    def write_line(self, text: str, level: Any = None) -> None:
        """An nsqtw log line (``level`` a ``LogLevel``): written within :attr:`interval`, or sooner."""
        rank = _RANK.get(level, _INFO)
        with self._lock:
            if self._keep(text, rank):
                return
            self._lines.append(text)
            self._size += len(text)
        if rank >= _CRITICAL:
            self.flush_now()
        elif rank >= _WARN:
            self.flush()
        elif self._call is None or self._must_write_now():
            self._schedule(False)
        # else: the pending flush takes it along

    def flush(self) -> None:
        """Write out at the end of the reactor turn (at once if that is not possible)."""
        self._schedule(True)

    def _must_write_now(self) -> bool:
        """Past :attr:`limit`, off the reactor's thread, or no reactor turn to wait for."""
        return (self._size > self.limit or get_ident() != threadable.ioThread
                or not getattr(self._reactor, "running", False))

    def _schedule(self, soon: bool) -> None:
        if self._must_write_now():
            self.flush_now()
            return
        call = self._call
        if call is not None:
            if not soon or self._call_soon:
                return
            call.cancel()
        self._call_soon = soon
        self._call = self._reactor.callLater(0 if soon else self.interval, self._scheduled_flush)

    def _scheduled_flush(self) -> None:
        self._call = None
        self.flush_now()

    def flush_now(self) -> None:
        """Write out everything buffered (also at exit)."""
        call = self._call
        if call is not None and threadable.isInIOThread():
            self._call = None
            try:
                call.cancel()
            except Exception:
                pass  # already called or cancelled
        with self._lock:
            # swapped, not cleared after the join: a line a signal handler adds
            # meanwhile lands in one list or the other, never between
            lines, self._lines = self._lines, []
            self._size = 0
        text = "".join(lines)
        try:
            if text:
                self._stream.write(text)
            self._stream.flush()
        except (OSError, ValueError):
            # stderr is gone (its reader closed the pipe, the terminal went away)
            # or full: these lines are lost, and saying so could only come back
            # here. Raising instead made Twisted log the failure, whose line
            # scheduled the next failing flush: the daemon spun on it.
            self.lost_writes += 1


_INFO = _RANK[LogLevel.info]
_WARN = _RANK[LogLevel.warn]
_CRITICAL = _RANK[LogLevel.critical]
