"""Spark as users run it, on loopback for tests, started from the pyspark install: a standalone
cluster (a master and workers) and a Spark Connect server.

Each runs as Spark ships it (``bin/spark-class`` of the master and worker
classes, ``bin/spark-submit`` of the Connect server), in a session of its
own so that a kill takes a worker's executors and their Python workers
with it, as a lost host would. Every port is chosen by the system.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyspark

SPARK_HOME = Path(pyspark.__file__).parent

_MASTER = re.compile(r"Starting Spark master at (spark://[0-9.]+:\d+)")
_CONNECT = re.compile(r"Spark Connect server started at: (\S+)")
_REGISTERED = "Successfully registered with master"


def _wait_in_log(log: Path, proc: subprocess.Popen[bytes], what: str, pattern: re.Pattern[str] | str,
                 timeout: float = 180.0) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        text = log.read_text(errors="replace") if log.exists() else ""
        if isinstance(pattern, str):
            if pattern in text:
                return pattern
        elif (found := pattern.search(text)) is not None:
            return found.group(1)
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited ({proc.returncode}):\n{text[-3000:]}")
        time.sleep(0.2)
    raise TimeoutError(f"{what} did not start within {timeout} s:\n{log.read_text(errors='replace')[-3000:]}")


class SparkProcesses:
    """Spark's own programs started for a test, each logging to ``workdir/NAME/out.log``."""

    def __init__(self, workdir: Path, python_path: str) -> None:
        self.workdir = workdir
        #: for the Python workers Spark starts: they import nsqtw
        self.python_path = python_path
        self.procs: list[subprocess.Popen[bytes]] = []

    def _spawn(self, name: str, program: str, *args: str) -> tuple[subprocess.Popen[bytes], Path]:
        (self.workdir / name).mkdir(parents=True, exist_ok=True)
        log = self.workdir / name / "out.log"
        env = dict(os.environ, SPARK_HOME=str(SPARK_HOME), SPARK_LOCAL_IP="127.0.0.1", SPARK_NO_DAEMONIZE="1",
                   SPARK_LOG_DIR=str(self.workdir / name), PYTHONPATH=self.python_path,
                   PYSPARK_PYTHON=sys.executable,
                   # no REST submission server: it would listen on a fixed port (6066)
                   SPARK_MASTER_OPTS="-Dspark.master.rest.enabled=false")
        with open(log, "wb") as out:
            proc = subprocess.Popen([str(SPARK_HOME / "bin" / program), *args], stdout=out,
                                    stderr=subprocess.STDOUT, env=env, start_new_session=True)
        self.procs.append(proc)
        return proc, log

    def kill(self, proc: subprocess.Popen[bytes]) -> None:
        """kill -9 the process and everything it started (a worker: its executors too)."""
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()

    def stop(self) -> None:
        for proc in reversed(self.procs):
            self.kill(proc)


class StandaloneCluster(SparkProcesses):
    """A standalone master and its workers."""

    url = ""

    def __init__(self, workdir: Path, python_path: str) -> None:
        super().__init__(workdir, python_path)
        self.workers: list[subprocess.Popen[bytes]] = []

    def start_master(self) -> str:
        proc, log = self._spawn("master", "spark-class", "org.apache.spark.deploy.master.Master",
                                "--host", "127.0.0.1", "--port", "0", "--webui-port", "0")
        self.url = _wait_in_log(log, proc, "the Spark master", _MASTER)
        return self.url

    def start_worker(self, cores: int = 1, memory: str = "768m") -> subprocess.Popen[bytes]:
        name = f"worker{len(self.workers)}"
        proc, log = self._spawn(name, "spark-class", "org.apache.spark.deploy.worker.Worker", "--host", "127.0.0.1",
                                "--port", "0", "--webui-port", "0", "--cores", str(cores), "--memory", memory,
                                "--work-dir", str(self.workdir / name / "work"), self.url)
        _wait_in_log(log, proc, f"Spark {name}", _REGISTERED)
        self.workers.append(proc)
        return proc


class ConnectServer(SparkProcesses):
    """A Spark Connect server, running its own ``local[2]`` Spark."""

    url = ""

    def start(self) -> str:
        proc, log = self._spawn(
            "connect", "spark-submit", "--class", "org.apache.spark.sql.connect.service.SparkConnectServer",
            "--master", "local[2]", "--conf", "spark.connect.grpc.binding.address=127.0.0.1",
            "--conf", "spark.connect.grpc.binding.port=0", "--conf", "spark.ui.enabled=false",
            "--conf", "spark.driver.host=127.0.0.1", "--conf", "spark.driver.bindAddress=127.0.0.1")
        self.url = "sc://" + _wait_in_log(log, proc, "the Spark Connect server", _CONNECT)
        return self.url
