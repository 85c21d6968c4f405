"""Rows/s through the ``coordinator`` Spark source, next to an in-memory Python source of the same
rows in the same run and session (the bare baseline: Spark's Python data source machinery
without the broker: each task yields Arrow record batches it already holds), and Spark's own
Parquet reader over the same rows. Prints one JSON line per figure::

    python bench/spark_source.py --records 1000000 --partitions 2
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
import pyarrow.parquet as pq
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
    """One partition's rows as the Arrow batches the broker source builds from its fetches, in an
    Arrow IPC file the task maps into memory (the page cache holds it): no data travels with the
    plan or the task, and yielding a batch copies nothing."""

    path: str

    @classmethod
    def of(cls, batches: Sequence[pa.RecordBatch], path: Path) -> MemoryPartition:
        with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_file(sink, batches[0].schema) as w:
            for batch in batches:
                w.write_batch(batch)
        return cls(path=str(path))

    def batches(self) -> Iterator[pa.RecordBatch]:
        with pa.memory_map(self.path) as source:
            reader = pa.ipc.open_file(source)
            for i in range(reader.num_record_batches):
                yield reader.get_batch(i)


class MemorySource(DataSource):
    """The same rows in the same Arrow batches, already in each task's memory: Spark's Python
    data source path alone, with no fetching, decoding or building of rows. Option ``paths``:
    the partitions' IPC files."""

    @classmethod
    def name(cls) -> str:
        return "memory_records"

    def schema(self) -> str:
        return SCHEMA

    def reader(self, schema: StructType) -> DataSourceReader:
        return MemoryReader([MemoryPartition(path=p) for p in self.options["paths"].split(",")])


class MemoryReader(DataSourceReader):
    def __init__(self, partitions: Sequence[MemoryPartition]) -> None:
        self._partitions = list(partitions)

    def partitions(self) -> Sequence[InputPartition]:
        return self._partitions

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, MemoryPartition)
        yield from partition.batches()


def fill(
    bootstrap: str, topic: str, partitions: int, records: int, directory: Path
) -> list[MemoryPartition]:
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
            result.append(MemoryPartition.of(arrow, directory / f"{p.partition}.arrow"))
        return result


def write_parquet(data: Sequence[MemoryPartition], directory: Path) -> None:
    """The same rows as Parquet files, one per partition, for Spark's own reader."""
    directory.mkdir()
    for i, partition in enumerate(data):
        table = pa.Table.from_batches(list(partition.batches()))
        pq.write_table(table, directory / f"part-{i}.parquet")


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
        data = fill(bootstrap, "bench", args.partitions, args.records, Path(tmp))
        spark = local_spark("bench-spark-source", cores=2, driver_memory="3g")
        try:
            spark.dataSource.register(MemorySource)
            source = (
                spark.read.format("coordinator")
                .option("bootstrap", bootstrap)
                .option("topic", "bench")
            )
            memory = spark.read.format("memory_records").option(
                "paths", ",".join(p.path for p in data)
            )
            write_parquet(data, Path(tmp) / "parquet")
            parquet = spark.read.format("parquet").option("path", str(Path(tmp) / "parquet"))
            rows_per_second(spark, source, args.records, 1)  # warm the Python workers
            broker_rate = rows_per_second(spark, source, args.records, args.rounds)
            memory_rate = rows_per_second(spark, memory, args.records, args.rounds)
            parquet_rate = rows_per_second(spark, parquet, args.records, args.rounds)
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
        figure="spark_source_rows_per_s",
        source="spark_parquet_reader",
        rows_per_s=round(parquet_rate),
        **common,
    )
    emit(
        figure="spark_source_ratio",
        coordinator_over_in_memory=round(broker_rate / memory_rate, 3),
        in_memory_over_parquet=round(memory_rate / parquet_rate, 3),
        target=0.5,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
