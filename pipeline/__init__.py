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
from pipeline.offsets import OptionError, TopicRecreated
from pipeline.source import SCHEMA, CoordinatorDataSource
from pipeline.wire import client_security, error_line

__all__ = [
    "SCHEMA",
    "CoordinatorDataSource",
    "GroupOffsetCommitter",
    "OptionError",
    "TopicRecreated",
    "client_security",
    "commit_group_offsets",
    "error_line",
    "register",
]


log = logging.getLogger(__name__)


def register(spark: Any) -> None:
    """Make ``format("coordinator")`` available in ``spark`` (a SparkSession).

    Spark's Python workers run ``PYSPARK_PYTHON`` (default: ``python3`` from PATH), which must
    have this project and pyarrow; when neither it nor ``spark.pyspark.python`` is set, the
    workers of the data source run this interpreter, as they must in local mode. On a cluster,
    set ``PYSPARK_PYTHON`` to an environment that has both on every node.

    A mistake of the source's or the sink's (an unknown option, a missing topic) reaches the
    driver wrapped in Spark's AnalysisException around the Python worker's traceback; left
    uncaught, it is shown as its one line (``error_line``), every other error as before."""
    _workers_run_this_interpreter(spark)
    spark.dataSource.register(CoordinatorDataSource)
    if not isinstance(sys.excepthook, _OneLine):
        sys.excepthook = _OneLine(sys.excepthook)


class _OneLine:
    """``sys.excepthook`` showing an uncaught error of this package in one line on stderr."""

    def __init__(self, previous: Any) -> None:
        self.previous = previous

    def __call__(self, kind: type[BaseException], value: BaseException, tb: Any) -> None:
        line = error_line(value)
        if line is None:
            self.previous(kind, value, tb)
        else:
            print(f"format coordinator: {line}", file=sys.stderr)


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
