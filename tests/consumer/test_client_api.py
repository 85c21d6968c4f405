"""The consumer API a user of aiokafka or kafka-python expects, on the in-memory cluster and the
autojump clock: one iterator over everything, ``getmany``, ``seek`` and friends, ``pause`` /
``resume``, explicit commits, a listener object, and one naming of offset resets."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import trio
import trio.testing

from consumer import ConsumerSettings, RebalanceListener, open_consumer, open_producer
from consumer.admin import AdminError, OffsetAndTimestamp
from coordinator.config import CoordinatorConfig
from protocol.types import TopicPartition
from simulation import open_simulated_cluster
from tests.consumer.inmemory import open_in_memory_cluster

#: Where these tests start: they read what was produced before they joined.
EARLIEST = ConsumerSettings(auto_offset_reset="earliest")

CONFIG = CoordinatorConfig(initial_rebalance_delay=1.0)
A0, A1, B0, B1 = (TopicPartition(topic=t, partition=p) for t in "ab" for p in (0, 1))


async def test_async_for_over_the_consumer_reads_every_partition_it_owns_in_order(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with (
        open_in_memory_cluster(tmp_path, CONFIG, {"a": 2, "b": 2}) as net,
        open_consumer(
            "b:1", "g", settings=EARLIEST, topics=["a", "b"], connect=net.connect
        ) as consumer,
    ):
        assert [s.topic for s in consumer.streams] == ["a", "b"]
        seen: dict[TopicPartition, list[int]] = {}
        async for record in consumer:
            seen.setdefault(record.topic_partition, []).append(record.offset)
            assert record.value == f"{record.topic}/{record.partition}/{record.offset}".encode()
            if all(len(seen.get(tp, ())) >= 10 for tp in (A0, A1, B0, B1)):
                break
        assert all(offsets == list(range(len(offsets))) for offsets in seen.values())
        # asking for the next record finished the previous ones: what a commit would send
        assert consumer.consumed_offsets() == {
            tp: len(offsets) for tp, offsets in seen.items() if tp != record.topic_partition
        } | {record.topic_partition: record.offset}


async def test_getmany_hands_out_what_is_buffered_and_finishes_it_on_the_next_call(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with (
        open_in_memory_cluster(tmp_path, CONFIG, {"a": 2}) as net,
        open_consumer("b:1", "g", settings=EARLIEST, topics="a", connect=net.connect) as consumer,
    ):
        await consumer.assignment.wait_value(lambda a: len(a) == 2)
        await trio.sleep(2.0)
        got = await consumer.getmany(max_records=7)
        assert sum(len(records) for records in got.values()) == 7
        last = {tp: records[-1].offset for tp, records in got.items()}
        assert all(o == list(range(len(o))) for o in ([r.offset for r in v] for v in got.values()))
        assert consumer.consumed_offsets() == dict.fromkeys(consumer.assignment.value, 0)
        with trio.move_on_after(1.0):
            await consumer.getmany()
        assert consumer.consumed_offsets() == {tp: o + 1 for tp, o in last.items()} | {
            tp: 0 for tp in consumer.assignment.value if tp not in last
        }


async def test_seek_position_commit_and_committed(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    settings = ConsumerSettings(auto_offset_reset="earliest", auto_commit=False)
    async with (
        open_in_memory_cluster(tmp_path, CONFIG, {"a": 1}) as net,
        open_consumer("b:1", "g", topics="a", settings=settings, connect=net.connect) as consumer,
    ):
        first = await consumer.__anext__()
        assert (first.topic_partition, first.offset) == (A0, 0)
        assert consumer.position(A0) == 1
        await trio.sleep(3.0)  # 30 records exist
        consumer.seek(A0, 20)
        assert consumer.position(A0) == 20
        assert (await consumer.__anext__()).offset == 20
        assert consumer.position(A0) == 21

        consumer.seek_to_beginning()
        assert consumer.position(A0) is None  # resolved by the next ListOffsets
        assert (await consumer.__anext__()).offset == 0

        assert await consumer.committed(A0) is None
        await consumer.commit({A0: 17})
        assert await consumer.committed(A0) == 17
        await consumer.commit()  # the consumed offset, 0: a member's commit never goes back
        assert await consumer.committed(A0) == 17

        consumer.seek_to_end()
        end_at = trio.current_time()
        record = await consumer.__anext__()
        # the end at 4 s of virtual time: 40 records
        assert end_at == pytest.approx(4.0)
        assert record.offset == net.log.listed[-1] == 40
        with pytest.raises(ValueError, match="not assigned"):
            consumer.seek(TopicPartition(topic="zz", partition=0), 0)


async def test_a_paused_partition_is_neither_fetched_nor_handed_out_until_resumed(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with (
        open_in_memory_cluster(tmp_path, CONFIG, {"a": 2}) as net,
        open_consumer("b:1", "g", settings=EARLIEST, topics="a", connect=net.connect) as consumer,
    ):
        await consumer.assignment.wait_value(lambda a: len(a) == 2)
        last: dict[TopicPartition, int] = {}
        async for record in consumer:
            last[record.topic_partition] = record.offset
            if len(last) == 2 and min(last.values()) >= 4:
                break
        consumer.pause(A0)
        paused_at = trio.current_time()
        assert consumer.paused() == {A0}
        during = []
        with trio.move_on_after(5.0):
            async for record in consumer:
                during.append(record.topic_partition)
        assert during and set(during) == {A1}
        assert not [at for at, tp, _ in net.log.fetches if tp == A0 and at > paused_at]
        consumer.resume()
        async for record in consumer:
            if record.topic_partition == A0:
                assert record.offset == last[A0] + 1  # nothing skipped, nothing twice
                break


async def test_a_listener_object_hears_assignments(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    heard: list[tuple[float, frozenset[TopicPartition]]] = []

    class Listener(RebalanceListener):
        async def on_partitions_assigned(self, assigned: frozenset[TopicPartition]) -> None:
            heard.append((trio.current_time(), assigned))

    async with (
        open_in_memory_cluster(tmp_path, CONFIG, {"a": 2}) as net,
        open_consumer(
            "b:1", "g", settings=EARLIEST, topics="a", listener=Listener(), connect=net.connect
        ),
    ):
        await trio.sleep(2.0)
    assert heard == [(1.0, frozenset({A0, A1}))]


def test_offset_resets_are_earliest_and_latest_and_the_old_names_warn() -> None:
    assert ConsumerSettings(auto_offset_reset="earliest").auto_offset_reset == "earliest"
    assert ConsumerSettings(auto_offset_reset="latest").auto_offset_reset == "latest"
    with pytest.warns(DeprecationWarning, match="say 'earliest'"):
        assert ConsumerSettings(auto_offset_reset="smallest").auto_offset_reset == "earliest"
    with pytest.warns(DeprecationWarning, match="say 'latest'"):
        assert ConsumerSettings(auto_offset_reset="largest").auto_offset_reset == "latest"
    with pytest.raises(ValueError, match="'earliest' or 'latest'"):
        ConsumerSettings(auto_offset_reset="beginning")


async def test_headers_and_serializers_go_from_producer_to_consumer(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with open_simulated_cluster(tmp_path, CONFIG) as cluster:
        await cluster.create_topic("a", partitions=1)
        async with open_producer(
            "simulated:9092",
            connect=cluster.connect_to,
            key_serializer=str.encode,
            value_serializer=lambda v: json.dumps(v).encode(),
        ) as producer:
            sent = await producer.send_and_wait(
                "a", {"n": 1}, key="user-1", headers=[("trace", b"abc"), ("retry", None)]
            )
            delivery = await producer.send("a", {"n": 2}, key="user-2")  # aiokafka's future
            assert await delivery == (0, 1)
        assert sent == (0, 0)
        async with open_consumer(
            "simulated:9092", "g", settings=EARLIEST, topics="a", connect=cluster.connect_to
        ) as c:
            first, second = await c.__anext__(), await c.__anext__()
        assert (first.key, first.value, first.headers) == (
            b"user-1",
            b'{"n": 1}',
            (("trace", b"abc"), ("retry", None)),
        )
        assert (second.key, second.headers) == (b"user-2", ())
        (stored_first, _) = cluster.log.records("a", 0)
        assert stored_first.value == b'{"n": 1}'

        # A consumer with deserializers reads back what was sent, through both ways of reading.
        settings = ConsumerSettings(
            auto_offset_reset="earliest",
            key_deserializer=bytes.decode,
            value_deserializer=json.loads,
        )
        async with open_consumer(
            "simulated:9092", "h", topics="a", settings=settings, connect=cluster.connect_to
        ) as c:
            first = await c.__anext__()
            rest = await c.getmany()
        assert (first.key, first.value) == ("user-1", {"n": 1})
        assert [(r.key, r.value) for r in rest[A0]] == [("user-2", {"n": 2})]


async def test_offsets_for_times_finds_where_a_time_begins_and_seek_goes_on_from_there(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    """aiokafka's ``offsets_for_times``: the earliest offset at least that late, with its
    timestamp, for assigned partitions and others alike; None where no record is that late."""
    settings = ConsumerSettings(auto_commit=False)
    async with (
        open_in_memory_cluster(tmp_path, CONFIG, {"a": 2, "b": 1}) as net,
        open_consumer("b:1", "g", topics="a", settings=settings, connect=net.connect) as consumer,
    ):
        await consumer.assignment.wait_value(lambda a: len(a) == 2)
        await trio.sleep(3.0)  # 30 records and more in each partition, one every 100 ms
        due = net.log.due_ms
        found = await consumer.offsets_for_times({A0: due(12), A1: due(12) - 1, B0: due(5) + 1})
        assert found == {
            A0: OffsetAndTimestamp(offset=12, timestamp=due(12)),
            A1: OffsetAndTimestamp(offset=12, timestamp=due(12)),
            B0: OffsetAndTimestamp(offset=6, timestamp=due(6)),  # not assigned here
        }
        assert await consumer.offsets_for_times({A0: due(10_000)}) == {A0: None}
        consumer.seek(A0, 12)
        async for record in consumer:
            if record.topic_partition == A0:
                assert record.offset == 12
                break
        with pytest.raises(ValueError, match="timestamp"):
            await consumer.offsets_for_times({A0: -1})
        with pytest.raises(AdminError, match="no such topic"):
            await consumer.offsets_for_times({TopicPartition(topic="zz", partition=0): 0})
