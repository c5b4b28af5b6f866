"""Record what Go's NSQ command-line tools do in the scenarios of tests/toolcases.py.

Runs each scenario with the Go v1.3.0 binaries (nsqd and the tool, from
``--bin`` or ``$NSQ_BIN``, one of which is required) and writes tests/reference/tools/<scenario>.json.
tests/integration/test_tools_live.py runs the same scenarios with nsqtw and
compares. Needs the Go binaries; the tests do not.

    python benchmarks/record_tools_reference.py --bin DIR [scenario ...]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from tests.daemon import Daemon  # noqa: E402
from tests.toolcases import REFERENCE, SCENARIOS, Env, help_tables  # noqa: E402


class GoNSQD(Daemon):
    """Go's nsqd, started and read like nsqtw's (it logs the same ``TCP: listening on`` lines)."""

    bin_dir = ""  #: set from --bin

    def command(self, tcp: str, http: str) -> list[str]:
        return [os.path.join(self.bin_dir, "nsqd"), f"--tcp-address={tcp}", f"--http-address={http}",
                f"--data-path={self.data_path}", *self.args]


def record(name: str, bin_dir: str) -> dict:
    started: list[GoNSQD] = []
    with tempfile.TemporaryDirectory() as tmp:
        def start_nsqd() -> GoNSQD:
            path = os.path.join(tmp, f"nsqd{len(started)}")
            os.makedirs(path)
            d = GoNSQD(path)
            d.bin_dir = bin_dir
            started.append(d)
            return d.start()  # type: ignore[return-value]

        env = Env(tool=lambda tool: [os.path.join(bin_dir, tool)], start_nsqd=start_nsqd, tmp=tmp,
                  env=dict(os.environ))
        try:
            return SCENARIOS[name](env)
        finally:
            for d in started:
                d.stop()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bin", default=os.environ.get("NSQ_BIN"), required="NSQ_BIN" not in os.environ,
                        help="folder of the Go NSQ v1.3.0 binaries (default: $NSQ_BIN)")
    parser.add_argument("scenarios", nargs="*", default=sorted(SCENARIOS))
    args = parser.parse_args()
    os.makedirs(REFERENCE, exist_ok=True)
    bin_dir = os.path.abspath(args.bin)
    with open(os.path.join(REFERENCE, "flags.json"), "w") as f:
        json.dump(help_tables(lambda tool: [os.path.join(bin_dir, tool)], dict(os.environ)), f, indent=1)
        f.write("\n")
    for name in args.scenarios:
        result = record(name, bin_dir)
        result["recorded_with"] = "Go NSQ v1.3.0 (nsqd and the tool)"
        with open(os.path.join(REFERENCE, name + ".json"), "w") as f:
            json.dump(result, f, indent=1, sort_keys=True)
            f.write("\n")
        print(name, json.dumps(result)[:300])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
