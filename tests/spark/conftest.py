"""One local SparkSession shared by every Spark test (it takes ~15 s to start)."""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Iterator
from typing import Any

import pytest

from tests.daemon import ROOT
from tests.integration.conftest import daemon_factory, lookupd_factory, nsqd  # noqa: F401  (fixtures)


def _java() -> str | None:
    home = os.environ.get("JAVA_HOME")
    if home and os.path.exists(os.path.join(home, "bin", "java")):
        return os.path.join(home, "bin", "java")
    return shutil.which("java")


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    if _java() is None:
        pytest.skip("Java is not installed: PySpark needs a JVM (JDK 17+) for the Spark tests")
    saved = {k: os.environ.get(k) for k in ("PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON", "PYTHONPATH")}
    # Spark's Python workers must run this interpreter and import this checkout's nsqtw
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (ROOT, saved["PYTHONPATH"]) if p)
    from pyspark.sql import SparkSession

    from nsqtw.spark import NSQDataSource

    session = (SparkSession.builder.master("local[2]").appName("nsqtw-tests")
               .config("spark.ui.enabled", "false")
               .config("spark.sql.shuffle.partitions", "2")
               .config("spark.default.parallelism", "2")
               .config("spark.driver.host", "127.0.0.1")
               .config("spark.driver.bindAddress", "127.0.0.1")
               .getOrCreate())
    session.sparkContext.setLogLevel("ERROR")
    session.dataSource.register(NSQDataSource)
    try:
        yield session
    finally:
        session.stop()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
