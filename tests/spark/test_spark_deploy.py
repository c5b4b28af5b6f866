"""The nsq source and sink where users deploy Spark: a standalone cluster (a master, two workers,
executors in their own JVMs and Python workers, one worker killed mid-query) and a Spark Connect
server, each started from the pyspark install (tests/spark/servers.py).

The driver is tests/spark/deploy_driver.py (its docstring says what it runs): a batch write, then
a streaming read into a JSON file sink with a checkpoint and a streaming write to another topic.
The file sink must hold every message exactly once; on the cluster although a worker, with its
executor, was killed with -9 while the queries ran (Spark runs lost tasks again on the other
worker from the same input partitions, and the sink's log lists only committed batches' files).
"""

from __future__ import annotations

import os
import subprocess
import sys
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.daemon import ROOT, Daemon
from tests.helpers import wait_for
from tests.integration.test_spark_client import channel_stats, publish, topic_stats
from tests.spark.conftest import _java
from tests.spark.servers import ConnectServer, StandaloneCluster

BATCH_ROWS = 4000
STREAMED = 6000
TIMEOUT = 300


def pythonpath() -> str:
    """This checkout first: Spark's Python workers and the driver import its nsqtw."""
    return os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH")) if p)


def needs_java() -> None:
    if _java() is None:
        pytest.skip("Java is not installed: Spark needs a JVM (JDK 17+)")


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[StandaloneCluster]:
    needs_java()
    c = StandaloneCluster(tmp_path / "spark", pythonpath())
    try:
        c.start_master()
        c.start_worker()
        c.start_worker()
        yield c
    finally:
        c.stop()


@pytest.fixture
def connect_server(tmp_path: Path) -> Iterator[ConnectServer]:
    needs_java()
    s = ConnectServer(tmp_path / "spark", pythonpath())
    try:
        s.start()
        yield s
    finally:
        s.stop()


def finished(nsqd: Daemon, channel: str) -> int:
    """Messages of ``ev`` the channel's reader FINed (after Spark committed their batch)."""
    s: dict[str, Any] = channel_stats(nsqd, "ev", channel)
    return int(s["message_count"]) - int(s["depth"]) - int(s["in_flight_count"]) if s else 0


def run_driver(url: str, nsqd: Daemon, work: Path, while_running: Callable[[], None]) -> list[bytes]:
    """Run deploy_driver.py against ``url``; ``while_running`` once both queries run. The file
    sink's rows once both queries committed every message."""
    work.mkdir()
    # both channels before the batch write, so that each gets all of it
    for path in ("topic/create?topic=ev", "channel/create?topic=ev&channel=archive",
                 "channel/create?topic=ev&channel=copy"):
        with urllib.request.urlopen(f"http://{nsqd.http_address}/{path}", data=b"", timeout=10) as r:
            assert r.status == 200
    env = dict(os.environ, PYTHONPATH=pythonpath(), PYSPARK_PYTHON=sys.executable,
               PYSPARK_DRIVER_PYTHON=sys.executable)
    log_path = work / "driver.log"
    with open(log_path, "wb") as log:
        driver = subprocess.Popen([sys.executable, str(Path(__file__).parent / "deploy_driver.py"), url,
                                   nsqd.tcp_address, str(work), str(BATCH_ROWS)],
                                  stdout=log, stderr=subprocess.STDOUT, env=env)

    def said(word: str) -> bool:
        text = log_path.read_text(errors="replace")
        if driver.poll() is not None and word not in text.split():
            raise AssertionError(f"the driver exited ({driver.returncode}):\n{text[-4000:]}")
        return word in text.split()

    try:
        wait_for(lambda: said("running"), timeout=TIMEOUT, what="the driver's two queries")
        # the batch write ran on Spark's side: every row is in the topic
        assert topic_stats(nsqd, "ev")["message_count"] == BATCH_ROWS
        while_running()
        total = BATCH_ROWS + STREAMED
        wait_for(lambda: finished(nsqd, "archive") == total and finished(nsqd, "copy") == total,
                 timeout=TIMEOUT, what="both queries to commit every message")
        (work / "stop").touch()
        wait_for(lambda: said("done"), timeout=TIMEOUT, what="the driver to stop its queries")
        assert driver.wait(TIMEOUT) == 0
    finally:
        if driver.poll() is None:
            driver.kill()
            driver.wait()
    archive = channel_stats(nsqd, "ev", "archive")
    assert (archive["depth"], archive["in_flight_count"]) == (0, 0)
    # the nsq sink publishes at least once (Spark may run a lost task's publish again)
    assert topic_stats(nsqd, "ev_copy")["message_count"] >= total
    return sorted(line.encode() for line in (work / "result").read_text().splitlines())


def expected(streamed: list[bytes]) -> list[bytes]:
    return sorted([b"b%05d" % i for i in range(BATCH_ROWS)] + streamed)


def test_a_standalone_cluster_with_a_worker_killed_mid_query(
        cluster: StandaloneCluster, nsqd: Daemon, tmp_path: Path) -> None:
    streamed = [b"s%05d" % i for i in range(STREAMED)]

    def lose_a_worker() -> None:
        publish(nsqd, "ev", streamed[:2000])
        # a batch was committed (its messages FINed): the queries run on the executors; now lose one
        wait_for(lambda: finished(nsqd, "archive") > 0, timeout=TIMEOUT, what="a first committed batch")
        cluster.kill(cluster.workers[0])
        for i in range(2000, STREAMED, 1000):
            publish(nsqd, "ev", streamed[i:i + 1000])

    assert run_driver(cluster.url, nsqd, tmp_path / "driver", lose_a_worker) == expected(streamed)


def test_spark_connect(connect_server: ConnectServer, nsqd: Daemon, tmp_path: Path) -> None:
    """``spark.dataSource.register(NSQDataSource)`` from a Spark Connect client: the same batch write,
    streaming read and streaming write, run by the server."""
    streamed = [b"c%05d" % i for i in range(STREAMED)]

    def publish_more() -> None:
        for i in range(0, STREAMED, 1000):
            publish(nsqd, "ev", streamed[i:i + 1000])

    assert run_driver(connect_server.url, nsqd, tmp_path / "driver", publish_more) == expected(streamed)
