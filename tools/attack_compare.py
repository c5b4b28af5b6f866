"""Run tests/attacks.py's hostile loads against Go nsqd and nsqtw, side by side, and print a table.

Usage: python tools/attack_compare.py [--churn-cycles=N] [--only=churn] [PATH/TO/GO/nsqd]
(default ../shared/anchor/bin/nsqd; 9,000 churn cycles; every attack)

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

from nsqtw.tools.daemons import start_listening  # noqa: E402
from tests.attacks import Bystander, churn, deflate_bomb, endless_chunked, huge_config, mpub_flood  # noqa: E402
from tests.daemon import Daemon  # noqa: E402


def start_go(binary: str, data: str) -> tuple[subprocess.Popen[str], str, str]:
    return start_listening([binary, f"--data-path={data}", "--tcp-address=127.0.0.1:0",
                            "--http-address=127.0.0.1:0"], data)


def run(tcp: str, http: str, churn_cycles: int = 9000, only: str = "") -> dict[str, str]:
    out: dict[str, str] = {}
    attacks: list[tuple[str, Any]] = [
        # first: the flood leaves the disk busy for a while, which would slow nsqtw's accepts
        (f"{churn_cycles:,} connect/close cycles", lambda: churn(tcp, http, churn_cycles)),
        ("deflate bomb (64 KB -> 64 MB of NOP)", lambda: deflate_bomb(tcp, 64 << 20, 5)),
        ("10 publishers flooding tiny MPUBs", lambda: mpub_flood(tcp, 10, 5)),
        ("endless chunked POST /pub", lambda: endless_chunked(http, 5)),
        # last: Go then dials the 20,000 addresses, one after another, for minutes
        ("PUT 20,000 lookupd addresses", lambda: huge_config(http, 20000)),
    ]
    if only == "churn":
        attacks = attacks[:1]
    for name, attack in attacks:
        with Bystander(tcp) as watch:
            result = attack()
        out[name] = f"{result}; {watch.summary()}"
        print(name, out[name], flush=True)
    return out


def main() -> None:
    args = sys.argv[1:]
    cycles = int(next((a.split("=", 1)[1] for a in args if a.startswith("--churn-cycles=")), 9000))
    only = next((a.split("=", 1)[1] for a in args if a.startswith("--only=")), "")
    rest = [a for a in args if not a.startswith("--")]
    go = os.path.abspath(rest[0]) if rest else os.path.join(ROOT, "..", "shared", "anchor", "bin", "nsqd")
    with tempfile.TemporaryDirectory() as tmp:
        os.makedirs(f"{tmp}/go")
        os.makedirs(f"{tmp}/tw")
        proc, tcp, http = start_go(go, f"{tmp}/go")
        try:
            time.sleep(0.3)
            print("== Go nsqd", flush=True)
            go_results = run(tcp, http, cycles, only)
        finally:
            proc.terminate()
            proc.wait()
        d = Daemon(f"{tmp}/tw").start()
        try:
            time.sleep(0.3)  # as for Go: start-up work settles before the first attack
            print("== nsqtw", flush=True)
            tw_results = run(d.tcp_address, d.http_address, cycles, only)
        finally:
            d.stop()
    print("\n| attack | Go nsqd v1.3.0 | nsqtw |\n| --- | --- | --- |")
    for name in go_results:
        print(f"| {name} | {go_results[name]} | {tw_results[name]} |")


if __name__ == "__main__":
    main()
