"""The simulated broker's log answers every Produce, Fetch and ListOffsets exactly as the real
broker's log does over its files: the same requests, side by side, get the same answers (record
timestamps aside: the append time is wall-clock on one, virtual on the other)."""

from __future__ import annotations

import uuid
from pathlib import Path

import attrs
import trio
import trio.testing

from broker.data_plane import DataPlaneLog
from coordinator.config import CoordinatorConfig
from protocol import (
    ErrorCode,
    FetchRequest,
    FetchResponse,
    ListOffsetsRequest,
    ListOffsetsResponse,
    ProduceRequest,
    Request,
    ResponseMessage,
)
from protocol.batches import batch_spans, build_batch, read_batches
from protocol.records import Record
from protocol.types import NO_TOPIC_ID, TopicId
from simulation import MemoryLog, open_simulated_cluster
from store import TopicPlacement
from tests.broker import test_hostile_batches as hostile
from tests.broker.test_hostile_batches import open_log

#: A CRC-valid batch whose value length runs past its records section.
POISONED = hostile.POISONED["value past its section"]
GOOD = build_batch([b"a", b"b"], keys=[b"k", None])
#: One topic of one partition, for a memory log alone.
PLACEMENT = {"t": TopicPlacement(topic="t", brokers=(1,), topic_id=uuid.uuid4())}
#: An id no topic has.
OTHER_ID = uuid.UUID(int=1)


def produce(batches: bytes = b"", records: tuple[Record, ...] = (), partition: int = 0) -> Request:
    message = ProduceRequest(topic="t", partition=partition, records=records, batches=batches)
    return Request(correlation_id=0, message=message)


def fetch(
    offset: int,
    max_bytes: int = 1 << 20,
    version: int = 1,
    topic: str = "t",
    topic_id: TopicId = NO_TOPIC_ID,
) -> Request:
    message = FetchRequest(
        topic=topic, partition=0, offset=offset, max_bytes=max_bytes, topic_id=topic_id
    )
    return Request(correlation_id=0, message=message, api_version=version)


def list_offsets(topic: str = "t") -> Request:
    return Request(correlation_id=0, message=ListOffsetsRequest(topic=topic, partition=0))


def v0(value: bytes) -> Record:
    return Record(offset=0, timestamp_ms=5, key=None, value=value)


#: What each step sends; in order, on one partition.
STEPS = [
    produce(GOOD),
    produce(POISONED),  # refused: no consumer could decode it
    produce(GOOD + POISONED),  # nothing of the request written
    produce(b"\x00" * 70),  # not a batch
    produce(build_batch([b"x" * (1024 * 1024)])),  # past LogConfig.max_batch_bytes
    produce(records=(v0(b"c"), v0(b"d"))),  # version 0: records
    produce(GOOD, records=(v0(b"e"),)),  # both: invalid
    produce(),  # nothing: the log's end
    produce(GOOD, partition=1),  # no such partition
    produce(GOOD, partition=-1),
    fetch(0, max_bytes=0),  # one whole batch whatever max_bytes says
    fetch(1),  # from inside a batch: the whole batch
    fetch(2, max_bytes=1),
    fetch(4),  # the high watermark: nothing
    fetch(5),  # past it
    fetch(-1),
    fetch(0, version=0),  # records, as many as max_bytes holds, one at least
    fetch(1, max_bytes=1, version=0),
    fetch(0, topic="u"),
    fetch(0, version=2, topic_id=OTHER_ID),  # another incarnation: nothing served
    fetch(0, version=2, topic="u", topic_id=OTHER_ID),
    list_offsets(),
    list_offsets("u"),
    list_offsets("bad/name"),
]


def comparable(answer: ResponseMessage | None) -> object:
    """The answer with its append-time stamps taken out."""
    if isinstance(answer, FetchResponse):
        batches = [
            [(offset, key, value) for offset, _, key, value in batch]
            for batch in read_batches(answer.batches)
        ]
        records = [attrs.evolve(r, timestamp_ms=0) for r in answer.records]
        return attrs.evolve(answer, batches=b"", records=tuple(records)), batches
    return answer


async def answers(log: DataPlaneLog) -> list[object]:
    return [comparable(await log(request)) for request in STEPS]


async def test_the_memory_log_answers_as_the_broker_log_does(tmp_path: Path) -> None:
    async with open_log(tmp_path) as files:
        expected = await answers(files)
        memory = MemoryLog(placement=files.placement, broker_id=files.broker_id)
    assert await answers(memory) == expected
    fetched = [a[0] for a in expected if isinstance(a, tuple)]
    refused = [a for a in fetched if a.error_code is ErrorCode.UNKNOWN_TOPIC_ID]
    assert len(refused) == 2
    assert [r.value for r in memory.records("t", 0)] == [b"a", b"b", b"c", b"d"]


async def test_the_memory_log_stamps_virtual_milliseconds_and_logs_each_fetch(
    autojump_clock: trio.testing.MockClock,
) -> None:
    memory = MemoryLog(placement=PLACEMENT)
    await trio.sleep(1.5)
    await memory(produce(GOOD))
    await trio.sleep(1.0)
    await memory(fetch(1))
    assert [(r.offset, r.timestamp_ms) for r in memory.records("t", 0)] == [(0, 1500), (1, 1500)]
    (stored,) = memory.partitions.values()
    assert [s.max_timestamp_ms for s in batch_spans(stored.data)] == [1500]
    assert [(at, tp.topic, offset) for at, tp, offset in memory.fetches] == [(2.5, "t", 1)]


async def test_a_stored_batch_no_consumer_can_decode_is_answered_alike(tmp_path: Path) -> None:
    """A batch stored before brokers checked what they acknowledge: version 1 hands it on (the
    consumer names it), version 0 cannot make records of it and answers CORRUPT_MESSAGE."""
    async with open_log(tmp_path) as files:
        memory = MemoryLog(placement=PLACEMENT, broker_id=files.broker_id)
        got: list[list[ResponseMessage | None]] = []
        for log in (files, memory):
            partition = await log.partition("t", 0)
            assert partition is not None
            await partition.append(POISONED, batch_spans(POISONED), 0)  # stamped alike
            got.append([await log(fetch(0, version=v)) for v in (0, 1)])
    assert got[0] == got[1]
    version0, version1 = got[1]
    assert isinstance(version0, FetchResponse) and isinstance(version1, FetchResponse)
    assert (version0.error_code, version0.records) == (ErrorCode.CORRUPT_MESSAGE, ())
    assert (version1.error_code, len(version1.batches)) == (ErrorCode.NONE, len(POISONED))


async def _fetched(log: DataPlaneLog, request: Request) -> FetchResponse:
    answer = await log(request)
    assert isinstance(answer, FetchResponse)
    return answer


async def test_a_deleted_topic_leaves_the_memory_log_and_one_created_again_starts_empty() -> None:
    """As the broker's log does (tests/broker/test_topic_ids.py): nothing of an incarnation
    outlives it, whether the watch shows the delete, or the delete and the re-creation at once."""
    first = PLACEMENT["t"]
    memory = MemoryLog(placement=PLACEMENT)
    await memory(produce(GOOD))
    memory.follow({})  # deleted
    assert memory.records("t", 0) == [] and memory.partitions == {}
    gone = await _fetched(memory, fetch(0))
    assert gone.error_code is ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    memory.follow(PLACEMENT)
    await memory(produce(GOOD))
    second = TopicPlacement(topic="t", brokers=(1,), topic_id=uuid.uuid4())
    memory.follow({"t": second})  # deleted and created again, seen as one change
    assert memory.records("t", 0) == []
    empty = await _fetched(memory, fetch(0))
    assert (empty.error_code, empty.high_watermark) == (ErrorCode.NONE, 0)
    refused = await _fetched(memory, fetch(0, version=2, topic_id=first.topic_id))
    assert refused.error_code is ErrorCode.UNKNOWN_TOPIC_ID
    await memory(produce(build_batch([b"new"])))
    assert [r.value for r in memory.records("t", 0)] == [b"new"]


async def test_the_simulated_cluster_feeds_its_log_the_topic_watch(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with open_simulated_cluster(tmp_path, CoordinatorConfig()) as cluster:
        await cluster.create_topic("t", partitions=2)
        cluster.produce("t", records=3)
        assert cluster.log.high_watermark("t", 1) == 3
        assert await cluster.delete_topic("t") is ErrorCode.NONE
        assert cluster.log.records("t", 1) == []
        await cluster.create_topic("t", partitions=2)
        assert cluster.log.high_watermark("t", 1) == 0
        cluster.produce("t", records=1)
        assert [r.offset for r in cluster.log.records("t", 1)] == [0]


def by_time(timestamp_ms: int, topic: str = "t") -> Request:
    message = ListOffsetsRequest(topic=topic, partition=0, timestamp_ms=timestamp_ms)
    return Request(correlation_id=0, message=message, api_version=1)


#: Producer timestamps, out of order within a batch and across batches, at offsets 0-6.
TIMED = [(300, 100, 200), (150,), (500, 400), (450,)]


async def test_lookups_by_time_answer_alike_with_the_earliest_offset_that_late(
    tmp_path: Path,
) -> None:
    """ListOffsets 1 (SPEC.md §8, 2): the first offset whose record's timestamp is at least the
    one asked, not the first record written after it; -1 and -1 when none is; -1 asks nothing;
    other negative timestamps are refused."""
    asked = [0, 100, 150, 201, 300, 301, 450, 451, 500, 501, -1, -2]
    got: list[list[object]] = []
    async with open_log(tmp_path) as files:
        memory = MemoryLog(placement=files.placement, broker_id=files.broker_id)
        for log in (files, memory):
            for stamps in TIMED:
                values = [str(s).encode() for s in stamps]
                await log(produce(build_batch(values, timestamps_ms=stamps)))
            answers = [await log(by_time(t)) for t in asked]
            assert all(isinstance(a, ListOffsetsResponse) for a in answers)
            got.append([(a.error_code, a.offset, a.timestamp_ms) for a in answers])  # type: ignore[union-attr]
            got[-1].append(await log(by_time(0, topic="u")))
    assert got[0] == got[1]
    none = (ErrorCode.NONE, -1, -1)
    assert got[0][:-1] == [
        (ErrorCode.NONE, 0, 300),  # 0
        (ErrorCode.NONE, 0, 300),  # 100: offset 1 is 100, but offset 0 is later still
        (ErrorCode.NONE, 0, 300),
        (ErrorCode.NONE, 0, 300),
        (ErrorCode.NONE, 0, 300),
        (ErrorCode.NONE, 4, 500),  # 301
        (ErrorCode.NONE, 4, 500),  # 450: offset 6 is 450, but offset 4 comes first
        (ErrorCode.NONE, 4, 500),
        (ErrorCode.NONE, 4, 500),
        none,  # 501: no record that late
        none,  # -1: no lookup asked
        (ErrorCode.INVALID_REQUEST, -1, -1),
    ]
    assert got[0][-1] == ListOffsetsResponse(
        error_code=ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, log_start_offset=-1, high_watermark=-1
    )
