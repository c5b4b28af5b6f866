"""The example pipeline (examples/spark/nsq_to_parquet.py) under spark-submit: killed, stopped, restarted.

The driver runs in its own spark-submit process group, as a deployed
pipeline would, so the test can SIGKILL all of it (JVM, Python driver, the
stream source process holding the NSQ connections) in the middle of the
stream and start it again from its checkpoint.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

from tests.daemon import ROOT, Daemon
from tests.helpers import wait_for
from tests.integration.test_spark_client import channel_stats, publish

EXAMPLE = os.path.join(ROOT, "examples", "spark", "nsq_to_parquet.py")
#: messages published before the first run
N = 20000
#: the pipeline's max_in_flight: at most this many messages are held unFINed at any time
WINDOW = 1000


def spark_submit() -> str:
    import pyspark

    return os.path.join(os.path.dirname(pyspark.__file__), "bin", "spark-submit")


class Pipeline:
    """One spark-submit run of the example, its output in a log file."""

    def __init__(self, nsqd: Daemon, work: Path, run: int) -> None:
        self.log = work / f"run{run}.log"
        env = dict(os.environ, PYSPARK_PYTHON=sys.executable, PYSPARK_DRIVER_PYTHON=sys.executable,
                   PYTHONPATH=os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH")) if p))
        cmd = [spark_submit(), "--master", "local[2]", "--conf", "spark.ui.enabled=false",
               "--conf", "spark.driver.host=127.0.0.1", "--conf", "spark.driver.bindAddress=127.0.0.1",
               EXAMPLE, "--nsqd-tcp-address", nsqd.tcp_address, "--topic", "events", "--channel", "archive",
               "--output", str(work / "out"), "--checkpoint", str(work / "checkpoint"),
               "--trigger", "500 milliseconds", "--option", f"max_in_flight={WINDOW}"]
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env,
                                         start_new_session=True)

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def driver_pid(self) -> int:
        m = wait_for(lambda: re.search(r"driver pid (\d+)", self.output()), timeout=120,
                     what="the driver to start")
        return int(m.group(1))

    def kill(self) -> None:
        """SIGKILL the whole spark-submit process group at once."""
        os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(30)

    def stop(self) -> int:
        """A clean stop: SIGTERM to the Python driver, which stops the query between batches."""
        os.kill(self.driver_pid(), signal.SIGTERM)
        return self.proc.wait(120)

    def cleanup(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(30)


def done(nsqd: Daemon) -> int:
    """Messages the pipeline has FINed (so Spark had committed their batch)."""
    s = channel_stats(nsqd, "events", "archive")
    if not s:
        return 0
    return int(s["message_count"] - s["depth"] - s["in_flight_count"] - s["deferred_count"])


def written_not_committed(work: Path) -> int | None:
    """A batch the Parquet sink has logged but Spark has not yet marked committed, if any."""
    logged = work / "out" / "_spark_metadata"
    commits = work / "checkpoint" / "commits"
    if not logged.is_dir() or not commits.is_dir():
        return None
    batches = {int(n.split(".")[0]) for n in os.listdir(logged) if n.split(".")[0].isdigit()}
    done = {int(n) for n in os.listdir(commits) if n.isdigit()}
    pending = batches - done
    return max(pending) if pending else None


def archived(spark: Any, work: Path) -> list[bytes]:
    """The bodies in the Parquet sink: only files its log lists (committed batches)."""
    return [bytes(r.body) for r in spark.read.parquet(str(work / "out")).select("body").collect()]


def duplicates(bodies: list[bytes]) -> int:
    return sum(n - 1 for n in Counter(bodies).values())


def test_kill_stop_restart_accounting(spark: Any, nsqd: Daemon, tmp_path: Path) -> None:
    """SIGKILL mid-stream, restart, clean stop, restart: nothing lost, duplicates only from the kill.

    After the kill, the duplicates (messages Spark wrote whose FIN never
    reached nsqd) are at most the in-flight window; the clean stop and
    restart add none.
    """
    sent = [b"k%06d" % i for i in range(N)]
    for i in range(0, N, 5000):
        publish(nsqd, "events", sent[i:i + 5000])
    runs: list[Pipeline] = []
    try:
        runs.append(Pipeline(nsqd, tmp_path, 1))
        wait_for(lambda: done(nsqd) >= N // 4, timeout=180, what="a quarter archived")
        # the worst moment: a batch is in the sink's log, Spark has not committed it, so a
        # restart replays it and the sink skips it while nsqd delivers its messages again
        deadline = time.monotonic() + 30
        caught = None
        while caught is None and time.monotonic() < deadline:
            caught = written_not_committed(tmp_path)
            time.sleep(0.002)
        runs[-1].kill()
        if caught is not None and (tmp_path / "checkpoint" / "commits" / str(caught)).exists():
            caught = None  # Spark committed it before the kill landed
        wait_for(lambda: channel_stats(nsqd, "events", "archive")["client_count"] == 0,
                 what="the killed consumer's connections to close")

        runs.append(Pipeline(nsqd, tmp_path, 2))
        wait_for(lambda: done(nsqd) >= N // 2, timeout=180, what="half archived")
        assert runs[-1].stop() == 0, runs[-1].output()
        assert "nsq_to_parquet: stopped" in runs[-1].output()
        first = archived(spark, tmp_path)

        runs.append(Pipeline(nsqd, tmp_path, 3))
        wait_for(lambda: done(nsqd) == N, timeout=180, what="everything archived")
        assert runs[-1].stop() == 0, runs[-1].output()
        final = archived(spark, tmp_path)
    except BaseException:
        for r in runs:
            sys.stderr.write(f"--- {r.log.name}\n{r.output()[-4000:]}\n")
        raise
    finally:
        for r in runs:
            r.cleanup()

    lost = set(sent) - set(final)
    after_kill_dups = duplicates(first)
    clean_dups = duplicates(final) - after_kill_dups
    moment = f"batch {caught} written, not committed" if caught is not None else "not inside a sink commit"
    print(f"\nSIGKILL ({moment}): {after_kill_dups} duplicates "
          f"(window {WINDOW}); clean stop and restart: {clean_dups} duplicates; lost {len(lost)}")
    assert not lost
    assert set(final) <= set(sent)
    assert after_kill_dups <= WINDOW
    assert clean_dups == 0
    s = channel_stats(nsqd, "events", "archive")
    assert (s["depth"], s["in_flight_count"], s["client_count"]) == (0, 0, 0)
