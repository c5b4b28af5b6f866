#!/usr/bin/env python
"""Record Go nsqadmin v1.3.0's answers for tests/integration/test_admin_api.py.

Starts Go nsqlookupd, two Go nsqd and three Go nsqadmin (over the lookupd;
over the lookupd and a dead one with --admin-user; over nsqd directly with a
dead node and --base-path) from ``--bin`` on free loopback ports,
runs the scenario of tests/admin_reference.py and writes its normalised
answers to tests/reference/admin/responses.json.

    python benchmarks/record_admin_reference.py --bin DIR [--check-nsqtw]

With ``--check-nsqtw`` it records nothing: it runs the scenario once more
over a fresh Go cluster with nsqtw-admin in front instead of Go nsqadmin
and compares the answers with the recording (nsqtw-admin against Go nsqd
and nsqlookupd), printing each difference; exit status 1 if any.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from tests.admin_reference import (  # noqa: E402
    REFERENCE,
    Cluster,
    free_port,
    http,
    loosen,
    run,
    setup,
    teardown,
)

TWISTD = "import sys; from twisted.scripts.twistd import run; sys.argv[0] = 'twistd'; run()"


def _wait_ping(address: str, timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if http("GET", f"http://{address}/ping", timeout=1)[0] == 200:
                return
        except OSError:
            pass
        time.sleep(0.05)
    raise RuntimeError(f"nothing answers on {address}")


def scenario(b: str, nsqtw_admin: bool) -> list[dict[str, object]]:
    """Go nsqlookupd and two Go nsqd, three admins (Go's or nsqtw's), the scenario's answers."""
    loop = "127.0.0.1"
    ports = {name: free_port() for name in
             ("lt", "lh", "at", "ah", "bt", "bh", "admin", "acl", "nsqd", "dead")}
    addr = {k: f"{loop}:{v}" for k, v in ports.items()}
    procs: list[subprocess.Popen[bytes]] = []
    with tempfile.TemporaryDirectory() as tmp:
        def start(*cmd: str) -> None:
            log = open(os.path.join(tmp, f"{len(procs)}.log"), "wb")
            env = dict(os.environ, PYTHONPATH=ROOT)
            procs.append(subprocess.Popen(list(cmd), cwd=tmp, stdout=log, stderr=log, env=env))

        def admin(*flags: str) -> None:
            if nsqtw_admin:
                start(sys.executable, "-c", TWISTD, "--pidfile=", "-n", "nsqtw-admin", *flags)
            else:
                start(f"{b}/nsqadmin", *flags)

        try:
            start(f"{b}/nsqlookupd", f"--tcp-address={addr['lt']}", f"--http-address={addr['lh']}",
                  f"--broadcast-address={loop}")
            for node in ("a", "b"):
                os.makedirs(os.path.join(tmp, node))
                start(f"{b}/nsqd", f"--data-path={os.path.join(tmp, node)}",
                      f"--tcp-address={addr[node + 't']}", f"--http-address={addr[node + 'h']}",
                      f"--lookupd-tcp-address={addr['lt']}", f"--broadcast-address={loop}")
            admin(f"--http-address={addr['admin']}", f"--lookupd-http-address={addr['lh']}")
            admin(f"--http-address={addr['acl']}", f"--lookupd-http-address={addr['lh']}",
                  f"--lookupd-http-address={addr['dead']}", "--admin-user=alice")
            admin(f"--http-address={addr['nsqd']}", f"--nsqd-http-address={addr['ah']}",
                  f"--nsqd-http-address={addr['dead']}", "--base-path=/adm")
            for key in ("lh", "ah", "bh", "admin", "acl"):
                _wait_ping(addr[key], 30)
            _wait_ping(addr["nsqd"] + "/adm", 30)
            cluster = Cluster(addr["lh"], addr["lt"], addr["ah"], addr["at"], addr["bh"], addr["bt"],
                              addr["admin"], addr["acl"], addr["nsqd"], addr["dead"])
            setup(cluster)
            answers = run(cluster)
            teardown(cluster)
        finally:
            for p in reversed(procs):
                p.terminate()
            for p in procs:
                p.wait(10)
    return answers


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bin", required=True, help="folder of the Go NSQ v1.3.0 binaries")
    parser.add_argument("--check-nsqtw", action="store_true",
                        help="compare nsqtw-admin over Go nsqd/nsqlookupd with the recording")
    args = parser.parse_args()
    b = os.path.abspath(args.bin)
    out = os.path.join(ROOT, "tests", "reference", REFERENCE)
    if args.check_nsqtw:
        with open(out) as f:
            recorded = json.load(f)["answers"]
        ours = scenario(b, nsqtw_admin=True)
        differ = 0
        for want, got in zip(recorded, ours, strict=True):
            keys = ("status", "content_type")
            if any(want[k] != got[k] for k in keys) or json.dumps(loosen(want["name"], want["body"])) \
                    != json.dumps(loosen(got["name"], got["body"])):
                differ += 1
                print(f"DIFFERS: {want['name']}\n  Go:    {want['status']} {json.dumps(want['body'])[:400]}"
                      f"\n  nsqtw: {got['status']} {json.dumps(got['body'])[:400]}")
        print(f"{len(recorded) - differ} of {len(recorded)} answers of nsqtw-admin over Go nsqd and"
              " nsqlookupd match Go nsqadmin's")
        raise SystemExit(1 if differ else 0)
    answers = scenario(b, nsqtw_admin=False)
    os.makedirs(os.path.dirname(out), exist_ok=True)
    with open(out, "w") as f:
        json.dump({"recorded_with": "Go nsqlookupd, nsqd and nsqadmin v1.3.0 (benchmarks/record_admin_reference.py)",
                   "answers": answers}, f, indent=1)
        f.write("\n")
    print(f"wrote {len(answers)} answers to {out}")


if __name__ == "__main__":
    main()
