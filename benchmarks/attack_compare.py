"""Run tests/attacks.py's hostile loads against Go nsqd and nsqtw, side by side, and print a table.

Usage: python benchmarks/attack_compare.py [--churn-cycles=N] [--only=churn|slices|lookupd] PATH/TO/GO/nsqd
(the Go nsqd is required; 9,000 churn cycles; every attack)

``--only=slices`` runs the loads one request or peer could once hold the
reactor with (a 5 MB ``/mpub`` of one-byte lines, 20,000 pipelined
``/ping``s, a REQ storm); ``--only=lookupd`` the REGISTER flood against Go
nsqlookupd and nsqtw-lookupd (the ``nsqlookupd`` next to Go's nsqd), with a
bystander asking ``/lookup`` in a loop.

Each daemon is started fresh on loopback with default flags; the attacks run
in the same order against each, with the same client and a bystander
(one PUB at a time, round trips timed; a 1 s-heartbeat consumer). The
figures in docs/reliability.md's "Hostile clients" table come from here.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from nsqtw.tools.daemons import start_listening, stop_daemons  # noqa: E402
from tests import attacks  # noqa: E402
from tests.daemon import Daemon, LookupdDaemon  # noqa: E402


def start_go(binary: str, data: str) -> tuple[subprocess.Popen[str], str, str]:
    return start_listening([binary, f"--data-path={data}", "--tcp-address=127.0.0.1:0",
                            "--http-address=127.0.0.1:0"], data)


def run(tcp: str, http: str, churn_cycles: int = 9000, only: str = "") -> dict[str, str]:
    out: dict[str, str] = {}
    loads: list[tuple[str, Any]] = [
        # first: the flood leaves the disk busy for a while, which would slow nsqtw's accepts
        (f"{churn_cycles:,} connect/close cycles", lambda: attacks.churn(tcp, http, churn_cycles)),
        ("deflate bomb (64 KB -> 64 MB of NOP)", lambda: attacks.deflate_bomb(tcp, 64 << 20, 5)),
        ("10 publishers flooding tiny MPUBs", lambda: attacks.mpub_flood(tcp, 10, 5)),
        ("endless chunked POST /pub", lambda: attacks.endless_chunked(http, 5)),
        # last: Go then dials the 20,000 addresses, one after another, for minutes
        ("PUT 20,000 lookupd addresses", lambda: attacks.huge_config(http, 20000)),
    ]
    if only == "churn":
        loads = loads[:1]
    elif only == "slices":
        attacks.warm_up(http)  # nsqtw imports its HTTP router at the first routed request
        loads = [
            ("POST /mpub of 5 MB of one-byte lines", lambda: attacks.http_mpub_lines(http)),
            # the hard-working clients in processes of their own, away from the bystander's GIL
            ("20,000 pipelined GET /ping", lambda: attacks.in_process("pipelined_pings", http, 20_000)),
            ("REQ storm: RDY 2500, 2,500 messages REQ'd with timeout 0 for 15 s",
             lambda: attacks.in_process("req_storm", tcp, 15)),
        ]
    for name, attack in loads:
        with attacks.Bystander(tcp) as watch:
            result = attack()
        out[name] = f"{result}; {watch.summary()}"
        print(name, out[name], flush=True)
    return out


def run_lookupd(tcp: str, http: str, count: int = 100_000) -> dict[str, str]:
    with attacks.LookupBystander(http) as watch:
        result = attacks.in_process("register_flood", tcp, count)
    name = f"{count:,} REGISTERs on one V1 connection"
    out = {name: f"{result}; {watch.summary()}"}
    print(name, out[name], flush=True)
    return out


def compare_lookupd(go: str, tmp: str) -> tuple[dict[str, str], dict[str, str]]:
    """The REGISTER flood against Go nsqlookupd, then nsqtw-lookupd."""
    proc, tcp, http = start_listening([go, "--tcp-address=127.0.0.1:0", "--http-address=127.0.0.1:0"], tmp)
    try:
        time.sleep(0.3)
        print("== Go nsqlookupd", flush=True)
        go_results = run_lookupd(tcp, http)
    finally:
        stop_daemons(("Go nsqlookupd", proc))
    d = LookupdDaemon(tmp).start()
    try:
        time.sleep(0.3)
        print("== nsqtw-lookupd", flush=True)
        tw_results = run_lookupd(d.tcp_address, d.http_address)
    finally:
        d.stop()
    return go_results, tw_results


def main() -> None:
    args = sys.argv[1:]
    cycles = int(next((a.split("=", 1)[1] for a in args if a.startswith("--churn-cycles=")), 9000))
    only = next((a.split("=", 1)[1] for a in args if a.startswith("--only=")), "")
    rest = [a for a in args if not a.startswith("--")]
    if not rest:
        raise SystemExit(__doc__.split("\n\n")[1])
    go = os.path.abspath(rest[0])
    with tempfile.TemporaryDirectory() as tmp:
        if only == "lookupd":
            go_results, tw_results = compare_lookupd(os.path.join(os.path.dirname(go), "nsqlookupd"), tmp)
            print_table(go_results, tw_results)
            return
        os.makedirs(f"{tmp}/go")
        os.makedirs(f"{tmp}/tw")
        proc, tcp, http = start_go(go, f"{tmp}/go")
        try:
            time.sleep(0.3)
            print("== Go nsqd", flush=True)
            go_results = run(tcp, http, cycles, only)
        finally:
            stop_daemons(("Go nsqd", proc))
        d = Daemon(f"{tmp}/tw").start()
        try:
            time.sleep(0.3)  # as for Go: start-up work settles before the first attack
            print("== nsqtw", flush=True)
            tw_results = run(d.tcp_address, d.http_address, cycles, only)
        finally:
            d.stop()
    print_table(go_results, tw_results)


def print_table(go_results: dict[str, str], tw_results: dict[str, str]) -> None:
    print("\n| attack | Go v1.3.0 | nsqtw |\n| --- | --- | --- |")
    for name in go_results:
        print(f"| {name} | {go_results[name]} | {tw_results[name]} |")


if __name__ == "__main__":
    main()
