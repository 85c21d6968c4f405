"""The partition log on real files: round trip, crash recovery, retention, index lookups."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import trio

from broker.log import (
    CorruptSegment,
    FsyncPolicy,
    LogConfig,
    LogFailed,
    OffsetOutOfRange,
    PartitionLog,
    open_partition_log,
)
from protocol.records import Record, encode_record

NOW_MS = 1_700_000_000_000


def make_records(n: int, start: int = 0, size: int = 100) -> list[Record]:
    return [
        Record(
            offset=-1,
            timestamp_ms=NOW_MS + i,
            key=f"k{i}".encode(),
            value=(f"v{i}-".encode() * size)[:size],
        )
        for i in range(start, start + n)
    ]


def stamped(records: list[Record], base: int) -> list[Record]:
    return [
        Record(offset=base + i, timestamp_ms=r.timestamp_ms, key=r.key, value=r.value)
        for i, r in enumerate(records)
    ]


def segment_files(directory: Path) -> list[Path]:
    return sorted(directory.glob("*.log"))


async def read_all(log: PartitionLog, start: int) -> list[Record]:
    out: list[Record] = []
    offset = start
    while offset < log.high_watermark:
        got = await log.read(offset, 1000)
        assert got, f"no progress at {offset}"
        out.extend(got)
        offset = got[-1].offset + 1
    return out


async def test_round_trip_is_byte_for_byte(tmp_path: Path) -> None:
    log = await open_partition_log(tmp_path / "t-0", LogConfig(), trio.CapacityLimiter(4))
    records = make_records(50)
    records.append(Record(offset=-1, timestamp_ms=NOW_MS, key=None, value=None))
    records.append(Record(offset=-1, timestamp_ms=NOW_MS, key=b"", value=b"\x00" * 3000))
    assert await log.append(records[:10], NOW_MS) == 0
    assert await log.append(records[10:], NOW_MS) == 10
    expected = stamped(records, 0)
    assert await read_all(log, 0) == expected
    # the file is exactly the wire encoding, nothing else
    (segment,) = segment_files(tmp_path / "t-0")
    assert segment.read_bytes() == b"".join(encode_record(r) for r in expected)
    await log.aclose()
    reopened = await open_partition_log(tmp_path / "t-0", LogConfig(), trio.CapacityLimiter(4))
    assert reopened.log_end_offset == len(records)
    assert await read_all(reopened, 0) == expected


async def test_fetch_returns_one_whole_record_over_max_bytes_and_respects_the_budget(
    tmp_path: Path,
) -> None:
    log = await open_partition_log(tmp_path / "t-0", LogConfig(), trio.CapacityLimiter(4))
    await log.append(make_records(10, size=500), NOW_MS)
    (first,) = await log.read(0, 1)
    assert first.offset == 0
    got = await log.read(3, 1200)
    assert [r.offset for r in got] == [3, 4]  # two ~540-byte records fit, a third does not
    assert await log.read(10, 1000) == ()
    with pytest.raises(OffsetOutOfRange):
        await log.read(11, 1000)
    with pytest.raises(OffsetOutOfRange):
        await log.read(-1, 1000)


@pytest.mark.parametrize("cut_into", [1, 8, 12, 20, 30, 60, -1])
async def test_torn_tail_is_cut_on_reopen(tmp_path: Path, cut_into: int) -> None:
    directory = tmp_path / "t-0"
    log = await open_partition_log(directory, LogConfig(), trio.CapacityLimiter(4))
    records = make_records(20)
    await log.append(records, NOW_MS)
    await log.aclose()
    (segment,) = segment_files(directory)
    whole = segment.stat().st_size
    last = len(encode_record(stamped(records, 0)[-1]))
    torn_at = whole - last + (cut_into if cut_into > 0 else last - 1)
    os.truncate(segment, torn_at)

    reopened = await open_partition_log(directory, LogConfig(), trio.CapacityLimiter(4))
    assert reopened.log_end_offset == 19
    assert segment.stat().st_size == whole - last
    assert await read_all(reopened, 0) == stamped(records, 0)[:19]
    # and it goes on from there
    assert await reopened.append(make_records(1, start=99), NOW_MS) == 19


async def test_corrupt_record_is_cut_with_everything_after_it(tmp_path: Path) -> None:
    directory = tmp_path / "t-0"
    log = await open_partition_log(directory, LogConfig(), trio.CapacityLimiter(4))
    records = make_records(20)
    await log.append(records, NOW_MS)
    await log.aclose()
    (segment,) = segment_files(directory)
    size = len(encode_record(stamped(records, 0)[0]))  # all 20 have the same size
    data = bytearray(segment.read_bytes())
    data[15 * size + 40] ^= 0x01  # a bit in record 15's value
    segment.write_bytes(bytes(data))

    reopened = await open_partition_log(directory, LogConfig(), trio.CapacityLimiter(4))
    assert reopened.log_end_offset == 15
    assert await read_all(reopened, 0) == stamped(records, 0)[:15]


async def test_index_lookups_land_on_the_right_record_across_segments(tmp_path: Path) -> None:
    config = LogConfig(segment_bytes=3000, index_interval_bytes=512)
    log = await open_partition_log(tmp_path / "t-0", config, trio.CapacityLimiter(4))
    records: list[Record] = []
    for batch in range(20):
        chunk = make_records(7, start=batch * 7, size=90 + batch)
        records.extend(chunk)
        await log.append(chunk, NOW_MS)
    expected = stamped(records, 0)
    assert len(log.segments) > 3
    for reopen in (False, True):
        if reopen:
            await log.aclose()
            log = await open_partition_log(tmp_path / "t-0", config, trio.CapacityLimiter(4))
        for offset in range(len(records)):
            (first, *_) = await log.read(offset, 1)
            assert first == expected[offset]
        # a read that starts near a segment's end goes on into the next one
        boundary = log.segments[1].base_offset
        got = await log.read(boundary - 2, 1000)
        assert [r.offset for r in got][:4] == [boundary - 2, boundary - 1, boundary, boundary + 1]


async def test_retention_by_size_deletes_whole_old_segments(tmp_path: Path) -> None:
    config = LogConfig(segment_bytes=2000, retention_bytes=5000, retention_ms=None)
    log = await open_partition_log(tmp_path / "t-0", config, trio.CapacityLimiter(4))
    for i in range(10):
        await log.append(make_records(6, start=i * 6, size=200), NOW_MS)  # ~1.4 KB per batch
    before = segment_files(tmp_path / "t-0")
    assert len(before) == 10
    # ~13.9 KB in 10 segments: deleting a 7th would leave less than 5000 bytes
    assert await log.enforce_retention(NOW_MS) == 6
    after = segment_files(tmp_path / "t-0")
    assert after == before[6:]
    assert 5000 <= log.size_bytes < 5000 + 1400
    assert log.log_start_offset == 36 == int(after[0].stem)
    with pytest.raises(OffsetOutOfRange):
        await log.read(35, 1000)
    assert (await log.read(36, 1))[0].offset == 36
    await log.aclose()
    reopened = await open_partition_log(tmp_path / "t-0", config, trio.CapacityLimiter(4))
    assert (reopened.log_start_offset, reopened.log_end_offset) == (36, 60)


async def test_retention_by_time_deletes_segments_whose_newest_record_is_old(
    tmp_path: Path,
) -> None:
    config = LogConfig(segment_bytes=1000, retention_ms=60_000)
    log = await open_partition_log(tmp_path / "t-0", config, trio.CapacityLimiter(4))
    for i in range(4):
        old = [Record(offset=-1, timestamp_ms=NOW_MS - 3_600_000 + i, key=None, value=b"x" * 900)]
        await log.append(old, NOW_MS)
    await log.append([Record(offset=-1, timestamp_ms=NOW_MS, key=None, value=b"y" * 900)], NOW_MS)
    await log.append([Record(offset=-1, timestamp_ms=NOW_MS, key=None, value=b"z")], NOW_MS)
    assert len(log.segments) == 5
    assert await log.enforce_retention(NOW_MS) == 4
    assert log.log_start_offset == 4
    assert [r.value for r in await log.read(4, 10_000)] == [b"y" * 900, b"z"]
    # the active segment stays even when everything in it is old
    assert await log.enforce_retention(NOW_MS + 10 * 3_600_000) == 0
    assert (log.log_start_offset, log.log_end_offset) == (4, 6)


async def test_always_policy_hides_nothing_it_acknowledged(tmp_path: Path) -> None:
    log = await open_partition_log(
        tmp_path / "t-0", LogConfig(fsync=FsyncPolicy.ALWAYS), trio.CapacityLimiter(4)
    )
    async with trio.open_nursery() as nursery:
        bases: list[int] = []

        async def produce(i: int) -> None:
            bases.append(await log.append(make_records(3, start=i * 3), NOW_MS))

        for i in range(20):
            nursery.start_soon(produce, i)
    assert sorted(bases) == list(range(0, 60, 3))
    assert log.high_watermark == log.log_end_offset == 60


async def test_interval_policy_fsyncs_what_was_written(tmp_path: Path) -> None:
    log = await open_partition_log(
        tmp_path / "t-0", LogConfig(fsync=FsyncPolicy.INTERVAL), trio.CapacityLimiter(4)
    )
    await log.append(make_records(5), NOW_MS)
    # readable at once, durable once the broker's interval task flushes
    assert (log.high_watermark, log.flushed_offset) == (5, 0)
    await log.flush()
    assert log.flushed_offset == 5


async def test_a_damaged_sealed_segment_fails_its_reads_loudly_and_only_its_own(
    tmp_path: Path,
) -> None:
    config = LogConfig(segment_bytes=1500, retention_ms=None)
    log = await open_partition_log(tmp_path / "t-0", config, trio.CapacityLimiter(4))
    for i in range(4):
        await log.append(make_records(10, start=i * 10), NOW_MS)
    await log.aclose()
    second = segment_files(tmp_path / "t-0")[1]
    data = bytearray(second.read_bytes())
    data[200] ^= 0x10
    second.write_bytes(bytes(data))

    reopened = await open_partition_log(tmp_path / "t-0", config, trio.CapacityLimiter(4))
    assert (reopened.log_start_offset, reopened.log_end_offset) == (0, 40)
    base = int(second.stem)
    with pytest.raises(CorruptSegment):
        await reopened.read(base, 100)
    assert (await reopened.read(0, 1))[0].offset == 0
    assert (await reopened.read(base + 10, 1))[0].offset == base + 10


async def test_a_failed_fsync_is_not_acknowledged_and_stops_appends(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A disk that fails fsync cannot be made on demand; os.fsync is replaced for this one test.
    log = await open_partition_log(tmp_path / "t-0", LogConfig(), trio.CapacityLimiter(4))
    await log.append(make_records(3), NOW_MS)

    def failing_fsync(fd: int) -> None:
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(os, "fsync", failing_fsync)
    with pytest.raises(LogFailed):
        await log.append(make_records(2), NOW_MS)
    monkeypatch.undo()
    assert log.high_watermark == 3  # never shown to a reader, never acknowledged
    with pytest.raises(LogFailed):
        await log.append(make_records(1), NOW_MS)  # a later fsync that "works" proves nothing
