"""``nsqtw-bench scale`` against Go nsqd and nsqtw, side by side, and a table of the two.

Usage: python benchmarks/scale_compare.py TOPICS CHANNELS CLIENTS PATH/TO/GO/nsqd

Both daemons start fresh on loopback with default flags and the file limit
raised to the hard limit (each daemon holds one socket per client); the
same scale run (nsqtw/tools/scale.py) is made against each, Go first.
docs/performance.md's scale summary comes from here. ``NSQTW_FLAGS`` adds
flags to nsqtw's (``NSQTW_FLAGS=--workers=2``: the node on three
processes; threads, files and RSS are then the core's alone).
"""

from __future__ import annotations

import os
import resource
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from nsqtw.tools.daemons import nsqtw_command, start_listening, stop_daemons  # noqa: E402
from nsqtw.tools.scale import ScaleResult, run_scale  # noqa: E402


def start(cmd: list[str], cwd: str) -> tuple[subprocess.Popen[str], str, str]:
    return start_listening(cmd, cwd, dict(os.environ, PYTHONPATH=ROOT))


def main() -> None:
    if len(sys.argv) != 5:
        raise SystemExit(__doc__.split("\n\n")[1])
    topics, channels, clients = (int(a) for a in sys.argv[1:4])
    go = os.path.abspath(sys.argv[4])
    limit = topics * channels * clients + 256
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard < limit:
        raise SystemExit(f"{limit} open files needed, the hard limit is {hard}: use fewer clients")
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))  # the daemons inherit it
    results: dict[str, ScaleResult] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, cmd in (("Go nsqd v1.3.0", [go]),
                          ("nsqtw", nsqtw_command() + os.environ.get("NSQTW_FLAGS", "").split())):
            data = os.path.join(tmp, name.split()[0])
            os.makedirs(data)
            proc, tcp, http = start(cmd + [f"--data-path={data}", "--tcp-address=127.0.0.1:0",
                                           "--http-address=127.0.0.1:0"], data)
            try:
                time.sleep(1)
                results[name] = run_scale(tcp, http, topics, channels, clients, proc.pid)
                print(f"== {name}\n{results[name].text()}", flush=True)
            finally:
                stop_daemons((name, proc), within=60)
    print(f"\n{topics} topics x {channels} channels x {clients} clients\n")
    print("| | " + " | ".join(results) + " |\n| --- | --- | --- |")
    rows = [("OS threads", lambda r: r.threads), ("open files", lambda r: r.open_files),
            ("RSS (MB)", lambda r: r.rss_mb), ("idle CPU (%)", lambda r: r.idle_cpu_percent),
            ("`/stats?format=json` median (ms)", lambda r: sorted(r.stats_ms)[len(r.stats_ms) // 2]),
            ("create topics+channels (/s)", lambda r: f"{r.create_per_s:,.0f}"),
            ("delete channels+topics (/s)", lambda r: f"{r.delete_per_s:,.0f}"),
            ("connect subscribers (/s)", lambda r: f"{r.connect_per_s:,.0f}"),
            ("heap objects: before / loaded / after deleting all",
             lambda r: " / ".join(f"{n:,}" for n in r.heap_objects)),
            ("after deleting all: threads / files / RSS MB",
             lambda r: f"{r.after_delete.get('threads')} / {r.after_delete.get('open_files')} / "
                       f"{r.after_delete.get('rss_mb')}")]
    for label, get in rows:
        print(f"| {label} | " + " | ".join(str(get(r)) for r in results.values()) + " |")


if __name__ == "__main__":
    main()
