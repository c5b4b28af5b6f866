"""Stream NSQ topics into Spark and write DataFrames into NSQ (a PySpark data source).

``from nsqtw.spark import NSQDataSource`` imports PySpark; the rest of the
package (the blocking client, consumer and producer) does not, and nothing
here is imported by the daemon.
"""

from __future__ import annotations

from typing import Any

__all__ = ["NSQDataSource"]


def __getattr__(name: str) -> Any:
    if name == "NSQDataSource":
        from nsqtw.spark.source import NSQDataSource
        return NSQDataSource
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
