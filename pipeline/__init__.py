"""PySpark integration: the ``coordinator`` data source (read topics, write a topic) and the
group-offset committer that keeps ``coordinator groups describe`` showing a job's lag.

    from pipeline import register
    register(spark)
    spark.readStream.format("coordinator").option("topic", "events").load()
"""

from __future__ import annotations

from typing import Any

from pipeline.commits import GroupOffsetCommitter, commit_group_offsets
from pipeline.source import SCHEMA, CoordinatorDataSource
from pipeline.wire import client_security

__all__ = [
    "SCHEMA",
    "CoordinatorDataSource",
    "GroupOffsetCommitter",
    "client_security",
    "commit_group_offsets",
    "register",
]


def register(spark: Any) -> None:
    """Make ``format("coordinator")`` available in ``spark`` (a SparkSession)."""
    spark.dataSource.register(CoordinatorDataSource)
