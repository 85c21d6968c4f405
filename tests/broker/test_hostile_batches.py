"""What a producer's batches can do to the broker's data plane (issue 30): a batch a consumer
could not decode is refused with nothing of its request written, and a batch that claims a
million records (legitimately: they are empty) costs a version-0 Fetch no more decoding than its
limit, under the broker's one decompression budget."""

from __future__ import annotations

import struct
import threading
import tracemalloc
import zlib
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
import trio
import trio.testing

import broker.data_plane
import protocol.batches
import protocol.records
from broker.data_plane import MAX_FETCH_BYTES, BrokerLog, open_broker_log
from broker.log import FsyncPolicy, LogConfig
from protocol import ErrorCode, FetchRequest, FetchResponse, ProduceRequest, ProduceResponse
from protocol.batches import (
    HEADERS,
    BatchSpan,
    Compression,
    build_batch,
    encode_batch,
    read_batches,
    records_from_batches,
)
from protocol.records import RECORD_OVERHEAD, record_size
from protocol.types import BrokerInfo
from store.embedded import open_embedded_store

MILLION = 1_000_000


@asynccontextmanager
async def open_log(tmp_path: Path) -> AsyncIterator[BrokerLog]:
    async with open_embedded_store(tmp_path / "metadata") as store:
        await store.register_broker(BrokerInfo(broker_id=1, host="memory", port=9092))
        await store.create_topic("t", (1,))
        config = LogConfig(fsync=FsyncPolicy.NEVER)
        async with open_broker_log(store, 1, tmp_path, config) as log:
            yield log


async def produce(log: BrokerLog, batches: bytes) -> ProduceResponse:
    return await log.produce(ProduceRequest(topic="t", partition=0, records=(), batches=batches))


async def fetch(log: BrokerLog, offset: int, max_bytes: int, version: int) -> FetchResponse:
    request = FetchRequest(topic="t", partition=0, offset=offset, max_bytes=max_bytes)
    return await log.fetch(request, version)


def section_batch(section: bytes, count: int, codec: Compression = Compression.NONE) -> bytes:
    """A CRC-valid batch around whatever section: a producer can make any bytes CRC-valid."""
    return encode_batch(
        section, count, first_timestamp_ms=-1, max_timestamp_ms=-1, compression=codec
    )


def with_headers(block: bytes) -> bytes:
    """One record whose headers block is ``block``."""
    section = struct.pack("<iii", 0, -1, 1) + b"v" + struct.pack("<i", len(block)) + block
    batch = bytearray(section_batch(section, 1))
    struct.pack_into(">h", batch, 25, 0x08 | HEADERS)
    struct.pack_into(">I", batch, 20, zlib.crc32(bytes(batch[24:])))
    return bytes(batch)


POISONED = {
    # the case: a value length that runs past the section
    "value past its section": section_batch(struct.pack("<iii", 0, -1, 1000) + b"short", 1),
    "the same, compressed": section_batch(
        struct.pack("<iii", 0, -1, 1000) + b"short", 1, Compression.ZSTD
    ),
    "a key length below -1": section_batch(struct.pack("<iii", 0, -7, 1) + b"v", 1),
    "bytes after the last value": section_batch(struct.pack("<iii", 0, -1, 1) + b"v+", 1),
    "a header name that is not UTF-8": with_headers(
        struct.pack("<i", 2) + b"\xff\xfe" + struct.pack("<i", -1)
    ),
    "a header value past its block": with_headers(
        struct.pack("<i", 1) + b"h" + struct.pack("<i", 99) + b"x"
    ),
}


@pytest.mark.parametrize("poison", list(POISONED), ids=list(POISONED))
async def test_a_batch_no_consumer_could_decode_is_refused_and_nothing_of_its_request_written(
    tmp_path: Path, poison: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    checked_in: list[int] = []
    real_check = protocol.batches.check_batches

    def check(buf: bytes, spans: list[BatchSpan]) -> None:
        checked_in.append(threading.get_ident())
        real_check(buf, spans)

    monkeypatch.setattr(broker.data_plane, "check_batches", check)
    good = build_batch([b"a", b"b"])
    async with open_log(tmp_path) as log:
        # a good batch first in the same request: it is not written either
        answer = await produce(log, good + POISONED[poison])
        assert answer.error_code is ErrorCode.CORRUPT_MESSAGE
        partition = log.partitions[next(iter(log.partitions))]
        assert partition.log_end_offset == 0
        assert partition.size_bytes == 0
        assert checked_in and threading.main_thread().ident not in checked_in  # off the loop
        assert (await produce(log, good)).base_offset == 0
        fetched = await fetch(log, 0, 1 << 20, 1)
        assert [v for b in read_batches(fetched.batches) for v in b.values()] == [b"a", b"b"]


def zstd_bomb(count: int) -> bytes:
    """``count`` empty records, valid, in a few hundred bytes of zstd."""
    section = bytes(4 * count) + b"\xff" * (4 * count) + bytes(4 * count)
    return section_batch(section, count, Compression.ZSTD)


async def test_a_version_0_fetch_of_a_million_record_batch_decodes_no_more_than_its_limit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bomb = zstd_bomb(MILLION)
    assert len(bomb) < 2000
    made: list[int] = []  # the thread that made each record
    real_record = protocol.records.Record

    def counted(**fields: object) -> object:
        made.append(threading.get_ident())
        return real_record(**fields)  # type: ignore[arg-type]

    monkeypatch.setattr(protocol.batches, "Record", counted)
    async with open_log(tmp_path) as log:
        assert (await produce(log, bomb)).error_code is ErrorCode.NONE  # a valid batch
        for max_bytes, offset in ((1024, 0), (1024, 500_000), (2**31 - 1, 0), (0, 10)):
            made.clear()
            answer = await fetch(log, offset, max_bytes, 0)
            assert answer.error_code is ErrorCode.NONE
            limit = max(1, min(max_bytes, MAX_FETCH_BYTES))
            expected = max(1, limit // RECORD_OVERHEAD)
            assert [r.offset for r in answer.records] == list(range(offset, offset + expected))
            assert sum(record_size(r) for r in answer.records) <= max(limit, RECORD_OVERHEAD)
            assert len(made) == expected  # the work: records made, not the batch's million
            assert threading.main_thread().ident not in made  # off the event loop
        # version 1 answers the stored batch as it is: the consumer decodes it
        answer = await fetch(log, 0, 1024, 1)
        assert len(answer.batches) == len(bomb)


def test_version_0_records_from_many_batches_stop_at_the_limit() -> None:
    batches = b"".join(build_batch([b"x" * 100] * 10, base_offset=10 * i) for i in range(5))
    records = records_from_batches(batches, 15, max_bytes=5 * (RECORD_OVERHEAD + 100))
    assert [r.offset for r in records] == [15, 16, 17, 18, 19]
    assert len(records_from_batches(batches, 0)) == 50  # no limit: everything
    assert [r.offset for r in records_from_batches(batches, 0, max_bytes=0)] == [0]


async def test_decompression_waits_for_the_brokers_budget(tmp_path: Path) -> None:
    batch = section_batch(struct.pack("<iii", 0, -1, 1) + b"v", 1, Compression.ZSTD)
    async with open_log(tmp_path) as log:
        assert (await produce(log, build_batch([b"first"]))).error_code is ErrorCode.NONE
        budget = log.decompressed
        await budget.claim(0, budget.limit)  # another request holds all of it
        answers: list[ProduceResponse] = []

        async def produce_one() -> None:
            answers.append(await produce(log, batch))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(produce_one)
            await trio.testing.wait_all_tasks_blocked()
            assert answers == []  # waiting for room, nothing decompressed
            budget.release(budget.limit)
        assert [a.error_code for a in answers] == [ErrorCode.NONE]
        assert budget.used == 0


async def test_a_version_0_fetch_of_a_million_record_batch_takes_memory_for_its_section_only(
    tmp_path: Path,
) -> None:
    section_bytes = 12 * MILLION  # what the batch decompresses to
    async with open_log(tmp_path) as log:
        assert (await produce(log, zstd_bomb(MILLION))).error_code is ErrorCode.NONE
        tracemalloc.start()
        try:
            answer = await fetch(log, 0, 1024, 0)
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        assert len(answer.records) == 1024 // RECORD_OVERHEAD
        # the section, and a little: not a Python object per record of the million
        assert peak < section_bytes + 4 * 1024 * 1024
