"""Reads side by side, with where the time went: each daemon's and ``bench_reader``'s CPU per message,
the cores all of them kept busy, and how busy each of nsqtw's threads was.

For each round, Go nsqd and then nsqtw (the order alternates from round to
round), each fresh: Go's ``bench_writer`` publishes MPUBs for ``WRITE``
(a topic without channels, so past ``--mem-queue-size`` the backlog is on
disk), then ``bench_reader`` (RDY 2500, a connection per core) reads for
``RUN``. Around the read it takes the daemon's CPU from ``/proc`` (every
thread, for nsqtw each thread apart: the reactor's is the process's first)
and the reader's from ``wait4``.

On a machine whose cores the daemon and the reader share, the rate is at
most the cores divided by the two CPU figures added: a daemon that keeps
the cores less busy than that, its reactor thread idle part of the time,
is waiting (for its disk threads, the GIL, the reader's FINs, a core), not
working, and there is rate to win without making a message cheaper.

    python benchmarks/read_threads.py GO/bin   # env: WRITE=20s RUN=8s ROUNDS=2 NSQTW_FLAGS=...

GO/bin holds Go NSQ v1.3.0's nsqd, bench_writer and bench_reader.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from nsqtw.tools.daemons import nsqtw_command, process_cpu, start_listening, stop_daemons  # noqa: E402


def thread_cpu(pid: int) -> dict[int, float]:
    """CPU seconds (user + system) each thread of ``pid`` has used so far, by thread ID."""
    tick = os.sysconf("SC_CLK_TCK")
    out: dict[int, float] = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/stat") as f:
                stat = f.read()
        except OSError:
            continue  # (the thread ended)
        fields = stat[stat.rindex(")") + 2:].split()
        out[int(tid)] = (int(fields[11]) + int(fields[12])) / tick
    return out


def read_once(go_bin: str, cmd: list[str], write_for: str, run_for: str) -> str:
    """One fresh daemon: the backlog, then the measured read; the line that reports it."""
    with tempfile.TemporaryDirectory(prefix="read-threads-") as tmp:
        proc, tcp, _ = start_listening([*cmd, "--tcp-address=127.0.0.1:0", "--http-address=127.0.0.1:0",
                                        f"--data-path={tmp}"], tmp)
        try:
            subprocess.run([f"{go_bin}/bench_writer", f"--nsqd-tcp-address={tcp}", "--batch-size=200",
                            "--size=200", f"--runfor={write_for}", "--topic=bench"], capture_output=True, check=True)
            time.sleep(0.5)
            threads_before = thread_cpu(proc.pid)
            cpu_before = sum(process_cpu(proc.pid))
            started = time.monotonic()
            reader = subprocess.Popen([f"{go_bin}/bench_reader", f"--nsqd-tcp-address={tcp}", "--size=200",
                                       f"--runfor={run_for}", "--topic=bench", "--channel=ch"],
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            assert reader.stdout is not None
            out = reader.stdout.read()
            _, status, usage = os.wait4(reader.pid, 0)
            wall = time.monotonic() - started
            daemon = sum(process_cpu(proc.pid)) - cpu_before
            threads_after = thread_cpu(proc.pid)
        finally:
            stop_daemons(("daemon", proc))
    found = re.search(r"duration: (\S+)s - [0-9.]+mb/s - ([0-9.]+)ops/s", out)
    if status != 0 or found is None:
        raise SystemExit(f"bench_reader failed: {out}")
    rate = float(found.group(2))
    messages = rate * float(found.group(1))
    client = usage.ru_utime + usage.ru_stime
    busy = [(threads_after[t] - threads_before.get(t, 0.0)) / wall for t in sorted(threads_after)]
    threads = " ".join(f"{b:.2f}" for b in busy if b >= 0.01)
    return (f"{rate:9,.0f}/s  daemon {1e6 * daemon / messages:5.2f} µs/msg  reader {1e6 * client / messages:5.2f}"
            f" µs/msg  cores busy {(daemon + client) / wall:4.2f}  threads busy (first: the main one) {threads}")


def main() -> None:
    if len(sys.argv) != 2:
        raise SystemExit(__doc__)
    go_bin = os.path.abspath(sys.argv[1])
    write_for = os.environ.get("WRITE", "20s")
    run_for = os.environ.get("RUN", "8s")
    daemons = {"Go": [f"{go_bin}/nsqd"],
               "nsqtw": [*nsqtw_command(), *os.environ.get("NSQTW_FLAGS", "").split()]}
    for round_ in range(int(os.environ.get("ROUNDS", "2"))):
        names = list(daemons) if round_ % 2 == 0 else list(daemons)[::-1]
        for name in names:
            print(f"round {round_ + 1} {name:<6} {read_once(go_bin, daemons[name], write_for, run_for)}", flush=True)


if __name__ == "__main__":
    main()
