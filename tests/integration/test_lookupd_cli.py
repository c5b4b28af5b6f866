"""nsqtw-lookupd's command line: Go flags, errors, --version, start-up lines, clean exit."""

from __future__ import annotations

import os
import subprocess
import sys

from tests.daemon import ROOT, TWISTD
from tests.integration.test_cluster_live import get


def twistd(*args: str, cwd: str) -> subprocess.CompletedProcess[str]:
    """Run ``twistd -n nsqtw-lookupd ARGS`` to completion (for flags that make it exit at once)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    return subprocess.run([sys.executable, "-c", TWISTD, "--pidfile=", "-n", "nsqtw-lookupd", *args],
                          cwd=cwd, env=env, capture_output=True, text=True, timeout=30, check=False)


def test_bad_flag_and_version(tmp_path) -> None:
    """An nsqd-only flag is refused with one line and exit 1; --version prints and exits 0."""
    r = twistd("--mem-queue-size=5", cwd=str(tmp_path))
    assert r.returncode == 1
    assert r.stderr.strip().splitlines()[-1] == "nsqtw-lookupd: flag provided but not defined: -mem-queue-size"
    r = twistd("-version", cwd=str(tmp_path))
    assert (r.returncode, r.stdout.split(" (")[0]) == (0, "nsqlookupd v1.3.0")
    r = twistd("--help", cwd=str(tmp_path))
    assert r.returncode == 0
    assert "--inactive-producer-timeout duration" in r.stdout and "(default 45s)" in r.stdout


def test_go_flags_and_sigterm(lookupd_factory) -> None:
    """Go-style flags work, the start-up lines carry the ports, SIGTERM exits 0."""
    d = lookupd_factory("-broadcast-address", "lk.example", "-tombstone-lifetime=1s")
    assert get(d.http_address, "/info") == {"version": "1.3.0"}
    out = d.read_output()
    assert f"TCP: listening on {d.tcp_address}" in out
    assert f"HTTP: listening on {d.http_address}" in out
    assert d.stop() == 0
