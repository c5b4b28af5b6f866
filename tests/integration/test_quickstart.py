"""docs/quickstart.md runs as written: every ``sh`` block after its marker, top to bottom.

The daemon is started here on free ports (port 0) instead of the defaults;
the blocks read its addresses from ``NSQD_TCP``/``NSQD_HTTP``, which is how
the quickstart is written. ``RUNFOR=1s`` shortens the bench steps, as the
quickstart offers. ``nsqtw-bench`` resolves to this checkout's.
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

from tests.daemon import ROOT, Daemon

DOC = Path(ROOT) / "docs" / "quickstart.md"
MARKER = "<!-- From here on, every `sh` block runs as written"


def sh_blocks() -> list[str]:
    text = DOC.read_text()
    assert MARKER in text, "the quickstart lost its marker"
    return re.findall(r"```sh\n(.*?)```", text[text.index(MARKER):], re.S)


def _env(tmp: Path, d: Daemon) -> dict[str, str]:
    shims = tmp / "bin"
    shims.mkdir()
    bench = shims / "nsqtw-bench"
    bench.write_text(f"#!/bin/sh\nexec {sys.executable} -m nsqtw.tools.bench \"$@\"\n")
    bench.chmod(0o755)
    # a script, not a symlink: a link to a venv's python, outside the venv, runs the base interpreter
    python = shims / "python"
    python.write_text(f"#!/bin/sh\nexec {sys.executable} \"$@\"\n")
    python.chmod(0o755)
    env = dict(os.environ, NSQD_TCP=d.tcp_address, NSQD_HTTP=d.http_address, RUNFOR="1s")
    env["PATH"] = f"{shims}{os.pathsep}{env['PATH']}"
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    return env


def _run_until(block: str, env: dict[str, str], cwd: Path, wanted: list[str], timeout: float) -> str:
    """Run a block that ends in a long-running command; SIGINT it once ``wanted`` lines are out."""
    proc = subprocess.Popen(["bash", "-c", "set -euo pipefail\n" + block], cwd=cwd, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    assert proc.stdout is not None
    out = ""
    deadline = time.monotonic() + timeout
    try:
        while not all(w in out.splitlines() for w in wanted):
            left = deadline - time.monotonic()
            assert left > 0, f"block did not print {wanted} in {timeout}s:\n{out}"
            ready, _, _ = select.select([proc.stdout], [], [], left)
            if ready:
                chunk = os.read(proc.stdout.fileno(), 65536)
                assert chunk, f"block ended before printing {wanted}:\n{out}"
                out += chunk.decode()
    finally:
        os.killpg(proc.pid, signal.SIGINT)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    return out


def test_quickstart_runs_as_written(daemon_factory, tmp_path: Path) -> None:
    """Every command of the quickstart works, in order, and prints what the doc says."""
    d = daemon_factory()
    env = _env(tmp_path, d)
    blocks = sh_blocks()
    assert len(blocks) == 4, blocks
    setup, publish, consume, bench = blocks
    outputs = []
    for block in (setup, publish):
        r = subprocess.run(["bash", "-c", "set -euo pipefail\n" + block], cwd=tmp_path, env=env,
                           capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stdout + r.stderr
        outputs.append(r.stdout)
    assert outputs[1].startswith("OKOK")  # /pub and /mpub answer OK, as nsqd does
    assert "[events" in outputs[1] and "msgs: 3" in outputs[1], outputs[1]
    printed = _run_until(consume, env, tmp_path, ["hello", "one", "two"], timeout=120)
    assert (tmp_path / "consume.py").exists()
    assert "Traceback" not in printed, printed
    r = subprocess.run(["bash", "-c", "set -euo pipefail\n" + bench], cwd=tmp_path, env=env,
                       capture_output=True, text=True, timeout=180)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.count("ops/s") == 2 and "latency: rate 5000/s" in r.stdout, r.stdout
    m = re.search(r"sent (\d+) - received (\d+) - p50 ([\d.]+)ms", r.stdout)
    assert m and m.group(1) == m.group(2) and float(m.group(3)) < 10_000, r.stdout
    # the bench topics are gone again: nothing left queued by the quickstart
    import json
    import urllib.request

    with urllib.request.urlopen(f"http://{d.http_address}/stats?format=json", timeout=10) as resp:
        topics = {t["topic_name"] for t in json.load(resp)["topics"]}
    assert topics == {"events"}, topics
