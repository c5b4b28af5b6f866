"""docs/client.md's complete example runs against a live nsqtw, and the page shows it verbatim."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.daemon import ROOT

EXAMPLE = Path(ROOT) / "docs" / "examples" / "client_example.py"
DOC = Path(ROOT) / "docs" / "client.md"


def test_example_runs(nsqd) -> None:
    """Every order arrives, the failing one a second time, and the stop is clean."""
    env = dict(os.environ, PYTHONPATH=ROOT)
    r = subprocess.run([sys.executable, str(EXAMPLE), f"--nsqd-tcp-address={nsqd.tcp_address}"],
                       capture_output=True, timeout=60, env=env)
    assert r.returncode == 0, r.stderr.decode()
    lines = r.stdout.decode().splitlines()
    assert sorted(lines[:-1]) == sorted(["order 0 (attempt 1)", "order 1 (attempt 1)", "order 2 (attempt 1)",
                                         "order 3 (attempt 2)", "order 4 (attempt 1)", "order late (attempt 1)"])
    assert lines[-1] == "received 7, finished 6, requeued 1"


def test_doc_shows_the_example() -> None:
    """The code in docs/client.md is the file the test runs."""
    assert EXAMPLE.read_text() in DOC.read_text()
