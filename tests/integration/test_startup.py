"""Start-up as a service manager sees it: a daemon that cannot listen exits 1 with one FATAL line,
and ``READY=1`` reaches ``$NOTIFY_SOCKET`` only once every listener answers.

Each test runs the real program (``twistd -n nsqtw``, ``nsqtw-lookupd``,
``nsqtw-admin``) as a subprocess. Where Go's programs are in
``../shared/anchor/bin`` the FATAL line is compared with theirs, side by
side; without them that part is skipped.
"""

from __future__ import annotations

import os
import re
import select
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest

from tests.daemon import ROOT, TWISTD

ANCHOR = os.path.join(os.path.dirname(ROOT), "shared", "anchor", "bin")
if not os.path.isdir(ANCHOR):
    ANCHOR = "/work/shared/anchor/bin"

PROGRAMS = {"nsqd": "nsqtw", "nsqlookupd": "nsqtw-lookupd", "nsqadmin": "nsqtw-admin"}


def env_with(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env.pop("NOTIFY_SOCKET", None)
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    env.update(extra)
    return env


def run_to_exit(plugin: str, args: list[str], cwd: str, env: dict[str, str],
                timeout: float = 30) -> subprocess.CompletedProcess[str]:
    """Run ``twistd -n PLUGIN ARGS``; a daemon still running after ``timeout`` fails the test."""
    return subprocess.run([sys.executable, "-c", TWISTD, "--pidfile=", "-n", plugin, *args],
                          cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, check=False)


def fatal_lines(output: str) -> list[str]:
    """The text after ``FATAL: `` of each FATAL line."""
    return [line.split("FATAL: ", 1)[1] for line in output.splitlines() if "FATAL: " in line]


@pytest.fixture
def taken() -> Iterator[str]:
    """An address whose port another socket holds."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen()
    yield f"127.0.0.1:{s.getsockname()[1]}"
    s.close()


def received(sock: socket.socket, timeout: float) -> list[bytes]:
    """Every datagram that arrives within ``timeout`` seconds of the last one (or of the call)."""
    out = []
    while select.select([sock], [], [], timeout)[0]:
        out.append(sock.recv(4096))
    return out


def free_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


# --- a listener that cannot be bound -----------------------------------------------------------

NSQD_DEFAULTS = {"TCP": "--tcp-address", "HTTP": "--http-address", "HTTPS": "--https-address"}


def program_args(program: str, label: str, address: str, tmp_path) -> list[str]:
    """Every listener of ``program`` on port 0, but ``label``'s on ``address``."""
    if program == "nsqd":
        listeners = {"TCP": "127.0.0.1:0", "HTTP": "127.0.0.1:0"}
        args = [f"--data-path={tmp_path}"]
        if label == "HTTPS":
            from tests.certs import make_certs

            certs = make_certs(str(tmp_path))
            listeners["HTTPS"] = "127.0.0.1:0"
            args += [f"--tls-cert={certs.server_cert}", f"--tls-key={certs.server_key}"]
    elif program == "nsqlookupd":
        listeners = {"TCP": "127.0.0.1:0", "HTTP": "127.0.0.1:0"}
        args = []
    else:
        listeners = {"HTTP": "127.0.0.1:0"}
        args = ["--nsqd-http-address=127.0.0.1:4151"]
    listeners[label] = address
    return [f"{NSQD_DEFAULTS[name]}={value}" for name, value in listeners.items()] + args


def assert_fails_with(program: str, label: str, address: str, reason: str, tmp_path,
                      notify: tuple[str, socket.socket]) -> str:
    """The program with ``label`` on ``address``: exit 1, one FATAL line naming the address, no READY.

    A ``reason`` that ends in ": " is followed by the system's own words (a resolver's).
    """
    args = program_args(program, label, address, tmp_path)
    r = run_to_exit(PROGRAMS[program], args, str(tmp_path), env_with(NOTIFY_SOCKET=notify[0]))
    out = r.stdout + r.stderr
    assert r.returncode == 1, out
    assert "Traceback" not in out, out
    fatal = fatal_lines(out)
    assert len(fatal) == 1, out
    expected = f"failed to instantiate {program} - listen ({address}) failed - {reason}"
    assert fatal[0] == expected or (reason.endswith(": ") and fatal[0].startswith(expected)), fatal
    assert b"READY=1" not in received(notify[1], 0.2)
    return fatal[0]


@pytest.mark.parametrize("program, label", [
    ("nsqd", "TCP"), ("nsqd", "HTTP"), ("nsqd", "HTTPS"),
    ("nsqlookupd", "TCP"), ("nsqlookupd", "HTTP"),
    ("nsqadmin", "HTTP"),
])
def test_port_taken_exits_1_with_one_fatal_line(program, label, taken, tmp_path, notify_socket) -> None:
    """A listener whose port is taken ends the whole daemon with status 1 and one FATAL line in nsqd's
    words, even when the other listeners bound (they are closed); READY=1 is never sent. Go's
    program, where present, says the same."""
    ours = assert_fails_with(program, label, taken, f"listen tcp {taken}: bind: address already in use",
                             tmp_path, notify_socket)
    go = os.path.join(ANCHOR, program)
    if not os.path.exists(go) or label == "HTTPS":
        return  # the side-by-side part needs Go's program (HTTPS: its TLS set-up differs)
    args = [a for a in program_args(program, label, taken, tmp_path) if not a.startswith("--tls-")]
    r = subprocess.run([go, *args], cwd=str(tmp_path), capture_output=True, text=True, timeout=30,
                       check=False)
    assert r.returncode == 1
    theirs = fatal_lines(r.stderr)[0]
    # nsqlookupd v1.3.0 garbles its own format ("nsqlookupd%!(EXTRA *errors.errorString=...)")
    theirs = re.sub(r"%!\(EXTRA \*errors\.errorString=(.*)\)$", r" - \1", theirs)
    assert theirs == ours


@pytest.mark.parametrize("address, reason", [
    ("notanaddress", "listen tcp: address notanaddress: missing port in address"),
    ("127.0.0.1:99999", "listen tcp: address 99999: invalid port"),
    ("127.0.0.1:http4150", "listen tcp: address http4150: invalid port"),
    ("nosuchhost.invalid:0", "listen tcp: lookup nosuchhost.invalid: "),
], ids=["no port", "port out of range", "port not a number", "host does not resolve"])
@pytest.mark.parametrize("program, label", [("nsqd", "TCP"), ("nsqd", "HTTP"), ("nsqlookupd", "TCP"),
                                            ("nsqadmin", "HTTP")])
def test_bad_address_exits_1_with_one_fatal_line(program, label, address, reason, tmp_path,
                                                 notify_socket) -> None:
    """A malformed address, a port out of range or a host that does not resolve: one FATAL line naming
    the address, exit 1, no traceback, no READY=1."""
    assert_fails_with(program, label, address, reason, tmp_path, notify_socket)


@pytest.mark.parametrize("program, conf", [
    ("nsqd", 'tcp_address = "notanaddress"\n'),
    ("nsqd", 'http_address = "127.0.0.1:70000"\n'),
    ("nsqlookupd", 'http_address = "nohost"\n'),
    ("nsqadmin", 'http_address = "127.0.0.1:x"\n'),
], ids=["nsqd tcp", "nsqd http", "nsqlookupd http", "nsqadmin http"])
def test_bad_address_in_config_file_exits_1(program, conf, tmp_path) -> None:
    """An address from the --config file is checked as a flag's is: one FATAL line, exit 1."""
    path = tmp_path / "conf.toml"
    path.write_text(conf)
    args = [f"--config={path}"]
    # the other listeners on port 0 by flag (a flag beats the file, so the file's key is the bad one's)
    other = {"nsqd": ["--http-address=127.0.0.1:0" if "tcp_" in conf else "--tcp-address=127.0.0.1:0",
                      f"--data-path={tmp_path}"],
             "nsqlookupd": ["--tcp-address=127.0.0.1:0"],
             "nsqadmin": ["--nsqd-http-address=127.0.0.1:4151"]}
    args += other[program]
    r = run_to_exit(PROGRAMS[program], args, str(tmp_path), env_with())
    out = r.stdout + r.stderr
    assert r.returncode == 1 and "Traceback" not in out, out
    fatal = fatal_lines(out)
    assert len(fatal) == 1 and fatal[0].startswith(f"failed to instantiate {program} - listen ("), out


@pytest.mark.parametrize("program, args, pattern", [
    ("nsqd", ["--msg-timeout=5 minutes"], r"invalid value \"5 minutes\" for flag -msg-timeout"),
    ("nsqd", ["--max-rdy-count=1e3"], r"invalid value \"1e3\" for flag -max-rdy-count"),
    ("nsqlookupd", ["--inactive-producer-timeout=soon"], r"-inactive-producer-timeout"),
    ("nsqadmin", ["--http-client-connect-timeout=x"], r"-http-client-connect-timeout"),
])
def test_bad_flag_values_are_one_line(program, args, pattern, tmp_path) -> None:
    """Bad durations and numbers, in each program: one error line, non-zero, no traceback."""
    r = run_to_exit(PROGRAMS[program], args, str(tmp_path), env_with())
    out = (r.stdout + r.stderr).strip()
    assert r.returncode != 0
    assert len(out.splitlines()) == 1 and re.search(pattern, out), out


@pytest.mark.parametrize("program, conf", [
    ("nsqd", "mem_queue_size = \"lots\"\n"),
    ("nsqd", "msg_timeout = [60]\n"),
    ("nsqlookupd", "tombstone_lifetime = \"1 minute\"\n"),
    ("nsqadmin", "http_client_request_timeout = true\n"),
])
def test_bad_config_values_are_one_line(program, conf, tmp_path) -> None:
    """Bad durations and numbers in the --config file: one error line naming the key, no traceback."""
    path = tmp_path / "conf.toml"
    path.write_text(conf)
    r = run_to_exit(PROGRAMS[program], [f"--config={path}", *program_args(program, "HTTP", "127.0.0.1:0", tmp_path)],
                    str(tmp_path), env_with())
    out = (r.stdout + r.stderr).strip()
    assert r.returncode != 0
    assert len(out.splitlines()) == 1 and conf.split(" ")[0] in out, out


# --- what the terminal shows: with -n and without it -------------------------------------------

#: how twistd is run: in the foreground with the log on stderr, in the foreground with a log file,
#: daemonized (a pid file and a log file, in the test's folder)
MODES = ["-n", "-n --logfile", "daemon"]


def twistd_args(mode: str, folder) -> list[str]:
    if mode == "-n":
        return ["--pidfile=", "-n"]
    log = f"--logfile={folder / 'twistd.log'}"
    if mode == "-n --logfile":
        return ["--pidfile=", "-n", log]
    return [f"--pidfile={folder / 'twistd.pid'}", log]


def launch(plugin: str, mode: str, args: list[str], folder, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """Run ``twistd [-n] PLUGIN ARGS`` as a user would; the started process must exit within 30 s."""
    return subprocess.run([sys.executable, "-c", TWISTD, *twistd_args(mode, folder), plugin, *args],
                          cwd=str(folder), env=env, capture_output=True, text=True, timeout=30, check=False)


def wait_daemon_gone(folder, timeout: float = 30, stop: bool = False) -> None:
    """The daemon of ``folder`` (its pid file) ends, SIGTERM first with ``stop``; killed and failed if not."""
    pidfile = folder / "twistd.pid"
    try:
        text = pidfile.read_text()
        while not text.strip():  # caught between twistd's open and its write
            time.sleep(0.01)
            text = pidfile.read_text()
    except FileNotFoundError:
        return  # never written, or the daemon already removed it on its way out
    pid = int(text)
    if stop:
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            assert not pidfile.exists()
            return
        time.sleep(0.05)
    os.kill(pid, signal.SIGKILL)
    raise AssertionError(f"the daemon (pid {pid}) was still running {timeout}s later")


def read_until(path, text: str, timeout: float = 10) -> str:
    """The file at ``path`` once it holds ``text`` (or as it is after ``timeout``)."""
    deadline = time.monotonic() + timeout
    while True:
        content = path.read_text() if path.exists() else ""
        if text in content or time.monotonic() > deadline:
            return content
        time.sleep(0.02)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("program, label", [
    ("nsqd", "TCP"), ("nsqd", "HTTP"), ("nsqlookupd", "TCP"), ("nsqlookupd", "HTTP"), ("nsqadmin", "HTTP"),
])
def test_failed_start_is_one_fatal_line(program, label, mode, taken, tmp_path) -> None:
    """A port taken, with -n or without it: the process that was started exits 1, stdout is empty and
    stderr is one FATAL line, nothing else (no twistd start-up or shut-down lines, no banner, no
    second error for a listener that failed after the first). Daemonized, that is the daemon's line,
    written by the process that waited for it; the daemon is gone right after, its pid file removed,
    and the log file has the whole story. Go's program, where present, ends with the same FATAL line
    (after its banner lines, which nsqtw leaves in the log)."""
    args = program_args(program, label, taken, tmp_path)
    if program == "nsqd" and label == "TCP" and mode == "-n":
        args = [a if not a.startswith("--http-address") else f"--http-address={taken}" for a in args]
    try:
        r = launch(PROGRAMS[program], mode, args, tmp_path, env_with())
    finally:
        wait_daemon_gone(tmp_path)
    expected = (f"failed to instantiate {program} - listen ({taken}) failed"
                f" - listen tcp {taken}: bind: address already in use")
    assert (r.returncode, r.stdout) == (1, ""), (r.returncode, r.stdout, r.stderr)
    assert len(r.stderr.splitlines()) == 1 and r.stderr.endswith("\n"), r.stderr
    if mode == "-n":  # the log is stderr: the line is the log's FATAL line
        assert r.stderr.rstrip("\n").endswith(f"] [{program}] FATAL: {expected}"), r.stderr
    else:
        assert r.stderr == f"FATAL: {expected}\n", r.stderr
        # twistd removes its pid file before it logs its last line: the log is read until it has it
        log = read_until(tmp_path / "twistd.log", "Server Shut Down.")
        assert f"FATAL: {expected}" in log and "Server Shut Down." in log, log
    go = os.path.join(ANCHOR, program)
    if mode == "-n" and os.path.exists(go):
        g = subprocess.run([go, *program_args(program, label, taken, tmp_path)], cwd=str(tmp_path),
                           capture_output=True, text=True, timeout=30, check=False)
        *before, last = g.stderr.splitlines()
        assert g.returncode == 1 and g.stdout == "", g.stderr
        assert all(" INFO: " in line for line in before), g.stderr  # its banner: nsqtw logs it, in the log
        theirs = re.sub(r"%!\(EXTRA \*errors\.errorString=(.*)\)$", r" - \1", fatal_lines(last)[0])
        assert theirs == expected


@pytest.mark.parametrize("program", ["nsqd", "nsqlookupd", "nsqadmin"])
def test_daemonized_start_returns_once_ready(program, tmp_path) -> None:
    """Without -n, the process that was started exits 0, silent, once every listener answers: the
    log file names the ports and they answer at once. SIGTERM then stops the daemon."""
    args = program_args(program, "HTTP", "127.0.0.1:0", tmp_path)
    try:
        r = launch(PROGRAMS[program], "daemon", args, tmp_path, env_with())
        assert (r.returncode, r.stdout, r.stderr) == (0, "", ""), r
        # info lines reach the log file in batches, up to 50 ms after they were logged
        read_until(tmp_path / "twistd.log", "HTTP: listening on")
        log = read_until(tmp_path / "twistd.log", "TCP: listening on" if program != "nsqadmin" else "HTTP")
        http = re.search(r"HTTP: listening on 127\.0\.0\.1:(\d+)", log)
        assert http, log
        assert http_ok(int(http.group(1)), "/ping" if program != "nsqadmin" else "/")
        tcp = re.search(r"TCP: listening on 127\.0\.0\.1:(\d+)", log)
        if program != "nsqadmin":
            assert tcp, log
            socket.create_connection(("127.0.0.1", int(tcp.group(1))), timeout=5).close()
    finally:
        wait_daemon_gone(tmp_path, stop=True)


@pytest.mark.parametrize("mode", MODES)
def test_missing_data_path_is_one_fatal_line(mode, tmp_path) -> None:
    """A --data-path that does not exist is refused before twistd forks: one plain FATAL line, with
    -n or without it, and no daemon."""
    missing = tmp_path / "nope"
    r = launch("nsqtw", mode, [f"--data-path={missing}", "--tcp-address=127.0.0.1:0",
                               "--http-address=127.0.0.1:0"], tmp_path, env_with())
    wait_daemon_gone(tmp_path)
    assert (r.returncode, r.stdout) == (1, "")
    assert r.stderr == (f"FATAL: failed to instantiate nsqd - failed to lock data-path: open {missing}:"
                        " no such file or directory\n"), r.stderr
    assert not (tmp_path / "twistd.pid").exists()


def test_a_running_pid_file_is_one_fatal_line(tmp_path) -> None:
    """A second start whose pid file names a running daemon (twistd's default, twistd.pid in the
    folder it starts in) is refused with one FATAL line and status 1, with -n or without it, where
    twistd's own refusal is five lines; the running daemon is left alone."""
    args = program_args("nsqlookupd", "HTTP", "127.0.0.1:0", tmp_path)
    try:
        assert launch("nsqtw-lookupd", "daemon", args, tmp_path, env_with()).returncode == 0
        pid = int((tmp_path / "twistd.pid").read_text())
        for command in (["-n"], []):  # the default --pidfile: twistd.pid, here
            r = subprocess.run([sys.executable, "-c", TWISTD, *command, "nsqtw-lookupd", *args], cwd=str(tmp_path),
                               env=env_with(), capture_output=True, text=True, timeout=30, check=False)
            assert (r.returncode, r.stdout) == (1, ""), r
            assert r.stderr == (f"FATAL: another twistd server is running, PID {pid} (pid file {tmp_path}/twistd.pid)"
                                " - start this one in another directory, or give it its own --pidfile=FILE\n"), r.stderr
        os.kill(pid, 0)  # still running
    finally:
        wait_daemon_gone(tmp_path, stop=True)


# --- readiness ----------------------------------------------------------------------------------


def http_ok(port: int, path: str) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as r:
            return r.status == 200
    except (OSError, urllib.error.URLError):
        return False


@pytest.mark.parametrize("program", ["nsqd", "nsqlookupd", "nsqadmin"])
@pytest.mark.parametrize("abstract", [False, True], ids=["path", "abstract"])
def test_ready_once_listeners_answer_and_stopping_on_sigterm(program, abstract, tmp_path) -> None:
    """With NOTIFY_SOCKET set, READY=1 arrives once, when every listener already answers (a TCP
    connect and GET /ping right after it succeed), and STOPPING=1 when SIGTERM begins the drain."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    if abstract:
        name = f"@nsqtw-test-{os.getpid()}-{program}"
        sock.bind(b"\0" + name[1:].encode())
    else:
        name = str(tmp_path / "notify")
        sock.bind(name)
    tcp, http = free_port(), free_port()
    if program == "nsqd":
        args = [f"--tcp-address=127.0.0.1:{tcp}", f"--http-address=127.0.0.1:{http}", f"--data-path={tmp_path}"]
    elif program == "nsqlookupd":
        args = [f"--tcp-address=127.0.0.1:{tcp}", f"--http-address=127.0.0.1:{http}"]
    else:
        args = [f"--http-address=127.0.0.1:{http}", "--nsqd-http-address=127.0.0.1:4151"]
    proc = subprocess.Popen([sys.executable, "-c", TWISTD, "--pidfile=", "-n", PROGRAMS[program], *args],
                            cwd=str(tmp_path), env=env_with(NOTIFY_SOCKET=name),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        assert select.select([sock], [], [], 30)[0], "no READY=1 within 30 s"
        assert sock.recv(4096) == b"READY=1"
        # the moment READY=1 is read, every listener answers
        assert http_ok(http, "/ping" if program != "nsqadmin" else "/")
        if program != "nsqadmin":
            socket.create_connection(("127.0.0.1", tcp), timeout=5).close()
        assert received(sock, 0.3) == []  # once
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
        assert received(sock, 0.5) == [b"STOPPING=1"]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        sock.close()


@pytest.mark.parametrize("mode", ["-n --logfile", "daemon"])
def test_workers_log_to_the_daemons_log_file(mode, tmp_path) -> None:
    """With ``--workers`` and a log file (twistd's ``--logfile``, or a daemon's ``twistd.log``) the
    workers' lines are in that file, as one process's would be: a worker serves every client, so
    its ``TCP: new client`` and protocol errors are lines only a worker writes. Its stderr is the
    core's (a daemon's is /dev/null): without the relay they were lost, or on the terminal."""
    args = [*twistd_args(mode, tmp_path), "nsqtw", "--workers=2", "--tcp-address=127.0.0.1:0",
            "--http-address=127.0.0.1:0", f"--data-path={tmp_path}"]
    proc = subprocess.Popen([sys.executable, "-c", TWISTD, *args], cwd=str(tmp_path), env=env_with(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    logfile = tmp_path / "twistd.log"
    try:
        if mode == "daemon":
            assert proc.wait(30) == 0, proc.communicate()
        log = read_until(logfile, "HTTP: listening on", timeout=30)
        tcp = re.search(r"TCP: listening on 127\.0\.0\.1:(\d+)", log)
        http = re.search(r"HTTP: listening on 127\.0\.0\.1:(\d+)", log)
        assert tcp and http, log
        assert http_ok(int(http.group(1)), "/ping")  # every worker is ready
        for _ in range(4):
            with socket.create_connection(("127.0.0.1", int(tcp.group(1))), timeout=5) as s:
                s.sendall(b"  V2BOGUS\n")
                answer = b""
                while chunk := s.recv(4096):  # the error, then the node closes the connection
                    answer += chunk
                assert b"E_INVALID" in answer, answer
        log = read_until(logfile, "E_INVALID invalid command BOGUS", timeout=10)
        deadline = time.monotonic() + 10
        # each worker writes its own lines: the last error may land after the last new client's line
        while (log.count("TCP: new client(") < 4 or log.count("E_INVALID invalid command BOGUS") < 4) \
                and time.monotonic() < deadline:
            time.sleep(0.05)
            log = logfile.read_text()
        assert log.count("TCP: new client(") == 4, log
        assert log.count("E_INVALID invalid command BOGUS") == 4, log
        # each a whole line of the file, as the core writes its own, with the worker's own system
        line = next(line for line in log.splitlines() if "TCP: new client(" in line)
        assert re.match(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d[+-]\d{4} \[nsqtw\.protocol\.v2\.\w+#info\] \[nsqd\] TCP: new"
                        r" client\(127\.0\.0\.1:\d+\)$", line), line
    finally:
        if mode == "daemon":
            wait_daemon_gone(tmp_path, stop=True)
        else:
            proc.terminate()
            out, err = proc.communicate(timeout=30)
            assert "TCP: new client" not in err, err  # in the file, not on the terminal


def _ignoring_interrupt() -> None:
    """What a script's background job (``nsqd &``, ``nohup``) starts with: SIGINT ignored."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _catches_interrupt(pid: int, timeout: float) -> bool:
    """Whether the process has a handler for SIGINT within ``timeout`` seconds, read from the
    kernel's SigCgt mask in ``/proc/PID/status`` (Linux)."""
    bit = 1 << (signal.SIGINT - 1)
    deadline = time.monotonic() + timeout
    while True:
        with open(f"/proc/{pid}/status") as status:
            caught = next(int(line.split()[1], 16) for line in status if line.startswith("SigCgt:"))
        if caught & bit:
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)


INTERRUPTED = {
    "nsqd": (["nsqtw", "--tcp-address=127.0.0.1:0", "--http-address=127.0.0.1:0"],
             ["--tcp-address=127.0.0.1:0", "--http-address=127.0.0.1:0"], "TCP: listening on"),
    "nsqlookupd": (["nsqtw-lookupd", "--tcp-address=127.0.0.1:0", "--http-address=127.0.0.1:0"],
                   ["--tcp-address=127.0.0.1:0", "--http-address=127.0.0.1:0"], "TCP: listening on"),
    "nsqadmin": (["nsqtw-admin", "--http-address=127.0.0.1:0", "--nsqd-http-address=127.0.0.1:1"],
                 ["--http-address=127.0.0.1:0", "--nsqd-http-address=127.0.0.1:1"], "HTTP: listening on"),
    "nsq_to_file": (["to-file", "--topic=t", "--nsqd-tcp-address=127.0.0.1:1", "--output-dir=out"],
                    ["--topic=t", "--nsqd-tcp-address=127.0.0.1:1", "--output-dir=out"], "nsqd"),
}


@pytest.mark.parametrize("program", sorted(INTERRUPTED))
def test_interrupt_stops_a_program_started_with_it_ignored(program, tmp_path) -> None:
    """Started with SIGINT ignored (a script's background job), Ctrl-C still stops it, as it stops
    Go's program (``signal.Notify`` takes an inherited ignore back), side by side where Go's is
    here: each daemon exits 0, the tool ends. Twisted alone installs its handler only over Python's
    default, so nsqtw's ignored SIGINT until it took it back."""
    ours, go_args, ready = INTERRUPTED[program]
    commands = {"nsqtw": [sys.executable, "-m", "nsqtw.tools.cli", *ours] if program == "nsq_to_file"
                else [sys.executable, "-c", TWISTD, "--pidfile=", "-n", *ours]}
    go = os.path.join(ANCHOR, program)
    if os.path.exists(go):
        commands["go"] = [go, *go_args]
    for who, command in commands.items():
        folder = tmp_path / who
        folder.mkdir()
        if program == "nsqd":
            command = [*command, f"--data-path={folder}"]
        proc = subprocess.Popen(command, cwd=str(folder), env=env_with(), stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, preexec_fn=_ignoring_interrupt)
        try:
            assert proc.stdout is not None
            seen = ""
            deadline = time.monotonic() + 30
            while ready not in seen and time.monotonic() < deadline:
                line = proc.stdout.readline()
                if not line:
                    break
                seen += line
            assert ready in seen, (who, seen)
            # Go's program logs "listening" before it calls signal.Notify: a SIGINT sent in between
            # is still ignored. Wait until the process catches SIGINT (what the test is about),
            # then press Ctrl-C.
            assert _catches_interrupt(proc.pid, timeout=30), (who, seen)
            proc.send_signal(signal.SIGINT)
            rest, _ = proc.communicate(timeout=30)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        assert proc.returncode == 0, (who, proc.returncode, seen + rest)
