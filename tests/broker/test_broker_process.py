"""A real broker process (``python -m cli serve``) with real files, driven by the producer
and by raw protocol requests."""

from __future__ import annotations

import os
import zlib
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import attrs
import pytest
import trio

from consumer import ProduceError, ProducerConfig, open_producer
from launch.processes import BrokerProcess, run_broker
from protocol import (
    CreateTopicRequest,
    CreateTopicResponse,
    ErrorCode,
    FetchRequest,
    FetchResponse,
    ListOffsetsRequest,
    ListOffsetsResponse,
    ProduceRequest,
    ProduceResponse,
)
from protocol.batches import Compression, batch_spans, read_batches, records_from_batches
from protocol.records import Record
from transport.channel import Channel
from transport.connect import connect_any, open_channel

pytestmark = pytest.mark.realtime

REQUEST_DEADLINE = 10.0


@asynccontextmanager
async def client(broker: BrokerProcess) -> AsyncIterator[Channel]:
    stream, _ = await connect_any([broker.address])
    async with open_channel(stream, client_id="test") as channel:
        yield channel


async def create_topic(channel: Channel, topic: str, partitions: int) -> None:
    with trio.fail_after(REQUEST_DEADLINE):
        response = await channel.request(CreateTopicRequest(topic=topic, partitions=partitions))
    assert isinstance(response, CreateTopicResponse)
    assert response.error_code is ErrorCode.NONE


async def fetch(channel: Channel, topic: str, partition: int, offset: int) -> FetchResponse:
    with trio.fail_after(REQUEST_DEADLINE):
        response = await channel.request(
            FetchRequest(topic=topic, partition=partition, offset=offset, max_bytes=64 * 1024)
        )
    assert isinstance(response, FetchResponse)
    return response


async def fetch_all(channel: Channel, topic: str, partition: int, start: int = 0) -> list[Record]:
    records: list[Record] = []
    offset = start
    while True:
        response = await fetch(channel, topic, partition, offset)
        assert response.error_code is ErrorCode.NONE
        fetched = records_from_batches(response.batches, offset)
        if not fetched:
            assert offset == response.high_watermark
            return records
        records.extend(fetched)
        offset = fetched[-1].offset + 1


def value(i: int) -> bytes:
    return (f"{i:08d}|".encode() + bytes(range(256)) * 2)[:100]


async def test_produce_and_fetch_round_trip(tmp_path: Path) -> None:
    async with run_broker(tmp_path / "data") as broker, client(broker) as channel:
        await create_topic(channel, "events", 3)
        sent: dict[tuple[int, int], Record] = {}
        async with open_producer([broker.address]) as producer:
            deliveries = []
            for i in range(600):
                key = None if i % 2 else f"user-{i % 7}".encode()
                record = Record(offset=-1, timestamp_ms=1_000_000 + i, key=key, value=value(i))
                delivery = await producer.enqueue(
                    "events", record.value, key, timestamp_ms=record.timestamp_ms
                )
                deliveries.append((delivery, record))
            for delivery, record in deliveries:
                partition, offset = await delivery.wait()
                sent[(partition, offset)] = attrs.evolve(record, offset=offset)
        # keyed records of one key share a partition
        by_key: dict[bytes, set[int]] = {}
        for (partition, _), record in sent.items():
            if record.key is not None:
                by_key.setdefault(record.key, set()).add(partition)
        assert all(len(partitions) == 1 for partitions in by_key.values())
        # and the one the documented hash picks, so another client can agree with it
        assert all(p == {zlib.crc32(key) % 3} for key, p in by_key.items())

        total = 0
        for partition in range(3):
            stored = await fetch_all(channel, "events", partition)
            total += len(stored)
            expected = [r for (p, _), r in sorted(sent.items()) if p == partition]
            assert stored == expected
            assert [r.offset for r in stored] == list(range(len(stored)))
        assert total == len(sent) == 600

        # the edges: at the high watermark nothing and NONE, past it OFFSET_OUT_OF_RANGE
        end = await fetch(channel, "events", 0, len(await fetch_all(channel, "events", 0)))
        assert (end.error_code, end.batches) == (ErrorCode.NONE, b"")
        past = await fetch(channel, "events", 0, end.high_watermark + 1)
        assert past.error_code is ErrorCode.OFFSET_OUT_OF_RANGE
        with trio.fail_after(REQUEST_DEADLINE):
            unknown = await channel.request(
                ProduceRequest(
                    topic="nope",
                    partition=0,
                    records=(Record(offset=-1, timestamp_ms=1, key=None, value=b"x"),),
                )
            )
            too_large = await channel.request(
                ProduceRequest(
                    topic="events",
                    partition=0,
                    records=(
                        Record(offset=-1, timestamp_ms=1, key=None, value=b"x" * (2 * 1024 * 1024)),
                    ),
                )
            )
            no_partition = await channel.request(ListOffsetsRequest(topic="events", partition=3))
        assert isinstance(unknown, ProduceResponse)
        assert unknown.error_code is ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
        assert isinstance(too_large, ProduceResponse)
        assert too_large.error_code is ErrorCode.MESSAGE_TOO_LARGE
        assert isinstance(no_partition, ListOffsetsResponse)
        assert no_partition.error_code is ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
        async with open_producer([broker.address]) as producer:
            with pytest.raises(ProduceError) as raised:
                await producer.send_and_wait("missing", b"x")
        assert raised.value.error_code is ErrorCode.UNKNOWN_TOPIC_OR_PARTITION


async def test_kill_9_loses_no_acknowledged_record_and_cuts_the_torn_tail(
    tmp_path: Path,
) -> None:
    data = tmp_path / "data"
    acknowledged: dict[int, bytes] = {}
    enough = trio.Event()
    async with run_broker(data, "--fsync", "always") as broker:
        async with client(broker) as channel:
            await create_topic(channel, "stream", 1)
        config = ProducerConfig(linger=0.001, delivery_timeout=1.0)

        async def produce(writer: int) -> None:
            for i in range(1_000_000):
                payload = f"w{writer}-{i}".encode().ljust(100, b".")
                _, offset = await producer.send_and_wait("stream", payload)
                acknowledged[offset] = payload
                if len(acknowledged) >= 2000:
                    enough.set()

        async with open_producer([broker.address], config=config) as producer:
            async with trio.open_nursery() as nursery:
                for writer in range(16):
                    nursery.start_soon(produce, writer)
                with trio.fail_after(60):
                    await enough.wait()
                await broker.kill()  # mid-stream: sends are in flight
                nursery.cancel_scope.cancel()
            producer.nursery.cancel_scope.cancel()

    (segment,) = sorted((data / "log" / "stream-0").glob("*.log"))
    # A kill -9 rarely tears a write(2) by itself; tear one the way a crash mid-write would: the
    # first half of a whole batch, its header saying more bytes follow than the file holds.
    on_disk = segment.read_bytes()
    last = batch_spans(on_disk)[-1]
    with open(segment, "ab") as f:
        f.write(on_disk[last.position : last.position + last.size // 2])
    torn_size = segment.stat().st_size

    async with run_broker(data, "--fsync", "always") as broker, client(broker) as channel:
        stored = await fetch_all(channel, "stream", 0)
        assert segment.stat().st_size < torn_size
        by_offset = {r.offset: r.value for r in stored}
        assert [r.offset for r in stored] == list(range(len(stored)))
        for offset, payload in acknowledged.items():
            assert by_offset.get(offset) == payload
        # the log goes on right after the last whole record
        async with open_producer([broker.address]) as producer:
            assert await producer.send_and_wait("stream", b"after") == (0, len(stored))


async def test_retention_removes_old_segments_and_moves_the_log_start(tmp_path: Path) -> None:
    data = tmp_path / "data"
    args = ("--segment-bytes", "2000", "--retention-bytes", "3000", "--retention-check-ms", "100")
    async with run_broker(data, *args) as broker, client(broker) as channel:
        await create_topic(channel, "old", 1)
        async with open_producer([broker.address]) as producer:
            for i in range(10):
                await trio.sleep(0)
                for j in range(10):
                    await producer.enqueue("old", value(i * 10 + j))
                await producer.flush()
        directory = data / "log" / "old-0"
        with trio.fail_after(20):  # the broker checks retention every 100 ms
            while True:
                segments = sorted(directory.glob("*.log"))
                response = await channel.request(ListOffsetsRequest(topic="old", partition=0))
                assert isinstance(response, ListOffsetsResponse)
                try:
                    on_disk = sum(os.path.getsize(s) for s in segments)
                except FileNotFoundError:  # retention removed one while we looked: look again
                    continue
                settled = segments == sorted(directory.glob("*.log"))  # no pass in between
                if settled and response.log_start_offset > 0 and on_disk < 3000 + 2000:
                    break
                await trio.sleep(0.05)
        assert response.high_watermark == 100
        start = response.log_start_offset
        assert int(segments[0].stem) == start
        assert on_disk >= 3000  # whole segments only, and never below the limit
        below = await fetch(channel, "old", 0, start - 1)
        assert below.error_code is ErrorCode.OFFSET_OUT_OF_RANGE
        assert below.log_start_offset == start
        kept = await fetch_all(channel, "old", 0, start)
        assert [r.value for r in kept] == [value(i) for i in range(start, 100)]


async def test_producer_rides_out_a_broker_restart(tmp_path: Path) -> None:
    data = tmp_path / "data"
    config = ProducerConfig(delivery_timeout=60.0, retry_backoff=0.1)
    acknowledged: dict[tuple[int, int], bytes] = {}
    async with run_broker(data) as broker:
        async with client(broker) as channel:
            await create_topic(channel, "t", 2)
        async with open_producer([broker.address], config=config) as producer:
            for i in range(10):
                acknowledged[await producer.send_and_wait("t", b"before-%d" % i)] = b"before-%d" % i
            await broker.kill()
            # sent while the broker is down: retried against fresh metadata until it is back
            deliveries = [
                (await producer.enqueue("t", b"during-%d" % i), b"during-%d" % i) for i in range(50)
            ]
            async with run_broker(data, "--port", str(broker.port)) as restarted:
                with trio.fail_after(60):
                    for delivery, sent_value in deliveries:
                        acknowledged[await delivery.wait()] = sent_value
                async with client(restarted) as channel:
                    stored = {
                        (p, r.offset): r.value
                        for p in range(2)
                        for r in await fetch_all(channel, "t", p)
                    }
    assert len(acknowledged) == 60
    for where, payload in acknowledged.items():
        assert stored[where] == payload


async def test_zstd_batches_are_stored_compressed_and_read_back_whole(tmp_path: Path) -> None:
    data = tmp_path / "data"
    events = [
        b'{"user": "user-%04d", "event": "click", "page": "/products/%d/details"}' % (i % 50, i)
        for i in range(5000)
    ]
    async with run_broker(data) as broker, client(broker) as channel:
        await create_topic(channel, "json", 1)
        config = ProducerConfig(compression=Compression.ZSTD)
        async with open_producer([broker.address], config=config) as producer:
            deliveries = [await producer.enqueue("json", event) for event in events]
            offsets = [(await d.wait())[1] for d in deliveries]
        assert offsets == list(range(len(events)))
        (segment,) = sorted((data / "log" / "json-0").glob("*.log"))
        stored = read_batches(segment.read_bytes())
        assert {b.compression for b in stored} == {Compression.ZSTD}
        assert segment.stat().st_size < sum(map(len, events)) / 5
        # the broker answers the stored bytes; the consumer side decompresses
        fetched: list[bytes | None] = []
        offset = 0
        while offset < len(events):
            response = await fetch(channel, "json", 0, offset)
            batches = read_batches(response.batches)
            assert {b.compression for b in batches} == {Compression.ZSTD}
            fetched += [v for b in batches for o, _, _, v in b if o >= offset]
            offset = batches[-1].next_offset
        assert fetched == events


async def test_a_clean_stop_leaves_an_index_per_segment_and_a_kill_9_loses_nothing(
    tmp_path: Path,
) -> None:
    data = tmp_path / "data"
    args = ("--segment-bytes", "20000")
    sent: list[bytes] = []
    async with run_broker(data, *args) as broker, client(broker) as channel:
        await create_topic(channel, "t", 1)
        async with open_producer([broker.address]) as producer:
            for i in range(30):
                for j in range(20):
                    sent.append(value(i * 20 + j))
                    await producer.enqueue("t", sent[-1])
                await producer.flush()
    directory = data / "log" / "t-0"
    segments = sorted(directory.glob("*.log"))
    assert len(segments) > 3
    assert sorted(directory.glob("*.index")) == [s.with_suffix(".index") for s in segments]

    async with run_broker(data, *args) as broker, client(broker) as channel:
        assert [r.value for r in await fetch_all(channel, "t", 0)] == sent
        async with open_producer([broker.address]) as producer:
            for i in range(5):
                sent.append(value(1000 + i))
                assert await producer.send_and_wait("t", sent[-1]) == (0, len(sent) - 1)
        await broker.kill()
    async with run_broker(data, *args) as broker, client(broker) as channel:
        assert [r.value for r in await fetch_all(channel, "t", 0)] == sent
