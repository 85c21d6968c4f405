"""The partition log's time index: a lookup by time (ListOffsets 1, SPEC.md §8, 2) finds the
earliest offset whose record is at least as late as asked, reading one region of one segment,
before and after a restart, below the high watermark only, and for segments whose index file
was written before the index knew time (rebuilt from their batches)."""

from __future__ import annotations

import random
import struct
from pathlib import Path

import pytest
import trio

from broker.data_plane import _first_record_at
from broker.log import FsyncPolicy, LogConfig, PartitionLog, open_partition_log
from broker.log import segment as segment_module
from protocol.batches import batch_spans, build_batch
from tests.broker.test_log import TOPIC_ID, record_scans

NOW_MS = 1_700_000_000_000
CONFIG = LogConfig(segment_bytes=4000, index_interval_bytes=600, retention_ms=None)
#: The most a lookup may read: the region between two index entries.
REGION = CONFIG.index_interval_bytes + 2000


def timed_batches(seed: int, count: int) -> list[tuple[list[int] | None, int]]:
    """``count`` batches of producer timestamps that wander back and forth in time, some with
    none (None: each record's is the batch's append time, the second member)."""
    rng = random.Random(seed)
    batches: list[tuple[list[int] | None, int]] = []
    for i in range(count):
        appended = NOW_MS + 100 * i
        if rng.random() < 0.2:
            batches.append((None, appended))
        else:
            around = NOW_MS + 100 * i + rng.randint(-700, 300)
            batches.append(
                ([around + rng.randint(-50, 50) for _ in range(rng.randint(1, 6))], appended)
            )
    return batches


async def fill(log: PartitionLog, batches: list[tuple[list[int] | None, int]]) -> list[int]:
    """Append the batches; every record's timestamp, in offset order."""
    stamps: list[int] = []
    for timestamps, appended in batches:
        n = 3 if timestamps is None else len(timestamps)
        data = bytearray(build_batch([b"v" * 150] * n, timestamps_ms=timestamps))
        await log.append(data, batch_spans(data), appended)
        stamps.extend([appended] * n if timestamps is None else timestamps)
    return stamps


def earliest(stamps: list[int], timestamp_ms: int, below: int | None = None) -> tuple[int, int]:
    """What ListOffsets 1 must answer, by looking at every record."""
    for offset, ts in enumerate(stamps[:below]):
        if ts >= timestamp_ms:
            return offset, ts
    return -1, -1


async def lookup(log: PartitionLog, timestamp_ms: int) -> tuple[int, int]:
    data = await log.batch_at_time(timestamp_ms)
    return _first_record_at(data, timestamp_ms) if data else (-1, -1)


def record_region_reads(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The size of every read of a segment's region from now on."""
    sizes: list[int] = []
    read = segment_module._read_exactly

    def recording(fd: int, position: int, size: int) -> bytes:
        sizes.append(size)
        return read(fd, position, size)

    monkeypatch.setattr(segment_module, "_read_exactly", recording)
    return sizes


async def test_a_lookup_finds_the_earliest_offset_that_late_reading_one_region(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    directory = tmp_path / "t-0"
    log = await open_partition_log(directory, CONFIG, trio.CapacityLimiter(4), topic_id=TOPIC_ID)
    stamps = await fill(log, timed_batches(seed=35, count=120))
    assert len(log.segments) > 5
    asked = sorted({*stamps, *(t + 1 for t in stamps), 0, min(stamps) - 1})
    for reopen in (False, True):
        if reopen:
            await log.aclose()
            scans = record_scans(monkeypatch)
            log = await open_partition_log(
                directory, CONFIG, trio.CapacityLimiter(4), topic_id=TOPIC_ID
            )
        reads = record_region_reads(monkeypatch)
        for t in asked:
            reads.clear()
            assert await lookup(log, t) == earliest(stamps, t), t
            assert len(reads) <= 1 and all(size <= REGION for size in reads), (t, reads)
        if reopen:
            assert scans == []  # a clean stop's index files serve the lookups as they are
    await log.aclose()


async def test_a_lookup_sees_nothing_past_the_high_watermark(tmp_path: Path) -> None:
    config = LogConfig(fsync=FsyncPolicy.ALWAYS, retention_ms=None)
    log = await open_partition_log(
        tmp_path / "t-0", config, trio.CapacityLimiter(4), topic_id=TOPIC_ID
    )
    stamps = await fill(log, [([1000, 3000], NOW_MS), ([2000], NOW_MS), ([4000], NOW_MS)])
    log.flushed_offset = 3  # as if the last append's fsync had not returned yet
    assert await lookup(log, 2500) == (1, 3000)
    assert await lookup(log, 3500) == (-1, -1)  # offset 3 is that late, but not yet readable
    assert earliest(stamps, 3500) == (3, 4000)
    await log.aclose()


def as_version_1(index_file: Path) -> None:
    """Rewrite an index file as it was before the index knew time."""
    data = index_file.read_bytes()
    head = segment_module._INDEX_HEAD
    magic, _, size, next_offset, newest, count = head.unpack_from(data)
    entries = segment_module._INDEX_ENTRY.iter_unpack(data[head.size :])
    index_file.write_bytes(
        head.pack(magic, 1, size, next_offset, newest, count)
        + b"".join(struct.pack(">II", offset, position) for offset, position, _ in entries)
    )


async def test_segments_indexed_before_the_time_index_get_one_rebuilt_from_their_batches(
    tmp_path: Path,
) -> None:
    directory = tmp_path / "t-0"
    log = await open_partition_log(directory, CONFIG, trio.CapacityLimiter(4), topic_id=TOPIC_ID)
    stamps = await fill(log, timed_batches(seed=9, count=60))
    await log.aclose()
    index_files = sorted(directory.glob("*.index"))
    assert len(index_files) > 2
    for index_file in index_files:
        as_version_1(index_file)

    log = await open_partition_log(directory, CONFIG, trio.CapacityLimiter(4), topic_id=TOPIC_ID)
    for t in sorted({*stamps, *(t + 1 for t in stamps)}):
        assert await lookup(log, t) == earliest(stamps, t), t
    await log.aclose()
    versions = {p.name: struct.unpack_from(">I", p.read_bytes(), 4)[0] for p in index_files}
    assert versions == {p.name: 2 for p in index_files}  # written again, with time
