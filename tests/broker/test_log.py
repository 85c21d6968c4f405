"""The partition log on real files: round trip, crash recovery, retention, index lookups, all at
the granularity of record batches."""

from __future__ import annotations

import os
import uuid
from pathlib import Path
from typing import Any

import pytest
import trio

from broker.log import (
    CorruptSegment,
    FsyncPolicy,
    LogConfig,
    LogFailed,
    LogFormatError,
    OffsetOutOfRange,
    PartitionLog,
    WrongIncarnation,
    check_log_format,
    open_partition_log,
    read_partition_id,
    write_partition_id,
)
from broker.log import segment as segment_module
from protocol.batches import batch_spans, build_batch, read_batches
from protocol.records import Record

NOW_MS = 1_700_000_000_000
#: The incarnation of the topic whose partitions these tests open.
TOPIC_ID = uuid.UUID("7d1a6c1e-53b4-4cbb-9a8e-0f1c2d3e4f50")


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


def batch_of(records: list[Record]) -> bytes:
    return build_batch(
        [r.value for r in records], [r.key for r in records], [r.timestamp_ms for r in records]
    )


async def append(log: PartitionLog, records: list[Record], now_ms: int = NOW_MS) -> int:
    """Append ``records`` as one batch, as a producer sends them."""
    data = bytearray(batch_of(records))
    return await log.append(data, batch_spans(data), now_ms)


def stamped(records: list[Record], base: int) -> list[Record]:
    return [
        Record(offset=base + i, timestamp_ms=r.timestamp_ms, key=r.key, value=r.value)
        for i, r in enumerate(records)
    ]


def decoded(data: bytes, start: int = 0) -> list[Record]:
    return [
        Record(offset=o, timestamp_ms=t, key=k, value=v)
        for batch in read_batches(data)
        for o, t, k, v in batch
        if o >= start
    ]


def record_scans(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Where each recovery scan from now on starts (0: the whole segment)."""
    scanned_from: list[int] = []
    scan = segment_module._scan

    def recording_scan(path: Path, base_offset: int, index_interval: int, start: Any = None) -> Any:
        scanned_from.append(0 if start is None else start.size)
        return scan(path, base_offset, index_interval, start=start)

    monkeypatch.setattr(segment_module, "_scan", recording_scan)
    return scanned_from


def segment_files(directory: Path) -> list[Path]:
    return sorted(directory.glob("*.log"))


async def read_all(log: PartitionLog, start: int) -> list[Record]:
    out: list[Record] = []
    offset = start
    while offset < log.high_watermark:
        got = decoded(await log.read(offset, 1000), offset)
        assert got, f"no progress at {offset}"
        out.extend(got)
        offset = got[-1].offset + 1
    return out


async def test_round_trip_is_byte_for_byte(tmp_path: Path) -> None:
    log = await open_partition_log(
        tmp_path / "t-0", LogConfig(), trio.CapacityLimiter(4), topic_id=TOPIC_ID
    )
    records = make_records(50)
    records.append(Record(offset=-1, timestamp_ms=NOW_MS, key=None, value=None))
    records.append(Record(offset=-1, timestamp_ms=NOW_MS, key=b"", value=b"\x00" * 3000))
    assert await append(log, records[:10]) == 0
    assert await append(log, records[10:]) == 10
    expected = stamped(records, 0)
    assert await read_all(log, 0) == expected
    # the file is exactly the batches as sent, with their base offsets and append time stamped
    (segment,) = segment_files(tmp_path / "t-0")
    sent = [bytearray(batch_of(records[:10])), bytearray(batch_of(records[10:]))]
    for batch, base in zip(sent, (0, 10), strict=True):
        batch[0:8] = base.to_bytes(8, "big")
        batch[12:20] = NOW_MS.to_bytes(8, "big")
    assert segment.read_bytes() == b"".join(sent)
    await log.aclose()
    reopened = await open_partition_log(
        tmp_path / "t-0", LogConfig(), trio.CapacityLimiter(4), topic_id=TOPIC_ID
    )
    assert reopened.log_end_offset == len(records)
    assert await read_all(reopened, 0) == expected


async def test_fetch_returns_whole_batches_one_over_max_bytes_and_respects_the_budget(
    tmp_path: Path,
) -> None:
    log = await open_partition_log(
        tmp_path / "t-0", LogConfig(), trio.CapacityLimiter(4), topic_id=TOPIC_ID
    )
    for i in range(5):  # five batches of two 500-byte records: ~1090 bytes each
        await append(log, make_records(2, start=2 * i, size=500))
    first = read_batches(await log.read(0, 1))
    assert [(b.base_offset, b.record_count) for b in first] == [(0, 2)]
    # offset 3 sits in the second batch, which comes whole; a third batch would pass 2500 bytes
    got = read_batches(await log.read(3, 2500))
    assert [b.base_offset for b in got] == [2, 4]
    assert await log.read(10, 1000) == b""
    with pytest.raises(OffsetOutOfRange):
        await log.read(11, 1000)
    with pytest.raises(OffsetOutOfRange):
        await log.read(-1, 1000)


@pytest.mark.parametrize("cut_into", [1, 8, 12, 20, 30, 64, 65, 66, -1])
async def test_torn_tail_is_cut_on_reopen_at_the_last_whole_batch(
    tmp_path: Path, cut_into: int
) -> None:
    directory = tmp_path / "t-0"
    log = await open_partition_log(
        directory, LogConfig(), trio.CapacityLimiter(4), topic_id=TOPIC_ID
    )
    records = make_records(20)
    await append(log, records[:12])
    await append(log, records[12:])
    (segment,) = segment_files(directory)
    whole = segment.stat().st_size
    last = len(batch_of(records[12:]))
    torn_at = whole - last + (cut_into if cut_into > 0 else last - 1)
    os.truncate(segment, torn_at)  # a crash mid-write: no clean close, no index file

    reopened = await open_partition_log(
        directory, LogConfig(), trio.CapacityLimiter(4), topic_id=TOPIC_ID
    )
    assert reopened.log_end_offset == 12
    assert segment.stat().st_size == whole - last
    assert await read_all(reopened, 0) == stamped(records, 0)[:12]
    # and it goes on from there
    assert await append(reopened, make_records(1, start=99)) == 12


async def test_corrupt_batch_is_cut_with_everything_after_it(tmp_path: Path) -> None:
    directory = tmp_path / "t-0"
    log = await open_partition_log(
        directory, LogConfig(), trio.CapacityLimiter(4), topic_id=TOPIC_ID
    )
    records = make_records(20)
    for i in range(4):
        await append(log, records[5 * i : 5 * i + 5])
    (segment,) = segment_files(directory)
    size = len(batch_of(records[:5]))  # all four batches have the same size
    data = bytearray(segment.read_bytes())
    data[2 * size + 100] ^= 0x01  # a bit in the third batch's records
    segment.write_bytes(bytes(data))

    reopened = await open_partition_log(
        directory, LogConfig(), trio.CapacityLimiter(4), topic_id=TOPIC_ID
    )
    assert reopened.log_end_offset == 10
    assert await read_all(reopened, 0) == stamped(records, 0)[:10]


async def test_index_lookups_land_on_the_right_batch_across_segments(tmp_path: Path) -> None:
    config = LogConfig(segment_bytes=3000, index_interval_bytes=512)
    log = await open_partition_log(
        tmp_path / "t-0", config, trio.CapacityLimiter(4), topic_id=TOPIC_ID
    )
    records: list[Record] = []
    for batch in range(20):
        chunk = make_records(7, start=batch * 7, size=90 + batch)
        records.extend(chunk)
        await append(log, chunk)
    expected = stamped(records, 0)
    assert len(log.segments) > 3
    for reopen in (False, True):
        if reopen:
            await log.aclose()
            log = await open_partition_log(
                tmp_path / "t-0", config, trio.CapacityLimiter(4), topic_id=TOPIC_ID
            )
        for offset in range(len(records)):
            (first, *_) = read_batches(await log.read(offset, 1))
            assert first.base_offset <= offset <= first.last_offset
            assert decoded(await log.read(offset, 1), offset)[0] == expected[offset]
        # a read that starts near a segment's end goes on into the next one
        boundary = log.segments[1].base_offset
        got = decoded(await log.read(boundary - 2, 2000), boundary - 2)
        assert [r.offset for r in got][:4] == [boundary - 2, boundary - 1, boundary, boundary + 1]


async def test_a_clean_stop_leaves_an_index_the_next_start_opens_without_a_scan(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = LogConfig(segment_bytes=3000, index_interval_bytes=512)
    directory = tmp_path / "t-0"
    log = await open_partition_log(directory, config, trio.CapacityLimiter(4), topic_id=TOPIC_ID)
    records: list[Record] = []
    for batch in range(20):
        chunk = make_records(7, start=batch * 7, size=90)
        records.extend(chunk)
        await append(log, chunk)
    await log.aclose()
    assert [p.stem for p in sorted(directory.glob("*.index"))] == [
        p.stem for p in segment_files(directory)
    ]

    def no_scan(*args: object, **kwargs: object) -> None:
        raise AssertionError("a segment was scanned")

    monkeypatch.setattr(segment_module, "_scan", no_scan)
    reopened = await open_partition_log(
        directory, config, trio.CapacityLimiter(4), topic_id=TOPIC_ID
    )
    assert reopened.log_end_offset == 140
    assert await read_all(reopened, 0) == stamped(records, 0)
    monkeypatch.undo()
    # a crash now (no aclose): the index file is a recovery point, and the next start scans the
    # active segment from there on only
    await append(reopened, make_records(3, start=140))
    active = segment_files(directory)[-1]
    scanned_from = record_scans(monkeypatch)
    again = await open_partition_log(directory, config, trio.CapacityLimiter(4), topic_id=TOPIC_ID)
    assert again.log_end_offset == 143
    assert scanned_from == [active.stat().st_size - len(batch_of(make_records(3, start=140)))]
    assert await read_all(again, 0) == stamped(records + make_records(3, start=140), 0)


async def test_after_a_crash_recovery_scans_only_what_no_checkpointed_fsync_covered(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = LogConfig(index_checkpoint_bytes=5000, fsync=FsyncPolicy.ALWAYS)
    directory = tmp_path / "t-0"
    log = await open_partition_log(directory, config, trio.CapacityLimiter(4), topic_id=TOPIC_ID)
    records = make_records(60)
    for i in range(20):  # 20 batches of ~400 bytes: a checkpoint every ~13 batches
        await append(log, records[3 * i : 3 * i + 3])
    (segment,) = segment_files(directory)
    checkpoint = log.segments[-1].checkpointed_size
    assert 5000 <= checkpoint < segment.stat().st_size
    # torn: the crash cut the last batch short
    os.truncate(segment, segment.stat().st_size - 7)
    scanned_from = record_scans(monkeypatch)
    reopened = await open_partition_log(
        directory, config, trio.CapacityLimiter(4), topic_id=TOPIC_ID
    )
    assert scanned_from == [checkpoint]
    assert reopened.log_end_offset == 57
    assert await read_all(reopened, 0) == stamped(records, 0)[:57]


async def test_an_index_that_does_not_describe_its_segment_is_not_trusted(tmp_path: Path) -> None:
    directory = tmp_path / "t-0"
    log = await open_partition_log(
        directory, LogConfig(), trio.CapacityLimiter(4), topic_id=TOPIC_ID
    )
    await append(log, make_records(5))
    await log.aclose()
    (segment,) = segment_files(directory)
    # bytes appended behind the index's back (a crash after a later start): it is stale
    with open(segment, "ab") as f:
        data = bytearray(batch_of(make_records(2, start=5)))
        data[0:8] = (5).to_bytes(8, "big")
        f.write(data)
    reopened = await open_partition_log(
        directory, LogConfig(), trio.CapacityLimiter(4), topic_id=TOPIC_ID
    )
    assert reopened.log_end_offset == 7
    assert [r.offset for r in await read_all(reopened, 0)] == list(range(7))


def test_a_log_of_another_format_is_refused_with_what_to_do(tmp_path: Path) -> None:
    fresh = tmp_path / "fresh" / "log"
    assert check_log_format(fresh) == 3
    assert (fresh / "log-format").read_text() == "3\n"
    assert check_log_format(fresh) == 3  # ours: accepted again
    old = tmp_path / "old" / "log"
    (old / "t-0").mkdir(parents=True)
    (old / "t-0" / f"{0:020d}.log").write_bytes(b"records of format 1")
    with pytest.raises(LogFormatError) as caught:
        check_log_format(old)
    assert str(caught.value) == (
        f"the log in {old} is format 1 (records one at a time, no version file), and this broker "
        "reads log format 3 (or 2, which it upgrades) only: start it with an empty --data-dir, "
        f"or move {old} away (its records are not converted)"
    )
    assert not (old / "log-format").exists()
    (fresh / "log-format").write_text("2\n")
    assert check_log_format(fresh) == 2  # the broker upgrades it once it knows the topic ids
    (fresh / "log-format").write_text("4\n")
    with pytest.raises(LogFormatError, match="is format '4'"):
        check_log_format(fresh)


async def test_a_partition_directory_names_its_topic_id_and_opens_for_no_other(
    tmp_path: Path,
) -> None:
    directory = tmp_path / "t-0"
    log = await open_partition_log(
        directory, LogConfig(), trio.CapacityLimiter(4), topic_id=TOPIC_ID
    )
    assert (directory / "partition.metadata").read_text() == f"version: 0\ntopic_id: {TOPIC_ID}\n"
    assert read_partition_id(directory) == log.topic_id == TOPIC_ID
    await append(log, make_records(3))
    await log.aclose()
    other = uuid.uuid4()
    with pytest.raises(WrongIncarnation, match=f"names topic id {TOPIC_ID}, not {other}"):
        await open_partition_log(directory, LogConfig(), trio.CapacityLimiter(4), topic_id=other)
    (directory / "partition.metadata").unlink()  # records of no known incarnation
    with pytest.raises(WrongIncarnation, match="names no topic id"):
        await open_partition_log(directory, LogConfig(), trio.CapacityLimiter(4), topic_id=TOPIC_ID)
    write_partition_id(directory, TOPIC_ID)
    reopened = await open_partition_log(
        directory, LogConfig(), trio.CapacityLimiter(4), topic_id=TOPIC_ID
    )
    assert [r.offset for r in await read_all(reopened, 0)] == [0, 1, 2]  # nothing was touched


async def test_retention_by_size_deletes_whole_old_segments(tmp_path: Path) -> None:
    config = LogConfig(segment_bytes=2000, retention_bytes=5000, retention_ms=None)
    log = await open_partition_log(
        tmp_path / "t-0", config, trio.CapacityLimiter(4), topic_id=TOPIC_ID
    )
    for i in range(10):
        await append(log, make_records(6, start=i * 6, size=200))  # ~1.4 KB per batch
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
    assert read_batches(await log.read(36, 1))[0].base_offset == 36
    await log.aclose()
    reopened = await open_partition_log(
        tmp_path / "t-0", config, trio.CapacityLimiter(4), topic_id=TOPIC_ID
    )
    assert (reopened.log_start_offset, reopened.log_end_offset) == (36, 60)


async def test_retention_by_time_deletes_segments_whose_newest_record_is_old(
    tmp_path: Path,
) -> None:
    config = LogConfig(segment_bytes=1100, retention_ms=60_000)
    log = await open_partition_log(
        tmp_path / "t-0", config, trio.CapacityLimiter(4), topic_id=TOPIC_ID
    )
    for i in range(4):
        old = [Record(offset=-1, timestamp_ms=NOW_MS - 3_600_000 + i, key=None, value=b"x" * 900)]
        await append(log, old)
    await append(log, [Record(offset=-1, timestamp_ms=NOW_MS, key=None, value=b"y" * 900)])
    await append(log, [Record(offset=-1, timestamp_ms=NOW_MS, key=None, value=b"z")])
    assert len(log.segments) == 5
    assert await log.enforce_retention(NOW_MS) == 4
    assert log.log_start_offset == 4
    assert [r.value for r in decoded(await log.read(4, 10_000))] == [b"y" * 900, b"z"]
    # the active segment stays even when everything in it is old
    assert await log.enforce_retention(NOW_MS + 10 * 3_600_000) == 0
    assert (log.log_start_offset, log.log_end_offset) == (4, 6)


async def test_always_policy_hides_nothing_it_acknowledged(tmp_path: Path) -> None:
    log = await open_partition_log(
        tmp_path / "t-0",
        LogConfig(fsync=FsyncPolicy.ALWAYS),
        trio.CapacityLimiter(4),
        topic_id=TOPIC_ID,
    )
    async with trio.open_nursery() as nursery:
        bases: list[int] = []

        async def produce(i: int) -> None:
            bases.append(await append(log, make_records(3, start=i * 3)))

        for i in range(20):
            nursery.start_soon(produce, i)
    assert sorted(bases) == list(range(0, 60, 3))
    assert log.high_watermark == log.log_end_offset == 60


async def test_interval_policy_fsyncs_what_was_written(tmp_path: Path) -> None:
    log = await open_partition_log(
        tmp_path / "t-0",
        LogConfig(fsync=FsyncPolicy.INTERVAL),
        trio.CapacityLimiter(4),
        topic_id=TOPIC_ID,
    )
    await append(log, make_records(5))
    # readable at once, durable once the broker's interval task flushes
    assert (log.high_watermark, log.flushed_offset) == (5, 0)
    await log.flush()
    assert log.flushed_offset == 5


async def test_a_damaged_sealed_segment_fails_its_reads_loudly_and_only_its_own(
    tmp_path: Path,
) -> None:
    config = LogConfig(segment_bytes=1500, retention_ms=None)
    log = await open_partition_log(
        tmp_path / "t-0", config, trio.CapacityLimiter(4), topic_id=TOPIC_ID
    )
    for i in range(4):
        await append(log, make_records(10, start=i * 10))
    await log.aclose()
    second = segment_files(tmp_path / "t-0")[1]
    second.with_suffix(".index").unlink()  # lost: the segment is scanned on its first read
    data = bytearray(second.read_bytes())
    data[200] ^= 0x10
    second.write_bytes(bytes(data))

    reopened = await open_partition_log(
        tmp_path / "t-0", config, trio.CapacityLimiter(4), topic_id=TOPIC_ID
    )
    assert (reopened.log_start_offset, reopened.log_end_offset) == (0, 40)
    base = int(second.stem)
    with pytest.raises(CorruptSegment):
        await reopened.read(base, 100)
    assert read_batches(await reopened.read(0, 1))[0].base_offset == 0
    assert read_batches(await reopened.read(base + 10, 1))[0].base_offset == base + 10


async def test_a_failed_fsync_is_not_acknowledged_and_stops_appends(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A disk that fails fsync cannot be made on demand; os.fsync is replaced for this one test.
    log = await open_partition_log(
        tmp_path / "t-0", LogConfig(), trio.CapacityLimiter(4), topic_id=TOPIC_ID
    )
    await append(log, make_records(3))

    def failing_fsync(fd: int) -> None:
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(os, "fsync", failing_fsync)
    with pytest.raises(LogFailed):
        await append(log, make_records(2))
    monkeypatch.undo()
    assert log.high_watermark == 3  # never shown to a reader, never acknowledged
    with pytest.raises(LogFailed):
        await append(log, make_records(1))  # a later fsync that "works" proves nothing


def test_a_topics_settings_take_the_place_of_the_brokers() -> None:
    """-1 lifts a limit the broker has, as in Kafka; a setting not named stays the broker's."""
    broker = LogConfig(retention_ms=1000, retention_bytes=None, segment_bytes=1 << 20)
    assert broker.for_topic(()) == broker
    topic = broker.for_topic((("retention.bytes", "4096"), ("retention.ms", "-1")))
    assert (topic.retention_ms, topic.retention_bytes, topic.segment_bytes) == (None, 4096, 1 << 20)
    topic = broker.for_topic((("segment.bytes", "2048"),))
    assert (topic.retention_ms, topic.segment_bytes) == (1000, 2048)
    # replication's settings are not the log's, and one is no number
    replicated = (("min.insync.replicas", "2"), ("unclean.leader.election.enable", "true"))
    assert broker.for_topic(replicated) == broker
