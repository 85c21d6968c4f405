"""Rows/s through the ``coordinator`` Spark source, next to an in-memory Python source of the same
rows in the same run and session (the bare baseline: Spark's Python data source machinery and
Arrow conversion without the broker). Prints one JSON line per figure::

    python bench/spark_source.py --records 500000 --partitions 2
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import attrs
import pyarrow as pa
from pyspark.sql import functions as F
from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition
from pyspark.sql.types import StructType

from pipeline.arrow import arrow_batch
from pipeline.local import local_broker, local_spark
from pipeline.source import FETCH_BYTES, SCHEMA
from pipeline.wire import Cluster
from protocol import CreateTopicRequest
from protocol.batches import build_batch, read_batches

VALUE_BYTES = 100
#: Records per produced batch: the producer's batches are about this size at 100-byte values.
BATCH_RECORDS = 5000


def emit(**figure: object) -> None:
    print(json.dumps(figure), flush=True)


@attrs.frozen(kw_only=True)
class MemoryPartition(InputPartition):
    """One partition's rows as the Arrow batches the broker source builds from its fetches."""

    batches: tuple[pa.RecordBatch, ...]


class MemorySource(DataSource):
    """The same rows in the same Arrow batches, shipped with each task: Spark's Python data source
    path alone, with no fetching, decoding or building of rows."""

    partitions_data: Sequence[MemoryPartition] = ()

    @classmethod
    def name(cls) -> str:
        return "memory_records"

    def schema(self) -> str:
        return SCHEMA

    def reader(self, schema: StructType) -> DataSourceReader:
        return MemoryReader(self.partitions_data)


class MemoryReader(DataSourceReader):
    def __init__(self, partitions: Sequence[MemoryPartition]) -> None:
        self._partitions = list(partitions)

    def partitions(self) -> Sequence[InputPartition]:
        return self._partitions

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, MemoryPartition)
        yield from partition.batches


def fill(bootstrap: str, topic: str, partitions: int, records: int) -> list[MemoryPartition]:
    """Produce ``records`` and read them back as the fetches the source will make."""
    with Cluster(bootstrap) as cluster:
        cluster.call_any(CreateTopicRequest(topic=topic, partitions=partitions))
        placements = sorted(cluster.placements([topic]).values(), key=lambda p: p.partition)
        value = b"x" * VALUE_BYTES
        for i in range(0, records, BATCH_RECORDS):
            count = min(BATCH_RECORDS, records - i)
            batch = build_batch([value] * count, [b"k%d" % j for j in range(i, i + count)])
            cluster.produce(placements[(i // BATCH_RECORDS) % partitions], batch)
        result = []
        for p in placements:
            arrow, offset = [], 0
            while True:
                response = cluster.fetch(p, offset, FETCH_BYTES)
                fetched = read_batches(response.batches)
                if not fetched:
                    break
                found = arrow_batch(p.topic, p.partition, fetched, offset, fetched[-1].next_offset)
                assert found is not None
                arrow.append(found)
                offset = fetched[-1].next_offset
            result.append(MemoryPartition(batches=tuple(arrow)))
        return result


def rows_per_second(spark: Any, reader: Any, records: int, rounds: int) -> float:
    best = 0.0
    for _ in range(rounds):
        start = time.perf_counter()
        total = reader.load().agg(F.sum(F.length("value")), F.count("*")).collect()[0]
        elapsed = time.perf_counter() - start
        assert total[1] == records, f"read {total[1]} rows, expected {records}"
        best = max(best, records / elapsed)
    return best


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=300_000)
    parser.add_argument("--partitions", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3, help="best of this many reads")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp, local_broker(Path(tmp) / "broker") as bootstrap:
        data = fill(bootstrap, "bench", args.partitions, args.records)
        # the in-memory source ships its rows inside the plan: the driver needs room for them
        spark = local_spark("bench-spark-source", cores=2, driver_memory="3g")
        try:
            MemorySource.partitions_data = data
            spark.dataSource.register(MemorySource)
            source = (
                spark.read.format("coordinator")
                .option("bootstrap", bootstrap)
                .option("topic", "bench")
            )
            memory = spark.read.format("memory_records")
            rows_per_second(spark, source, args.records, 1)  # warm the Python workers
            broker_rate = rows_per_second(spark, source, args.records, args.rounds)
            memory_rate = rows_per_second(spark, memory, args.records, args.rounds)
        finally:
            spark.stop()
    common = {"records": args.records, "partitions": args.partitions, "value_bytes": VALUE_BYTES}
    emit(
        figure="spark_source_rows_per_s",
        source="coordinator",
        rows_per_s=round(broker_rate),
        **common,
    )
    emit(
        figure="spark_source_rows_per_s",
        source="in_memory",
        rows_per_s=round(memory_rate),
        **common,
    )
    emit(
        figure="spark_source_ratio", coordinator_over_in_memory=round(broker_rate / memory_rate, 3)
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
