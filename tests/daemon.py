"""Start real nsqtw daemons (twistd nsqtw, nsqtw-lookupd) on loopback port 0 for integration tests."""

from __future__ import annotations

import os
import re
import select
import signal
import subprocess
import sys
import threading
import time

from nsqtw.tools.daemons import TWISTD, start_listening  # noqa: F401 (re-exported)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_LISTEN = re.compile(r"(TCP|HTTP|HTTPS): listening on (\S+)")


#: daemons that did not stop within their ``stop`` timeout of SIGTERM or SIGINT, and were killed
#: (:meth:`Daemon.stop`); tests/conftest.py fails the test whose teardown found one
HUNG: list[str] = []

#: the ``--workers`` values the client suites run with (``workers`` in tests/integration/conftest.py)
WORKERS = [1, 2]


def workers_args(workers: int) -> tuple[str, ...]:
    """nsqd's arguments for ``workers`` (none for one process: :meth:`Daemon.plugin_args` asks for it)."""
    return (f"--workers={workers}",) if workers > 1 else ()


class Daemon:
    """One nsqtw process; ``tcp``/``http`` are ``(host, port)`` it reported.

    After start-up a thread keeps reading the daemon's output into ``output``,
    so a daemon that logs a lot (thousands of connections) never blocks on a
    full pipe. ``code`` is the Python that runs twistd; a test may prepend
    set-up (a fault injected in the disk layer) to it.
    """

    plugin = "nsqtw"
    #: the interpreter that runs twistd; with ``checkout`` this checkout comes first on its path
    python = sys.executable
    checkout = True

    def __init__(self, data_path: str, *args: str, env: dict[str, str] | None = None,
                 code: str = TWISTD, nofile: int | None = None) -> None:
        self.data_path = data_path
        self.args = list(args)
        self.env = env
        self.code = code
        #: the open-file limit (soft and hard) the daemon runs under, if not this process's
        self.nofile = nofile
        self.proc: subprocess.Popen[bytes] | None = None
        self.tcp: tuple[str, int] = ("", 0)
        self.http: tuple[str, int] = ("", 0)
        self.output: list[str] = []
        self._reader: threading.Thread | None = None
        self._output_lock = threading.Lock()
        self._fd = -1

    @property
    def tcp_address(self) -> str:
        return f"{self.tcp[0]}:{self.tcp[1]}"

    @property
    def http_address(self) -> str:
        return f"{self.http[0]}:{self.http[1]}"

    def start(self, tcp: str = "127.0.0.1:0", http: str = "127.0.0.1:0", timeout: float = 20) -> Daemon:
        env = dict(os.environ, **(self.env or {}))
        if self.checkout:
            env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
        cmd = self.command(tcp, http)
        self.proc = subprocess.Popen(cmd, cwd=self.data_path, env=env, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, preexec_fn=self._limit if self.nofile else None)
        found: dict[str, str] = {}
        deadline = time.monotonic() + timeout
        assert self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        buf = b""
        while not set(self.listens) <= found.keys():  # HTTPS may be logged too, in any order
            left = deadline - time.monotonic()
            if left <= 0:
                self.stop()
                raise RuntimeError(f"{self.plugin} did not start:\n" + "".join(self.output))
            ready, _, _ = select.select([fd], [], [], left)
            if not ready:
                continue
            chunk = os.read(fd, 65536)
            if not chunk:
                self.proc.wait()
                raise RuntimeError(f"{self.plugin} exited:\n" + "".join(self.output) + buf.decode())
            buf += chunk
            *lines, buf = buf.split(b"\n")
            for raw in lines:
                line = raw.decode("utf-8", "replace") + "\n"
                self.output.append(line)
                m = _LISTEN.search(line)
                if m:
                    found[m.group(1)] = m.group(2)
        if buf:
            self.output.append(buf.decode("utf-8", "replace"))
        self._fd = fd
        self._reader = threading.Thread(target=self._drain, args=(fd,), daemon=True)
        self._reader.start()
        if "TCP" in found:
            host, port = found["TCP"].rsplit(":", 1)
            self.tcp = (host, int(port))
        host, port = found["HTTP"].rsplit(":", 1)
        self.http = (host, int(port))
        return self

    def _limit(self) -> None:
        """In the child, before exec: the open-file limit, hard too (the daemon raises its soft one)."""
        import resource

        assert self.nofile is not None
        resource.setrlimit(resource.RLIMIT_NOFILE, (self.nofile, self.nofile))

    #: the listeners whose ``listening on`` lines start() waits for
    listens: tuple[str, ...] = ("TCP", "HTTP")

    def address_args(self, tcp: str, http: str) -> list[str]:
        return [f"--tcp-address={tcp}", f"--http-address={http}"]

    def command(self, tcp: str, http: str) -> list[str]:
        """The program and arguments that start this daemon."""
        return [self.python, "-c", self.code, "--pidfile=", "-n", self.plugin,
                *self.address_args(tcp, http), *self.plugin_args(), *self.args]

    def plugin_args(self) -> list[str]:
        # one process unless a test asks for workers or a config file: --workers=0, the default,
        # would make the suite's processes depend on the cores of the machine that runs it
        asked = any(a.startswith(("--workers", "--config")) for a in self.args)
        return [f"--data-path={self.data_path}", *(() if asked else ("--workers=1",))]

    def _drain(self, fd: int) -> None:
        poller = select.poll()  # poll, not select: the test may hold more than 1024 descriptors
        poller.register(fd, select.POLLIN)
        while True:
            poller.poll(1000)
            if not self._read_available(fd):
                return

    def _read_available(self, fd: int) -> bool:
        """Append what the pipe holds right now to ``output``; False once it is at its end."""
        with self._output_lock:
            poller = select.poll()
            poller.register(fd, select.POLLIN)
            while poller.poll(0):
                try:
                    chunk = os.read(fd, 65536)
                except OSError:
                    return False
                if not chunk:
                    return False
                self.output.append(chunk.decode("utf-8", "replace"))
        return True

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def read_output(self) -> str:
        """Everything logged so far (whatever the daemon wrote before this call)."""
        if self._reader is not None and self.proc is not None:
            if self.proc.poll() is not None:
                self._reader.join(5)
            else:
                self._read_available(self._fd)
        return "".join(self.output)

    def wait_output(self, pattern: str, timeout: float = 10) -> re.Match[str]:
        """Wait until the log matches ``pattern`` (a regex); returns the match."""
        deadline = time.monotonic() + timeout
        while True:
            m = re.search(pattern, self.read_output())
            if m:
                return m
            if time.monotonic() > deadline:
                raise AssertionError(f"no {pattern!r} in the log:\n" + "".join(self.output))
            time.sleep(0.05)

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 20) -> int:
        """Signal the daemon, wait at most ``timeout`` seconds for it to exit, and return its code.

        A daemon a test froze (SIGSTOP) is continued after the signal, so it acts on it. One
        still running ``timeout`` after a signal that asks it to stop (SIGTERM, SIGINT) is killed
        and noted in :data:`HUNG`; the test whose teardown saw that fails (tests/conftest.py),
        so a daemon that hangs on its way out is a failure, never a quiet 20 s kill.
        """
        if self.proc is None:
            return 0
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            if sig != signal.SIGKILL:
                self.proc.send_signal(signal.SIGCONT)
        try:
            deadline = time.monotonic() + timeout
            while self.proc.poll() is None and time.monotonic() < deadline:
                time.sleep(0.02)
            if self.proc.poll() is None:
                self.proc.kill()
                if sig in (signal.SIGTERM, signal.SIGINT):
                    HUNG.append(f"{self.plugin} (pid {self.proc.pid}, {' '.join(self.args)}) still running "
                                f"{timeout:g} s after {signal.Signals(sig).name}: killed")
            rc = self.proc.wait()
        finally:
            if self._reader is not None:
                self._reader.join(5)
                self._reader = None
            if self.proc.stdout is not None:
                self.proc.stdout.close()
            self.proc = None
        return rc

    def kill(self) -> int:
        return self.stop(signal.SIGKILL)


class Started:
    """Daemons a test starts, each in its own folder under ``root``; ``stop_all`` stops them, last first."""

    def __init__(self, root: str) -> None:
        self.root = root
        self.daemons: list[Daemon] = []

    def folder(self, name: str) -> str:
        path = os.path.join(self.root, name)
        os.mkdir(path)
        return path

    def start(self, daemon: Daemon, **where: str) -> Daemon:
        self.daemons.append(daemon)
        return daemon.start(**where)  # type: ignore[arg-type]

    def stop_all(self) -> None:
        for d in reversed(self.daemons):
            d.stop()


class LookupdDaemon(Daemon):
    """One nsqtw-lookupd process; it keeps no data, ``data_path`` is just its working directory."""

    plugin = "nsqtw-lookupd"

    def plugin_args(self) -> list[str]:
        return []


class AdminDaemon(Daemon):
    """One nsqtw-admin process: HTTP only; ``data_path`` is just its working directory."""

    plugin = "nsqtw-admin"
    listens = ("HTTP",)

    def address_args(self, tcp: str, http: str) -> list[str]:
        return [f"--http-address={http}"]

    def plugin_args(self) -> list[str]:
        return []
