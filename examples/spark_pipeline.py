"""A Spark pipeline on the log: JSON events in, per-key totals per time window out.

One command runs everything: a broker (unless ``--bootstrap`` names one), a producer feeding
``events`` with JSON events, and a Spark streaming query that reads them with the ``coordinator``
source, sums ``amount`` per ``user`` and 10-second window, and writes each micro-batch's updated
windows to Parquet and to the topic ``user-totals``. The consumer group ``example-pipeline``
follows the job, so ``coordinator groups describe example-pipeline`` shows its lag::

    python examples/spark_pipeline.py --seconds 30
    python examples/spark_pipeline.py --bootstrap 127.0.0.1:9092 --out /tmp/totals

Progress is one JSON line per micro-batch.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import threading
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import trio
from pyspark.sql import functions as F

from consumer import Compression, ProducerConfig, open_producer
from consumer.admin import AdminError, open_admin
from pipeline import GroupOffsetCommitter
from pipeline.local import local_broker, local_spark
from pipeline.wire import Cluster
from protocol import ErrorCode
from transport.connect import parse_bootstrap

EVENTS, TOTALS, GROUP = "events", "user-totals", "example-pipeline"
EVENT_SCHEMA = "user string, amount double, ts timestamp"


async def create_topics(bootstrap: str) -> None:
    async with open_admin(parse_bootstrap(bootstrap)) as admin:
        for topic in (EVENTS, TOTALS):
            try:
                await admin.create_topic(topic, 2)
            except AdminError as exc:
                if exc.error_code is not ErrorCode.TOPIC_ALREADY_EXISTS:
                    raise


def feed(bootstrap: str, rate: int, stop: threading.Event, sent: list[int]) -> None:
    """Produce about ``rate`` events per second until ``stop`` is set (runs in its own thread)."""

    async def run() -> None:
        users = [f"user-{i}" for i in range(20)]
        # JSON compresses well: each record batch goes out and is stored zstd-compressed
        config = ProducerConfig(compression=Compression.ZSTD)
        async with open_producer(parse_bootstrap(bootstrap), config=config) as producer:
            while not stop.is_set():
                for _ in range(max(rate // 10, 1)):
                    user = random.choice(users)
                    event = {
                        "user": user,
                        "amount": round(random.uniform(1, 100), 2),
                        "ts": time.strftime("%Y-%m-%dT%H:%M:%S")  # real-clock: event time
                        + f".{int(time.time() * 1000) % 1000:03d}Z",
                    }
                    await producer.enqueue(EVENTS, json.dumps(event).encode(), user.encode())
                    sent[0] += 1
                await trio.sleep(0.1)

    trio.run(run)


def closing_hint(bootstrap: str, own_broker: bool) -> str:
    """Where to look next. The broker the example started stops with it, so its address would
    lead nowhere: a broker of the user's own keeps the group to look at."""
    if own_broker:
        return (
            f"this run's broker stopped with it; to follow the group with coordinator groups "
            f"describe {GROUP}, start a broker (scripts/serve.sh) and run this example with "
            "--bootstrap 127.0.0.1:9092"
        )
    return f"coordinator groups describe {GROUP} --bootstrap {bootstrap}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bootstrap", help="HOST:PORT of a broker (default: start one)")
    parser.add_argument("--seconds", type=float, default=30.0, help="how long to run")
    parser.add_argument("--rate", type=int, default=500, help="events per second to produce")
    parser.add_argument("--out", type=Path, help="Parquet and checkpoint directory")
    args = parser.parse_args()

    with ExitStack() as stack:
        work = args.out or Path(stack.enter_context(tempfile.TemporaryDirectory()))
        bootstrap = args.bootstrap or stack.enter_context(local_broker(work / "broker"))
        trio.run(create_topics, bootstrap)
        stop, sent = threading.Event(), [0]
        feeder = threading.Thread(target=feed, args=(bootstrap, args.rate, stop, sent))
        feeder.start()
        spark = local_spark("example-pipeline")
        committer = GroupOffsetCommitter(bootstrap, GROUP, query_name="user-totals")
        spark.streams.addListener(committer)
        try:
            events = (
                spark.readStream.format("coordinator")
                .option("bootstrap", bootstrap)
                .option("topic", EVENTS)
                .option("group", GROUP)
                .option("maxRecordsPerTrigger", "20000")
                .load()
                .select(F.from_json(F.col("value").cast("string"), EVENT_SCHEMA).alias("e"))
                .select("e.*")
            )
            totals = (
                events.withWatermark("ts", "30 seconds")
                .groupBy(F.window("ts", "10 seconds"), "user")
                .agg(F.sum("amount").alias("total"), F.count("*").alias("events"))
            )

            def write(batch: Any, batch_id: int) -> None:
                rows = batch.select(
                    F.col("window.start").alias("window_start"), "user", "total", "events"
                ).withColumn("batch", F.lit(batch_id))
                rows.write.mode("append").parquet(str(work / "totals.parquet"))
                rows.select(
                    F.col("user").alias("key"), F.to_json(F.struct("*")).alias("value")
                ).write.format("coordinator").option("bootstrap", bootstrap).option(
                    "topic", TOTALS
                ).mode("append").save()

            query = (
                totals.writeStream.outputMode("update")
                .queryName("user-totals")
                .foreachBatch(write)
                .option("checkpointLocation", str(work / "checkpoint"))
                .trigger(processingTime="2 seconds")
                .start()
            )
            deadline = time.monotonic() + args.seconds  # real-clock: the demo's run time
            shown = -1

            def show_progress() -> None:
                nonlocal shown
                for progress in query.recentProgress:
                    if progress["batchId"] <= shown:
                        continue
                    shown = progress["batchId"]
                    line = {
                        "batch": shown,
                        "input_rows": progress["numInputRows"],
                        "rows_per_s": round(progress["processedRowsPerSecond"] or 0),
                        "produced": sent[0],
                        "end_offsets": json.loads(progress["sources"][0]["endOffset"]),
                    }
                    print(json.dumps(line), flush=True)

            while time.monotonic() < deadline and query.isActive:
                time.sleep(0.5)
                show_progress()
            stop.set()
            failure = query.exception()
            if failure is not None:
                raise SystemExit(f"the query failed: {failure}")
            query.processAllAvailable()  # finish what was produced, then stop between batches
            query.stop()
            show_progress()
            committer.commit_last(query)
        finally:
            stop.set()
            feeder.join()
            spark.streams.removeListener(committer)
        with Cluster(bootstrap) as cluster:
            placements = cluster.placements([TOTALS])
            bounds = cluster.log_bounds(placements.values())
            committed = cluster.committed_offsets(GROUP)
        parquet_rows = spark.read.parquet(str(work / "totals.parquet")).count()
        spark.stop()
        print(
            json.dumps(
                {
                    "produced": sent[0],
                    "consumed_committed": sum(committed.values()),
                    "parquet_rows": parquet_rows,
                    "records_in_" + TOTALS: sum(end for _, end in bounds.values()),
                    "see": closing_hint(bootstrap, own_broker=args.bootstrap is None),
                }
            ),
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
