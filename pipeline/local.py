"""A throwaway broker on the embedded store and a local SparkSession, for examples, benchmarks
and tests (blocking)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

STARTUP_TIMEOUT = 30.0
_SERVING = re.compile(rb"serving on (\S+):(\d+)")


@contextmanager
def local_broker(data_dir: Path, *args: str) -> Iterator[str]:
    """``coordinator serve --port 0`` for the block's span; yields its ``HOST:PORT``."""
    log_path = data_dir.with_name(data_dir.name + ".log")
    log_path.parent.mkdir(parents=True, exist_ok=True)  # the example's --out DIR may not exist
    command = [sys.executable, "-m", "cli", "serve", "--port", "0"]
    with open(log_path, "ab") as log_file:
        process = subprocess.Popen(
            [*command, "--data-dir", str(data_dir), *args],
            stdout=subprocess.PIPE,
            stderr=log_file,
        )
    try:
        assert process.stdout is not None
        deadline = time.monotonic() + STARTUP_TIMEOUT  # real-clock: waits on a real process
        seen = b""
        while (match := _SERVING.search(seen)) is None and time.monotonic() < deadline:
            line = process.stdout.readline()
            if not line:
                break
            seen += line
        if match is None:
            raise RuntimeError(f"broker did not start: {seen!r}\n{log_path.read_text()}")
        yield f"{match.group(1).decode()}:{match.group(2).decode()}"
    finally:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        if process.stdout is not None:
            process.stdout.close()


def local_spark(app_name: str, cores: int = 2, driver_memory: str = "1g") -> Any:
    """A ``local[cores]`` SparkSession whose Python workers run this interpreter, with the data
    source registered. Spark's Python workers otherwise run ``python3`` from PATH, which may not
    have pyarrow or this project."""
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    from pipeline import register

    spark = (
        SparkSession.builder.master(f"local[{cores}]")
        .appName(app_name)
        .config("spark.pyspark.python", sys.executable)
        .config("spark.driver.memory", driver_memory)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", str(cores))
        .config("spark.sql.streaming.stopTimeout", "30s")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    return spark
