"""Record Go nsqd v1.3.0's answers to the hostile cases of tests/hostile.py.

Usage: python benchmarks/record_hostile_reference.py PATH/TO/GO/nsqd
(required). Starts Go nsqd on loopback ports 0 with
a TLS certificate made by tests/certs.py, runs every case and writes
tests/reference/nsqd-1.3.0-hostile.json. The tests never need Go nsqd: they
read the recording.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from tests.certs import make_certs  # noqa: E402
from tests.hostile import Target, run_all  # noqa: E402

#: the flags both daemons run the cases with
FLAGS = ["--broadcast-address=127.0.0.1", "--msg-timeout=2s"]
OUT = os.path.join(ROOT, "tests", "reference", "nsqd-1.3.0-hostile.json")


def main() -> None:
    if len(sys.argv) != 2:
        raise SystemExit(__doc__.split("\n\n")[1])
    nsqd = sys.argv[1]
    with tempfile.TemporaryDirectory() as tmp:
        certs = make_certs(tmp)
        proc = subprocess.Popen([nsqd, f"--data-path={tmp}", "--tcp-address=127.0.0.1:0",
                                 "--http-address=127.0.0.1:0", "--https-address=127.0.0.1:0",
                                 f"--tls-cert={certs.server_cert}", f"--tls-key={certs.server_key}",
                                 *FLAGS], stderr=subprocess.PIPE, text=True)
        found: dict[str, str] = {}
        assert proc.stderr is not None
        while len(found) < 3:
            line = proc.stderr.readline()
            m = re.search(r"(TCP|HTTP|HTTPS): listening on (\S+)", line)
            if m:
                found[m.group(1)] = m.group(2)
        try:
            time.sleep(0.2)
            answers = run_all(Target(found["TCP"], found["HTTP"], found["HTTPS"]))
        finally:
            proc.terminate()
            proc.wait()
    version = subprocess.run([nsqd, "--version"], capture_output=True, text=True).stdout.strip()
    with open(OUT, "w") as f:
        json.dump({"about": f"Answers of {version} to tests/hostile.py's cases, flags {FLAGS}, "
                            "recorded on loopback by benchmarks/record_hostile_reference.py.",
                   "cases": answers}, f, indent=1, ensure_ascii=False)
        f.write("\n")
    print(json.dumps(answers, indent=1, ensure_ascii=False)[:20000])


if __name__ == "__main__":
    main()
