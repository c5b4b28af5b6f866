"""nsqtw's command line as tools that launch nsqd use it: Go flags, --config, errors, ports.

Each test starts the real daemon (``twistd -n nsqtw``) as a subprocess; flags
take effect where a client can see them, in IDENTIFY's feature-negotiation
response.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import struct
import subprocess
import sys
import time
import urllib.request

import pytest

from tests.daemon import ROOT, TWISTD
from tests.helpers import reference

IDENTIFY_FN = json.dumps({"feature_negotiation": True, "client_id": "cli"}).encode()


def twistd(*args: str, cwd: str, timeout: float = 20) -> subprocess.CompletedProcess[str]:
    """Run ``twistd -n nsqtw ARGS`` to completion (for flags that make it exit at once)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    return subprocess.run([sys.executable, "-c", TWISTD, "--pidfile=", "-n", "nsqtw", *args],
                          cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, check=False)


def recv_frame(sock: socket.socket) -> tuple[int, bytes]:
    head = b""
    while len(head) < 8:
        chunk = sock.recv(8 - len(head))
        if not chunk:
            raise ConnectionError("closed")
        head += chunk
    size, ftype = struct.unpack(">ii", head)
    data = b""
    while len(data) < size - 4:
        chunk = sock.recv(size - 4 - len(data))
        if not chunk:
            raise ConnectionError("closed")
        data += chunk
    return ftype, data


def identify(address: str, body: bytes = IDENTIFY_FN) -> tuple[int, bytes]:
    """Send IDENTIFY on a fresh connection; returns the answer frame."""
    host, port = address.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=5) as s:
        s.sendall(b"  V2IDENTIFY\n" + struct.pack(">i", len(body)) + body)
        return recv_frame(s)


def negotiated(address: str) -> dict:
    ftype, data = identify(address)
    assert ftype == 0, data
    return json.loads(data)


BOTH_COMPRESSIONS = json.dumps({"feature_negotiation": True, "snappy": True, "deflate": True}).encode()
BOTH_REFUSED = (1, b"E_IDENTIFY_FAILED cannot enable both deflate and snappy compression")


# --- Go flag syntax ---------------------------------------------------------------


@pytest.mark.parametrize("args, expected", [
    (["-msg-timeout", "3s"], {"msg_timeout": 3000}),
    (["-max-rdy-count=77"], {"max_rdy_count": 77}),
    (["--max-msg-timeout", "20m"], {"max_msg_timeout": 1_200_000}),
    (["--max-deflate-level=4"], {"max_deflate_level": 4, "deflate_level": 4}),
], ids=["-flag value", "-flag=value", "--flag value", "--flag=value"])
def test_go_flag_syntaxes(daemon_factory, args, expected) -> None:
    """Each of Go's four flag spellings sets the value (seen in IDENTIFY's response)."""
    d = daemon_factory(*args)
    got = negotiated(d.tcp_address)
    assert {k: got[k] for k in expected} == expected


def test_all_syntaxes_together(daemon_factory) -> None:
    """The four spellings mix on one command line, and the defaults of untouched flags stay."""
    d = daemon_factory("-msg-timeout", "3s", "-max-rdy-count=77", "--max-msg-timeout", "20m",
                       "--max-deflate-level=4")
    got = negotiated(d.tcp_address)
    assert got["msg_timeout"] == 3000
    assert got["max_rdy_count"] == 77
    assert got["max_msg_timeout"] == 1_200_000
    assert got["max_deflate_level"] == 4
    assert got["output_buffer_timeout"] == 250
    assert got["version"] == "1.3.0"


def test_bare_bool_means_true(daemon_factory) -> None:
    """A bool flag alone is true: ``--snappy=false --snappy`` ends with snappy on (the last one wins)."""
    d = daemon_factory("--snappy=false", "--snappy", "-deflate")
    assert identify(d.tcp_address, BOTH_COMPRESSIONS) == BOTH_REFUSED


@pytest.mark.parametrize("args", [["--snappy=false"], ["-deflate=false"], ["-snappy=0"],
                                  ["--deflate=true", "--snappy=FALSE"]])
def test_bool_with_value(daemon_factory, args) -> None:
    """``-flag=false`` (and Go's other bool spellings) turns a default-on feature off."""
    d = daemon_factory(*args)
    ftype, data = identify(d.tcp_address, BOTH_COMPRESSIONS)
    assert ftype == 0, data


def test_defaults_without_flags(daemon_factory) -> None:
    """With no flags IDENTIFY reports nsqd's defaults (the reference answer apart from msg_timeout)."""
    d = daemon_factory()
    [case] = [c for c in reference("nsqd-1.3.0-responses.json")["tcp"]
              if c["case"] == "IDENTIFY with feature_negotiation"]
    want = json.loads(case["received"][0]["data"])
    want["msg_timeout"] = 60000  # the reference ran with --msg-timeout=2s
    assert negotiated(d.tcp_address) == want
    assert identify(d.tcp_address, BOTH_COMPRESSIONS) == BOTH_REFUSED  # both on by default


# --- --config ----------------------------------------------------------------------


def test_config_file_values_take_effect(daemon_factory, tmp_path) -> None:
    """Values from a --config TOML file apply (duration strings, integers, bools)."""
    conf = tmp_path / "nsqd.toml"
    conf.write_text('msg_timeout = "7s"\nmax_rdy_count = 321\nsnappy = false\n'
                    'max_msg_timeout = "30m"\nsome_future_key = "ignored"\n')
    d = daemon_factory(f"--config={conf}")
    got = negotiated(d.tcp_address)
    assert (got["msg_timeout"], got["max_rdy_count"], got["max_msg_timeout"]) == (7000, 321, 1_800_000)
    assert identify(d.tcp_address, BOTH_COMPRESSIONS)[0] == 0


def test_command_line_beats_config_file(daemon_factory, tmp_path) -> None:
    """A flag given on the command line overrides the same key in the config file."""
    conf = tmp_path / "nsqd.toml"
    conf.write_text('msg_timeout = "7s"\nmax_rdy_count = 321\n')
    d = daemon_factory("-config", str(conf), "-max-rdy-count=123")
    got = negotiated(d.tcp_address)
    assert (got["msg_timeout"], got["max_rdy_count"]) == (7000, 123)


def test_config_file_addresses_used(tmp_path) -> None:
    """tcp_address from the config file is where the daemon listens when no flag overrides it."""
    probe = socket.socket()
    probe.bind(("127.0.0.1", 0))
    port = probe.getsockname()[1]
    probe.close()
    conf = tmp_path / "nsqd.toml"
    conf.write_text(f'tcp_address = "127.0.0.1:{port}"\nhttp_address = "127.0.0.1:0"\n'
                    f'data_path = "{tmp_path}"\n')
    env = dict(os.environ)
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    proc = subprocess.Popen([sys.executable, "-c", TWISTD, "--pidfile=", "-n", "nsqtw",
                             f"--config={conf}"], cwd=str(tmp_path), env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 20
        negotiated_ok = False
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                negotiated_ok = negotiated(f"127.0.0.1:{port}")["version"] == "1.3.0"
                break
            except OSError:
                time.sleep(0.1)
        assert negotiated_ok
    finally:
        proc.terminate()
        proc.communicate(timeout=20)


# --- errors ----------------------------------------------------------------------------


@pytest.mark.parametrize("args, pattern", [
    (["--bogus"], r"flag provided but not defined: -bogus"),
    (["-bogus=1"], r"flag provided but not defined: -bogus"),
    (["--msg-timeout=abc"], r"invalid value \"abc\" for flag -msg-timeout"),
    (["-max-rdy-count", "x"], r"invalid value \"x\" for flag -max-rdy-count"),
    (["--snappy=maybe"], r"invalid boolean value \"maybe\" for -snappy"),
    (["--mem-queue-size"], r"flag needs an argument: -mem-queue-size"),
    (["--config=/nonexistent/nsqd.toml"], r"/nonexistent/nsqd.toml"),
    (["--node-id=5000"], r"node-id"),
], ids=["unknown", "unknown=value", "bad duration", "bad int", "bad bool", "missing value",
        "missing config", "out of range"])
def test_bad_flag_exits_with_one_error_line(tmp_path, args, pattern) -> None:
    """A bad value or unknown flag ends the process non-zero with exactly one error line."""
    r = twistd(*args, cwd=str(tmp_path))
    assert r.returncode != 0
    lines = [ln for ln in (r.stdout + r.stderr).splitlines() if ln.strip()]
    assert len(lines) == 1, lines
    assert re.search(pattern, lines[0]), lines[0]
    assert "Traceback" not in lines[0]


def test_bad_config_value_exits_with_one_error_line(tmp_path) -> None:
    """A config file with a value of the wrong type is refused with one line naming the key."""
    conf = tmp_path / "bad.toml"
    conf.write_text('msg_timeout = "soon"\n')
    r = twistd(f"--config={conf}", cwd=str(tmp_path))
    assert r.returncode != 0
    lines = [ln for ln in (r.stdout + r.stderr).splitlines() if ln.strip()]
    assert len(lines) == 1, lines
    assert "msg_timeout" in lines[0]


def test_version_prints_and_exits_zero(tmp_path) -> None:
    """``--version`` (and ``-version``) prints one ``nsqd v1.3.0`` line and exits 0 without listening."""
    for flag in ("--version", "-version"):
        r = twistd(flag, cwd=str(tmp_path))
        assert r.returncode == 0, r.stderr
        lines = [ln for ln in (r.stdout + r.stderr).splitlines() if ln.strip()]
        assert len(lines) == 1, lines
        assert re.match(r"nsqd v1\.3\.0\b", lines[0]), lines[0]
        assert "listening" not in r.stdout


# --- listening and restarting -------------------------------------------------------------


def test_startup_lines_carry_bound_addresses(daemon_factory) -> None:
    """Started on port 0, the daemon logs ``TCP: listening on`` / ``HTTP: listening on`` with the real ports."""
    d = daemon_factory()
    out = d.read_output()
    assert re.search(rf"TCP: listening on 127\.0\.0\.1:{d.tcp[1]}\b", out)
    assert re.search(rf"HTTP: listening on 127\.0\.0\.1:{d.http[1]}\b", out)
    assert d.tcp[1] != 0 and d.http[1] != 0 and d.tcp[1] != d.http[1]
    assert negotiated(d.tcp_address)["version"] == "1.3.0"
    with urllib.request.urlopen(f"http://{d.http_address}/ping", timeout=5) as r:
        assert r.read() == b"OK"


def test_restart_on_same_port_after_sigkill(daemon_factory, tmp_path) -> None:
    """After kill -9 (with a client still connected) a new daemon binds the same TCP port at once."""
    first = daemon_factory()
    port = first.tcp[1]
    client = socket.create_connection(first.tcp, timeout=5)
    client.sendall(b"  V2SUB t c\nRDY 1\n")
    assert recv_frame(client) == (0, b"OK")
    first.kill()
    t0 = time.monotonic()
    second = daemon_factory(tcp=f"127.0.0.1:{port}", timeout=10)
    assert time.monotonic() - t0 < 10
    assert second.tcp == ("127.0.0.1", port)
    assert negotiated(second.tcp_address)["version"] == "1.3.0"
    client.close()


def test_sigterm_exits_cleanly(daemon_factory) -> None:
    """SIGTERM stops the daemon gracefully: ports closed, exit status 0 as Go nsqd's."""
    d = daemon_factory()
    address = d.tcp
    rc = d.stop(signal.SIGTERM)
    out = "".join(d.output)
    assert "Traceback" not in out
    with pytest.raises(OSError):
        socket.create_connection(address, timeout=2).close()
    assert rc == 0, rc


def test_messages_survive_graceful_restart(daemon_factory, tmp_path) -> None:
    """Queued and in-flight messages are written out on SIGTERM and delivered after a restart."""
    data = str(tmp_path / "keep")
    first = daemon_factory(data_path=data)
    sub = socket.create_connection(first.tcp, timeout=5)
    sub.sendall(b"  V2SUB keep c\n")
    assert recv_frame(sub) == (0, b"OK")
    pub = socket.create_connection(first.tcp, timeout=5)
    body = struct.pack(">i", 3) + b"".join(struct.pack(">i", 1) + b for b in (b"a", b"b", b"c"))
    pub.sendall(b"  V2MPUB keep\n" + struct.pack(">i", len(body)) + body)
    assert recv_frame(pub) == (0, b"OK")
    sub.sendall(b"RDY 1\n")
    ftype, _ = recv_frame(sub)  # one message in flight, never finished
    assert ftype == 2
    first.stop()
    sub.close()
    pub.close()
    second = daemon_factory(data_path=data)
    c = socket.create_connection(second.tcp, timeout=5)
    c.sendall(b"  V2SUB keep c\nRDY 10\n")
    assert recv_frame(c) == (0, b"OK")
    bodies = []
    for _ in range(3):
        ftype, payload = recv_frame(c)
        assert ftype == 2
        bodies.append(payload[26:])
    assert sorted(bodies) == [b"a", b"b", b"c"]
    c.close()
