"""What ``--workers=0`` (the default) means on this machine: the worker count chosen from its CPUs."""

from __future__ import annotations

import os
from dataclasses import replace

from nsqtw.nsqd.options import NSQDOptions

__all__ = ["AUTO_WORKERS", "auto_workers", "usable_cpus", "with_workers_resolved"]

#: ``--workers=0``, the default: the count is :func:`auto_workers` of the CPUs this process may use
AUTO_WORKERS = 0


def auto_workers(cpus: int) -> int:
    """What ``--workers=0`` means on ``cpus`` CPUs: 1 below 8, else half of them, at most 8.

    Chosen by measurement beside Go nsqd on the same machine
    (docs/performance.md): on 2 cores one process is ahead of Go on every
    load and a second process only costs; on 16 cores one process answers
    a fifth of Go's one-message round trips and 8 workers about twice
    Go's, while 15 fall back (the core and the clients need cores too).
    Machines between and beyond were not measured; the rule stays on the
    safe side of both.
    """
    return 1 if cpus < 8 else min(8, cpus // 2)


def usable_cpus() -> int:
    """The CPUs this process may run on (its affinity mask, as ``taskset`` and cgroups cpusets set it)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def with_workers_resolved(opts: NSQDOptions, cpus: int) -> NSQDOptions:
    """``opts`` with ``--workers=0`` replaced by the count :func:`auto_workers` chooses for ``cpus``
    (:func:`usable_cpus`, which the service reads once and logs)."""
    if opts.workers != AUTO_WORKERS:
        return opts
    return replace(opts, workers=auto_workers(cpus))
