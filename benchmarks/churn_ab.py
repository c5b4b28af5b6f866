"""Connection churn per kind (bare connect/close, SUB, HTTP /ping), A/B on fresh daemons, alternating.

Usage: python benchmarks/churn_ab.py [--cycles=N] [--rounds=R] [--kinds=bare,sub,ping,mixed] LABEL=TARGET...

A TARGET is a directory holding an nsqtw tree (run as ``PYTHONPATH=DIR twistd -n nsqtw``) or the
path of a Go ``nsqd`` binary. Each round starts one fresh daemon per target, in turn (the order
alternates from round to round), runs every kind against it from this one Python client, and
prints the cycles per second and the daemon's CPU per cycle (utime+stime from ``/proc/PID/stat``
over the run, divided by cycles), the steadier figure on a shared machine. The daemon's log goes
to a file, so no reader in this process competes with the client. docs/performance.md quotes it.

    python benchmarks/churn_ab.py --cycles=6000 --rounds=3 before=OTHER-CHECKOUT after=. go=PATH/TO/GO/nsqd
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from nsqtw.tools.daemons import LISTEN_LINE, nsqtw_command, process_cpu, stop_daemons  # noqa: E402
from tests.attacks import MAGIC, _connect, _read_frame, churn  # noqa: E402


def start(target: str, data: str) -> tuple[subprocess.Popen[bytes], str, str, str]:
    log = os.path.join(data, "daemon.log")
    flags = [f"--data-path={data}", "--tcp-address=127.0.0.1:0", "--http-address=127.0.0.1:0"]
    env = dict(os.environ)
    if os.path.isdir(target):
        env["PYTHONPATH"] = os.path.abspath(target)
        cmd = [*nsqtw_command(), *flags]
    else:
        cmd = [target, *flags]
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, cwd=data, env=env, stdout=out, stderr=out)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        with open(log, encoding="utf-8", errors="replace") as f:
            found = dict(m.groups() for m in LISTEN_LINE.finditer(f.read()))
        if len(found) == 2:
            return proc, found["TCP"], found["HTTP"], log
        if proc.poll() is not None:
            break
        time.sleep(0.05)
    proc.kill()
    raise RuntimeError(f"{target} did not start: {open(log).read()}")


def bare(tcp: str, http: str, n: int) -> None:
    for _ in range(n):
        s = _connect(tcp)
        s.sendall(MAGIC)
        s.close()


def sub(tcp: str, http: str, n: int) -> None:
    for _ in range(n):
        s = _connect(tcp)
        s.sendall(MAGIC + b"SUB churn c\n")
        _read_frame(s)
        s.close()


def ping(tcp: str, http: str, n: int) -> None:
    for _ in range(n):
        s = _connect(http)
        s.sendall(b"GET /ping HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        while s.recv(65536):
            pass
        s.close()


KINDS: dict[str, Callable[[str, str, int], object]] = {
    "bare": bare, "sub": sub, "ping": ping, "mixed": churn,
}


def measure(pid: int, kind: str, tcp: str, http: str, cycles: int) -> tuple[float, float, float]:
    """Cycles per second, and the daemon's user and system CPU µs per cycle."""
    user0, sys0 = process_cpu(pid)
    started = time.monotonic()
    KINDS[kind](tcp, http, cycles)
    elapsed = time.monotonic() - started
    time.sleep(0.3)  # let the daemon finish the last closes
    user1, sys1 = process_cpu(pid)
    return cycles / elapsed, (user1 - user0) / cycles * 1e6, (sys1 - sys0) / cycles * 1e6


def main() -> None:
    cycles, rounds, kinds = 6000, 3, ["bare", "sub", "ping", "mixed"]
    targets: list[tuple[str, str]] = []
    for arg in sys.argv[1:]:
        if arg.startswith("--cycles="):
            cycles = int(arg.split("=", 1)[1])
        elif arg.startswith("--rounds="):
            rounds = int(arg.split("=", 1)[1])
        elif arg.startswith("--kinds="):
            kinds = arg.split("=", 1)[1].split(",")
        else:
            label, target = arg.split("=", 1)
            targets.append((label, os.path.abspath(target)))  # each daemon runs in a scratch directory
    print(f"load average at start: {os.getloadavg()[0]:.2f}", flush=True)
    results: dict[tuple[str, str], list[tuple[float, float, float]]] = {}
    for n in range(rounds):
        order = targets if n % 2 == 0 else targets[::-1]
        for label, target in order:
            with tempfile.TemporaryDirectory() as data:
                proc, tcp, http, _ = start(target, data)
                try:
                    time.sleep(0.5)
                    KINDS["mixed"](tcp, http, 300)  # warm up
                    for kind in kinds:
                        rate, user, system = measure(proc.pid, kind, tcp, http, cycles)
                        results.setdefault((label, kind), []).append((rate, user, system))
                        print(f"round {n + 1} {label:<8} {kind:<6} {rate:8.0f} cycles/s, daemon CPU "
                              f"{user + system:6.1f} us/cycle (user {user:6.1f}, sys {system:6.1f})",
                              flush=True)
                finally:
                    stop_daemons((label, proc))
    print(f"load average at end: {os.getloadavg()[0]:.2f}")
    print("\nmedians: cycles/s, daemon CPU µs per cycle (of it user µs)")
    print("\n| kind | " + " | ".join(label for label, _ in targets) + " |")
    print("| --- |" + " --- |" * len(targets))
    for kind in kinds:
        cells = []
        for label, _ in targets:
            rs = results[(label, kind)]
            cells.append(f"{statistics.median(r for r, _, _ in rs):,.0f}/s, "
                         f"{statistics.median(u + s for _, u, s in rs):.0f} µs "
                         f"(user {statistics.median(u for _, u, _ in rs):.0f})")
        print(f"| {kind} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
