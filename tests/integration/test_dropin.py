"""What client test harnesses rely on when they start nsqd themselves (issue: drop-in details).

gnsq's test server, for one, starts ``nsqd`` with stdout and stderr as
separate pipes, reads stderr for ``TCP: listening on HOST:PORT`` and parses
``--version`` with a regex; these tests do the same with the same patterns.
"""

from __future__ import annotations

import os
import re
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.daemon import ROOT, TWISTD

#: the patterns gnsq's integration server uses (read for behaviour)
LISTENING = re.compile(r"(?P<protocol>[A-Z]+): listening on "
                       r"(?P<address>(?:[0-9]{1,3}\.){3}[0-9]{1,3}):(?P<port>[0-9]+)")
VERSION = re.compile(r"(?P<name>[a-z]+) v(?P<version>[0-9]+\.[0-9]+\.[0-9]+)(?:-[a-z]+)? "
                     r"\(built w\/(?P<go_version>[a-z0-9.-]+)\)")


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    return env


def _twistd(plugin: str, *args: str, cwd: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-c", TWISTD, "--pidfile=", "-n", plugin, *args], cwd=cwd,
                            env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def _read_until(proc: subprocess.Popen[bytes], pattern: re.Pattern[str], timeout: float = 20) -> str:
    """stderr until ``pattern`` matches twice (TCP and HTTP), as a harness reads it."""
    assert proc.stderr is not None
    text = ""
    deadline = time.monotonic() + timeout
    while len(pattern.findall(text)) < 2:
        left = deadline - time.monotonic()
        assert left > 0, f"no listening lines on stderr within {timeout}s:\n{text}"
        ready, _, _ = select.select([proc.stderr], [], [], left)
        if ready:
            chunk = os.read(proc.stderr.fileno(), 65536)
            assert chunk, f"exited before listening:\n{text}"
            text += chunk.decode()
    return text


@pytest.mark.parametrize("plugin", ["nsqtw", "nsqtw-lookupd"])
def test_listening_lines_on_stderr_stdout_empty(tmp_path: Path, plugin: str) -> None:
    """Under ``twistd -n`` the start-up lines (and every log line) go to stderr, nothing to stdout."""
    proc = _twistd(plugin, "--tcp-address=127.0.0.1:0", "--http-address=127.0.0.1:0", cwd=tmp_path)
    try:
        err = _read_until(proc, LISTENING)
        protocols = {m.group("protocol") for m in LISTENING.finditer(err)}
        assert protocols == {"TCP", "HTTP"}
        assert all(int(m.group("port")) > 0 for m in LISTENING.finditer(err))
        assert VERSION.search(err), err  # the start-up banner, as Go logs it
    finally:
        proc.send_signal(signal.SIGTERM)
        out, rest = proc.communicate(timeout=30)
    assert proc.returncode == 0, rest
    assert out == b""
    assert b"closing" in rest or b"stopped" in rest


def test_logfile_still_writes_a_file(tmp_path: Path) -> None:
    """``--logfile=FILE`` still sends the log to that file (and not to stderr)."""
    log = tmp_path / "nsqd.log"
    proc = subprocess.Popen([sys.executable, "-c", TWISTD, "--pidfile=", f"--logfile={log}", "-n", "nsqtw",
                             "--tcp-address=127.0.0.1:0", "--http-address=127.0.0.1:0"], cwd=tmp_path,
                            env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 20
        while not (log.exists() and len(LISTENING.findall(log.read_text())) == 2):
            assert time.monotonic() < deadline, "no listening lines in the log file"
            time.sleep(0.1)
    finally:
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    assert b"listening" not in out + err


@pytest.mark.parametrize("plugin,name", [("nsqtw", "nsqd"), ("nsqtw-lookupd", "nsqlookupd")])
def test_version_parses_like_go(tmp_path: Path, plugin: str, name: str) -> None:
    """``--version`` prints Go's shape on stdout, which client harnesses' regexes parse, and exits 0."""
    r = subprocess.run([sys.executable, "-c", TWISTD, "--pidfile=", "-n", plugin, "--version"], cwd=tmp_path,
                       env=_env(), capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    m = VERSION.fullmatch(r.stdout.strip())
    assert m is not None, r.stdout
    assert (m.group("name"), m.group("version"), m.group("go_version")) == (name, "1.3.0", "nsqtw-0.1.0")
    assert r.stderr == ""


def test_missing_data_path_refused_as_go(tmp_path: Path) -> None:
    """A --data-path that does not exist stops nsqd at once with Go's message; nothing is created."""
    missing = tmp_path / "nope"
    r = subprocess.run([sys.executable, "-c", TWISTD, "--pidfile=", "-n", "nsqtw", f"--data-path={missing}",
                        "--tcp-address=127.0.0.1:0", "--http-address=127.0.0.1:0"], cwd=tmp_path, env=_env(),
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 1
    assert (f"FATAL: failed to instantiate nsqd - failed to lock data-path: open {missing}: "
            "no such file or directory") in r.stderr
    assert not missing.exists()
    assert "listening" not in r.stdout + r.stderr


def test_data_path_in_use_refused(tmp_path: Path) -> None:
    """A second nsqd on the same --data-path exits 1 at once instead of sharing it."""
    first = _twistd("nsqtw", "--tcp-address=127.0.0.1:0", "--http-address=127.0.0.1:0", cwd=tmp_path)
    try:
        _read_until(first, LISTENING)
        r = subprocess.run([sys.executable, "-c", TWISTD, "--pidfile=", "-n", "nsqtw", f"--data-path={tmp_path}",
                            "--tcp-address=127.0.0.1:0", "--http-address=127.0.0.1:0"], cwd=tmp_path, env=_env(),
                           capture_output=True, text=True, timeout=60)
        assert r.returncode == 1
        # Go nsqd v1.3.0's words, one line
        assert r.stderr == (f"FATAL: failed to instantiate nsqd - failed to lock data-path: cannot flock directory"
                            f" {tmp_path} - resource temporarily unavailable (possibly in use by another instance"
                            " of nsqd)\n"), r.stderr
    finally:
        first.send_signal(signal.SIGTERM)
        first.communicate(timeout=30)
