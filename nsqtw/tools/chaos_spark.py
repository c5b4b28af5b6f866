"""The Spark side of ``nsqtw-bench chaos``: a streaming query submitted with spark-submit, killed and restarted.

The query is an application taking the arguments of
``examples/spark/nsq_to_parquet.py`` (the default, from a checkout): it reads
the topic's ``spark`` channel through nsqlookupd with the ``nsq`` source and
writes every message to Spark's Parquet file sink with a checkpoint. The
``spark`` fault SIGKILLs the whole spark-submit process group (the JVM and
the Python driver that holds the NSQ connections) and submits again from the
same checkpoint. At the end the driver is stopped cleanly and the sink is
read the way Spark reads it (only the files its log lists), in a process of
its own::

    python -m nsqtw.tools.chaos_spark OUTPUT RESULT   # one SEQ NODE/ID line per row into RESULT
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable

from nsqtw.tools.chaos_cluster import SPARK_CHANNEL, seq_of

__all__ = ["DEFAULT_APP", "SPARK_CHANNEL", "SparkQuery", "drain", "last_batch", "read_sink"]

#: the example pipeline, where nsqtw runs from a checkout
DEFAULT_APP = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                           "examples", "spark", "nsq_to_parquet.py")
#: messages the query holds at once: what one batch can carry
MAX_IN_FLIGHT = 1000
#: the query's message timeout (seconds): what a killed driver held comes back this soon on Go nsqd too
MSG_TIMEOUT = 5.0


def _spark_submit() -> str:
    import pyspark

    return os.path.join(os.path.dirname(pyspark.__file__), "bin", "spark-submit")


def _env() -> dict[str, str]:
    """Spark's Python workers run this interpreter, which imports the same nsqtw as the runner."""
    import nsqtw

    root = os.path.dirname(os.path.dirname(os.path.abspath(nsqtw.__file__)))
    path = os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)
    return dict(os.environ, PYSPARK_PYTHON=sys.executable, PYSPARK_DRIVER_PYTHON=sys.executable, PYTHONPATH=path)


class SparkQuery:
    """One streaming query, submitted again (same checkpoint) after each kill."""

    def __init__(self, app: str, work: str, lookupd_http: str, topic: str) -> None:
        self.output = os.path.join(work, "spark-out")
        self.checkpoint = os.path.join(work, "spark-checkpoint")
        self.log = os.path.join(work, "spark.log")
        self.cmd = [_spark_submit(), "--master", "local[2]", "--conf", "spark.ui.enabled=false",
                    "--conf", "spark.driver.host=127.0.0.1", "--conf", "spark.driver.bindAddress=127.0.0.1",
                    app, "--lookupd-http-address", lookupd_http, "--topic", topic, "--channel", SPARK_CHANNEL,
                    "--output", self.output, "--checkpoint", self.checkpoint, "--trigger", "1 second",
                    "--option", f"max_in_flight={MAX_IN_FLIGHT}", "--option", "lookupd_poll_interval_ms=1000",
                    "--option", f"msg_timeout_ms={int(MSG_TIMEOUT * 1000)}"]
        self.proc: subprocess.Popen[bytes] | None = None
        self.submits = 0
        self._seen = 0

    def start(self) -> None:
        with open(self.log, "ab") as log:
            self._seen = log.tell()
            self.proc = subprocess.Popen(self.cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         env=_env(), start_new_session=True)
        self.submits += 1

    def driver_pid(self, timeout: float = 180.0) -> int:
        """The Python driver's process id, which it prints once its query runs."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with open(self.log, "rb") as f:
                f.seek(self._seen)
                m = re.search(rb"driver pid (\d+)", f.read())
            if m:
                return int(m.group(1))
            if self.proc is not None and self.proc.poll() is not None:
                break
            time.sleep(0.2)
        raise RuntimeError(f"the Spark query did not start; see {self.log}")

    def kill(self) -> None:
        """SIGKILL the whole spark-submit process group at once (a driver machine lost)."""
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(30)

    def stop(self) -> None:
        """A clean stop: SIGTERM to the Python driver, which ends the query between batches."""
        if self.proc is None or self.proc.poll() is not None:
            return
        try:
            os.kill(self.driver_pid(), signal.SIGTERM)
            self.proc.wait(120)
        except (RuntimeError, subprocess.TimeoutExpired):
            self.kill()
            raise RuntimeError(f"the Spark query did not stop cleanly; see {self.log}") from None

    def last_batch(self) -> int:
        return last_batch(self.output)


def last_batch(output: str) -> int:
    """The last batch a Parquet sink writing to ``output`` has logged (-1 before the first).

    Its log's files are numbered by batch; every tenth is a compaction
    (``29.compact``) after which older files go, so their count stalls while
    the numbers go on.
    """
    meta = os.path.join(output, "_spark_metadata")
    names = os.listdir(meta) if os.path.isdir(meta) else []
    return max((int(n.split(".")[0]) for n in names if n.split(".")[0].isdigit()), default=-1)


def drain(query: SparkQuery, waiting: Callable[[], int], timeout: float) -> bool:
    """Let the query take everything, then stop it cleanly; again if its stop gave messages back.

    ``waiting()`` counts the channel's messages no live client holds (queued,
    deferred, or in flight to a connection that is gone). The query is done
    when nothing waits and its sink has logged no batch for 3 s (what it holds
    is in its last batches); a clean stop then FINs or gives back what it
    held, and whatever it gave back needs one more run. False (wedged) once
    ``timeout`` passes with the backlog no smaller: a query that restarted
    often during the run may still be working off a backlog of hundreds of
    thousands at a thousand a second, which is slow, not stuck.
    """
    deadline = time.monotonic() + timeout
    least = waiting()
    while time.monotonic() < deadline:
        logged, since = -2, time.monotonic()
        while time.monotonic() < deadline:
            batch = query.last_batch()
            if batch != logged:
                logged, since = batch, time.monotonic()
            left = waiting()
            if left < least:
                least, deadline = left, max(deadline, time.monotonic() + timeout)
            if left == 0 and time.monotonic() - since >= 3.0:
                break
            time.sleep(0.5)
        query.stop()
        back = time.monotonic() + 2 * MSG_TIMEOUT
        while waiting() and time.monotonic() < back:
            time.sleep(0.5)
        if waiting() == 0:
            return True
        query.start()
        query.driver_pid()
        least = waiting()  # what the stop gave back: a new backlog, which must shrink in time too
    return False


def read_sink(output: str, work: str) -> list[tuple[int, str]]:
    """Every row in the Parquet sink's committed files, as Spark reads them (a process of its own): its body's
    sequence number and its message (``NODE/ID``)."""
    result = os.path.join(work, "spark-seqs.txt")
    subprocess.run([sys.executable, "-m", "nsqtw.tools.chaos_spark", output, result], env=_env(), check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=300)
    with open(result) as f:
        return [(int(seq), message) for seq, message in (line.split() for line in f) if seq.isdigit()]


def _read(output: str, result: str) -> None:
    from pyspark.sql import SparkSession

    spark = (SparkSession.builder.master("local[1]").config("spark.ui.enabled", "false")
             .config("spark.driver.host", "127.0.0.1").config("spark.driver.bindAddress", "127.0.0.1")
             .getOrCreate())
    try:
        with open(result, "w") as f:
            if os.path.isdir(os.path.join(output, "_spark_metadata")):
                rows = spark.read.parquet(output).select("body", "nsqd_address", "id").toLocalIterator()
                for row in rows:
                    seq = seq_of(bytes(row.body))
                    f.write(f"{'?' if seq is None else seq} {row.nsqd_address}/{row.id}\n")
    finally:
        spark.stop()


if __name__ == "__main__":
    _read(sys.argv[1], sys.argv[2])
