"""A Spark streaming query in a cluster under chaos (``nsqtw-bench chaos --spark``): its sink gets every
acknowledged message exactly once while its driver is killed and submitted again from its checkpoint.

The query is the example pipeline (examples/spark/nsq_to_parquet.py) under
spark-submit, reading through nsqlookupd from three ``--durable-delivery``
nodes into Spark's Parquet file sink. Its faults are the ones a driver lives
through: its own kill -9 (the whole spark-submit process group), a node
paused, nsqlookupd killed. (A node's kill -9 can hand a message of a batch
Spark committed to the query again, since its FIN died with the node; the
long runs in docs/reliability.md include those.)
"""

from __future__ import annotations

import os
from typing import Any

import pytest

from nsqtw.tools.chaos import render, run_chaos
from nsqtw.tools.chaos_spark import DEFAULT_APP
from nsqtw.tools.daemons import TWISTD, nsqtw_command
from tests.daemon import ROOT, Daemon


@pytest.fixture
def checkout_on_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """The cluster's processes (twistd, the consumer, spark-submit's Python) import this checkout's nsqtw."""
    monkeypatch.setenv("PYTHONPATH", ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))


@pytest.mark.usefixtures("checkout_on_path")
def test_the_sink_gets_every_acknowledged_message_once_across_driver_kills(spark: Any, tmp_path) -> None:
    lookupd = [Daemon.python, "-c", TWISTD, "--pidfile=", "-n", "nsqtw-lookupd"]
    outcome = run_chaos("nsqtw", nsqtw_command(), lookupd, ["--durable-delivery"], nodes=3, duration=45.0,
                        every=4.0, seed=2, kinds=("spark", "stop", "lookupd"), publishers=3, rate=300.0,
                        batch=2, drain_timeout=120.0, keep=str(tmp_path), spark_app=DEFAULT_APP)
    report = render([outcome])
    assert outcome.faults.get("spark", 0) >= 2, report
    assert outcome.drained and not outcome.problems, report
    assert outcome.acknowledged >= 5000 and outcome.lost == 0, report
    assert outcome.spark_submits >= outcome.faults["spark"] + 1, report
    assert outcome.spark_lost == 0, report
    assert outcome.spark_extra_copies == 0, report
    # a body is in the sink twice only where the cluster took it twice (a publisher's retry)
    assert outcome.spark_republished <= outcome.republished + outcome.retries, report
