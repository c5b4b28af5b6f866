"""The subcommands' pieces without sockets: stat rows, gzip members, file names, JSON filters, host choice."""

from __future__ import annotations

import dataclasses
import gzip
import io
import os
import re
import socket
import sys
from pathlib import Path

from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase

from nsqtw.tools import cli
from nsqtw.tools.common import GoLog
from nsqtw.tools.forward import Destinations, TimerMetrics
from nsqtw.tools.stat import HEADER, aggregate, row
from nsqtw.tools.to_file import GzipMember, ToFileOptions, filename_template
from nsqtw.tools.to_nsq import Backoff, JSONFilter, ToNSQOptions

ROOT = Path(__file__).resolve().parents[2]


def counts(**kw: int) -> dict[str, int]:
    base = dict.fromkeys(("depth", "memory_depth", "backend_depth", "in_flight_count", "deferred_count",
                          "requeue_count", "timeout_count", "message_count", "client_count"), 0)
    return {**base, **kw}


class StatTests(SynchronousTestCase):
    def test_stat_rows(self) -> None:
        """Rates are the message and depth differences over the interval, truncated as Go's int64()."""
        prev = counts(depth=10, message_count=100)
        cur = counts(depth=16, memory_depth=6, message_count=125, in_flight_count=3, client_count=2)
        self.assertEqual(row(cur, prev, 2.0), "     12       9 |      16       6       0     3     0 |"
                                              "       0       0          125       2\n")
        self.assertEqual(len(HEADER.splitlines()[1]), len(row(cur, prev, 2.0).rstrip("\n")))

    def test_aggregate_sums_nodes(self) -> None:
        """The channel is summed over nodes; memory depth is depth minus backend depth; missing: None."""
        node = {"topics": [{"topic_name": "t", "channels": [
            {"channel_name": "c", "depth": 5, "backend_depth": 2, "in_flight_count": 1, "deferred_count": 0,
             "requeue_count": 1, "timeout_count": 0, "message_count": 9, "client_count": 1, "clients": [{}]}]}]}
        total = aggregate([node, node], "t", "c")
        assert total is not None
        self.assertEqual((total["depth"], total["memory_depth"], total["backend_depth"], total["client_count"]),
                         (10, 6, 4, 2))
        self.assertIsNone(aggregate([node], "t", "other"))


class ToFileTests(SynchronousTestCase):
    def test_gzip_member(self) -> None:
        """A member is a valid gzip stream with Go's header bytes; members concatenate; an empty one is valid."""
        m = GzipMember(6)
        data = m.write(b"hello\n") + m.write(b"world\n") + m.finish()
        self.assertEqual(data[:10], b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\xff")
        empty = GzipMember(9).finish()
        self.assertEqual(empty[8], 2)  # XFL: best compression
        self.assertEqual(gzip.decompress(data + empty + data), b"hello\nworld\nhello\nworld\n")

    def test_filename_template(self) -> None:
        """<TOPIC>, <HOST>, <PID> replaced; <REV> dropped unless needed (then required); .gz appended."""
        short = socket.gethostname().split(".")[0]
        plain = ToFileOptions(work_dir="/tmp")
        self.assertEqual(filename_template(plain, "t"), f"t.{short}.<DATETIME>.log")
        gz = dataclasses.replace(plain, gzip=True, filename_format="<TOPIC>-<PID><REV>",
                                 host_identifier="x-<SHORT_HOST>")
        self.assertEqual(filename_template(gz, "t"), f"t-{os.getpid()}<REV>.gz")
        with self.assertRaisesRegex(ValueError, "missing <REV>"):
            filename_template(dataclasses.replace(plain, rotate_size=10, filename_format="<TOPIC>.log"), "t")


class ToNSQTests(SynchronousTestCase):
    def filter(self, **kw: object) -> JSONFilter:
        return JSONFilter(dataclasses.replace(ToNSQOptions(), **kw), GoLog(io.StringIO()))  # type: ignore[arg-type]

    def test_json_filter(self) -> None:
        """nsq_to_nsq's rules: string or number match, whitelist re-encoded as Go, non-JSON dropped."""
        f = self.filter(require_json_field="b", require_json_value="x", whitelist_json_field=("a", "c"))
        self.assertEqual(f.apply(b'{"a":1,"b":"x","c":2.50}'), b'{"a":1,"c":2.5}')
        self.assertIsNone(f.apply(b'{"a":1,"b":"y"}'))
        self.assertIsNone(f.apply(b"not json"))
        with self.assertRaises(Backoff):
            f.apply(b'{"a":1}')  # required field missing while a value is required
        n = self.filter(require_json_field="n", require_json_value="3")
        self.assertEqual(n.apply(b'{"n":3.0}'), b'{"n":3.0}')
        self.assertIsNone(n.apply(b'{"n":"3.0"}'))
        w = self.filter(whitelist_json_field=("z",))
        self.assertEqual(w.apply(b'{"z":{"b":[1e3,true],"a":null}}'), b'{"z":{"a":null,"b":[1000,true]}}')


class ForwardTests(SynchronousTestCase):
    def test_round_robin_starts_at_the_second(self) -> None:
        """Round-robin increments first, as nsq_to_http's counter: 5 messages split 2 and 3."""
        d = Destinations(["a", "b"], "round-robin", Clock())
        self.assertEqual([d.pick() for _ in range(5)], ["b", "a", "b", "a", "b"])

    def test_hostpool_skips_a_failed_host(self) -> None:
        """A failed host is skipped for 30s, then tried again; all down means all retried."""
        clock = Clock()
        d = Destinations(["a", "b"], "hostpool", clock)
        d.mark("a", False)
        self.assertEqual({d.pick() for _ in range(4)}, {"b"})
        clock.advance(31)
        self.assertEqual({d.pick() for _ in range(4)}, {"a", "b"})

    def test_timer_metrics_line(self) -> None:
        """Every N requests: percentiles and mean in ms, then a fresh window."""
        out = io.StringIO()
        m = TimerMetrics(2, "[aggregate]:", GoLog(out))
        m.status(0.0, 0.002)
        m.status(0.0, 0.004)
        lines = out.getvalue().splitlines()
        self.assertIn("configured with 2", lines[0])
        self.assertTrue(lines[1].endswith("[aggregate]: finished 2 - 99th: 4.00ms - 95th: 4.00ms - avg: 3.00ms"))


class CommandLineTests(SynchronousTestCase):
    def run_cli(self, *args: str) -> tuple[int, str, str]:
        out, err = io.StringIO(), io.StringIO()
        self.patch(sys, "stdout", out)
        self.patch(sys, "stderr", err)
        return cli.main(list(args)), out.getvalue(), err.getvalue()

    def test_no_command_is_a_usage_error(self) -> None:
        """``nsqtw`` alone prints the usage line and the commands as plain text to stderr, status 2."""
        code, out, err = self.run_cli()
        self.assertEqual((code, out), (2, ""))
        self.assertEqual(err.splitlines()[0], "usage: nsqtw <command> [flags]")
        for name, (_, go_tool, _) in cli.SUBCOMMANDS.items():
            self.assertRegex(err, rf"\n  {re.escape(name)} +\({go_tool}\) +\w")
        self.assertNotIn("`", err)

    def test_help_prints_the_same_to_stdout(self) -> None:
        """``nsqtw --help`` and ``-h`` print the same text to stdout and exit 0."""
        _, _, alone = self.run_cli()
        for flag in ("--help", "-h"):
            self.assertEqual(self.run_cli(flag), (0, alone, ""))

    def test_unknown_command(self) -> None:
        """An unknown command names the known ones on stderr, status 2."""
        code, out, err = self.run_cli("tial")
        self.assertEqual((code, out), (2, ""))
        self.assertIn("unknown subcommand 'tial'", err)


class DocTests(SynchronousTestCase):
    def test_docs_name_real_tests(self) -> None:
        """Every test docs/client.md and docs/tools.md cite exists."""
        source = "\n".join(p.read_text() for p in (ROOT / "tests").rglob("test_*.py"))
        for doc in ("client.md", "tools.md"):
            text = (ROOT / "docs" / doc).read_text()
            for name in set(re.findall(r"`(test_[a-z0-9_]+)", text)):
                self.assertIn(f"def {name}(", source, f"{doc} cites {name}")
