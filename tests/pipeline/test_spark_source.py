"""The ``coordinator`` Spark data source against a real broker process and a real local Spark.

One broker and one SparkSession (``local[2]``) serve the whole module; each test has its own
topic. Most sinks are ``foreachBatch`` functions that write one file per batch id (an idempotent
sink: a batch Spark runs again overwrites its own file); the project's own sink and batch writer
write topics that a batch read then checks.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import trio
from pyspark.sql.streaming.datasource import ReadAllAvailable

from consumer import open_producer
from consumer.admin import open_admin
from pipeline import GroupOffsetCommitter, TopicRecreated, commit_group_offsets, error_line
from pipeline.local import local_broker, local_spark
from pipeline.offsets import OffsetsJson
from pipeline.source import OffsetRange, StreamReader
from pipeline.wire import Cluster
from protocol import NO_TOPIC_ID
from transport.connect import parse_bootstrap

pytestmark = pytest.mark.realtime

WAIT = 120.0  # generous: CI has two busy cores and Spark plans every batch in a JVM


@pytest.fixture(scope="module")
def bootstrap(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with local_broker(tmp_path_factory.mktemp("pipeline") / "broker") as address:
        yield address


@pytest.fixture(scope="module")
def spark() -> Iterator[Any]:
    session = local_spark("pipeline-tests")
    yield session
    session.stop()


def create_topic(bootstrap: str, topic: str, partitions: int) -> None:
    async def create() -> None:
        async with open_admin(parse_bootstrap(bootstrap)) as admin:
            await admin.create_topic(topic, partitions)

    trio.run(create)


def produce(bootstrap: str, topic: str, values: list[str]) -> set[tuple[int, int, str]]:
    """Send keyed records with the project's producer: {(partition, offset, value)}."""

    async def send() -> set[tuple[int, int, str]]:
        async with open_producer(parse_bootstrap(bootstrap)) as producer:
            deliveries = [
                (await producer.enqueue(topic, v.encode(), f"key-{v}".encode()), v) for v in values
            ]
            return {(*(await d.wait()), v) for d, v in deliveries if v}

    return trio.run(send)


def wait_until(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + WAIT  # real-clock: Spark runs on the wall clock
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {WAIT} s: {what}")
        time.sleep(0.05)


def batch_file_sink(directory: Path) -> Callable[[Any, int], None]:
    directory.mkdir(parents=True, exist_ok=True)

    def write(df: Any, batch_id: int) -> None:
        rows = [[r.partition, r.offset, r.value.decode()] for r in df.collect()]
        staged = directory / f".batch-{batch_id:05d}"
        staged.write_text(json.dumps(rows))
        staged.rename(directory / f"batch-{batch_id:05d}.json")

    return write


def sink_rows(directory: Path) -> list[tuple[int, int, str]]:
    """Every row of every batch file (duplicates kept, so a test can see them)."""
    return [
        (p, o, v)
        for path in sorted(directory.glob("batch-*.json"))
        for p, o, v in json.loads(path.read_text())
    ]


def stream(spark: Any, bootstrap: str, topic: str, **options: str) -> Any:
    reader = spark.readStream.format("coordinator").option("bootstrap", bootstrap)
    for key, value in {"topic": topic, **options}.items():
        reader = reader.option(key, value)
    return reader.load()


def run_available_now(df: Any, sink: Path, checkpoint: Path, name: str) -> Any:
    query = (
        df.writeStream.foreachBatch(batch_file_sink(sink))
        .queryName(name)
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    assert query.awaitTermination(WAIT), "the availableNow query did not finish"
    return query


def describe_group(bootstrap: str, group: str) -> dict[str, Any]:
    """What an operator sees: ``coordinator groups describe G --json``."""
    command = [sys.executable, "-m", "cli", "groups", "describe", group, "--json"]
    out = subprocess.run(
        [*command, "--bootstrap", bootstrap],
        capture_output=True,
        check=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])},
    ).stdout
    result: dict[str, Any] = json.loads(out)
    return result


def test_a_batch_read_returns_exactly_what_was_produced(spark: Any, bootstrap: str) -> None:
    create_topic(bootstrap, "batch", 3)
    produced = produce(bootstrap, "batch", [f"v{i}" for i in range(600)])
    assert {p for p, _, _ in produced} == {0, 1, 2}

    df = (
        spark.read.format("coordinator")
        .option("bootstrap", bootstrap)
        .option("topic", "batch")
        .option("minPartitions", "7")  # cut the three ranges into about seven tasks
        .load()
    )
    assert 6 <= df.rdd.getNumPartitions() <= 8
    rows = df.collect()

    assert len(rows) == 600
    assert {(r.partition, r.offset, r.value.decode()) for r in rows} == produced
    assert all(r.topic == "batch" and r.key == b"key-" + r.value for r in rows)
    assert all(r.timestamp is not None for r in rows)

    by_pattern = (
        spark.read.format("coordinator")
        .option("bootstrap", bootstrap)
        .option("pattern", "ba.ch")
        .option("endingOffsets", '{"batch": {"0": 5}}')
        .load()
    )
    counts = {r.partition: r["count"] for r in by_pattern.groupBy("partition").count().collect()}
    ends = {p: max(o + 1 for q, o, _ in produced if q == p) for p in (1, 2)}
    assert counts == {0: 5, 1: ends[1], 2: ends[2]}


def test_available_now_picks_up_what_was_produced_between_runs_and_commits_the_group(
    spark: Any, bootstrap: str, tmp_path: Path
) -> None:
    create_topic(bootstrap, "runs", 2)
    first = produce(bootstrap, "runs", [f"a{i}" for i in range(200)])
    committer = GroupOffsetCommitter(bootstrap, "nightly", query_name="runs")
    spark.streams.addListener(committer)
    try:
        df = stream(spark, bootstrap, "runs", group="nightly", maxRecordsPerTrigger="70")
        run_available_now(df, tmp_path / "sink", tmp_path / "checkpoint", "runs")
        assert set(sink_rows(tmp_path / "sink")) == first
        assert len(sink_rows(tmp_path / "sink")) == 200
        assert len(list((tmp_path / "sink").glob("batch-*"))) >= 3  # the limit made batches

        # the listener commits each finished batch, the last one included
        wait_until(
            lambda: (
                sum(p["committed"] or 0 for p in describe_group(bootstrap, "nightly")["partitions"])
                == 200
            ),
            "the group's offsets at the end of the first run",
        )
        group = describe_group(bootstrap, "nightly")
        assert [(p["committed"], p["lag"]) for p in group["partitions"]] == [
            (p["end"], 0) for p in group["partitions"]
        ]
        assert sum(p["committed"] for p in group["partitions"]) == 200

        second = produce(bootstrap, "runs", [f"b{i}" for i in range(50)])
        assert sum(p["lag"] for p in describe_group(bootstrap, "nightly")["partitions"]) == 50
        query = run_available_now(df, tmp_path / "sink", tmp_path / "checkpoint", "runs")
        committer.commit_last(query)  # at once, without waiting for the listener
    finally:
        spark.streams.removeListener(committer)

    rows = sink_rows(tmp_path / "sink")
    assert len(rows) == 250 and set(rows) == first | second
    group = describe_group(bootstrap, "nightly")
    assert sum(p["committed"] for p in group["partitions"]) == 250
    assert all(p["lag"] == 0 for p in group["partitions"])

    # a new job (no checkpoint) on the group's offsets starts where the group stands
    third = produce(bootstrap, "runs", [f"c{i}" for i in range(10)])
    df = stream(spark, bootstrap, "runs", group="nightly", startingOffsets="group")
    run_available_now(df, tmp_path / "sink2", tmp_path / "checkpoint2", "fresh")
    assert sorted(sink_rows(tmp_path / "sink2")) == sorted(third)


def test_restarting_from_the_checkpoint_loses_and_duplicates_nothing(
    spark: Any, bootstrap: str, tmp_path: Path
) -> None:
    create_topic(bootstrap, "restart", 3)
    produced = produce(bootstrap, "restart", [f"r{i}" for i in range(1500)])
    sink, checkpoint = tmp_path / "sink", tmp_path / "checkpoint"
    df = stream(spark, bootstrap, "restart", startingOffsets="earliest", maxRecordsPerTrigger="100")
    query = (
        df.writeStream.foreachBatch(batch_file_sink(sink))
        .option("checkpointLocation", str(checkpoint))
        .trigger(processingTime="100 milliseconds")
        .start()
    )
    try:
        wait_until(lambda: len(list(sink.glob("batch-*"))) >= 3, "three batches written")
    finally:
        query.stop()
    stopped_with = len(sink_rows(sink))
    assert 0 < stopped_with < 1500, "the query was not stopped mid-way"

    run_available_now(df, sink, checkpoint, "restart-2")

    rows = sink_rows(sink)
    assert len(rows) == 1500, "records were lost or duplicated across the restart"
    assert set(rows) == produced


def test_a_partition_added_while_the_query_runs_is_picked_up(
    spark: Any, bootstrap: str, tmp_path: Path
) -> None:
    create_topic(bootstrap, "grow", 1)
    produce(bootstrap, "grow", [f"g{i}" for i in range(20)])
    sink = tmp_path / "sink"
    df = stream(spark, bootstrap, "grow", startingOffsets="earliest")
    query = (
        df.writeStream.foreachBatch(batch_file_sink(sink))
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .trigger(processingTime="200 milliseconds")
        .start()
    )
    try:
        wait_until(lambda: len(sink_rows(sink)) == 20, "the first partition's records")

        async def grow() -> None:
            async with open_admin(parse_bootstrap(bootstrap)) as admin:
                await admin.add_partitions("grow", 2)

        trio.run(grow)
        later = produce(bootstrap, "grow", [f"h{i}" for i in range(40)])
        assert any(p == 1 for p, _, _ in later)
        wait_until(lambda: len(sink_rows(sink)) == 60, "the records of both partitions")
    finally:
        query.stop()
    rows = sink_rows(sink)
    assert {(p, o, v) for p, o, v in rows if v.startswith("h")} == later
    assert len(rows) == len(set(rows)) == 60


def recreate_topic(bootstrap: str, topic: str, partitions: int) -> None:
    async def recreate() -> None:
        async with open_admin(parse_bootstrap(bootstrap)) as admin:
            await admin.delete_topic(topic)
            await admin.create_topic(topic, partitions)

    trio.run(recreate)


def topic_id(bootstrap: str, topic: str) -> uuid.UUID:
    """The id the cluster metadata gives ``topic`` (one id for all its partitions)."""
    with Cluster(bootstrap) as cluster:
        (found,) = {p.topic_id for p in cluster.placements([topic]).values()}
    assert found != NO_TOPIC_ID
    return found


def test_a_topic_created_again_under_its_name_fails_the_query_from_its_checkpoint(
    spark: Any, bootstrap: str, tmp_path: Path
) -> None:
    """The checkpoint's offsets belong to the deleted topic: going on from them would skip the
    new topic's first records (issue 33), so the query fails and says what to do."""
    create_topic(bootstrap, "reborn", 2)
    old = produce(bootstrap, "reborn", [f"old{i}" for i in range(20)])
    old_id = topic_id(bootstrap, "reborn")
    sink, checkpoint = tmp_path / "sink", tmp_path / "checkpoint"
    df = stream(spark, bootstrap, "reborn", startingOffsets="earliest")
    run_available_now(df, sink, checkpoint, "reborn")
    assert set(sink_rows(sink)) == old
    # Spark's checkpoint keeps the id with the offsets: a restarted query checks it
    offsets_log = json.loads((checkpoint / "offsets" / "0").read_text().splitlines()[-1])
    assert offsets_log["reborn"]["id"] == str(old_id)

    recreate_topic(bootstrap, "reborn", 2)
    new_id = topic_id(bootstrap, "reborn")
    assert new_id != old_id
    produce(bootstrap, "reborn", [f"new{i}" for i in range(40)])

    query = (
        df.writeStream.foreachBatch(batch_file_sink(sink))
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    with pytest.raises(Exception, match="was deleted and created again") as failed:
        query.awaitTermination(WAIT)
    message = str(failed.value)
    assert "topic 'reborn' was deleted and created again since this query read it" in message
    assert f"(its id was {old_id}, it is now {new_id})" in message
    assert "new checkpoint location" in message
    assert set(sink_rows(sink)) == old, "the query read the new topic from the old offsets"


def test_a_kafka_sources_options_fail_at_load_in_one_line_naming_this_sources_own(
    spark: Any, bootstrap: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Code written for ``format("kafka")`` hears at ``load()``, before any query starts, which
    option to use instead; uncaught, Spark's exception around the worker's traceback is shown
    as that one line (``register`` installed the hook)."""
    with pytest.raises(Exception) as raised:
        spark.readStream.format("coordinator").option("kafka.bootstrap.servers", bootstrap).option(
            "subscribe", "events"
        ).option("startingOffsets", "earliest").load()
    assert type(raised.value).__name__ == "AnalysisException"
    line = error_line(raised.value)
    assert line is not None, str(raised.value)
    assert line.startswith(
        "unknown options 'kafka.bootstrap.servers' (Kafka's; here: bootstrap), 'subscribe' "
        "(Kafka's; here: topics (or topic)) for format coordinator; the known options are "
        "bootstrap, "
    ), line
    sys.excepthook(type(raised.value), raised.value, raised.value.__traceback__)
    assert capsys.readouterr().err == f"format coordinator: {line}\n"


def test_the_stream_reader_takes_ids_for_a_checkpoint_written_without_them(
    bootstrap: str,
) -> None:
    """Checkpoints of the source before topic ids still restart: the offsets name no id, and the
    topic's current one is taken from then on. No Spark: the reader's planning alone."""
    create_topic(bootstrap, "idless", 1)
    produce(bootstrap, "idless", [f"i{i}" for i in range(5)])
    the_id = topic_id(bootstrap, "idless")
    reader = StreamReader({"bootstrap": bootstrap, "topic": "idless"})
    try:
        latest = reader.latestOffset({"idless": {"0": 2}}, ReadAllAvailable())
        assert latest == {"idless": {"id": str(the_id), "0": 5}}
        (planned,) = reader.partitions({"idless": {"0": 2}}, latest)
        assert isinstance(planned, OffsetRange) and (planned.start, planned.end) == (2, 5)
        other = str(uuid.UUID(int=the_id.int ^ 1))
        with pytest.raises(TopicRecreated, match="topic 'idless' was deleted"):
            reader.latestOffset({"idless": {"id": other, "0": 2}}, ReadAllAvailable())
        with pytest.raises(TopicRecreated):  # a batch planned before the topic was re-created
            reader.partitions({"idless": {"0": 2}}, {"idless": {"id": other, "0": 5}})
    finally:
        reader.stop()
    # offsets copied from a checkpoint into startingOffsets are checked too
    named = json.dumps({"idless": {"id": other, "0": 1}})
    copied = StreamReader({"bootstrap": bootstrap, "topic": "idless", "startingOffsets": named})
    try:
        with pytest.raises(TopicRecreated, match="topic 'idless'"):
            copied.initialOffset()
    finally:
        copied.stop()


def test_the_committer_does_not_move_a_new_topics_offsets_with_the_old_ones(bootstrap: str) -> None:
    """A batch's end offsets, read from a topic since deleted and created again, are not
    committed to the group: the commit names topics only, and would apply to the new one."""
    create_topic(bootstrap, "committed-reborn", 1)
    produce(bootstrap, "committed-reborn", [f"c{i}" for i in range(6)])
    old_id = str(topic_id(bootstrap, "committed-reborn"))
    batch_end: OffsetsJson = {"committed-reborn": {"id": old_id, "0": 6}}

    recreate_topic(bootstrap, "committed-reborn", 1)
    produce(bootstrap, "committed-reborn", [f"d{i}" for i in range(10)])
    with pytest.raises(TopicRecreated, match="topic 'committed-reborn' was deleted"):
        commit_group_offsets(bootstrap, "reborn-job", batch_end)
    with Cluster(bootstrap) as cluster:
        assert cluster.committed_offsets("reborn-job") == {}

    # offsets read from the new topic are committed
    new_id = str(topic_id(bootstrap, "committed-reborn"))
    commit_group_offsets(bootstrap, "reborn-job", {"committed-reborn": {"id": new_id, "0": 3}})
    assert [p["committed"] for p in describe_group(bootstrap, "reborn-job")["partitions"]] == [3]


def read_topic(spark: Any, bootstrap: str, topic: str) -> list[Any]:
    """Every record of ``topic``, by a batch read."""
    reader = spark.read.format("coordinator").option("bootstrap", bootstrap)
    return list(reader.option("topic", topic).load().collect())


def to_topic_with_the_sink(df: Any, bootstrap: str, topic: str) -> Any:
    writer = df.writeStream.format("coordinator").option("bootstrap", bootstrap)
    return writer.option("topic", topic)


def to_topic_in_foreach_batch(df: Any, bootstrap: str, topic: str) -> Any:
    def write(batch: Any, batch_id: int) -> None:
        writer = batch.write.format("coordinator").option("bootstrap", bootstrap)
        writer.option("topic", topic).mode("append").save()

    return df.writeStream.foreachBatch(write)


@pytest.mark.parametrize(
    "to_topic",
    [to_topic_with_the_sink, to_topic_in_foreach_batch],
    ids=["writeStream", "foreachBatch"],
)
def test_a_named_query_copies_a_topic_and_its_committer_moves_the_group(
    spark: Any, bootstrap: str, tmp_path: Path, to_topic: Callable[[Any, str, str], Any]
) -> None:
    """The README's pipeline with the committer finding its query by name, written both ways."""
    name = to_topic.__name__.replace("_", "-")
    source, target, group = f"{name}-in", f"{name}-out", f"{name}-job"
    create_topic(bootstrap, source, 2)
    create_topic(bootstrap, target, 2)
    produced = produce(bootstrap, source, [f"n{i}" for i in range(120)])
    committer = GroupOffsetCommitter(bootstrap, group, query_name=name)
    spark.streams.addListener(committer)
    try:
        df = stream(spark, bootstrap, source, group=group, maxRecordsPerTrigger="50")
        query = (
            to_topic(df.select("key", "value"), bootstrap, target)
            .queryName(name)
            .option("checkpointLocation", str(tmp_path / "checkpoint"))
            .trigger(availableNow=True)
            .start()
        )
        assert query.awaitTermination(WAIT), "the availableNow query did not finish"
        assert query.name == name
        committer.commit_last(query)
    finally:
        spark.streams.removeListener(committer)

    copied = read_topic(spark, bootstrap, target)
    assert all(r.key == b"key-" + r.value for r in copied)
    # both topics have two partitions and the sink partitions keys as the producer does
    assert sorted((r.partition, r.value.decode()) for r in copied) == sorted(
        (p, v) for p, _, v in produced
    )
    # the listener may still be delivering earlier batches' progress
    wait_until(
        lambda: (
            sum(p["committed"] or 0 for p in describe_group(bootstrap, group)["partitions"]) == 120
        ),
        "the group's offsets at the end of the query",
    )
    partitions = describe_group(bootstrap, group)["partitions"]
    assert {p["topic"] for p in partitions} == {source}
    assert [(p["committed"], p["lag"]) for p in partitions] == [(p["end"], 0) for p in partitions]


def test_a_batch_job_copies_a_topic_with_the_batch_writer(spark: Any, bootstrap: str) -> None:
    create_topic(bootstrap, "batch-in", 2)
    create_topic(bootstrap, "batch-out", 3)
    produced = produce(bootstrap, "batch-in", [f"w{i}" for i in range(60)])
    df = (
        spark.read.format("coordinator")
        .option("bootstrap", bootstrap)
        .option("topic", "batch-in")
        .load()
    )
    writer = df.select("key", "value").write.format("coordinator")
    writer.option("bootstrap", bootstrap).option("topic", "batch-out").mode("append").save()

    copied = read_topic(spark, bootstrap, "batch-out")
    assert sorted(r.value.decode() for r in copied) == sorted(v for _, _, v in produced)
    assert {r.partition for r in copied} == {0, 1, 2}
    assert all(r.key == b"key-" + r.value for r in copied)


def readme_spark_snippet() -> str:
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    spark_section = readme[readme.index("\n## Spark\n") :]
    start = spark_section.index("```python\n") + len("```python\n")
    return spark_section[start : spark_section.index("```\n", start)]


def test_the_readme_snippet_runs_as_written(spark: Any, bootstrap: str, tmp_path: Path) -> None:
    """Only the broker's address and the checkpoint directory are put in."""
    create_topic(bootstrap, "events", 2)
    create_topic(bootstrap, "totals", 1)
    produced = produce(bootstrap, "events", [f"v{i % 7}" for i in range(70)])
    assert len(produced) == 70
    code = readme_spark_snippet()
    assert "127.0.0.1:9092" in code and "/tmp/totals-checkpoint" in code
    code = code.replace("127.0.0.1:9092", bootstrap)
    code = code.replace("/tmp/totals-checkpoint", str(tmp_path / "checkpoint"))
    exec(compile(code, "README.md", "exec"), {})

    totals = read_topic(spark, bootstrap, "totals")
    counts: dict[bytes, int] = {}
    for row in totals:
        counts[row.key] = counts.get(row.key, 0) + int(row.value)
    assert counts == {f"key-v{i}".encode(): 10 for i in range(7)}
