"""Run a documentation page's ``sh`` blocks as a person types them into a terminal.

A page's blocks go, in order, into one bash (:class:`Terminal`) whose
working directory stands for the root of a checkout (its top-level entries
linked from this one), so they share the directory, the variables and the
background jobs, as in a terminal. Job control is on (``set -m``): every job
has its own process group, so Ctrl-C (SIGINT to that group) reaches what it
would. What the test machine must change is changed the same way in every
block, and only this:

* **Ports.** Every port on this machine a doc names (:data:`DOC_PORTS`,
  after ``127.0.0.1:``, ``0.0.0.0:``, ``localhost:`` or a bare ``:``)
  becomes a free one, the same one everywhere in the page, so pages and
  other tests on the machine never collide.
  A ``twistd`` daemon the doc starts on its defaults is given those
  defaults explicitly (``--tcp-address=0.0.0.0:4150`` and so on, before
  the port becomes the page's).
* **Foreground daemons.** A ``twistd -n`` line without ``&`` runs until
  Ctrl-C in its own terminal. Here it is started as a job, the block goes
  on once its listeners answer, and it is stopped with SIGINT when a later
  daemon needs its ports (as a person stops one before starting the next)
  or at the end of the page.
* **Commands.** ``twistd``, ``nsqtw``, ``nsqtw-bench`` and ``python`` run
  this checkout with this interpreter (:func:`shims`); ``pip`` installs
  nothing: it checks that what a doc installs is this checkout (whose
  install tests/integration/test_install.py checks) or a version the
  tests already run with.
* **The default address of a program**, ``NSQD_TCP_ADDRESS``
  (examples/spark/events_per_minute.py's), is the page's node's.
* **Durations** a block's spec lists (``Block.shorten``), to keep a
  benchmark short; the rest of the command is the doc's.

A command that fails (bash's ``ERR`` trap, with ``pipefail``) fails the block.
"""

from __future__ import annotations

import configparser
import os
import random
import re
import signal
import socket
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from nsqtw.tools.daemons import TWISTD

ROOT = Path(__file__).resolve().parents[1]

#: every port the docs' blocks name, and the daemons' defaults among them
DOC_PORTS = (4150, 4151, 4152, 4160, 4161, 4171, 4181, 4250, 4251, 4260, 4261, 4350, 4351, 4450, 4451, 8125)
DEFAULTS = {
    "nsqtw": (("tcp-address", "0.0.0.0:4150"), ("http-address", "0.0.0.0:4151"), ("https-address", "0.0.0.0:4152")),
    "nsqtw-lookupd": (("tcp-address", "0.0.0.0:4160"), ("http-address", "0.0.0.0:4161")),
    "nsqtw-admin": (("http-address", "0.0.0.0:4171"),),
}
_TWISTD = re.compile(r"\btwistd\b(?P<opts>[^&;|\n]*?)\s(?P<plugin>nsqtw(?:-lookupd|-admin)?)(?=\s|$)"
                     r"(?P<args>[^&;|\n)]*)")
_MARK = "@@"
#: a port on this machine: after 127.0.0.1, 0.0.0.0, localhost, or a bare ``:`` (``--tcp-address=:4150``)
_LOCAL_PORT = re.compile(r"(?:(?<=127\.0\.0\.1:)|(?<=0\.0\.0\.0:)|(?<=localhost:)|(?<=[=\s]:))(\d{4})\b")


#: a line a twistd daemon logs (a job's output shares the terminal with the blocks')
_DAEMON_LOG = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d[+-]\d{4} \[[^\]\n]*\][^\n]*\n")


def without_logs(text: str) -> str:
    """A terminal's output without the lines its daemons logged into it."""
    return _DAEMON_LOG.sub("", text)


def sh_blocks(page: Path) -> list[str]:
    """The page's ```sh blocks, in order; one indented in a list item without its indent."""
    found = re.findall(r"^( *)```sh\n(.*?)^\1```", page.read_text(), re.S | re.M)
    return [textwrap.dedent(text) if indent else text for indent, text in found]


def go_bin() -> Path | None:
    """Go NSQ v1.3.0's bin/: ``$NSQTW_GO_BIN``, or ../shared/anchor/bin beside the checkout."""
    for candidate in (os.environ.get("NSQTW_GO_BIN", ""), str(ROOT.parent / "shared" / "anchor" / "bin")):
        if candidate and os.access(os.path.join(candidate, "nsqd"), os.X_OK):
            return Path(candidate).resolve()
    return None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _ephemeral_ports() -> tuple[int, int]:
    """The range the kernel picks a connection's source port from."""
    try:
        low, high = map(int, Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    except (OSError, ValueError):
        low, high = 32768, 60999
    return low, high


def page_ports(wanted: Iterable[int]) -> dict[int, int]:
    """A free port for each of ``wanted``, distinct, chosen below the ephemeral range.

    A port found free and closed again waits for the block that binds it;
    from the ephemeral range, it could meanwhile become the source port of
    a connection the page's own daemons make (a node to its lookupds), and
    the daemon that then binds it fails. Where the range leaves no room
    below it, ports come from the kernel as :func:`free_port`'s do.
    """
    wanted = list(wanted)
    low, _ = _ephemeral_ports()
    if low < 10000:
        return {p: free_port() for p in wanted}
    candidates = list(range(10000, min(low, 32000)))
    random.shuffle(candidates)
    chosen: list[int] = []
    for port in candidates:
        if len(chosen) == len(wanted):
            break
        with socket.socket() as s:
            try:
                s.bind(("0.0.0.0", port))
            except OSError:
                continue
        chosen.append(port)
    return dict(zip(wanted, chosen, strict=True))


def _logical_lines(text: str) -> list[str]:
    """Lines with their backslash continuations joined (kept as written, newlines included)."""
    out: list[str] = []
    pending = ""
    for line in text.splitlines(keepends=True):
        pending += line
        if not line.rstrip("\n").endswith("\\"):
            out.append(pending)
            pending = ""
    if pending:
        out.append(pending)
    return out


def _code(line: str) -> str:
    """A line without its trailing comment (a ``#`` after a space, outside quotes: the docs' use)."""
    quote = ""
    for i, ch in enumerate(line):
        if quote:
            quote = "" if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and (i == 0 or line[i - 1] in " \t"):
            return line[:i]
    return line


def with_defaults(line: str) -> str:
    """A twistd daemon started on its default addresses, given them explicitly (to be made free ports)."""

    def add(m: re.Match[str]) -> str:
        args = m.group("args")
        given = set(re.findall(r"(?:^|\s)--?([a-z-]+-address)\b", args))
        tls = "--tls-cert" in args or "-tls-cert" in args
        extra = [f" --{flag}={value}" for flag, value in DEFAULTS[m.group("plugin")]
                 if flag not in given and (flag != "https-address" or tls)]
        return f"twistd{m.group('opts')} {m.group('plugin')}{''.join(extra)}{args}"

    code = _code(line)
    return _TWISTD.sub(add, code) + line[len(code):]


@dataclass
class Ports:
    """The page's free port for each port the docs name."""

    mapping: dict[int, int] = field(default_factory=lambda: page_ports(DOC_PORTS))

    def apply(self, text: str) -> str:
        return _LOCAL_PORT.sub(lambda m: str(self.mapping.get(int(m.group(1)), m.group(1))), text)


def daemon_ports(line: str) -> list[int]:
    """The ports a (rewritten) twistd line listens on."""
    m = _TWISTD.search(_code(line))
    if not m:
        return []
    found = re.findall(r"(?:^|\s)--?(?:tcp|http|https)-address[= ]\S*?:(\d+)\b", m.group("args"))
    return [int(p) for p in found if p != "0"]


def is_foreground_daemon(line: str) -> bool:
    code = _code(line).rstrip()
    return bool(_TWISTD.search(code)) and not code.endswith("&") and not code.endswith("\\")


def shims(where: Path, python: str = sys.executable) -> Path:
    """A bin/ directory whose commands run this checkout with ``python`` (first on the terminal's PATH)."""
    where.mkdir(parents=True, exist_ok=True)
    commands = {
        "twistd": f'exec "{python}" -c "{TWISTD}" "$@"',
        "nsqtw": f'exec "{python}" -m nsqtw.tools.cli "$@"',
        "nsqtw-bench": f'exec "{python}" -m nsqtw.tools.bench "$@"',
        "python": f'exec "{python}" "$@"',
        "python3": f'exec "{python}" "$@"',
        "pip": f'exec "{python}" "{ROOT / "tests" / "docrun.py"}" pip "$@"',
    }
    for name, line in commands.items():
        path = where / name
        path.write_text(f"#!/bin/sh\n{line}\n")
        path.chmod(0o755)
    return where


def pip_check(args: list[str]) -> int:
    """The ``pip`` of a doc's block: what it installs must be this checkout (with extras setup.cfg
    has) or a pinned version the tests run with; nothing is installed."""
    if not args or args[0] != "install":
        print(f"pip: only 'pip install' is expected in the docs, not {args}", file=sys.stderr)
        return 1
    cfg = configparser.ConfigParser()
    cfg.read(ROOT / "setup.cfg")
    extras = set(cfg["options.extras_require"])
    from importlib.metadata import PackageNotFoundError, version

    for arg in args[1:]:
        if arg.startswith("-"):
            continue
        m = re.fullmatch(r"\.(?:\[([\w,]+)\])?", arg)
        if m:
            unknown = set(filter(None, (m.group(1) or "").split(","))) - extras
            if unknown:
                print(f"pip: setup.cfg has no extra {sorted(unknown)}", file=sys.stderr)
                return 1
            continue
        m = re.fullmatch(r"([\w.-]+)==([\w.]+)", arg)
        if m:
            try:
                found = version(m.group(1))
            except PackageNotFoundError:
                found = "none"
            if found != m.group(2):
                print(f"pip: the doc pins {arg}, the tests run {m.group(1)} {found}", file=sys.stderr)
                return 1
            continue
        print(f"pip: {arg} is not this checkout: ERROR: No matching distribution found for {arg}", file=sys.stderr)
        return 1
    return 0


def _state(pid: int) -> str:
    """A process's state letter, '' when it is gone ('Z': exited, not yet reaped)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return ""


def _alive(pid: int) -> bool:
    return _state(pid) not in ("", "Z", "X")


def _children(pid: int) -> list[int]:
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    if int(f.read().rsplit(")", 1)[1].split()[1]) == pid:
                        out.append(int(entry))
            except (OSError, IndexError, ValueError):
                pass
    return out


def _answers(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return True
    except OSError:
        return False


class BlockFailed(AssertionError):
    pass


@dataclass
class Daemon:
    """A daemon started by a block: its job's process group and the ports it listens on."""

    pgid: int
    ports: list[int]
    line: str


def _default_interrupt() -> None:
    """In the child, before bash starts: SIGINT and SIGQUIT back to their defaults."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGQUIT, signal.SIG_DFL)


class Terminal:
    """One bash, typed into block by block; what it prints goes to ``log``."""

    def __init__(self, cwd: Path, env: dict[str, str], log: Path) -> None:
        self.cwd = cwd
        self.log = log
        #: the files it types commands from and answers into (its own: a page's terminals share a directory)
        self.files = log.with_suffix("")
        self._out = open(log, "ab")  # noqa: SIM115 - held for the terminal's life
        # Ctrl-C as a terminal gives it: a test run started in the background (``cmd &`` in a
        # script) ignores SIGINT, which every process it starts inherits, and a daemon (twistd,
        # like Go's programs) leaves an ignored SIGINT ignored, so the page's Ctrl-C did nothing
        self.proc = subprocess.Popen(["bash", "--norc", "--noprofile"], stdin=subprocess.PIPE, stdout=self._out,
                                     stderr=subprocess.STDOUT, cwd=cwd, env=env, start_new_session=True,
                                     preexec_fn=_default_interrupt)
        self.count = 0
        self.jobs: set[int] = set()
        self._type("set -m -o pipefail -E\n"
                   f"trap 'echo \"{_MARK}ERR($?): $BASH_COMMAND\" >&2' ERR\n")

    def _type(self, text: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(text.encode())
        self.proc.stdin.flush()

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def run(self, script: str, timeout: float, until: str | None = None) -> str:
        """Run ``script`` as typed; its output. With ``until``, its last command runs until Ctrl-C,
        which comes once that text has been printed."""
        self.count += 1
        n = self.count
        path = Path(f"{self.files}.block{n}.sh")
        path.write_text(script)
        start = len(self.output())
        jobs = Path(f"{self.files}.jobs{n}")  # absolute: a block may change the directory
        self._type(f'echo "{_MARK}START {n}"; . "{path}" </dev/null; jobs -p > "{jobs}"; '
                   f'echo "{_MARK}DONE {n}"\n')
        deadline = time.monotonic() + timeout
        interrupted = False
        while True:
            out = self.output()[start:]
            if f"{_MARK}DONE {n}\n" in out:
                break
            if self.proc.poll() is not None:
                raise BlockFailed(f"the terminal exited ({self.proc.returncode}):\n{out}")
            if until is not None and not interrupted and until in out:
                for child in _children(self.proc.pid):
                    if child not in self.jobs:  # the foreground job: Ctrl-C
                        try:
                            _signal_group(os.getpgid(child), signal.SIGINT)
                        except ProcessLookupError:
                            pass
                interrupted = True
            if time.monotonic() > deadline:
                raise BlockFailed(f"block {n} did not finish within {timeout:.0f} s:\n{script}\n--- output:\n{out}")
            time.sleep(0.1)
        self.jobs |= {int(p) for p in jobs.read_text().split()}
        out = out.split(f"{_MARK}START {n}\n", 1)[-1].split(f"{_MARK}DONE {n}\n", 1)[0]
        # (a marker may follow output without a newline, such as curl's)
        errors = [line for line in out.splitlines() if f"{_MARK}ERR(" in line
                  and not (interrupted and f"{_MARK}ERR(130)" in line)]
        if errors:
            raise BlockFailed(f"a command failed: {errors}\n{script}\n--- output:\n{out}")
        if until is not None and not interrupted:
            raise BlockFailed(f"block {n} ended without printing {until!r}:\n{out}")
        return out

    def _wait_file(self, path: Path) -> None:
        deadline = time.monotonic() + 10
        while not path.exists() and time.monotonic() < deadline:
            time.sleep(0.05)

    def start_job(self, line: str) -> int:
        """Start one command line as a background job; its process group."""
        self.count += 1
        n = self.count
        # its input is not the terminal's (the commands typed after it)
        job = Path(f"{self.files}.job{n}")
        self._type(f'{line.rstrip()} </dev/null &\necho $! > "{job}"\n')
        self._wait_file(job)
        for _ in range(100):
            text = job.read_text().strip()
            if text:
                break
            time.sleep(0.05)
        pgid = int(text)
        self.jobs.add(pgid)
        return pgid

    def close(self) -> None:
        """Ctrl-C every job still running (and a command left in the foreground), then the terminal;
        what stays is killed."""
        groups = [g for g in self.jobs if _alive(g)]
        for child in _children(self.proc.pid):
            try:
                groups.append(os.getpgid(child))
            except ProcessLookupError:
                pass
        for g in groups:
            _signal_group(g, signal.SIGINT)
        deadline = time.monotonic() + 30
        while any(_group_alive(g) for g in groups) and time.monotonic() < deadline:
            time.sleep(0.1)
        for g in groups:
            _signal_group(g, signal.SIGKILL)
        _signal_group(self.proc.pid, signal.SIGKILL)
        self.proc.wait()
        self._out.close()


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _group_alive(pgid: int) -> bool:
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
                if int(fields[2]) == pgid and fields[0] not in ("Z", "X"):
                    return True
            except (OSError, IndexError, ValueError):
                pass
    return False


@dataclass
class Page:
    """A page's run: its terminals, the daemons started in the foreground, its ports."""

    work: Path
    env: dict[str, str]
    ports: Ports = field(default_factory=Ports)
    terminals: list[Terminal] = field(default_factory=list)
    foreground: list[Daemon] = field(default_factory=list)

    def __post_init__(self) -> None:
        # a program a block runs that takes the default address from this variable (docs/spark.md's
        # examples/spark/events_per_minute.py) finds the page's node, as the blocks' own addresses do
        self.env = dict(self.env, NSQD_TCP_ADDRESS=f"127.0.0.1:{self.ports.mapping[4150]}")

    def terminal(self) -> Terminal:
        t = Terminal(self.work, self.env, self.work / f".terminal{len(self.terminals)}.log")
        self.terminals.append(t)
        return t

    def prepare(self, text: str, shorten: Iterable[tuple[str, str]] = ()) -> str:
        for doc, test in shorten:
            assert doc in text, f"the block no longer says {doc!r}"
            text = text.replace(doc, test)
        return "".join(self.ports.apply(with_defaults(line.replace("\\\n", " ")))
                       for line in _logical_lines(text))

    def run_block(self, term: Terminal, text: str, *, shorten: Iterable[tuple[str, str]] = (),
                  until: str | None = None, timeout: float = 120) -> str:
        """Run one block: its foreground daemons as jobs, the rest as typed; waits for every daemon it
        starts to answer on its ports. Its output, without the lines daemons logged meanwhile."""
        lines = _logical_lines(self.prepare(text, shorten))
        out = ""
        segment: list[str] = []
        for line in lines:
            if is_foreground_daemon(line):
                out += self._segment(term, segment, timeout, None)
                segment = []
                out += self._foreground(term, line)
            else:
                segment.append(line)
        out += self._segment(term, segment, timeout, until)
        return without_logs(out)

    def run_job(self, term: Terminal, text: str, until: str, *, timeout: float = 120) -> str:
        """Run a block whose one command runs until stopped (while the doc goes on in another shell) as
        a job; once it has printed ``until``, the page goes on. It is stopped with the page."""
        script = self.prepare(text).strip()
        start = len(term.output())
        pgid = term.start_job("{ " + script + "\n}")
        deadline = time.monotonic() + timeout
        while until not in term.output()[start:]:
            if not _group_alive(pgid) or time.monotonic() > deadline:
                raise BlockFailed(f"{script!r} did not print {until!r} "
                                  f"({'it exited' if not _group_alive(pgid) else 'timed out'}):\n"
                                  f"{term.output()[start:][-4000:]}")
            time.sleep(0.2)
        return without_logs(term.output()[start:])

    def wait_for(self, term: Terminal, command: str, wanted: str, timeout: float = 120) -> None:
        """Run ``command`` until its output holds ``wanted``: what the doc tells the reader to wait for."""
        deadline = time.monotonic() + timeout
        while wanted not in (out := term.run(self.prepare(command), timeout)):
            if time.monotonic() > deadline:
                raise BlockFailed(f"{command!r} did not print {wanted!r} within {timeout:.0f} s:\n{out}")
            time.sleep(1)

    def _segment(self, term: Terminal, lines: list[str], timeout: float, until: str | None) -> str:
        if not "".join(lines).strip():
            return ""
        before = set(term.jobs)
        out = term.run("".join(lines), timeout, until)
        ports = [p for line in lines for p in daemon_ports(line)]
        self._wait_listening(ports, term.jobs - before, term)
        return out

    def _foreground(self, term: Terminal, line: str) -> str:
        ports = daemon_ports(line)
        for d in list(self.foreground):
            if set(d.ports) & set(ports):  # Ctrl-C in the terminal that runs it, as before starting the next
                self.stop(d)
        code = _code(line).rstrip()
        pgid = term.start_job(code.rstrip("\\").rstrip())
        self.foreground.append(Daemon(pgid, ports, code))
        self._wait_listening(ports, {pgid}, term)
        return ""

    def stop(self, d: Daemon) -> None:
        _signal_group(d.pgid, signal.SIGINT)
        deadline = time.monotonic() + 30
        while _group_alive(d.pgid):
            if time.monotonic() > deadline:
                raise BlockFailed(f"{d.line!r} did not stop within 30 s of Ctrl-C")
            time.sleep(0.1)
        self.foreground.remove(d)

    def _wait_listening(self, ports: list[int], jobs: set[int], term: Terminal, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while not all(_answers(p) for p in ports):
            dead = bool(jobs) and not any(_group_alive(g) for g in jobs)
            if dead or time.monotonic() > deadline:
                raise BlockFailed(f"a daemon did not start listening on {ports} "
                                  f"({'it exited' if dead else 'timed out'}):\n{term.output()[-4000:]}")
            time.sleep(0.1)

    def close(self) -> None:
        for t in reversed(self.terminals):
            t.close()


def work_dir(where: Path) -> Path:
    """A directory standing for a fresh checkout: the top-level entries git has in this one, linked
    (not what the docs' commands leave in a checkout, such as ``nsq-data/``)."""
    where.mkdir(parents=True, exist_ok=True)
    try:
        listed = subprocess.run(["git", "ls-files"], cwd=ROOT, check=True, capture_output=True, text=True).stdout
        names = {line.split("/", 1)[0] for line in listed.splitlines()}
    except (OSError, subprocess.CalledProcessError):  # not a git checkout: what a source tree holds
        names = {e.name for e in ROOT.iterdir() if not e.name.startswith((".", "nsq-data", "events-"))}
    for name in sorted(names):
        if not name.startswith(".") and (ROOT / name).exists():
            (where / name).symlink_to(ROOT / name)
    return where


def environment(bin_dir: Path, go: Path | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("NSQTW_GO_BIN", "PYTHONPATH")}
    env["PATH"] = os.pathsep.join([str(bin_dir), os.path.dirname(sys.executable), env.get("PATH", "")])
    env["PYTHONPATH"] = str(ROOT)
    env["PYTHONUNBUFFERED"] = "1"
    if go is not None:
        env["NSQTW_GO_BIN"] = str(go)
    return env


if __name__ == "__main__" and sys.argv[1:2] == ["pip"]:
    sys.exit(pip_check(sys.argv[2:]))
