"""Durable publishing side by side: nsqtw ``--durable-delivery`` against Go nsqd ``--sync-every=1``.

Usage: python benchmarks/durable_compare.py --go-nsqd=PATH/TO/GO/nsqd [--runs=3] [--runfor=10s]

Each publisher sends one PUB of 200 bytes and waits for its OK before the
next (``nsqtw-bench writer --pub``), so an OK means the message is on disk
as far as each daemon promises: nsqtw's after the fsync of its group, Go's
after the write that ``--sync-every=1`` follows with an fsync. Both daemons
start fresh for each figure, with ``--mem-queue-size=0`` for Go (so every
message goes through its disk queue and ``--sync-every``) and the order
alternates from run to run; the table gives medians (docs/durability.md,
"Throughput").
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

from nsqtw.tools.daemons import nsqtw_command, start_listening, stop_daemons

PUBLISHERS = (1, 8)


def one(name: str, cmd: list[str], workers: int, runfor: str) -> float:
    """PUB/s of ``workers`` one-at-a-time publishers against a fresh daemon ``name`` started by ``cmd``."""
    with tempfile.TemporaryDirectory(prefix="nsqtw-durable-") as data:
        proc, tcp, _ = start_listening(cmd + [f"--data-path={data}", "--tcp-address=127.0.0.1:0",
                                              "--http-address=127.0.0.1:0"], data)
        try:
            out = subprocess.run([sys.executable, "-m", "nsqtw.tools.bench", "writer", "--pub",
                                  f"--workers={workers}", f"--runfor={runfor}", "--size=200",
                                  f"--nsqd-tcp-address={tcp}", "--topic=durable", "--json"],
                                 capture_output=True, text=True, check=True, timeout=600)
            return float(json.loads(out.stdout.strip().splitlines()[-1])["ops_per_s"])
        finally:
            stop_daemons((name, proc), within=60.0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--go-nsqd", required=True)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--runfor", default="10s")
    ns = parser.parse_args()
    daemons = {"Go nsqd --mem-queue-size=0 --sync-every=1":
               [os.path.abspath(ns.go_nsqd), "--mem-queue-size=0", "--sync-every=1"],
               "nsqtw --durable-delivery": nsqtw_command() + ["--durable-delivery"]}
    figures: dict[tuple[str, int], list[float]] = {}
    for run in range(ns.runs):
        order = list(daemons) if run % 2 == 0 else list(reversed(daemons))
        for name in order:
            for workers in PUBLISHERS:
                rate = one(name, daemons[name], workers, ns.runfor)
                figures.setdefault((name, workers), []).append(rate)
                print(f"run {run + 1}/{ns.runs} {name}, {workers} publisher(s): {rate:,.0f} PUB/s",
                      file=sys.stderr, flush=True)
    print("| daemon | " + " | ".join(f"{w} publisher{'s' if w > 1 else ''}" for w in PUBLISHERS) + " |")
    print("| --- | " + " | ".join("---" for _ in PUBLISHERS) + " |")
    for name in daemons:
        cells = [f"{statistics.median(figures[name, w]):,.0f} PUB/s" for w in PUBLISHERS]
        print(f"| {name} | " + " | ".join(cells) + " |")
    print(f"\nMedians of {ns.runs} run(s) of {ns.runfor}, 200-byte PUBs, each publisher waiting for its OK.")


if __name__ == "__main__":
    main()
