"""nsqtw.log: nsqd's --log-level and --log-prefix in front of twistd's observer."""

from __future__ import annotations

from typing import Any

from twisted.logger import PredicateResult, formatEvent, globalLogPublisher
from twisted.trial.unittest import SynchronousTestCase

from nsqtw import log


class LogPrefixTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.events: list[dict[str, Any]] = []
        globalLogPublisher.addObserver(self.events.append)
        self.addCleanup(globalLogPublisher.removeObserver, self.events.append)
        self.addCleanup(log.set_prefix, "")
        self.addCleanup(log.set_level, "info")

    def test_prefix_before_every_line(self) -> None:
        """--log-prefix goes in front of the text; braces in it are text, not fields."""
        log.set_prefix("[nsqd {x}] ")
        log.Logger(namespace="t").info("TCP: listening on {address}", address="127.0.0.1:4150")
        self.assertEqual([formatEvent(e) for e in self.events], ["[nsqd {x}] TCP: listening on 127.0.0.1:4150"])

    def test_level_filters_before_the_observer(self) -> None:
        """--log-level warn drops info lines and keeps warnings."""
        log.set_level("warn")
        logger = log.Logger(namespace="t")
        logger.info("quiet")
        logger.warn("loud")
        self.assertEqual([formatEvent(e) for e in self.events], ["loud"])


class EmitTests(SynchronousTestCase):
    """nsqtw's Logger.emit filters by level itself and publishes what Twisted's emit would."""

    def setUp(self) -> None:
        self.events: list[dict[str, Any]] = []
        globalLogPublisher.addObserver(self.events.append)
        self.addCleanup(globalLogPublisher.removeObserver, self.events.append)
        self.addCleanup(log.set_level, "info")

    def test_same_event_as_twisted_emit(self) -> None:
        from twisted.logger import LogLevel

        from twisted import logger as tw

        logger = log.Logger(namespace="nsqtw.t")
        for level in (LogLevel.info, LogLevel.warn, LogLevel.error, LogLevel.critical):
            logger.emit(level, "TCP: new client({client})", client="127.0.0.1:1")
            tw.Logger.emit(logger, level, "TCP: new client({client})", client="127.0.0.1:1")
        self.assertEqual(len(self.events), 8)
        for fast, slow in zip(self.events[::2], self.events[1::2], strict=True):
            self.assertLessEqual(slow["log_time"] - fast["log_time"], 1)
            # (the global publisher's legacy observers add keys to the event, made anew each time)
            skip = ("log_time", "time", "message", "log_legacy", "format", "system", "isError")
            self.assertEqual({k: v for k, v in fast.items() if k not in skip},
                             {k: v for k, v in slow.items() if k not in skip})
            self.assertEqual(sorted(fast), sorted(slow))

    def test_every_level_filtered_as_the_predicate_does(self) -> None:
        from twisted.logger import LogLevel

        logger = log.Logger(namespace="nsqtw.t")
        for name in log.LEVELS:
            log.set_level(name)
            del self.events[:]
            for level in LogLevel.iterconstants():
                logger.emit(level, "{n}", n=level.name)
            expected = [level.name for level in LogLevel.iterconstants()
                        if log._predicate({"log_level": level, "log_namespace": "nsqtw.t"})
                        is not PredicateResult.no]
            self.assertEqual([formatEvent(e) for e in self.events], expected, name)

    def test_empty_namespace_dropped_as_the_predicate_does(self) -> None:
        log.Logger(namespace="").info("nothing")
        self.assertEqual(self.events, [])

    def test_invalid_level_reported_as_twisted_does(self) -> None:
        log.Logger(namespace="nsqtw.t").emit("loud", "x")  # type: ignore[arg-type]
        self.assertEqual(len(self.events), 1)
        self.assertIn("invalid log level", formatEvent(self.events[0]))
        from twisted.logger import InvalidLogLevelError

        self.assertEqual(len(self.flushLoggedErrors(InvalidLogLevelError)), 1)


def make_writer(running: bool = True):
    """A BufferedLogWriter on a StringIO and a Clock; ``writes`` records each write to the stream."""
    import io

    from twisted.internet.task import Clock
    from twisted.python import threadable

    from nsqtw.log import BufferedLogWriter

    threadable.registerAsIOThread()
    clock = Clock()
    clock.running = running  # type: ignore[attr-defined]
    stream = io.StringIO()
    writes: list[str] = []
    original = stream.write
    stream.write = lambda text: (writes.append(text), original(text))[1]  # type: ignore[method-assign]
    return BufferedLogWriter(stream, clock), stream, clock, writes


class BufferedLogWriterTests(SynchronousTestCase):
    """twistd's per-line flush becomes one write per reactor turn, nsqtw's own lines one per interval."""

    def _writer(self, running: bool = True):
        return make_writer(running)

    def test_lines_of_one_turn_go_out_in_one_write_in_order(self) -> None:
        writer, stream, clock, writes = self._writer()
        for i in range(100):
            writer.write(f"line {i}\n")
            writer.flush()
        self.assertEqual(stream.getvalue(), "")
        clock.advance(0)
        self.assertEqual(writes, ["".join(f"line {i}\n" for i in range(100))])

    def test_info_lines_wait_for_the_interval_and_keep_their_order(self) -> None:
        from twisted.logger import LogLevel

        writer, stream, clock, writes = self._writer()
        for i in range(100):
            writer.write_line(f"line {i}\n", LogLevel.info if i % 2 else LogLevel.debug)
            clock.advance(writer.interval / 1000)
        self.assertEqual(writes, [])
        self.assertEqual(len(clock.getDelayedCalls()), 1)  # one timer for them all
        clock.advance(writer.interval)
        self.assertEqual(writes, ["".join(f"line {i}\n" for i in range(100))])
        self.assertEqual(clock.getDelayedCalls(), [])
        writer.write_line("later\n", LogLevel.info)
        clock.advance(writer.interval)
        self.assertEqual(writes[1:], ["later\n"])

    def test_a_generic_flush_takes_waiting_info_lines_along_at_the_end_of_the_turn(self) -> None:
        from twisted.logger import LogLevel

        writer, stream, clock, writes = self._writer()
        writer.write_line("nsqtw\n", LogLevel.info)
        writer.write("Unhandled Error\n")
        writer.flush()
        clock.advance(0)
        self.assertEqual(writes, ["nsqtw\nUnhandled Error\n"])
        self.assertEqual(clock.getDelayedCalls(), [])

    def test_warnings_and_errors_go_out_at_the_end_of_the_turn(self) -> None:
        from twisted.logger import LogLevel

        for level in (LogLevel.warn, LogLevel.error):
            writer, stream, clock, writes = self._writer()
            writer.write_line("info\n", LogLevel.info)
            writer.write_line("bad\n", level)
            self.assertEqual(writes, [])
            clock.advance(0)
            self.assertEqual(writes, ["info\nbad\n"])
            self.assertEqual(clock.getDelayedCalls(), [])

    def test_a_fatal_line_goes_out_at_once_after_the_waiting_ones(self) -> None:
        from twisted.logger import LogLevel

        writer, stream, clock, writes = self._writer()
        writer.write_line("info\n", LogLevel.info)
        writer.write_line("FATAL: listen failed\n", LogLevel.critical)
        self.assertEqual(writes, ["info\nFATAL: listen failed\n"])
        self.assertEqual(clock.getDelayedCalls(), [])

    def test_a_full_buffer_goes_out_at_once(self) -> None:
        from twisted.logger import LogLevel

        writer, stream, clock, writes = self._writer()
        writer.write("x" * (writer.limit + 1))
        writer.flush()
        self.assertEqual(len(stream.getvalue()), writer.limit + 1)
        writer.write_line("y" * (writer.limit + 1), LogLevel.info)
        self.assertEqual(len(stream.getvalue()), 2 * (writer.limit + 1))

    def test_without_a_running_reactor_each_flush_writes(self) -> None:
        from twisted.logger import LogLevel

        writer, stream, clock, writes = self._writer(running=False)
        writer.write("start-up line\n")
        writer.flush()
        self.assertEqual(stream.getvalue(), "start-up line\n")
        writer.write_line("TCP: listening on 127.0.0.1:4150\n", LogLevel.info)
        self.assertEqual(writes, ["start-up line\n", "TCP: listening on 127.0.0.1:4150\n"])

    def test_nothing_waiting_is_lost_when_the_reactor_stops(self) -> None:
        """twistd's last lines come after the reactor stopped: they take the waiting ones along."""
        from twisted.logger import LogLevel

        writer, stream, clock, writes = self._writer()
        writer.write_line("NSQ: stopped\n", LogLevel.info)
        clock.running = False  # type: ignore[attr-defined]
        writer.write("Main loop terminated.\n")
        writer.flush()
        self.assertEqual(writes, ["NSQ: stopped\nMain loop terminated.\n"])
        writer.write_line("after\n", LogLevel.info)
        writer.flush_now()  # atexit
        self.assertEqual(stream.getvalue(), "NSQ: stopped\nMain loop terminated.\nafter\n")

    def test_a_stream_that_fails_loses_lines_and_nothing_else(self) -> None:
        """A closed pipe on stderr: the flush drops the lines, raises nothing (Twisted would log that,
        and its line would schedule the next failing flush), schedules nothing; a stream that
        works again gets the lines written after."""
        from twisted.logger import LogLevel

        writer, stream, clock, writes = self._writer()
        broken = [True]
        write = stream.write

        def failing(text: str) -> int:
            if broken[0]:
                raise BrokenPipeError(32, "Broken pipe")
            return write(text)

        stream.write = failing  # type: ignore[method-assign]
        writer.write_line("lost\n", LogLevel.error)
        clock.advance(0)
        writer.write("also lost\n")
        writer.flush_now()
        self.assertEqual((stream.getvalue(), writer.lost_writes), ("", 2))
        self.assertEqual(clock.getDelayedCalls(), [])
        broken[0] = False
        writer.write_line("back\n", LogLevel.warn)
        clock.advance(0)
        self.assertEqual(stream.getvalue(), "back\n")

    def test_from_another_thread_at_once(self) -> None:
        import threading

        from twisted.logger import LogLevel

        writer, stream, clock, writes = self._writer()
        writer.write_line("main\n", LogLevel.info)
        t = threading.Thread(target=writer.write_line, args=("thread\n", LogLevel.info))
        t.start()
        t.join()
        self.assertEqual(stream.getvalue(), "main\nthread\n")
        clock.advance(writer.interval)  # the main thread's timer finds nothing left
        self.assertEqual(writes, ["main\nthread\n"])


class StartHoldTests(SynchronousTestCase):
    """Under ``twistd -n`` a start's lines wait for its outcome: a failed start shows its FATAL line alone."""

    def _writer(self):
        writer, stream, clock, writes = make_writer()
        writer.hold_start()
        return writer, stream, clock

    def start_up(self, writer) -> None:
        from twisted.logger import LogLevel

        writer.write("twistd 26.10.0 starting up.\n")
        writer.flush()
        writer.write_line("[nsqd] nsqd v1.3.0 (built w/nsqtw-0.1.0)\n", LogLevel.info)
        writer.write_line("[nsqd] TCP: listening on 127.0.0.1:4150\n", LogLevel.info)

    def test_a_successful_start_writes_what_it_held_in_order(self) -> None:
        """Nothing reaches stderr until every listener is bound; then all of it, in order, and
        lines after that as usual."""
        from twisted.logger import LogLevel

        writer, stream, clock = self._writer()
        self.start_up(writer)
        clock.advance(1)
        self.assertEqual(stream.getvalue(), "")
        writer.start_succeeded()
        clock.advance(0)
        self.assertEqual(stream.getvalue(), "twistd 26.10.0 starting up.\n[nsqd] nsqd v1.3.0 (built w/nsqtw-0.1.0)\n"
                                            "[nsqd] TCP: listening on 127.0.0.1:4150\n")
        writer.write_line("[nsqd] TCP: new client(127.0.0.1:5)\n", LogLevel.info)
        clock.advance(writer.interval)
        self.assertTrue(stream.getvalue().endswith("new client(127.0.0.1:5)\n"))

    def test_a_failed_start_shows_its_fatal_line_alone(self) -> None:
        """The held lines are dropped and so is everything the stop after it writes (twistd's
        ``Server Shut Down`` included), but for FATAL lines."""
        from twisted.logger import LogLevel

        writer, stream, clock = self._writer()
        self.start_up(writer)
        writer.start_failed()
        writer.write_line("[nsqd] FATAL: failed to instantiate nsqd - listen (x) failed - nope\n",
                          LogLevel.critical)
        writer.write_line("[nsqd] failed to instantiate nsqd - listen (y) failed - nope\n", LogLevel.error)
        writer.write_line("[nsqd] NSQ: stopped\n", LogLevel.info)
        writer.write("Server Shut Down.\n")
        writer.flush()
        clock.advance(1)
        writer.at_exit()
        self.assertEqual(stream.getvalue(), "[nsqd] FATAL: failed to instantiate nsqd - listen (x) failed - nope\n")

    def test_warnings_before_a_failure_are_kept(self) -> None:
        """nsqtw's own warnings and errors from before the failure may say why: they stay, before it."""
        from twisted.logger import LogLevel

        writer, stream, clock = self._writer()
        self.start_up(writer)
        writer.write_line("[nsqd] JOURNAL(t): cut 3 bytes of torn records at its end\n", LogLevel.warn)
        writer.start_failed()
        writer.write_line("[nsqd] FATAL: failed to persist metadata - nope\n", LogLevel.critical)
        self.assertEqual(stream.getvalue(), "[nsqd] JOURNAL(t): cut 3 bytes of torn records at its end\n"
                                            "[nsqd] FATAL: failed to persist metadata - nope\n")

    def test_a_start_that_never_settles_shows_its_lines_at_exit(self) -> None:
        """Stopped by a signal before it was ready (or a bug): at exit, what was held is written."""
        writer, stream, clock = self._writer()
        self.start_up(writer)
        writer.at_exit()
        self.assertIn("TCP: listening on", stream.getvalue())

    def test_a_long_start_is_shown_as_it_goes(self) -> None:
        """Past hold_limit characters the held lines go out, and later ones as usual."""
        writer, stream, clock = self._writer()
        writer.write("x" * writer.hold_limit)
        writer.flush()
        clock.advance(0)
        self.assertEqual(stream.getvalue(), "")
        writer.write("y\n")
        writer.flush()
        clock.advance(0)
        self.assertEqual(stream.getvalue(), "x" * writer.hold_limit + "y\n")

    def test_without_hold_a_failure_drops_nothing(self) -> None:
        """--log-level=debug (no hold): a failed start's lines all stay."""
        from twisted.logger import LogLevel

        writer, stream, clock, writes = make_writer()
        writer.write_line("[nsqd] TCP: listening on 127.0.0.1:4150\n", LogLevel.info)
        writer.start_failed()
        writer.write_line("[nsqd] FATAL: nope\n", LogLevel.critical)
        writer.write_line("[nsqd] NSQ: stopped\n", LogLevel.info)
        writer.at_exit()
        self.assertEqual(stream.getvalue().count("\n"), 3)


#: a writer that takes a real SIGUSR1 while it holds its lock for a line starting "outer" (Twisted's
#: SIGTERM handler logs; so does this one), in a process of its own: a writer that waits for itself
#: never returns, and the test ends it
INTERRUPTED_WRITER = """
import io, signal, sys
from twisted.internet.task import Clock
from twisted.logger import LogLevel
from twisted.python import threadable
from nsqtw.log import BufferedLogWriter

threadable.registerAsIOThread()
clock = Clock()
clock.running = True
stream = io.StringIO()
writer = BufferedLogWriter(stream, clock)
keep = writer._keep

def interrupted_keep(text, rank):
    if text.startswith("outer"):
        signal.raise_signal(signal.SIGUSR1)  # its Python handler runs before this call returns
    return keep(text, rank)

def handler(signum, frame):
    writer.write_line("received SIGTERM\\n", LogLevel.info)
    writer.write("RECEIVED SIGTERM\\n")

writer._keep = interrupted_keep
signal.signal(signal.SIGUSR1, handler)
if sys.argv[1] == "held":
    writer.hold_start()
    writer.write("outer start-up line\\n")
    assert stream.getvalue() == "", stream.getvalue()
    writer.start_succeeded()
else:
    writer.write("outer twistd line\\n")
    writer.write_line("outer nsqtw line\\n", LogLevel.info)
writer.flush_now()
sys.stdout.write(stream.getvalue())
"""


class SignalHandlerTests(SynchronousTestCase):
    """A signal handler that logs while the main thread is inside the writer (Twisted's SIGTERM handler
    does) neither waits for itself nor loses a line: a daemon stopped under load used to hang in it."""

    def run_interrupted(self, case: str) -> str:
        import subprocess
        import sys

        try:
            out = subprocess.run([sys.executable, "-c", INTERRUPTED_WRITER, case], capture_output=True,
                                 text=True, timeout=60)
        except subprocess.TimeoutExpired:
            self.fail("the writer waited for itself: a signal handler's line never returned")
        self.assertEqual(out.returncode, 0, out.stderr)
        return out.stdout

    def test_a_handler_logging_inside_a_write_is_written_too(self) -> None:
        self.assertEqual(self.run_interrupted("write"),
                         "received SIGTERM\nRECEIVED SIGTERM\nouter twistd line\n"
                         "received SIGTERM\nRECEIVED SIGTERM\nouter nsqtw line\n")

    def test_a_handler_logging_inside_a_held_start_is_written_too(self) -> None:
        self.assertEqual(self.run_interrupted("held"),
                         "received SIGTERM\nRECEIVED SIGTERM\nouter start-up line\n")


class ClassicTextTests(SynchronousTestCase):
    """The fast formatter writes exactly what twisted.logger's classic text observer would."""

    def events(self) -> list[dict[str, object]]:
        from twisted.logger import LogLevel
        from twisted.python.failure import Failure

        class Client:
            def __str__(self) -> str:
                return "127.0.0.1:4150"

        failure = Failure(ZeroDivisionError("division by zero"))
        base = {"log_time": 1_790_000_000.25, "log_namespace": "nsqtw.protocol.v2.V2Protocol",
                "log_level": LogLevel.info}
        cases: list[dict[str, object]] = [
            {"log_format": "TCP: new client({client})", "client": Client()},
            {"log_format": "[{client}] IDENTIFY: {data!r}", "client": Client(), "data": {"a": [1, "é"]}},
            {"log_format": "DISKQUEUE({name}): readOne() opened {path}", "name": "t", "path": "/x"},
            {"log_format": "{n:>6} of {total:.2f}", "n": 3, "total": 2.5},
            {"log_format": "braces {{kept}} and {x}", "x": "y"},
            {"log_format": "two\nlines {x}", "x": "and\nthree"},
            {"log_format": "missing {nothing}"},
            {"log_format": "a call {f()}", "f": lambda: "called"},
            {"log_format": "calls {f()!r} and {f():>8} beside {x}", "f": lambda: "called", "x": 1},
            {"log_format": "with a failure", "log_failure": failure},
            {"log_format": "", "x": 1},
            {"log_format": "system set", "log_system": "custom"},
            {"log_format": "no level", "log_level": None},
            {"log_format": "no time", "log_time": None},
        ]
        return [{**base, **case} for case in cases]

    def test_same_text_as_twisted(self) -> None:
        from twisted.logger import formatEventAsClassicLogText

        from nsqtw.log import _classic_text, _format_time

        for event in self.events():
            expected = formatEventAsClassicLogText(dict(event), _format_time)
            self.assertEqual(_classic_text(dict(event)), expected, event.get("log_format"))


class BoundLoggerTests(SynchronousTestCase):
    def test_one_logger_per_owner_class_with_its_namespace(self) -> None:
        """``self.log`` is built once per class (Twisted's builds one per access), still named after
        the class and still publishing through the descriptor's observer."""
        events: list[dict[str, Any]] = []

        class Owner:
            log = log.Logger(observer=events.append)

        class Other(Owner):
            pass

        a, b = Owner(), Owner()
        self.assertIs(a.log, b.log)
        self.assertIs(a.log, Owner.log)
        self.assertIsNot(Other().log, a.log)
        self.assertEqual(a.log.namespace, f"{__name__}.Owner")
        self.assertEqual(Other().log.namespace, f"{__name__}.Other")
        a.log.info("TOPIC({topic}): created", topic="t")
        self.assertEqual([(e["log_namespace"], formatEvent(e)) for e in events],
                         [(f"{__name__}.Owner", "TOPIC(t): created")])


class WorkerRelayTests(SynchronousTestCase):
    """A worker whose core logs to a file sends its events to the core (``relay_record``), which
    logs them as the worker would have (``emit_relayed``): the same classic line."""

    def setUp(self) -> None:
        self.events: list[dict[str, Any]] = []
        globalLogPublisher.addObserver(self.events.append)
        self.addCleanup(globalLogPublisher.removeObserver, self.events.append)

    def relayed(self, event: dict[str, Any]) -> str:
        record = log.relay_record(event)
        assert record is not None and record.endswith("\n") and record.count("\n") == 1, record
        log.emit_relayed(record[:-1], "WORKER(1)")
        self.assertEqual(len(self.events), 1)
        text = log._classic_text(self.events.pop())
        assert text is not None
        return text

    def test_a_line_comes_out_as_the_worker_would_have_written_it(self) -> None:
        from twisted.logger import LogLevel

        event = {"log_format": "[nsqd] TCP: new client({client}) {{braces}}", "client": "127.0.0.1:5",
                 "log_time": 1_700_000_000.25, "log_level": LogLevel.warn,
                 "log_namespace": "nsqtw.protocol.v2.V2Protocol", "log_system": "nsqtw.protocol.v2.V2Protocol#warn"}
        self.assertEqual(self.relayed(event), log._classic_text(dict(event)))
        self.assertIn("TCP: new client(127.0.0.1:5) {braces}", log._classic_text(dict(event)) or "")

    def test_a_failure_keeps_its_traceback_and_level(self) -> None:
        from twisted.logger import LogLevel
        from twisted.python.failure import Failure

        try:
            raise ZeroDivisionError("division by zero")
        except ZeroDivisionError:
            failure = Failure()
        event = {"log_format": "[nsqd] WORKER({index}): failed", "index": 2, "log_failure": failure,
                 "log_time": 1_700_000_001.0, "log_level": LogLevel.critical, "log_namespace": "n"}
        record = log.relay_record(event)
        assert record is not None
        log.emit_relayed(record[:-1], "WORKER(2)")
        (got,) = self.events
        self.assertEqual(got["log_level"], LogLevel.critical)
        self.assertEqual(got["log_time"], 1_700_000_001.0)
        self.assertIn("[nsqd] WORKER(2): failed", got["log_text"])
        self.assertIn("ZeroDivisionError", got["log_text"])
        self.assertIn("Traceback", got["log_text"])

    def test_what_the_worker_wrote_to_stderr_itself_is_an_error_of_the_worker(self) -> None:
        from twisted.logger import LogLevel

        for raw in ("Traceback (most recent call last):", "[1, 2]", '["not", "a", "record"]'):
            log.emit_relayed(raw, "WORKER(3)")
        self.assertEqual([(e["log_system"], e["log_level"], e["log_text"]) for e in self.events],
                         [("WORKER(3)", LogLevel.error, "Traceback (most recent call last):"),
                          ("WORKER(3)", LogLevel.error, "[1, 2]"),
                          ("WORKER(3)", LogLevel.error, '["not", "a", "record"]')])
