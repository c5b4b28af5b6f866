"""Start real nsqtw daemons (twistd nsqtw, nsqtw-lookupd) on loopback port 0 for integration tests."""

from __future__ import annotations

import os
import re
import select
import signal
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_LISTEN = re.compile(r"(TCP|HTTP|HTTPS): listening on (\S+)")
TWISTD = ("import sys; from twisted.scripts.twistd import run; sys.argv[0] = 'twistd'; run()")


class Daemon:
    """One nsqtw process; ``tcp``/``http`` are ``(host, port)`` it reported."""

    plugin = "nsqtw"

    def __init__(self, data_path: str, *args: str, env: dict[str, str] | None = None) -> None:
        self.data_path = data_path
        self.args = list(args)
        self.env = env
        self.proc: subprocess.Popen[bytes] | None = None
        self.tcp: tuple[str, int] = ("", 0)
        self.http: tuple[str, int] = ("", 0)
        self.output: list[str] = []

    @property
    def tcp_address(self) -> str:
        return f"{self.tcp[0]}:{self.tcp[1]}"

    @property
    def http_address(self) -> str:
        return f"{self.http[0]}:{self.http[1]}"

    def start(self, tcp: str = "127.0.0.1:0", http: str = "127.0.0.1:0", timeout: float = 20) -> Daemon:
        env = dict(os.environ, **(self.env or {}))
        env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
        cmd = [sys.executable, "-c", TWISTD, "--pidfile=", "-n", self.plugin,
               f"--tcp-address={tcp}", f"--http-address={http}", *self.plugin_args(), *self.args]
        self.proc = subprocess.Popen(cmd, cwd=self.data_path, env=env, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT)
        found: dict[str, str] = {}
        deadline = time.monotonic() + timeout
        assert self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        buf = b""
        while not {"TCP", "HTTP"} <= found.keys():  # HTTPS may be logged too, in any order
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
        self._drain_fd = fd
        host, port = found["TCP"].rsplit(":", 1)
        self.tcp = (host, int(port))
        host, port = found["HTTP"].rsplit(":", 1)
        self.http = (host, int(port))
        return self

    def plugin_args(self) -> list[str]:
        return [f"--data-path={self.data_path}"]

    def read_output(self) -> str:
        """Everything logged so far (non-blocking)."""
        if self.proc is not None and self.proc.stdout is not None:
            fd = self.proc.stdout.fileno()
            while select.select([fd], [], [], 0)[0]:
                chunk = os.read(fd, 65536)
                if not chunk:
                    break
                self.output.append(chunk.decode("utf-8", "replace"))
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
        if self.proc is None:
            return 0
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            deadline = time.monotonic() + timeout
            while self.proc.poll() is None and time.monotonic() < deadline:
                self.read_output()
                time.sleep(0.02)
            if self.proc.poll() is None:
                self.proc.kill()
            rc = self.proc.wait()
        finally:
            self.read_output()
            if self.proc.stdout is not None:
                self.proc.stdout.close()
            self.proc = None
        return rc

    def kill(self) -> int:
        return self.stop(signal.SIGKILL)


class LookupdDaemon(Daemon):
    """One nsqtw-lookupd process; it keeps no data, ``data_path`` is just its working directory."""

    plugin = "nsqtw-lookupd"

    def plugin_args(self) -> list[str]:
        return []
