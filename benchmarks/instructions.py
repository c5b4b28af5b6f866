"""Instructions a publish and a consumed message cost, counted by valgrind: an A/B that noise cannot move.

Usage: python benchmarks/instructions.py TREE [TREE ...]   (needs valgrind; WHAT in the environment)

A shared machine moves timings by tens of percent from one minute to the
next; the number of instructions a command costs does not move. For each
tree (a checkout, with its compiled build if it has one) this runs
``pub_cpu.py``'s in-process publish twice under ``valgrind --tool=callgrind``,
with few and with more commands, and prints the difference per command
(per message for ``mpub200``), so start-up and imports cancel out.

``WHAT`` (default ``pub,mpub1disk,mpub200disk``), comma-separated:
``pub``, ``mpub1``, ``mpub200``, each optionally with ``disk`` (a real disk
queue, as ``DISK=1`` gives ``pub_cpu.py``) and then ``repl`` (the owner's
side of ``--replicas=2`` too, as ``REPLICAS=2`` gives it), and ``read`` or ``readdisk``:
``read_cpu.py``'s consume path (a backlog of 20,000, then of 60,000
messages, read by one consumer that FINs them all), per message. Instructions are not time (a
cache miss costs more than an add) but two builds of the same code that
differ by a tenth in instructions differ in time the same way, while a
timed A/B on a loaded two-core machine cannot show a tenth.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))

#: (commands in the short run, in the long run, messages per command); for ``read``, messages
SIZES = {"pub": (200, 1200, 1), "mpub1": (200, 1200, 1), "mpub200": (10, 60, 200), "read": (20_000, 60_000, 1)}

_CHILD = """
import os, sys, tempfile
sys.path.insert(0, os.path.dirname(sys.argv[1]))  # this script's folder: pub_cpu.py, read_cpu.py
import pub_cpu as pc
from nsqtw.heap import keep_long_lived_old
keep_long_lived_old()
what, n = sys.argv[2], int(sys.argv[3])
with tempfile.TemporaryDirectory() as d:
    if what.startswith("read"):
        import read_cpu
        read_cpu.BACKLOG = n
        read_cpu.run(d if what.endswith("disk") else None)
    else:
        replicas = 2 if what.endswith("repl") else 1
        what = what.removesuffix("repl")
        command, per = {"pub": (pc.PUB, 1), "mpub1": (pc.MPUB_OF_ONE, 1), "mpub200": (pc.MPUB_OF_200, 200)}[
            what.removesuffix("disk")]
        pc.run(command, n, d if what.endswith("disk") else None, per, replicas)
"""


def instructions(tree: str, what: str, commands: int) -> int:
    """Instructions valgrind counts for a whole run of ``commands`` commands of ``tree``'s code."""
    with tempfile.TemporaryDirectory() as scratch:
        child = os.path.join(scratch, "child.py")
        with open(child, "w") as f:
            f.write(_CHILD)
        # one hash seed for every run: the dicts and sets of IDs then probe alike in both trees
        env = dict(os.environ, PYTHONPATH=os.path.abspath(tree))
        env.setdefault("PYTHONHASHSEED", "0")
        done = subprocess.run(
            ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", sys.executable, child,
             os.path.join(HERE, "pub_cpu.py"), what, str(commands)],
            env=env, capture_output=True, text=True, check=False)
    found = re.search(r"Collected : (\d+)", done.stderr)
    if done.returncode != 0 or found is None:
        raise SystemExit(f"{tree} {what}: the run failed:\n{done.stderr[-2000:]}")
    return int(found.group(1))


def main() -> None:
    trees = sys.argv[1:]
    if not trees:
        raise SystemExit(__doc__)
    for what in os.environ.get("WHAT", "pub,mpub1disk,mpub200disk").split(","):
        few, more, per = SIZES[what.removesuffix("repl").removesuffix("disk")]
        for tree in trees:
            spent = instructions(tree, what, more) - instructions(tree, what, few)
            unit = "a message" if per > 1 or what.startswith("read") else "a command"
            print(f"{tree}: {what}: {spent / ((more - few) * per):,.0f} instructions {unit}")


if __name__ == "__main__":
    main()
