"""``nsqtw-bench compare``: Go nsqd and nsqtw measured side by side, in one run, on one machine.

A figure for nsqtw means something only next to Go nsqd's taken the same way,
on the same machine, at the same time: the load of a shared machine moves
both. So this mode starts both daemons itself, fresh for every measurement
session, with the same flags; drives the same loads at each with the same
clients (Go's own ``bench_writer``/``bench_reader`` when they are found,
and ``nsqtw-bench``); alternates which daemon goes first from run to run; and
prints the median of the runs for each figure, with the daemon's CPU per
message beside it (the steadier figure on a busy machine).

The sessions, per daemon and client:

- a fresh daemon: MPUB write (``--batch-size`` × ``--size``) for ``--runfor``,
  then as long again unmeasured (so the backlog outlasts the reader), then a
  reader (RDY 2500) for ``--runfor``;
- another fresh daemon: one-message round trips (an MPUB of one, as
  ``bench_writer -batch-size=1``), then (``nsqtw-bench`` only, Go's tools
  have no such mode) single-message ``PUB`` from one connection and the
  end-to-end latency at ``--latency-rate`` messages/s;
- a third, with ``--mem-queue-size`` raised to hold a million messages: its
  RSS just after start-up, then the RSS each message adds once a million of
  ``--size`` bytes are published to a topic without channels (held in its
  memory queue);
- with ``--measures=fanout`` (not in the default set): a fresh daemon for
  each ``--fanout-channels`` count and ``--fanout-modes`` mode, Go's and
  nsqtw's in turn, measured by ``nsqtw-bench fanout``
  (:mod:`nsqtw.tools.fanout`): copies/s and a bystander's ``/ping`` and
  ``PUB`` latency meanwhile, in a table of their own.
"""

from __future__ import annotations

import json
import os
import platform
import re
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from nsqtw._go.duration import parse_duration
from nsqtw.tools.daemons import nsqtw_command, process_cpu, rss_bytes, start_listening, stop_daemons
from nsqtw.tools.fanout import FanoutResult, messages_for, run_fanout
from nsqtw.tools.workers import fill

__all__ = ["FANOUT", "Figure", "Measure", "compare", "compare_fanout", "main", "render_fanout"]

_OPS = re.compile(r"([0-9.]+)ops/s")


@dataclass(frozen=True)
class Measure:
    """One figure the comparison takes: a row of the table."""

    key: str
    label: str
    #: "ops" (messages/s, higher is better); "ms", "MB", "B" (lower is better)
    unit: str


WRITE = Measure("write", "MPUB write", "ops")
READ = Measure("read", "read, RDY 2500", "ops")
ROUND_TRIP = Measure("round_trip", "one-message round trips (MPUB of 1)", "ops")
PUB = Measure("pub", "PUB from one connection", "ops")
LATENCY = Measure("latency_p99", "e2e latency p99", "ms")
IDLE_RSS = Measure("idle_rss", "RSS at idle, just started", "MB")
MEMORY = Measure("memory", "memory per message held", "B")
MEASURES = (WRITE, READ, ROUND_TRIP, PUB, LATENCY, IDLE_RSS, MEMORY)

#: seconds a daemon has to exit after SIGTERM (a stop writes its queues to disk: a million
#: messages held by the memory measure take a while on a slow disk)
STOP_WITHIN = 120.0
#: asked for by name only (``--measures=fanout``): its sessions and table are its own
FANOUT = "fanout"
#: lower is better for these units; higher for messages/s
_LOWER_IS_BETTER = {"ms", "MB", "B"}
#: messages the memory figure holds by default (``--mem-queue-size`` is set to hold them all)
MEMORY_MESSAGES = 1_000_000


@dataclass
class Figure:
    """What one measurement gave: the value and the daemon's CPU per message (µs), if known."""

    value: float
    cpu_us_per_msg: float | None = None
    #: the messages the figure stands for
    messages: int = 0
    #: a reader that emptied the backlog: its figure is a lower bound
    drained: bool = False


@dataclass
class Table:
    """Every run's figures, by (measure key, client, daemon)."""

    figures: dict[tuple[str, str, str], list[Figure]] = field(default_factory=dict)

    def add(self, key: str, client: str, daemon: str, figure: Figure) -> None:
        self.figures.setdefault((key, client, daemon), []).append(figure)

    def median(self, key: str, client: str, daemon: str) -> Figure | None:
        got = self.figures.get((key, client, daemon))
        if not got:
            return None
        cpus = [f.cpu_us_per_msg for f in got if f.cpu_us_per_msg is not None]
        return Figure(statistics.median(f.value for f in got), statistics.median(cpus) if cpus else None,
                      drained=any(f.drained for f in got))



class Session:
    """One fresh daemon: started on loopback port 0 in a scratch data directory, stopped at the end."""

    def __init__(self, cmd: list[str], flags: list[str], tmp: str, name: str) -> None:
        #: which daemon it is (``Go``, ``nsqtw``): what a stop that hangs is named by
        self.name = name
        self.pid = 0
        self.data = tempfile.mkdtemp(dir=tmp)
        self.proc, self.tcp, self.http = start_listening(
            [*cmd, f"--data-path={self.data}", "--tcp-address=127.0.0.1:0", "--http-address=127.0.0.1:0",
             *flags], self.data)
        self.pid = self.proc.pid

    def rss_bytes(self) -> int:
        """The daemon's resident set size now."""
        return rss_bytes(self.pid)

    def measure(self, run: Callable[..., tuple[float, int]], *args: Any) -> Figure:
        """``run(*args)`` a load, which returns (value, messages); the daemon's CPU is read around it."""
        before = sum(process_cpu(self.proc.pid))
        value, messages = run(*args)
        cpu = sum(process_cpu(self.proc.pid)) - before
        return Figure(value, cpu * 1e6 / messages if messages else None, messages)

    def stop(self) -> None:
        """Stop the daemon and remove its data: a whole compare writes gigabytes, session by session.

        A daemon still running :data:`STOP_WITHIN` seconds after SIGTERM is killed and the
        comparison fails naming it (:func:`stop_daemons`): a stop that hangs is a bug to report,
        not a kill to hide."""
        try:
            stop_daemons((f"{self.name} nsqd", self.proc), within=STOP_WITHIN)
        finally:
            shutil.rmtree(self.data, ignore_errors=True)


class Clients:
    """The load generators: Go's bench tools (``go_bench_dir``, may be absent) and nsqtw-bench."""

    def __init__(self, go_bench_dir: str, runfor: str, size: int, batch: int, latency_rate: float,
                 memory_messages: int = MEMORY_MESSAGES) -> None:
        self.go_bench_dir = go_bench_dir
        self.memory_messages = memory_messages
        self.runfor = runfor
        self.seconds = parse_duration(runfor)
        self.size = size
        self.batch = batch
        self.latency_rate = latency_rate

    def names(self) -> list[str]:
        have_go = self.go_bench_dir and all(
            os.access(os.path.join(self.go_bench_dir, t), os.X_OK) for t in ("bench_writer", "bench_reader"))
        return ["Go bench", "nsqtw-bench"] if have_go else ["nsqtw-bench"]

    def _go(self, tool: str, tcp: str, *args: str) -> float:
        cmd = [os.path.join(self.go_bench_dir, tool), f"-nsqd-tcp-address={tcp}", f"-runfor={self.runfor}",
               f"-size={self.size}", *args]
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=self.seconds + 120, check=True)
        m = _OPS.search(out.stdout + out.stderr)
        if m is None:
            raise RuntimeError(f"no ops/s in {tool}'s output: {out.stdout + out.stderr!r}")
        return float(m.group(1))

    def _ours(self, mode: str, tcp: str, *args: str) -> dict[str, Any]:
        cmd = [sys.executable, "-m", "nsqtw.tools.bench", mode, f"--nsqd-tcp-address={tcp}",
               f"--runfor={self.runfor}", f"--size={self.size}", "--json", *args]
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=self.seconds + 120, check=True)
        result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
        return result

    def take(self, client: str, measure: Measure, tcp: str) -> tuple[float, int]:
        """One figure of ``measure`` with ``client`` against the daemon at ``tcp``."""
        if measure is LATENCY:
            return self.latency_p99(tcp)
        return self.throughput(client, measure, tcp)

    def fill(self, tcp: str, count: int) -> None:
        """Publish ``count`` messages of ``--size`` bytes (MPUBs of ``--batch-size``), each answered OK."""
        fill(tcp, "memory", self.size, self.batch, count)

    def throughput(self, client: str, measure: Measure, tcp: str) -> tuple[float, int]:
        """Messages/s for ``measure`` and the message count it stands for."""
        if client == "Go bench":
            go_args: dict[Measure, tuple[str, ...]] = {
                WRITE: ("bench_writer", f"-batch-size={self.batch}", "-topic=bench"),
                READ: ("bench_reader", "-topic=bench", "-channel=ch"),
                ROUND_TRIP: ("bench_writer", "-batch-size=1", "-topic=rt")}
            tool, *rest = go_args[measure]
            ops = self._go(tool, tcp, *rest)
            return ops, int(ops * self.seconds)
        our_args: dict[Measure, tuple[str, ...]] = {
            WRITE: ("writer", f"--batch-size={self.batch}", "--topic=bench"),
            READ: ("reader", "--topic=bench", "--channel=ch"),
            ROUND_TRIP: ("writer", "--batch-size=1", "--topic=rt"),
            PUB: ("writer", "--pub", "--batch-size=1", "--workers=1", "--topic=pub")}
        mode, *rest = our_args[measure]
        got = self._ours(mode, tcp, *rest)
        return float(got["ops_per_s"]), int(got["messages"])

    def latency_p99(self, tcp: str) -> tuple[float, int]:
        got = self._ours("latency", tcp, f"--rate={self.latency_rate}", "--topic=latency")
        return float(got["p99_ms"]), int(got["received"])


def _sessions(clients: Clients, client: str, measures: set[str]) -> list[list[Measure]]:
    """The fresh-daemon sessions one client runs, each a list of measures in order."""
    first = [m for m in (WRITE, READ) if m.key in measures]
    second = [m for m in (ROUND_TRIP, PUB, LATENCY) if m.key in measures
              and (client == "nsqtw-bench" or m is ROUND_TRIP)]
    third = [m for m in (IDLE_RSS, MEMORY) if m.key in measures and client == "nsqtw-bench"]
    return [s for s in (first, second, third) if s]


def _memory_session(session: Session, clients: Clients, measures: list[Measure]) -> list[tuple[Measure, Figure]]:
    """RSS just after start-up, then the RSS each of 1M held messages adds."""
    time.sleep(2)
    idle = session.rss_bytes()
    out = [(IDLE_RSS, Figure(idle / 1e6))] if IDLE_RSS in measures else []
    if MEMORY in measures:
        n = clients.memory_messages
        clients.fill(session.tcp, n)
        time.sleep(2)
        out.append((MEMORY, Figure((session.rss_bytes() - idle) / n, None, n)))
    return out


def compare(daemons: dict[str, list[str]], flags: list[str], clients: Clients, runs: int,
            measures: Iterable[str], log: Callable[[str], None]) -> Table:
    """Measure every daemon with every client ``runs`` times, alternating which daemon goes first."""
    table = Table()
    wanted = set(measures)
    names = list(daemons)
    with tempfile.TemporaryDirectory(prefix="nsqtw-compare-") as tmp:
        for run in range(runs):
            order = names if run % 2 == 0 else names[::-1]
            for daemon in order:
                for client in clients.names():
                    for measures_in_session in _sessions(clients, client, wanted):
                        memory = MEMORY in measures_in_session or IDLE_RSS in measures_in_session
                        extra = [f"--mem-queue-size={clients.memory_messages}"] if memory else []
                        session = Session(daemons[daemon], [*flags, *extra], tmp, daemon)
                        try:
                            time.sleep(0.5)  # let start-up work settle before the clock starts
                            if memory:
                                for m, fig in _memory_session(session, clients, measures_in_session):
                                    table.add(m.key, client, daemon, fig)
                                    log(f"run {run + 1}/{runs} {daemon:<6} {m.label}: {fig.value:,.1f} {m.unit}")
                                continue
                            written = 0
                            for m in measures_in_session:
                                if m is READ:
                                    # a backlog bigger than the reader can drain in --runfor, or the
                                    # read figure would be the writer's (unmeasured fills)
                                    for _ in range(1 if WRITE in measures_in_session else 2):
                                        written += clients.take(client, WRITE, session.tcp)[1]
                                fig = session.measure(clients.take, client, m, session.tcp)
                                if m is WRITE:
                                    written += fig.messages
                                elif m is READ and fig.messages >= 0.99 * written:
                                    fig.drained = True
                                table.add(m.key, client, daemon, fig)
                                cpu = "" if fig.cpu_us_per_msg is None else f", daemon {fig.cpu_us_per_msg:.2f} µs/msg"
                                log(f"run {run + 1}/{runs} {daemon:<6} {client:<11} {m.label}: "
                                    f"{fig.value:,.3f} {'ms' if m.unit == 'ms' else 'msg/s'}{cpu}")
                        finally:
                            session.stop()
    return table


def compare_fanout(daemons: dict[str, list[str]], flags: list[str], runs: int, channel_counts: list[int],
                   modes: list[str], copies: int, batch: int, size: int,
                   log: Callable[[str], None]) -> dict[tuple[int, str, str], list[FanoutResult]]:
    """``nsqtw-bench fanout`` on a fresh daemon per channel count and mode, each daemon in turn."""
    results: dict[tuple[int, str, str], list[FanoutResult]] = {}
    names = list(daemons)
    with tempfile.TemporaryDirectory(prefix="nsqtw-compare-") as tmp:
        for run in range(runs):
            order = names if run % 2 == 0 else names[::-1]
            for channels in channel_counts:
                for mode in modes:
                    for daemon in order:
                        session = Session(daemons[daemon], flags, tmp, daemon)
                        try:
                            time.sleep(0.5)
                            got = run_fanout(session.tcp, session.http, channels, mode,
                                             messages_for(channels, copies), batch, size)
                        finally:
                            session.stop()
                        results.setdefault((channels, mode, daemon), []).append(got)
                        log(f"run {run + 1}/{runs} {daemon:<6} {got.text()}")
    return results


def render_fanout(results: dict[tuple[int, str, str], list[FanoutResult]], daemons: list[str], runs: int) -> str:
    """The Markdown table of the fan-out medians: one row per channel count and mode."""
    go, ours = daemons
    lines = [f"| channels | publish | messages | copies/s {go} | copies/s {ours} | nsqtw ahead by | "
             f"bystander /ping p50 / max, {go} → {ours} | bystander PUB p50 / max, {go} → {ours} |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for channels, mode in dict.fromkeys((c, m) for c, m, _ in results):
        a, b = results.get((channels, mode, go)), results.get((channels, mode, ours))
        if not a or not b:
            continue

        def med(rs: list[FanoutResult], name: str) -> float:
            return float(statistics.median(getattr(r, name) for r in rs))

        ca, cb = med(a, "copies_per_s"), med(b, "copies_per_s")
        ping = (f"{med(a, 'ping_p50_ms'):.1f} / {med(a, 'ping_max_ms'):.0f} → "
                f"{med(b, 'ping_p50_ms'):.1f} / {med(b, 'ping_max_ms'):.0f} ms")
        pub = (f"{med(a, 'pub_p50_ms'):.1f} / {med(a, 'pub_max_ms'):.0f} → "
               f"{med(b, 'pub_p50_ms'):.1f} / {med(b, 'pub_max_ms'):.0f} ms")
        lines.append(f"| {channels:,} | {'PUB' if mode == 'pub' else 'MPUB'} | {a[0].messages:,} | {ca:,.0f} | "
                     f"{cb:,.0f} | **{cb / ca if ca else float('inf'):.2f}×** | {ping} | {pub} |")
    lines.append("")
    lines.append(f"Medians of {runs} run(s); copies/s: messages × channels over the time from the first"
                 " publish until the channels' depths add up to all of them.")
    return "\n".join(lines)


def machine() -> str:
    """A line naming the machine the figures were taken on."""
    model = platform.processor() or "?"
    try:
        with open("/proc/cpuinfo") as f:
            model = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), model)
    except OSError:
        pass
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    return (f"{os.cpu_count()} cores ({model}), Python {platform.python_version()}, "
            f"load average at the start {load}, {time.strftime('%Y-%m-%d %H:%M %Z')}")


def speedups() -> str:
    """Whether the nsqtw daemons this run starts use the compiled speed-ups (asked of their interpreter)."""
    asked = subprocess.run([sys.executable, "-c", "from nsqtw.core.message import SPEEDUPS; print(SPEEDUPS)"],
                           capture_output=True, text=True)
    return {"True": "yes", "False": "no"}.get(asked.stdout.strip(), "unknown")


def render(table: Table, daemons: list[str], clients: list[str], runs: int) -> str:
    """The Markdown table of medians: one row per measure and client."""
    go, ours = daemons
    lines = [f"| measure | client | {go} | {ours} | nsqtw ahead by | daemon CPU/msg, {go} → {ours} |",
             "| --- | --- | --- | --- | --- | --- |"]
    for m in MEASURES:
        for client in clients:
            a, b = table.median(m.key, client, go), table.median(m.key, client, ours)
            if a is None or b is None:
                continue
            if m.unit in _LOWER_IS_BETTER:
                digits = 3 if m.unit == "ms" else 1
                cells = f"{a.value:,.{digits}f} {m.unit} | {b.value:,.{digits}f} {m.unit}"
                ratio = a.value / b.value if b.value else float("inf")
            else:
                cells = " | ".join(f"{'≥ ' if f.drained else ''}{f.value:,.0f}/s" for f in (a, b))
                ratio = b.value / a.value if a.value else float("inf")
            cpu = "—"
            if a.cpu_us_per_msg is not None and b.cpu_us_per_msg is not None:
                cpu = f"{a.cpu_us_per_msg:.2f} → {b.cpu_us_per_msg:.2f} µs"
            lines.append(f"| {m.label} | {client} | {cells} | **{ratio:.2f}×** | {cpu} |")
    lines.append("")
    lines.append(f"Medians of {runs} run(s); \"nsqtw ahead by\" is nsqtw's throughput ÷ Go's, or Go's latency or"
                 " memory ÷ nsqtw's; \"≥\": the reader emptied the backlog in some run, so its figure is a"
                 " lower bound.")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    """``nsqtw-bench compare`` (called by :func:`nsqtw.tools.bench.main` with the remaining arguments)."""
    import argparse

    parser = argparse.ArgumentParser(prog="nsqtw-bench compare", description=__doc__.split("\n\n")[0])
    parser.add_argument("--go-nsqd", required=True,
                        help="Go nsqd to compare with: a path, or a command line (split like a shell)")
    parser.add_argument("--go-bench-dir", default=None,
                        help="where bench_writer/bench_reader are (default: next to --go-nsqd; '' for none)")
    parser.add_argument("--runs", type=int, default=3, help="runs; the table shows medians")
    parser.add_argument("--runfor", default="10s", help="each measurement's length (Go duration)")
    parser.add_argument("--size", type=int, default=200)
    parser.add_argument("--batch-size", type=int, default=200, help="messages per MPUB for the write figure")
    parser.add_argument("--latency-rate", type=float, default=10000.0, help="messages/s of the latency figure")
    parser.add_argument("--measures", default=",".join(m.key for m in MEASURES),
                        help="which figures, comma-separated: " + ", ".join(m.key for m in MEASURES)
                        + f"; and {FANOUT} (only when named)")
    parser.add_argument("--fanout-channels", default="50,500,5000", help="fanout: channel counts")
    parser.add_argument("--fanout-modes", default="pub,mpub", help="fanout: pub, mpub or both")
    parser.add_argument("--fanout-copies", type=int, default=1_000_000,
                        help="fanout: about this many copies per measurement (at most 10000 messages)")
    parser.add_argument("--daemon-flag", action="append", default=[], metavar="FLAG",
                        help="a flag both daemons get, e.g. --daemon-flag=--mem-queue-size=0 (repeatable)")
    parser.add_argument("--nsqtw-flag", action="append", default=[], metavar="FLAG",
                        help="a flag only nsqtw gets, one Go nsqd does not have, e.g. --nsqtw-flag=--busy-poll=0"
                             " for an A/B of that feature (repeatable)")
    parser.add_argument("--memory-messages", type=int, default=MEMORY_MESSAGES,
                        help="messages held for the memory figure")
    parser.add_argument("--json", action="store_true", help="print every figure of every run as JSON too")
    ns = parser.parse_args(argv)
    go_cmd = shlex.split(ns.go_nsqd)
    if os.sep in go_cmd[0]:
        # each daemon starts in a scratch directory: a relative path must not depend on it
        go_cmd[0] = os.path.abspath(go_cmd[0])
    bench_dir = ns.go_bench_dir if ns.go_bench_dir is not None else os.path.dirname(go_cmd[0])
    clients = Clients(bench_dir, ns.runfor, ns.size, ns.batch_size, ns.latency_rate, ns.memory_messages)
    daemons = {"Go": go_cmd, "nsqtw": [*nsqtw_command(), *ns.nsqtw_flag]}
    header = machine()
    print(f"# {header}\n# daemons: {' '.join(go_cmd)} | {' '.join(daemons['nsqtw'])}; "
          f"flags: {' '.join(ns.daemon_flag) or '(defaults)'}; nsqtw's compiled speed-ups: {speedups()}", flush=True)
    measures = ns.measures.split(",")
    log = lambda line: print(line, file=sys.stderr, flush=True)  # noqa: E731
    table = compare(daemons, ns.daemon_flag, clients, ns.runs, [m for m in measures if m != FANOUT], log)
    if table.figures:
        print(render(table, list(daemons), clients.names(), ns.runs))
    if FANOUT in measures:
        fanout = compare_fanout(daemons, ns.daemon_flag, ns.runs, [int(c) for c in ns.fanout_channels.split(",")],
                                ns.fanout_modes.split(","), ns.fanout_copies, ns.batch_size, ns.size, log)
        print(render_fanout(fanout, list(daemons), ns.runs))
    if ns.json:
        print(json.dumps({f"{k}|{c}|{d}": [[f.value, f.cpu_us_per_msg] for f in figs]
                          for (k, c, d), figs in table.figures.items()}))
    return 0
