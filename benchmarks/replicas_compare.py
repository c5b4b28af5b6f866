"""What ``--replicas=2`` costs, side by side: Go nsqd, nsqtw ``--replicas=1`` and nsqtw ``--replicas=2``.

Usage: python benchmarks/replicas_compare.py --go-nsqd=PATH/TO/GO/nsqd [--runs=2] [--runfor=10s] [--workers=1]

The same cluster shape for all three: one nsqtw-lookupd and the measured
node registered with it (``--broadcast-address=127.0.0.1``). For
``--replicas=2`` a second nsqtw node with ``--replicas=2`` is started, fresh,
beside each measured one, so every publish is answered only once that peer
holds its copy; the peer's CPU is not counted in the figures but shares the
machine. Go's bench tools (``bench_writer``, ``bench_reader``, next to
``--go-nsqd``) make the load, as ``nsqtw-bench compare`` runs them: MPUB
writes of 200 messages, reads of that backlog (written for twice
``--runfor``, so that it outlasts the reader), one-message round trips
(``bench_writer -batch-size=1``). Every daemon starts fresh per figure and
the order alternates from run to run; the table gives medians
(docs/performance.md, "Replication"). ``--workers`` is the measured nsqtw
nodes' (1 by default; 0 lets each choose from its CPUs, as the daemon's
default does); the peer always runs one process.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

from nsqtw.tools.compare import READ, ROUND_TRIP, STOP_WITHIN, WRITE, Clients, Measure
from nsqtw.tools.daemons import TWISTD, nsqtw_command, start_daemon, start_listening, stop_daemons

MEASURES = (WRITE, READ, ROUND_TRIP)


def session(cmd: list[str], lookupd_tcp: str, replicated: bool, clients: Clients,
            measures: tuple[Measure, ...]) -> dict[str, float]:
    """Fresh daemon(s), the measures in order; messages/s of each."""
    with tempfile.TemporaryDirectory(prefix="nsqtw-replicas-") as tmp:
        shape = [f"--lookupd-tcp-address={lookupd_tcp}", "--broadcast-address=127.0.0.1"]
        procs: list[tuple[str, subprocess.Popen[str]]] = []
        try:
            if replicated:
                os.mkdir(os.path.join(tmp, "peer"))
                peer, _, _ = start_listening([*nsqtw_command(), f"--data-path={tmp}/peer", "--tcp-address=127.0.0.1:0",
                                              "--http-address=127.0.0.1:0", "--workers=1", "--replicas=2",
                                              *shape], tmp)
                procs.append(("the peer", peer))
                shape.append("--replicas=2")
            os.mkdir(os.path.join(tmp, "node"))
            node, tcp, _ = start_listening([*cmd, f"--data-path={tmp}/node", "--tcp-address=127.0.0.1:0",
                                            "--http-address=127.0.0.1:0", *shape], tmp)
            procs.append(("the node", node))
            time.sleep(2.0)  # registered, and (replicated) its peer found through lookupd
            out: dict[str, float] = {}
            written = 0
            for m in measures:
                if m is READ:
                    # a backlog bigger than the reader can drain in --runfor (as nsqtw-bench compare makes
                    # it), or the read figure would be the writer's: unmeasured fills
                    for _ in range(1 if WRITE in measures else 2):
                        written += clients.take("Go bench", WRITE, tcp)[1]
                value, count = clients.take("Go bench", m, tcp)
                if m is WRITE:
                    written += count
                elif m is READ and count >= 0.99 * written:
                    out["drained"] = 1.0  # the reader emptied the backlog: its figure is a lower bound
                out[m.key] = value
            return out
        finally:
            stop_daemons(*reversed(procs), within=STOP_WITHIN)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--go-nsqd", required=True)
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--runfor", default="10s")
    parser.add_argument("--workers", type=int, default=1)
    ns = parser.parse_args()
    go = os.path.abspath(ns.go_nsqd)
    clients = Clients(os.path.dirname(go), ns.runfor, 200, 200, 10000.0)
    ours = [*nsqtw_command(), f"--workers={ns.workers}"]
    daemons: dict[str, tuple[list[str], bool]] = {
        "Go nsqd": ([go], False), "nsqtw --replicas=1": (ours, False), "nsqtw --replicas=2": (ours, True)}
    figures: dict[tuple[str, str], list[float]] = {}
    with tempfile.TemporaryDirectory(prefix="nsqtw-lookupd-") as tmp:
        lookupd, found = start_daemon([sys.executable, "-c", TWISTD, "--pidfile=", "-n",
                                       "nsqtw-lookupd", "--tcp-address=127.0.0.1:0", "--http-address=127.0.0.1:0"],
                                      tmp)
        try:
            for run in range(ns.runs):
                names = list(daemons) if run % 2 == 0 else list(daemons)[::-1]
                for name in names:
                    cmd, replicated = daemons[name]
                    for group in ((WRITE, READ), (ROUND_TRIP,)):
                        for key, value in session(cmd, found["TCP"], replicated, clients, group).items():
                            figures.setdefault((name, key), []).append(value)
                            if key != "drained":
                                print(f"run {run + 1}/{ns.runs} {name}: {key} {value:,.0f}/s", file=sys.stderr,
                                      flush=True)
        finally:
            stop_daemons(("nsqtw-lookupd", lookupd), within=STOP_WITHIN)
    names = list(daemons)
    print(f"| measure | {' | '.join(names)} | --replicas=2 ÷ Go | --replicas=2 ÷ --replicas=1 |")
    print("| --- |" + " --- |" * (len(names) + 2))
    for m in MEASURES:
        med = [statistics.median(figures[(n, m.key)]) for n in names]
        at_least = ["≥ " if m is READ and (n, "drained") in figures else "" for n in names]
        print(f"| {m.label} | " + " | ".join(f"{a}{v:,.0f}/s" for a, v in zip(at_least, med, strict=True))
              + f" | {med[2] / med[0]:.2f}× | {med[2] / med[1]:.2f}× |")
    print(f"\nMedians of {ns.runs} run(s), {ns.runfor} each, Go's bench tools, nsqtw --workers={ns.workers}; the"
          " backlog read is written for twice --runfor first; \"≥\": the reader emptied it in some run.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
