"""PySpark integration: the ``coordinator`` data source (read topics, write a topic) and the
group-offset committer that keeps ``coordinator groups describe`` showing a job's lag.

    from pipeline import register
    register(spark)
    spark.readStream.format("coordinator").option("topic", "events").load()
"""

from __future__ import annotations

import logging
import os
import sys
from typing import Any

from pipeline.commits import GroupOffsetCommitter, commit_group_offsets
from pipeline.offsets import TopicRecreated
from pipeline.source import SCHEMA, CoordinatorDataSource
from pipeline.wire import client_security

__all__ = [
    "SCHEMA",
    "CoordinatorDataSource",
    "GroupOffsetCommitter",
    "TopicRecreated",
    "client_security",
    "commit_group_offsets",
    "register",
]


log = logging.getLogger(__name__)


def register(spark: Any) -> None:
    """Make ``format("coordinator")`` available in ``spark`` (a SparkSession).

    Spark's Python workers run ``PYSPARK_PYTHON`` (default: ``python3`` from PATH), which must
    have this project and pyarrow; when neither it nor ``spark.pyspark.python`` is set, the
    workers of the data source run this interpreter, as they must in local mode. On a cluster,
    set ``PYSPARK_PYTHON`` to an environment that has both on every node."""
    _workers_run_this_interpreter(spark)
    spark.dataSource.register(CoordinatorDataSource)


def _workers_run_this_interpreter(spark: Any) -> None:
    if os.environ.get("PYSPARK_PYTHON"):
        return
    try:
        context = spark.sparkContext
    except Exception:  # Spark Connect: no SparkContext here, its workers are configured there
        return
    if context.getConf().get("spark.pyspark.python"):
        return
    log.info("PYSPARK_PYTHON is not set: Spark's Python workers run %s", sys.executable)
    os.environ["PYSPARK_PYTHON"] = sys.executable
    # read when a function is registered: the data source's workers are started with it
    context.pythonExec = sys.executable
