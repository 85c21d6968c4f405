"""The ``coordinator`` data source: batch and streaming reads of topics, and writes to one.

The driver plans (metadata, log bounds, the group's offsets); each Spark input partition is one
topic partition's offset range, read by a Spark task straight from the broker that holds it, so
executors fetch partitions in parallel. Offsets are ``pipeline.offsets`` JSON maps, which name
the id of each topic they were taken from: a topic deleted and created again under its name
fails the query (``pipeline.offsets.TopicRecreated``) instead of being read from the old one's
offsets, also after a restart from the checkpoint. Every Fetch names the id too, so a task
reading while the topic is re-created gets nothing of the new one.

Group offsets are not committed here: ``DataSourceStreamReader.commit`` runs one batch late and
not at all for the last batch under ``availableNow``. ``pipeline.commits`` commits each finished
micro-batch's end offsets from the driver instead.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import attrs
import pyarrow as pa
from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    DataSourceWriter,
    InputPartition,
    WriterCommitMessage,
)
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import StructType

from pipeline import offsets as om
from pipeline.arrow import ARROW_SCHEMA, arrow_batch
from pipeline.sink import TopicWriter
from pipeline.wire import Cluster, PipelineError, Placement, check_options, client_security
from protocol import NO_TOPIC_ID, ErrorCode, TopicPartition
from protocol.batches import read_batches
from transport.security import ClientSecurity

SCHEMA = "topic string, partition int, offset long, key binary, value binary, timestamp timestamp"
DEFAULT_BOOTSTRAP = "127.0.0.1:9092"
#: Bytes asked for per Fetch; the broker caps a response at 2 MiB.
FETCH_BYTES = 1024 * 1024
#: A read's options, as documented (besides the security options of ``pipeline.wire``).
READ_OPTIONS = (
    "bootstrap",
    "topic",
    "topics",
    "pattern",
    "group",
    "startingOffsets",
    "endingOffsets",
    "minPartitions",
    "maxRecordsPerTrigger",
)
#: A write's options. The last two are Spark's own, which it hands to a streaming sink with the
#: user's: PySpark's ``DataStreamWriter.queryName`` (pyspark/sql/streaming/readwriter.py) calls
#: the JVM writer's, which keeps the name among the query's options (``extraOptions +=
#: ("queryName" -> ...)`` in Spark's sql/core .../classic/DataStreamWriter.scala, as
#: ``checkpointLocation`` is kept), and ``startQuery`` gives those options to the sink's write,
#: whose options pyspark/sql/worker/write_into_data_source.py passes to the DataSource. A batch
#: write gets only the user's. ``path`` (from ``start(path)`` or ``save(path)``) is not accepted:
#: this sink writes to ``topic``, and a path it ignored would be a mistake passed over.
WRITE_OPTIONS = ("bootstrap", "topic", "checkpointLocation", "queryName")


@attrs.frozen(kw_only=True)
class OffsetRange(InputPartition):
    """One Spark task: records [start, end) of one partition, from the broker holding it."""

    placement: Placement
    """Where the partition's leader was when planned: a first guess."""
    start: int
    end: int
    security: ClientSecurity | None = None
    bootstrap: str = ""
    """Whom to ask where the leader is if the planned one no longer leads the partition
    (empty: the planned one)."""


class CoordinatorDataSource(DataSource):
    """``spark.read.format("coordinator")`` / ``spark.readStream`` / ``df.write`` (see README)."""

    @classmethod
    def name(cls) -> str:
        return "coordinator"

    def schema(self) -> str:
        # Spark asks for the schema as ``load()`` runs: an option neither a read nor a write
        # takes (a Kafka source's, a misspelt one) fails there, before any query starts.
        check_options(self.options, (*READ_OPTIONS, *WRITE_OPTIONS), "format coordinator")
        return SCHEMA

    def reader(self, schema: StructType) -> DataSourceReader:
        return BatchReader(dict(self.options))

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return StreamReader(dict(self.options))

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        return BatchWriter(dict(self.options))

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        return StreamWriter(dict(self.options))


class _Planner:
    """What the driver asks the cluster: the partitions a read covers and their bounds."""

    def __init__(self, options: dict[str, str]) -> None:
        check_options(options, READ_OPTIONS, "reading format coordinator")
        # Spark hands the options over with lowercased keys
        self.options = {key.lower(): value for key, value in options.items()}
        self.bootstrap = options.get("bootstrap", DEFAULT_BOOTSTRAP)
        self.selector = om.TopicSelector(self.options)
        self.group = options.get("group") or None
        self.security = client_security(self.options)

    def placements(self, cluster: Cluster) -> dict[TopicPartition, Placement]:
        """The partitions to read; PipelineError if a topic named by ``topic``/``topics`` does
        not exist (a pattern may match none)."""
        names = self.selector.names
        found = cluster.placements(list(names) if names is not None else None)
        missing = sorted(set(names or ()) - {tp.topic for tp in found})
        if missing:
            raise PipelineError(
                f"topic {', '.join(map(repr, missing))} does not exist at {self.bootstrap}"
            )
        return {tp: p for tp, p in found.items() if self.selector.matches(tp.topic)}

    def check_named_ids(self, spec: str, placements: dict[TopicPartition, Placement]) -> None:
        """TopicRecreated if an offset map given as an option (copied from a checkpoint or a
        progress report) names a topic id the topic no longer has."""
        if spec.strip().startswith("{"):
            om.carry_ids(om.ids_from_json(spec), topic_ids(placements))

    def resolve_start(
        self,
        cluster: Cluster,
        placements: dict[TopicPartition, Placement],
        bounds: dict[TopicPartition, tuple[int, int]],
        default: str,
    ) -> om.Offsets:
        spec = self.options.get("startingoffsets") or default
        self.check_named_ids(spec, placements)
        if spec == "group" and self.group is None:
            raise om.OptionError("startingOffsets=group needs the group option")
        committed = cluster.committed_offsets(self.group) if spec == "group" and self.group else {}
        return om.starting_offsets(spec, bounds, committed)

    def input_partitions(
        self,
        placements: dict[TopicPartition, Placement],
        start: dict[TopicPartition, int],
        end: dict[TopicPartition, int],
    ) -> list[OffsetRange]:
        wanted = [r for r in om.ranges(start, end) if r[0] in placements]
        min_partitions = self.options.get("minpartitions")
        if min_partitions:
            wanted = om.split(wanted, int(min_partitions))
        return [
            OffsetRange(
                placement=placements[tp],
                start=first,
                end=until,
                security=self.security,
                bootstrap=self.bootstrap,
            )
            for tp, first, until in wanted
        ]


class BatchReader(DataSourceReader):
    """A bounded read: ``startingOffsets`` (default earliest) to ``endingOffsets`` (default
    latest, or a JSON map)."""

    def __init__(self, options: dict[str, str]) -> None:
        self.planner = _Planner(options)

    def partitions(self) -> Sequence[InputPartition]:
        with Cluster(self.planner.bootstrap, self.planner.security) as cluster:
            placements = self.planner.placements(cluster)
            bounds = cluster.log_bounds(placements.values())
            start = self.planner.resolve_start(cluster, placements, bounds, "earliest")
        end = {tp: e for tp, (_, e) in bounds.items()}
        ending = self.planner.options.get("endingoffsets", "latest")
        if ending != "latest":
            self.planner.check_named_ids(ending, placements)
            named = om.from_json(ending)
            end = {tp: min(named.get(tp, e), e) for tp, e in end.items()}
        return self.planner.input_partitions(placements, start, end)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, OffsetRange)
        return read_range(partition)


class StreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Micro-batches of every partition the topics have at each trigger (new partitions and,
    with ``pattern``, new topics included), capped by ``maxRecordsPerTrigger``."""

    def __init__(self, options: dict[str, str]) -> None:
        self.planner = _Planner(options)
        limit = self.planner.options.get("maxrecordspertrigger")
        self.max_rows = int(limit) if limit else None
        self._target: om.Offsets | None = None
        self._placements: dict[TopicPartition, Placement] = {}
        self._cluster: Cluster | None = None

    @property
    def cluster(self) -> Cluster:
        if self._cluster is None:
            self._cluster = Cluster(self.planner.bootstrap, self.planner.security)
        return self._cluster

    def _bounds(self) -> dict[TopicPartition, tuple[int, int]]:
        self._placements = self.planner.placements(self.cluster)
        return self.cluster.log_bounds(self._placements.values())

    @property
    def _ids(self) -> om.TopicIds:
        return topic_ids(self._placements)

    def initialOffset(self) -> om.OffsetsJson:
        default = "group" if self.planner.group else "latest"
        bounds = self._bounds()
        start = self.planner.resolve_start(self.cluster, self._placements, bounds, default)
        return om.to_json(start, self._ids)

    def prepareForTriggerAvailableNow(self) -> None:
        self._target = {tp: end for tp, (_, end) in self._bounds().items()}

    def getDefaultReadLimit(self) -> ReadLimit:
        return ReadMaxRows(self.max_rows) if self.max_rows else ReadAllAvailable()

    def latestOffset(self, start: om.OffsetsJson, limit: ReadLimit) -> om.OffsetsJson:
        previous = om.from_json(start)
        bounds = self._bounds()
        ids = om.carry_ids(om.ids_from_json(start), self._ids)  # TopicRecreated: the query fails
        ends = {tp: end for tp, (_, end) in bounds.items()}
        if self._target is not None:
            # partitions that appeared after the target was taken have nothing to read this run
            ends = {tp: min(end, self._target.get(tp, 0)) for tp, end in ends.items()}
        # a partition new since the last batch starts at its log start, never before it
        first = {tp: previous.get(tp, log_start) for tp, (log_start, _) in bounds.items()}
        ends = {tp: max(end, first[tp]) for tp, end in ends.items()}
        if isinstance(limit, ReadMaxRows):
            ends = om.limit_ends(first, ends, limit.max_rows)
        # a partition that is gone from the metadata keeps its last offset (and its topic's id)
        return om.to_json({**previous, **ends}, ids)

    def reportLatestOffset(self) -> om.OffsetsJson | None:
        bounds = self._bounds()
        return om.to_json({tp: end for tp, (_, end) in bounds.items()}, self._ids)

    def partitions(self, start: om.OffsetsJson, end: om.OffsetsJson) -> Sequence[InputPartition]:
        first, until = om.from_json(start), om.from_json(end)
        if not until.keys() <= self._placements.keys():
            self._bounds()  # a restart from a checkpoint plans before any latestOffset
        om.carry_ids(om.ids_from_json(end), self._ids)  # a batch planned before a re-creation
        return self.planner.input_partitions(self._placements, first, until)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, OffsetRange)
        return read_range(partition)

    def commit(self, end: om.OffsetsJson) -> None:
        """Nothing: group offsets are committed from the driver (``pipeline.commits``)."""

    def stop(self) -> None:
        if self._cluster is not None:
            self._cluster.close()
            self._cluster = None


def topic_ids(placements: dict[TopicPartition, Placement]) -> om.TopicIds:
    """The id of each topic of ``placements`` whose broker gave one."""
    return {p.topic: p.topic_id for p in placements.values() if p.topic_id != NO_TOPIC_ID}


def read_range(task: OffsetRange) -> Iterator[pa.RecordBatch]:
    """Fetch [start, end) of one partition from its leader (the planned broker, or the one the
    metadata names once that one answers a leader code), one Arrow batch per Fetch response.

    Records below the log start (deleted by retention since the batch was planned) are skipped;
    a topic deleted since (UNKNOWN_TOPIC_ID: the Fetch names its id) fails the task.
    """
    p = task.placement
    offset = task.start
    with Cluster(task.bootstrap or f"{p.host}:{p.port}", task.security) as cluster:
        while offset < task.end:
            response = cluster.fetch(p, offset, FETCH_BYTES)
            if response.error_code is ErrorCode.OFFSET_OUT_OF_RANGE and (
                offset < response.log_start_offset
            ):
                offset = response.log_start_offset
                continue
            if response.error_code is ErrorCode.UNKNOWN_TOPIC_ID:
                raise om.TopicRecreated(p.topic, p.topic_id, None)
            if response.error_code is not ErrorCode.NONE:
                raise RuntimeError(
                    f"fetch {p.topic}-{p.partition} at {offset}: {response.error_code.name}"
                )
            batches = read_batches(response.batches)
            arrow = arrow_batch(p.topic, p.partition, batches, offset, task.end)
            if arrow is None:
                if response.high_watermark <= offset:
                    raise RuntimeError(
                        f"{p.topic}-{p.partition} ends at {response.high_watermark}, "
                        f"before the planned {task.end}"
                    )
                continue
            offset = min(task.end, batches[-1].next_offset)
            yield arrow


__all__ = ["ARROW_SCHEMA", "SCHEMA", "CoordinatorDataSource", "read_range"]


@attrs.frozen(kw_only=True)
class Written(WriterCommitMessage):
    """What one write task acknowledged."""

    records: int


class BatchWriter(DataSourceWriter):
    """``df.write.format("coordinator").option("topic", T).mode("append").save()``."""

    def __init__(self, options: dict[str, str]) -> None:
        check_options(options, WRITE_OPTIONS, "writing format coordinator")
        self.options = options

    def write(self, iterator: Iterator[Any]) -> WriterCommitMessage:
        return Written(records=TopicWriter.from_options(self.options).write_rows(iterator))


class StreamWriter(DataSourceStreamWriter):
    """``writeStream.format("coordinator")``: at least once (a retried batch is produced again)."""

    def __init__(self, options: dict[str, str]) -> None:
        check_options(options, WRITE_OPTIONS, "writing format coordinator")
        self.options = options

    def write(self, iterator: Iterator[Any]) -> WriterCommitMessage:
        return Written(records=TopicWriter.from_options(self.options).write_rows(iterator))

    def commit(self, messages: list[Any], batchId: int) -> None:
        """Nothing to do: every record was acknowledged before its task finished."""
