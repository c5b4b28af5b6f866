"""Where a node with ``--workers`` spends its CPU: the core's and the workers' µs per message.

For each ``--workers`` value (1 is one process), a fresh nsqtw node takes
Go's ``bench_writer`` (MPUB write), ``bench_reader`` (RDY 2500) and
``bench_writer -batch-size=1`` (one-message round trips) in turn, and the
CPU each process used is read from ``/proc`` around each load: the core
(the process twistd started) and its workers, summed. The core runs all
topic work, so ``1e6 / core µs`` is the rate that the core alone
permits on any number of cores; the workers' figure is what the others
add, spread over their cores. Go nsqd runs first in each round, for the
same loads' rates in the same run.

    python benchmarks/workers_cpu.py GO/bin [WORKERS...]   # env: RUN=5s ROUNDS=1 NSQTW_FLAGS=...

``NSQTW_FLAGS`` are more flags for nsqtw (``--busy-poll=0``: CPU spent
working, not spinning while it waits).

GO/bin holds Go NSQ v1.3.0's nsqd, bench_writer and bench_reader.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from nsqtw.tools.daemons import nsqtw_command, process_cpu, start_listening, stop_daemons  # noqa: E402

LOADS = (("write", "bench_writer", ("-topic=bw",)),
         ("read", "bench_reader", ("-topic=bw", "-channel=ch")),
         ("round trips", "bench_writer", ("-topic=bp", "-batch-size=1")))


def own_cpu(pid: int) -> float:
    """CPU seconds of ``pid`` alone (not its children)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def run_load(bin_dir: str, tcp: str, prog: str, args: tuple[str, ...], pid: int, runfor: str
             ) -> tuple[float, float, float]:
    """(messages a second, the core's µs a message, the workers' µs a message) of one load."""
    core0, all0 = own_cpu(pid), sum(process_cpu(pid))
    out = subprocess.run([os.path.join(bin_dir, prog), f"-nsqd-tcp-address={tcp}", f"-runfor={runfor}", *args],
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, check=True).stdout
    core1, all1 = own_cpu(pid), sum(process_cpu(pid))
    # Go's bench tools end with "duration: 5.000311s - 1.234mb/s - 123456.789ops/s - 8.1us/op"
    rate = re.findall(r"([\d.]+)ops/s", out)
    took = re.findall(r"duration: ([\d.]+)s", out)
    if not rate or not took:
        raise SystemExit(f"{prog} gave no rate:\n{out}")
    messages = float(rate[-1]) * float(took[-1])
    core = core1 - core0
    return float(rate[-1]), core * 1e6 / messages, ((all1 - all0) - core) * 1e6 / messages


def main(argv: list[str]) -> None:
    bin_dir = argv[1]
    workers = [int(w) for w in argv[2:]] or [1, 2]
    runfor = os.environ.get("RUN", "5s")
    rounds = int(os.environ.get("ROUNDS", "1"))
    print(f"{os.cpu_count()} cores, Python {sys.version.split()[0]}, {runfor} a load,"
          f" nsqtw flags {os.environ.get('NSQTW_FLAGS', '')!r}")
    for r in range(rounds):
        for n in [0, *workers]:  # 0: Go nsqd
            data = tempfile.mkdtemp()
            if n == 0:
                cmd = [os.path.join(bin_dir, "nsqd"), "--tcp-address=127.0.0.1:0", "--http-address=127.0.0.1:0",
                       f"--data-path={data}"]
                label = "Go nsqd"
            else:
                cmd = [*nsqtw_command(), "--tcp-address=127.0.0.1:0", "--http-address=127.0.0.1:0",
                       f"--data-path={data}", f"--workers={n}", *os.environ.get("NSQTW_FLAGS", "").split()]
                label = f"nsqtw --workers={n}"
            env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
            proc, tcp, _ = start_listening(cmd, data, env)
            time.sleep(1.0)  # the workers start after the listening line
            try:
                for name, prog, args in LOADS:
                    rate, core, rest = run_load(bin_dir, tcp, prog, args, proc.pid, runfor)
                    cpu = (f"core {core:.2f} µs/msg, workers {rest:.2f} µs/msg"
                           if n > 1 else f"{core + rest:.2f} µs/msg")
                    print(f"round {r + 1} {label:20} {name:12} {rate:>12,.0f}/s  {cpu}", flush=True)
            finally:
                stop_daemons((label, proc))
                shutil.rmtree(data, ignore_errors=True)


if __name__ == "__main__":
    main(sys.argv)
