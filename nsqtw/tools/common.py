"""What every ``nsqtw`` subcommand shares.

- Go flag syntax and Go's ``Usage of ...`` listing (:class:`nsqtw._go.flags.FlagSet`);
- log lines on stderr as Go's ``log`` package writes them
  (``2006/01/02 15:04:05 text``), and the client library's events in
  go-nsq's shape (``INF    1 [topic/channel] (addr) connecting to nsqd``);
- running on the reactor, where Ctrl-C and SIGTERM stop the reactor and the
  subcommand's ``before shutdown`` trigger drains it first (the consumer's
  clean stop, files synced, publishes answered).
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable, Coroutine, Sequence
from typing import IO, Any

from twisted.internet.defer import Deferred, FirstError, ensureDeferred, gatherResults
from twisted.internet.error import ReactorNotRunning
from twisted.logger import ILogObserver, LogLevel, formatEvent, globalLogBeginner
from twisted.python.failure import Failure
from zope.interface import implementer

from nsqtw import __version__
from nsqtw._go.flags import FlagSet, HelpRequested, OptionsError
from nsqtw.client import Config, ConfigError
from nsqtw.net.exit import interrupt_stops

__all__ = ["GoLog", "StdinReader", "ToolError", "client_config", "connected_or_exit", "parse_flags", "require",
           "run_tool", "user_agent"]


class ToolError(Exception):
    """A start-up refusal: printed as Go's ``log.Fatal`` prints it, exit status 1."""


def user_agent(program: str) -> str:
    return f"{program}/{__version__} nsqtw/{__version__}"


def go_time(now: float | None = None, micro: bool = False) -> str:
    """Go's ``log.LstdFlags`` time (with ``Lmicroseconds`` when asked)."""
    t = time.time() if now is None else now
    text = time.strftime("%Y/%m/%d %H:%M:%S", time.localtime(t))
    if micro:
        text += f".{int(t * 1e6) % 1000000:06d}"
    return text


class GoLog:
    """Writes Go ``log.Printf`` lines to a stream (stderr)."""

    def __init__(self, stream: IO[str] | None = None, prefix: str = "", micro: bool = False) -> None:
        self.stream = stream if stream is not None else sys.stderr
        self.prefix = prefix
        self.micro = micro

    def printf(self, text: str) -> None:
        self.stream.write(f"{self.prefix}{go_time(micro=self.micro)} {text}\n")
        self.stream.flush()


_LEVELS = {LogLevel.debug: "DBG", LogLevel.info: "INF", LogLevel.warn: "WRN",
           LogLevel.error: "ERR", LogLevel.critical: "ERR"}


@implementer(ILogObserver)
class ClientLogObserver:
    """Twisted log events on stderr: nsqtw's at info and up in go-nsq's shape, the rest from warn up."""

    def __init__(self, stream: IO[str] | None = None, verbose: bool = False) -> None:
        self.stream = stream if stream is not None else sys.stderr
        self.verbose = verbose

    def __call__(self, event: dict[str, Any]) -> None:
        level = event.get("log_level", LogLevel.info)
        namespace = str(event.get("log_namespace", ""))
        ours = namespace.startswith("nsqtw")
        if level < (LogLevel.debug if self.verbose else LogLevel.info if ours else LogLevel.warn):
            return
        text = formatEvent(event)
        failure = event.get("log_failure")
        if isinstance(failure, Failure) and ours:
            text += f" ({failure.getErrorMessage()})"
        elif isinstance(failure, Failure):
            text += "\n" + failure.getTraceback()
        self.stream.write(f"{go_time(event.get('log_time'))} {_LEVELS.get(level, 'INF')}    1 {text}\n")
        self.stream.flush()


def parse_flags(program: str, flagset: FlagSet, argv: Sequence[str]) -> Any:
    """Parse ``argv`` as Go's flag package would; exit 2 with the usage on a bad flag, 0 on -h."""
    try:
        return flagset.parse(list(argv))
    except HelpRequested:
        sys.stderr.write(flagset.print_defaults(program))
        raise SystemExit(0) from None
    except OptionsError as e:
        sys.stderr.write(f"{e}\n{flagset.print_defaults(program)}")
        raise SystemExit(2) from None


def client_config(options: Sequence[str], program: str, **settings: Any) -> Config:
    """A client Config: ``--consumer-opt``/``--producer-opt`` values first, then the tool's own settings.

    (The Go tools apply the pass-through options while parsing flags and set
    ``MaxInFlight`` and ``UserAgent`` afterwards, so those two win.)
    """
    config = Config(user_agent=user_agent(program))
    try:
        for text in options:
            config.set_flag(text)
        for name, value in settings.items():
            setattr(config, name, value)
        config.validate()
    except ConfigError as e:
        raise ToolError(str(e)) from None
    return config


def run_tool(main: Callable[[Any], Coroutine[Any, Any, int | None]], verbose: bool = False) -> int:
    """Run ``main(reactor)`` to completion (or until Ctrl-C/SIGTERM); returns the exit status.

    ``main`` registers its drain as a ``before shutdown`` trigger, so a
    signal runs it before the reactor stops; a main that finishes on its own
    should drain itself before returning (the trigger must be idempotent).
    """
    from twisted.internet import reactor

    globalLogBeginner.beginLoggingTo([ClientLogObserver(verbose=verbose)], redirectStandardIO=False,
                                     discardBuffer=True)
    status = [0]
    log = GoLog()

    def finished(code: int | None) -> None:
        status[0] = code or 0

    def failed(f: Failure) -> None:
        status[0] = 1
        if f.check(ToolError):
            log.printf(f.getErrorMessage())
        else:
            log.printf(f"ERROR: {f.getErrorMessage()}")
            sys.stderr.write(f.getTraceback())

    def stop(_: Any) -> None:
        try:
            reactor.stop()
        except ReactorNotRunning:
            pass  # already stopping (a signal, or the subcommand's own stop)

    def start() -> None:
        d: Deferred[Any] = ensureDeferred(main(reactor))
        d.addCallbacks(finished, failed)
        d.addBoth(stop)

    reactor.callWhenRunning(start)
    interrupt_stops()  # Ctrl-C stops a tool started with SIGINT ignored, as Go's tools
    reactor.run()
    return status[0]


async def connected_or_exit(first_attempts: Sequence[Deferred[None]]) -> None:
    """Go's tools ``log.Fatal`` when ``ConnectToNSQDs`` fails: once every client's first attempts
    are over (``Consumer.first_attempts``, ``Producer.first_attempts``), the first failure, a
    refused connect or a server that breaks the protocol, ends the tool (one line, status 1)."""
    try:
        await gatherResults(list(first_attempts), consumeErrors=True)
    except FirstError as e:
        raise ToolError(e.subFailure.getErrorMessage()) from None


def require(condition: bool, message: str) -> None:
    """Go's ``if !condition { log.Fatal(message) }``."""
    if not condition:
        raise ToolError(message)


class StdinReader:
    """Chunks of a blocking stream (stdin) read on a daemon thread, one at a time on request.

    A daemon thread, not the reactor's pool: a read still blocked when the
    tool exits must not hold the process (the pool joins its threads).
    """

    def __init__(self, reactor: Any, stream: IO[bytes], size: int = 65536) -> None:
        self.reactor = reactor
        self.stream = stream
        self.size = size
        self._want = threading.Event()
        self._waiting: Deferred[bytes] | None = None
        self._thread = threading.Thread(target=self._run, name="stdin", daemon=True)
        self._thread.start()

    def read(self) -> Deferred[bytes]:
        """The next chunk; ``b""`` at the end of the stream."""
        d: Deferred[bytes] = Deferred()
        self._waiting = d
        self._want.set()
        return d

    def _run(self) -> None:
        while True:
            self._want.wait()
            self._want.clear()
            try:
                # os.read, not the buffered reader: a daemon thread blocked inside a BufferedReader
                # holds its lock, and Python aborts at exit when it cannot take it
                chunk = os.read(self.stream.fileno(), self.size)
            except (OSError, ValueError):
                chunk = b""
            self.reactor.callFromThread(self._deliver, chunk)
            if not chunk:
                return

    def _deliver(self, chunk: bytes) -> None:
        d, self._waiting = self._waiting, None
        if d is not None:
            d.callback(chunk)
