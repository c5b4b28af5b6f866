"""What a replicated one-message publish costs: round trips a second, the owner's and the peer's CPU a publish.

Usage: python benchmarks/replica_cpu.py GO/bin [--publishers=16] [--runs=2] [--runfor=6s]
       [--batch-size=1] [--read] [--owner-flag=FLAG ...] [--peer-flag=FLAG ...]

One nsqtw-lookupd and two nsqtw nodes with ``--replicas=2`` (one process
each, registered with it), started fresh for each run. Go's
``bench_writer -batch-size=1`` sends one-message MPUBs of 200 B to the
owner, each answered only once the peer holds its copy; ``--publishers``
sets how many (its ``GOMAXPROCS``: Go's tool opens one connection a
processor). The CPU each node used is read from ``/proc`` around the load
(every thread, the kernel's time on its behalf included) and divided by
the publishes answered. On a machine with fewer cores than busy
processes the rate moves with the scheduling; the CPU per publish is the
steadier figure for an A/B (run each tree with ``PYTHONPATH=TREE`` from
outside the checkout, alternating).

``--owner-flag`` and ``--peer-flag`` add nsqtw flags to one node
(``--peer-flag=--busy-poll=0``: the peer sleeps between records instead
of spinning). ``--batch-size=200`` sends MPUBs of 200 messages instead,
and the figures are then a message's. ``--read`` measures reads instead:
a backlog of MPUBs of 200 is written for twice ``--runfor`` (unmeasured), then
Go's ``bench_reader`` (``--publishers`` connections, RDY 2500, a FIN each)
reads it for ``--runfor``; the figures are then per message read, the FINs
the owner sends its replica included.

GO/bin holds Go NSQ v1.3.0's ``bench_writer`` (and ``bench_reader``).
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

from nsqtw._go.duration import format_duration, parse_duration
from nsqtw.tools.daemons import TWISTD, nsqtw_command, process_cpu, start_daemon, start_listening, stop_daemons


def _cpu(pid: int) -> float:
    user, system = process_cpu(pid)
    return user + system


def one_run(go_bin: str, lookupd_tcp: str, publishers: int, runfor: str, batch: int, owner_flags: list[str],
            peer_flags: list[str], read: bool = False) -> tuple[float, float, float]:
    """Fresh owner and peer, one load: (publishes a second, owner µs a publish, peer µs a publish)."""
    with tempfile.TemporaryDirectory(prefix="nsqtw-replica-cpu-") as tmp:
        shape = [f"--lookupd-tcp-address={lookupd_tcp}", "--broadcast-address=127.0.0.1", "--replicas=2",
                 "--workers=1", "--tcp-address=127.0.0.1:0", "--http-address=127.0.0.1:0"]
        procs: list[tuple[str, subprocess.Popen[str]]] = []
        try:
            for name, flags in (("peer", peer_flags), ("owner", owner_flags)):
                os.mkdir(os.path.join(tmp, name))
                proc, tcp, _ = start_listening([*nsqtw_command(), f"--data-path={tmp}/{name}", *shape, *flags], tmp)
                procs.append((name, proc))
            (_, peer), (_, owner) = procs
            time.sleep(2.0)  # both registered, and the peer found through lookupd
            writer = [os.path.join(go_bin, "bench_writer"), f"--nsqd-tcp-address={tcp}", "--size=200",
                      "--topic=replica_cpu"]
            if read:  # the backlog, unmeasured: MPUBs of 200 for twice --runfor, more than the reader takes
                subprocess.run([*writer, "--batch-size=200", f"--runfor={format_duration(2 * parse_duration(runfor))}"],
                               capture_output=True, text=True, check=True)
                load = [os.path.join(go_bin, "bench_reader"), f"--nsqd-tcp-address={tcp}", "--topic=replica_cpu",
                        "--channel=ch", "--size=200", f"--runfor={runfor}"]
            else:
                load = [*writer, f"--batch-size={batch}", f"--runfor={runfor}"]
            before = _cpu(owner.pid), _cpu(peer.pid)
            out = subprocess.run(load, capture_output=True, text=True,
                                 env={**os.environ, "GOMAXPROCS": str(publishers)})
            after = _cpu(owner.pid), _cpu(peer.pid)
            found = re.search(r"duration: (\S+)s - [0-9.]+mb/s - ([0-9.]+)ops/s", out.stdout + out.stderr)
            if found is None:
                raise SystemExit(f"{os.path.basename(load[0])} said: {out.stdout}{out.stderr}")
            rate = float(found.group(2))
            publishes = rate * float(found.group(1))
            return (rate, (after[0] - before[0]) / publishes * 1e6, (after[1] - before[1]) / publishes * 1e6)
        finally:
            stop_daemons(*reversed(procs))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("go_bin")
    parser.add_argument("--publishers", type=int, default=16)
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--runfor", default="6s")
    parser.add_argument("--batch-size", type=int, default=1)
    parser.add_argument("--read", action="store_true")
    parser.add_argument("--owner-flag", action="append", default=[])
    parser.add_argument("--peer-flag", action="append", default=[])
    ns = parser.parse_args()
    figures = []
    # bench_writer counts messages: with MPUBs the figures are a message's
    unit, units = ("publish", "publishes") if ns.batch_size == 1 and not ns.read else ("message", "messages")
    with tempfile.TemporaryDirectory(prefix="nsqtw-lookupd-") as tmp:
        lookupd, found = start_daemon([sys.executable, "-c", TWISTD, "--pidfile=", "-n", "nsqtw-lookupd",
                                       "--tcp-address=127.0.0.1:0", "--http-address=127.0.0.1:0"], tmp)
        try:
            for run in range(ns.runs):
                rate, owner, peer = one_run(os.path.abspath(ns.go_bin), found["TCP"], ns.publishers, ns.runfor,
                                            ns.batch_size, ns.owner_flag, ns.peer_flag, ns.read)
                figures.append((rate, owner, peer))
                print(f"run {run + 1}/{ns.runs}: {rate:,.0f} {units}/s, owner {owner:.1f} µs, peer {peer:.1f} µs"
                      f" a {unit}", flush=True)
        finally:
            stop_daemons(("nsqtw-lookupd", lookupd))
    rate, owner, peer = (statistics.median(f[k] for f in figures) for k in range(3))
    who = "readers" if ns.read else "publishers"
    print(f"median of {ns.runs}, {ns.publishers} {who}: {rate:,.0f} {units}/s, owner {owner:.1f} µs,"
          f" peer {peer:.1f} µs a {unit}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
