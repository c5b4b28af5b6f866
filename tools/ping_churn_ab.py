"""``/ping`` connect/request/close cycles against nsqtw with and without the direct route, A/B.

Usage: python tools/ping_churn_ab.py [CYCLES] [ROUNDS]   (default 3000 × 2)

Each round starts a fresh daemon with ``HTTPAPI.direct_routes`` emptied (every ``/ping`` through
Klein), then a fresh one as shipped, and prints the cycles per second of one Python client.
docs/performance.md quotes it.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from tests.attacks import _connect  # noqa: E402
from tests.daemon import TWISTD, Daemon  # noqa: E402

THROUGH_KLEIN = "import nsqtw.nsqd.http as _h; _h.HTTPAPI.direct_routes = {}\n"


def rate(d: Daemon, cycles: int) -> int:
    started = time.monotonic()
    for _ in range(cycles):
        s = _connect(d.http_address)
        s.sendall(b"GET /ping HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        while s.recv(65536):
            pass
        s.close()
    return round(cycles / (time.monotonic() - started))


def main() -> None:
    cycles = int(sys.argv[1]) if len(sys.argv) > 1 else 3000
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 2
    for n in range(rounds):
        for label, code in (("through Klein", THROUGH_KLEIN + TWISTD), ("direct", TWISTD)):
            with tempfile.TemporaryDirectory() as data:
                d = Daemon(data, code=code).start(timeout=60)
                try:
                    time.sleep(1)
                    print(f"round {n + 1} {label:<14} {rate(d, cycles)} cycles/s", flush=True)
                finally:
                    d.stop()


if __name__ == "__main__":
    main()
