"""What ``--workers=N`` costs in memory: the PSS of the whole process tree, idle and after traffic.

PSS (proportional set size) counts a page shared by k processes as 1/k in
each, so the sum over the tree (core, fork server, workers) is what the
node really holds; RSS would count the shared pages once per process. For
each ``--workers`` value given, a fresh node is started on port 0; its
tree's PSS is read (``/proc/PID/smaps_rollup``) once it answers ``/ping``
OK and has been idle a few seconds, then again after a burst: 64 clients
publishing 200 messages each while a consumer reads them.

    python benchmarks/workers_pss.py            # --workers 1 and 4
    python benchmarks/workers_pss.py 1 2 4 8

Prints one line per node and a JSON summary (MB = 10^6 bytes).
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import threading
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from nsqtw.tools.daemons import nsqtw_command, start_listening, stop_daemons  # noqa: E402
from tests.rawclient import Client, subscribe  # noqa: E402

CLIENTS = 64
MESSAGES = 200


def tree(pid: int) -> list[int]:
    """``pid`` and every live descendant."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        try:
            with open(f"/proc/{p}/task/{p}/children") as f:
                todo.extend(int(c) for c in f.read().split())
        except OSError:
            pass
    return out


def pss_kib(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def tree_pss(pid: int) -> tuple[float, list[float]]:
    """The tree's PSS in MB, and each process's."""
    each = [pss_kib(p) * 1024 / 1e6 for p in tree(pid)]
    return sum(each), each


def wait_ping(http: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"http://{http}/ping", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.05)
    raise RuntimeError("the node never answered /ping OK")


def burst(tcp: str) -> None:
    consumer = subscribe(tcp, "pss", "c", rdy=1000)
    stop = threading.Event()

    def read() -> None:
        while not stop.is_set():
            try:
                consumer.fin(consumer.message(timeout=0.5))
            except Exception:
                if stop.is_set():
                    return

    reader = threading.Thread(target=read, daemon=True)
    reader.start()

    def publish() -> None:
        c = Client(tcp)
        for i in range(MESSAGES):
            c.pub("pss", b"x" * 100 + str(i).encode())
        c.close()

    threads = [threading.Thread(target=publish) for _ in range(CLIENTS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    time.sleep(1)
    stop.set()
    reader.join(2)
    consumer.close()


def measure(workers: int, idle: float = 3.0, traffic: bool = True) -> dict[str, object]:
    with tempfile.TemporaryDirectory() as data:
        cmd = [*nsqtw_command(), f"--workers={workers}", "--tcp-address=127.0.0.1:0",
               "--http-address=127.0.0.1:0", f"--data-path={data}"]
        env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
        proc, tcp, http = start_listening(cmd, data, env)
        try:
            wait_ping(http)
            time.sleep(idle)
            idle_total, idle_each = tree_pss(proc.pid)
            busy_total, busy_each = 0.0, []
            if traffic:
                burst(tcp)
                time.sleep(idle)
                busy_total, busy_each = tree_pss(proc.pid)
        finally:
            stop_daemons((f"nsqtw --workers={workers}", proc))
    return {"workers": workers, "processes": len(idle_each), "idle_mb": round(idle_total, 1),
            "idle_each_mb": [round(x, 1) for x in idle_each], "after_traffic_mb": round(busy_total, 1),
            "after_traffic_each_mb": [round(x, 1) for x in busy_each]}


def main(argv: list[str]) -> None:
    counts = [int(a) for a in argv[1:]] or [1, 4]
    results = []
    for n in counts:
        r = measure(n)
        results.append(r)
        print(f"--workers={n}: {r['processes']} processes, PSS idle {r['idle_mb']} MB"
              f" {r['idle_each_mb']}, after traffic {r['after_traffic_mb']} MB {r['after_traffic_each_mb']}",
              flush=True)
    print(json.dumps(results))


if __name__ == "__main__":
    main(sys.argv)
