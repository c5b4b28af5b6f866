"""docs/cluster.md's examples run as written against two nsqtw-lookupds and three nodes.

The daemons start as the doc's first block starts them (the same flags, two
lookupds, three nodes with ``--node-id`` 1..3 registered with both) but on
port 0; every ``127.0.0.1:PORT`` the doc names is replaced by the address of
the daemon the doc means (4160/4161: the first lookupd, 4260/4261: the
second, 4{i}50/4{i}51: node i) before a block runs. The blocks run in the
doc's order: publish, look up, the pynsq consumer, removing a topic.
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

from tests.daemon import ROOT

DOC = Path(ROOT) / "docs" / "cluster.md"


def blocks() -> list[tuple[str, str]]:
    return re.findall(r"```(sh|python)\n(.*?)```", DOC.read_text(), re.S)


def _lookup_ports(http: str) -> set[int]:
    with urllib.request.urlopen(f"http://{http}/lookup?topic=events", timeout=10) as resp:
        return {p["tcp_port"] for p in json.load(resp)["producers"]}


def test_cluster_doc_runs_as_written(daemon_factory, lookupd_factory, tmp_path: Path) -> None:
    """Publishing to each node, /lookup, /nodes and /topics, the pynsq consumer through both lookupds
    (it prints all three messages, from three nodes, within seconds) and the removal commands work."""
    found = blocks()
    setup, publish, lookup, reader, admin, config, remove, tombstone = found
    assert "--node-id=$i" in setup[1] and "--broadcast-address=127.0.0.1" in setup[1], setup
    lookupds = [lookupd_factory() for _ in range(2)]
    joined = [f"--lookupd-tcp-address={d.tcp_address}" for d in lookupds]
    nodes = [daemon_factory(f"--node-id={i}", "--broadcast-address=127.0.0.1", *joined) for i in (1, 2, 3)]
    ports = {"4160": lookupds[0].tcp_address, "4161": lookupds[0].http_address,
             "4260": lookupds[1].tcp_address, "4261": lookupds[1].http_address}
    for i, node in enumerate(nodes, 1):
        ports[f"4{i}50"], ports[f"4{i}51"] = node.tcp_address, node.http_address

    def here(text: str) -> str:
        return re.sub(r"127\.0\.0\.1:(\d{4})\b", lambda m: ports[m.group(1)], text)

    def sh(block: str) -> str:
        r = subprocess.run(["bash", "-c", "set -euo pipefail\n" + here(block)], capture_output=True, text=True,
                           timeout=60, cwd=tmp_path)
        assert r.returncode == 0, r.stdout + r.stderr
        return r.stdout

    assert sh(publish[1]) == "OKOKOK"
    deadline = time.monotonic() + 30
    # pynsq asks the lookupds in turn, the first one first, and the next one a poll interval (15 s) later:
    # both must know every node before the consumer starts, as they do by the time a person runs it
    while any(_lookup_ports(d.http_address) != {n.tcp[1] for n in nodes} for d in lookupds):
        assert time.monotonic() < deadline, "the nodes did not register"
        time.sleep(0.2)
    answers = sh(lookup[1])
    assert answers.count('"broadcast_address":"127.0.0.1"') == 6 and answers.endswith('{"topics":["events"]}')

    script = tmp_path / "reader.py"
    script.write_text(here(reader[1]))
    # unbuffered, as print is to a terminal
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""), PYTHONUNBUFFERED="1")
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

    assert "NOT_FOUND" not in sh(remove[1])
    sh(tombstone[1])
    with urllib.request.urlopen(f"http://{nodes[1].http_address}/stats?format=json", timeout=10) as resp:
        assert json.load(resp)["topics"] == []
    assert "nsqtw-admin --lookupd-http-address=127.0.0.1:4161" in admin[1] and "nsqlookupd_tcp_addresses" in config[1]
