"""``--workers``: the workers share the core's memory (forked from it loaded, its heap frozen).

An idle ``--workers=4`` node's PSS, summed over its processes (core, fork
server, four workers), stays within one process's PSS plus 10 MB a worker
(measured on 2 cores: 61 MB against 32 MB, where workers that were
interpreters of their own made 159 MB). The figures and the command that
measures them: ``benchmarks/workers_pss.py``, docs/configuration.md.
"""

from __future__ import annotations

import importlib.util
import os

from tests.daemon import ROOT

_spec = importlib.util.spec_from_file_location("workers_pss", os.path.join(ROOT, "benchmarks", "workers_pss.py"))
assert _spec is not None and _spec.loader is not None
workers_pss = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(workers_pss)

#: what each worker may add to one process's PSS, idle
PER_WORKER_MB = 10


def test_an_idle_node_of_four_workers_costs_at_most_10_mb_a_worker() -> None:
    """Idle PSS of --workers=4 (all six processes) <= idle PSS of one process + 4 x 10 MB."""
    one = workers_pss.measure(1, idle=1.0, traffic=False)
    four = workers_pss.measure(4, idle=1.0, traffic=False)
    assert four["processes"] == 6, four
    assert four["idle_mb"] <= one["idle_mb"] + 4 * PER_WORKER_MB, (one, four)
