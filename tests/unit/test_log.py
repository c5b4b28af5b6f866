"""nsqtw.log: nsqd's --log-level and --log-prefix in front of twistd's observer."""

from __future__ import annotations

from typing import Any

from twisted.logger import formatEvent, globalLogPublisher
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


class TurnBufferedWriterTests(SynchronousTestCase):
    """twistd's per-line flush becomes one write per reactor turn."""

    def _writer(self, running: bool = True):
        import io

        from twisted.internet.task import Clock
        from twisted.python import threadable

        from nsqtw.log import TurnBufferedWriter

        threadable.registerAsIOThread()
        clock = Clock()
        clock.running = running  # type: ignore[attr-defined]
        stream = io.StringIO()
        writes: list[str] = []
        original = stream.write
        stream.write = lambda text: (writes.append(text), original(text))[1]  # type: ignore[method-assign]
        return TurnBufferedWriter(stream, clock), stream, clock, writes

    def test_lines_of_one_turn_go_out_in_one_write_in_order(self) -> None:
        writer, stream, clock, writes = self._writer()
        for i in range(100):
            writer.write(f"line {i}\n")
            writer.flush()
        self.assertEqual(stream.getvalue(), "")
        clock.advance(0)
        self.assertEqual(writes, ["".join(f"line {i}\n" for i in range(100))])

    def test_a_full_buffer_goes_out_at_once(self) -> None:
        writer, stream, clock, writes = self._writer()
        writer.write("x" * (writer.limit + 1))
        writer.flush()
        self.assertEqual(len(stream.getvalue()), writer.limit + 1)

    def test_without_a_running_reactor_each_flush_writes(self) -> None:
        writer, stream, clock, writes = self._writer(running=False)
        writer.write("start-up line\n")
        writer.flush()
        self.assertEqual(stream.getvalue(), "start-up line\n")


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
