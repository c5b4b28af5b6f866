"""Idle RSS of each daemon, Go's and nsqtw's side by side, once it has answered one ``GET /ping`` and one TCP client.

Usage: ``PYTHONPATH=. python benchmarks/idle_rss.py [--go-bin=DIR] [--settle=2]``
from the checkout: the daemons run the nsqtw this script imported.

Each daemon starts in a scratch directory with its default flags and
listeners on loopback port 0. Once it listens it gets one ``GET /ping`` and
(nsqd, nsqlookupd) one TCP connection that sends the protocol magic and
closes; ``--settle`` seconds later its ``VmRSS`` is read: a realistic idle
node, not a process that has served nothing. The ``twistd floor`` row is a
process that imported ``twisted.scripts.twistd`` and ran twistd's plugin
discovery, and nothing else: what any ``twistd PLUGIN`` takes before the
plugin's code runs. Go's daemons are skipped without ``--go-bin`` or where it lacks them.
Figures are in MB of 10^6 bytes, as ``nsqtw-bench compare`` counts them
(``docs/performance.md``, Memory).
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import sys
import tempfile
import time
import urllib.request

import nsqtw
from nsqtw.tools.daemons import TWISTD, rss_bytes, start_daemon, stop_daemons, twistd_floor_rss

#: the daemons' environment: the nsqtw imported here first on their path
ENV = dict(os.environ, PYTHONPATH=os.pathsep.join(
    [os.path.dirname(os.path.dirname(os.path.abspath(nsqtw.__file__))), os.environ.get("PYTHONPATH", "")]))

#: (name, Go program, its flags, nsqtw plugin, its flags, the TCP magic or None); DATA is the scratch dir
DAEMONS = (
    ("nsqd", "nsqd", ["--data-path=DATA", "--tcp-address=127.0.0.1:0", "--http-address=127.0.0.1:0"],
     "nsqtw", ["--data-path=DATA", "--tcp-address=127.0.0.1:0", "--http-address=127.0.0.1:0"], b"  V2"),
    ("nsqlookupd", "nsqlookupd", ["--tcp-address=127.0.0.1:0", "--http-address=127.0.0.1:0"],
     "nsqtw-lookupd", ["--tcp-address=127.0.0.1:0", "--http-address=127.0.0.1:0"], b"  V1"),
    ("nsqadmin", "nsqadmin", ["--http-address=127.0.0.1:0", "--nsqd-http-address=127.0.0.1:1"],
     "nsqtw-admin", ["--http-address=127.0.0.1:0", "--nsqd-http-address=127.0.0.1:1"], None),
)


def idle_rss(name: str, cmd: list[str], magic: bytes | None, settle: float) -> float:
    """Start daemon ``name`` from ``cmd`` (its flags may name DATA), serve one /ping and one TCP client,
    settle; its RSS."""
    data = tempfile.mkdtemp(prefix="idle_rss.")
    try:
        proc, found = start_daemon([arg.replace("DATA", data) for arg in cmd], data, ENV,
                                   listeners=("TCP", "HTTP") if magic else ("HTTP",))
        try:
            with urllib.request.urlopen(f"http://{found['HTTP']}/ping", timeout=10) as r:
                r.read()
            if magic:
                host, port = found["TCP"].rsplit(":", 1)
                with socket.create_connection((host, int(port)), timeout=10) as s:
                    s.sendall(magic)
                    time.sleep(0.2)
            time.sleep(settle)
            return rss_bytes(proc.pid) / 1e6
        finally:
            stop_daemons((name, proc))
    finally:
        shutil.rmtree(data, ignore_errors=True)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--go-bin", default=None,
                   help="where Go's nsqd, nsqlookupd and nsqadmin are (default: none, nsqtw's daemons alone)")
    p.add_argument("--settle", type=float, default=2.0, help="seconds between the last request and the reading")
    args = p.parse_args(argv)
    floor = twistd_floor_rss(ENV) / 1e6
    print(f"{'daemon':<12} {'Go':>8} {'nsqtw':>8}")
    for name, go, go_flags, plugin, flags, magic in DAEMONS:
        go_path = os.path.join(args.go_bin, go) if args.go_bin else ""
        go_mb = (idle_rss(f"Go {go}", [go_path, *go_flags], magic, args.settle)
                 if go_path and os.access(go_path, os.X_OK) else None)
        ours = idle_rss(plugin, [sys.executable, "-c", TWISTD, "--pidfile=", "-n", plugin, *flags], magic, args.settle)
        print(f"{name:<12} {'—' if go_mb is None else f'{go_mb:.1f}':>8} {ours:>8.1f}")
    print(f"{'twistd floor':<12} {'':>8} {floor:>8.1f}")


if __name__ == "__main__":
    main()
