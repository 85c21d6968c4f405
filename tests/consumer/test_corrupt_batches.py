"""A corrupt stored batch (a disk fault, or a log written before brokers checked what they
acknowledge): the consumer hands out the records before it, then raises one named exception
naming topic, partition and offset, at every ask, without fetching the batch for ever; a seek past
it goes on, and says so in the log. Against the simulated cluster, on the autojump clock."""

from __future__ import annotations

import logging
import struct
from pathlib import Path

import pytest
import trio
import trio.testing

from broker.log import CorruptSegment
from consumer import ConsumerSettings, CorruptBatch, open_consumer, open_producer
from consumer.fetcher import CORRUPT_ATTEMPTS
from coordinator.config import CoordinatorConfig
from protocol.batches import HEADER_SIZE, batch_spans, build_batch, encode_batch
from protocol.types import TopicPartition
from simulation import SimulatedCluster, open_simulated_cluster
from simulation.log import MemoryPartition

CONFIG = CoordinatorConfig(initial_rebalance_delay=1.0)
TP = TopicPartition(topic="t", partition=0)


async def produce(cluster: SimulatedCluster, values: list[bytes]) -> None:
    async with open_producer("simulated:9092", connect=cluster.connect_to) as producer:
        for value in values:
            await producer.enqueue("t", value)


async def store_unchecked(cluster: SimulatedCluster, payload: bytes) -> None:
    """Store ``payload`` as a broker that did not check records would have."""
    now_ms = round(trio.current_time() * 1000)
    await cluster.log.partitions[TP].append(payload, batch_spans(payload), now_ms)


async def damage(cluster: SimulatedCluster, how: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """One batch of one record at the log's end that no consumer can decode."""
    if how == "lengths":  # CRC-valid; its value length runs past its section (issue 30)
        section = struct.pack("<iii", 0, -1, 1000) + b"short"
        await store_unchecked(
            cluster, encode_batch(section, 1, first_timestamp_ms=-1, max_timestamp_ms=-1)
        )
    elif how == "unreadable":  # the broker cannot read it: Fetch answers CORRUPT_MESSAGE
        await store_unchecked(cluster, build_batch([b"d"]))
        real_read = MemoryPartition.read

        async def read(partition: MemoryPartition, offset: int, max_bytes: int) -> bytes:
            data = await real_read(partition, offset, max_bytes)
            if offset < 3:  # the read stops before the batch it cannot read
                end = [s.position for s in batch_spans(data) if s.base_offset == 3]
                return data[: end[0]] if end else data
            if offset > 3:
                return data
            raise CorruptSegment(f"batch at offset {offset} unreadable")

        monkeypatch.setattr(MemoryPartition, "read", read)
    else:  # a disk fault: a byte of a good batch's records changed after it was stored
        partition = cluster.log.partitions[TP]
        at = len(partition.data)
        await store_unchecked(
            cluster,
            encode_batch(
                struct.pack("<iii", 0, -1, 3) + b"bad",
                1,
                first_timestamp_ms=-1,
                max_timestamp_ms=-1,
            ),
        )
        partition.data[at + HEADER_SIZE + 12] ^= 0xFF


@pytest.mark.parametrize("how", ["lengths", "crc", "unreadable"])
async def test_a_corrupt_stored_batch_raises_a_named_error_until_sought_past(
    tmp_path: Path,
    autojump_clock: trio.testing.MockClock,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    how: str,
) -> None:
    settings = ConsumerSettings(auto_offset_reset="earliest")
    async with open_simulated_cluster(tmp_path, CONFIG) as cluster:
        await cluster.create_topic("t", partitions=1)
        await produce(cluster, [b"a", b"b", b"c"])
        await damage(cluster, how, monkeypatch)  # offset 3
        await produce(cluster, [b"e", b"f"])
        async with open_consumer(
            "simulated:9092", "g", topics={"t": 1}, settings=settings, connect=cluster.connect_to
        ) as consumer:
            (stream,) = consumer.streams_for("t")
            seen: list[bytes] = []
            with trio.fail_after(60), pytest.raises(CorruptBatch) as caught:
                async for record in stream:
                    seen.append(record.value)
            assert seen == [b"a", b"b", b"c"]  # everything before it
            error = caught.value
            after = None if how == "unreadable" else 4  # unknown when nothing of it was read
            assert (error.topic, error.partition, error.offset, error.next_offset) == (
                "t",
                0,
                3,
                after,
            )
            assert "t-0: the batch at offset 3 is corrupt" in str(error)

            await trio.sleep(600)  # the fetcher stopped there: no fetch of it for ever
            fetched_at_3 = [f for f in cluster.log.fetches if f[1] == TP and f[2] == 3]
            assert len(fetched_at_3) == CORRUPT_ATTEMPTS
            with pytest.raises(CorruptBatch):  # at every ask, not once and then skipped
                await stream.__anext__()

            with caplog.at_level(logging.WARNING, logger="consumer.client"):
                consumer.seek(TP, 4)
            assert any("skipped it, to offset 4" in r.getMessage() for r in caplog.records)
            with trio.fail_after(60):
                assert [(await stream.__anext__()).value for _ in range(2)] == [b"e", b"f"]
