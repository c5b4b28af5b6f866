"""docs/cluster.md's examples run as written against two nsqtw-lookupds and three nodes.

As tests/integration/test_docs_run.py runs every page (tests/docrun.py:
the README's first command first, then the page's blocks in one terminal,
the doc's ports made free ones), with more checks: the nodes start as the
first block starts them and register with both lookupds; publishing to
each, looking them up, the pynsq consumer (a ``python`` block, run as a
script), the admin, changing a node's lookupds and removing the topic,
in the doc's order.
"""

from __future__ import annotations

import json
import os
import re
import select
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from tests import docrun

DOC = docrun.ROOT / "docs" / "cluster.md"


def blocks() -> list[tuple[str, str]]:
    return re.findall(r"^```(sh|python)\n(.*?)^```", DOC.read_text(), re.S | re.M)


def _get(address: str, path: str) -> object:
    with urllib.request.urlopen(f"http://{address}{path}", timeout=10) as resp:
        return json.load(resp)


def _lookup_ports(http: str) -> set[int]:
    found = _get(http, "/lookup?topic=events")
    assert isinstance(found, dict)
    return {p["tcp_port"] for p in found["producers"]}


def test_cluster_doc_runs_as_written(tmp_path: Path) -> None:
    """Publishing to each node, /lookup, /nodes and /topics, the pynsq consumer through both lookupds
    (it prints all three messages, from three nodes, within seconds), the admin, a node's new lookupds
    and the removal commands work."""
    setup, publish, lookup, reader, admin, config, remove, tombstone = blocks()
    assert "--node-id=3" in setup[1] and "--broadcast-address=127.0.0.1" in setup[1], setup
    run = docrun.Page(docrun.work_dir(tmp_path / "checkout"), docrun.environment(docrun.shims(tmp_path / "bin"), None))
    try:
        run.run_block(run.terminal(), docrun.sh_blocks(docrun.ROOT / "README.md")[0])
        term = run.terminal()
        run.run_block(term, setup[1])
        port = run.ports.mapping
        lookupds = [f"127.0.0.1:{port[4161]}", f"127.0.0.1:{port[4261]}"]
        nodes = {port[4250], port[4350], port[4450]}

        assert run.run_block(term, publish[1]) == "OKOKOK"
        deadline = time.monotonic() + 30
        # pynsq asks the lookupds in turn, the first one first, and the next one a poll interval (15 s)
        # later: both must know every node before the consumer starts, as they do by the time a person runs it
        while any(_lookup_ports(d) != nodes for d in lookupds):
            assert time.monotonic() < deadline, "the nodes did not register"
            time.sleep(0.2)
        answers = run.run_block(term, lookup[1])
        assert answers.count('"broadcast_address":"127.0.0.1"') == 6 and answers.endswith('{"topics":["events"]}')

        script = tmp_path / "reader.py"
        script.write_text(run.ports.apply(reader[1]))
        # unbuffered, as print is to a terminal
        env = dict(run.env, PYTHONUNBUFFERED="1")
        proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                env=env)
        assert proc.stdout is not None
        output = b""
        started = time.monotonic()
        try:
            # the pipe's own bytes, not a buffered reader's lines: lines that arrive together are all seen
            while sum(b"hello from" in line for line in output.split(b"\n")[:-1]) < 3:  # whole lines
                assert time.monotonic() - started < 30, f"the consumer printed {output!r}"
                if select.select([proc.stdout], [], [], 1)[0]:
                    output += os.read(proc.stdout.fileno(), 65536)
        finally:
            proc.kill()
            proc.wait()
        printed = output.decode().splitlines(keepends=True)
        assert sorted(line for line in printed if "hello" in line) == [f"b'hello from {i}'\n" for i in (1, 2, 3)]

        run.run_block(term, admin[1])  # the admin answers on its port (the run waits for it)
        nodes_seen = _get(f"127.0.0.1:{port[4171]}", "/api/nodes")
        assert isinstance(nodes_seen, dict) and len(nodes_seen["nodes"]) == 3, nodes_seen
        assert run.run_block(term, config[1]) == '["10.0.0.5:4160","10.0.0.6:4160"]'
        assert "NOT_FOUND" not in run.run_block(term, remove[1])
        run.run_block(term, tombstone[1])
        stats = _get(f"127.0.0.1:{port[4351]}", "/stats?format=json")
        assert isinstance(stats, dict) and stats["topics"] == []
    finally:
        run.close()
