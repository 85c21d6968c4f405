"""The broker's open segment files: a bounded LRU within the file budget, reopened on demand,
a descriptor closed only when no thread holds it and only once what was written through it is
flushed."""

from __future__ import annotations

import errno
import os
import threading
import uuid
from pathlib import Path

import pytest
import trio

from broker.log import FsyncPolicy, LogConfig, SegmentFiles, open_partition_log
from broker.log.segment import Segment
from tests.broker.test_log import append, make_records, read_all, stamped
from transport.limits import FileBudget


def segment(tmp_path: Path, name: str, data: bytes, synced: bool = True) -> Segment:
    path = tmp_path / f"{name}.log"
    path.write_bytes(data)
    return Segment(
        base_offset=0,
        path=path,
        size=len(data),
        next_offset=0,
        max_timestamp_ms=-1,
        index_interval=4096,
        synced_size=len(data) if synced else 0,
    )


def is_open(fd: int) -> bool:
    try:
        os.fstat(fd)
    except OSError:
        return False
    return True


def test_a_borrowed_descriptor_is_never_closed_and_an_unflushed_one_closed_once_fsynced(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    files = SegmentFiles(budget=FileBudget(limit=2, floor=2))
    a, b, c = (segment(tmp_path, n, n.encode() * 10) for n in "abc")
    with files.borrow(a) as fd_a:
        with files.borrow(b):
            pass
        with files.borrow(c):  # the budget is full: b, idle, gives way; a is in use
            assert files.open_count == 2 and files.budget.files == 2
        assert os.pread(fd_a, 3, 0) == b"aaa"
        files.discard(a)  # retention deletes it meanwhile: closed when given back
        assert is_open(fd_a) and os.pread(fd_a, 3, 0) == b"aaa"
    assert not is_open(fd_a)
    assert (files.open_count, files.budget.files) == (1, 1)

    synced: list[int] = []
    fsync = os.fsync

    def recording_fsync(fd: int) -> None:
        synced.append(fd)
        fsync(fd)

    monkeypatch.setattr(os, "fsync", recording_fsync)
    unflushed = segment(tmp_path, "d", b"d" * 10, synced=False)
    with files.borrow(unflushed) as fd_d:
        pass
    # b: c, flushed, goes; then c: the only idle one is unflushed: fsynced first, then closed
    with files.borrow(b), files.borrow(c):
        assert synced == [fd_d] and unflushed.flushed and unflushed.sync_error is None
        assert (files.open_count, files.budget.files, files.beyond_budget) == (2, 2, 0)
        with files.borrow(unflushed):  # every open one in use: beyond the budget
            assert (files.open_count, files.budget.files, files.beyond_budget) == (3, 3, 1)
    assert files.evict_idle()
    assert (files.open_count, files.budget.files) == (2, 2)


def test_a_failed_fsync_to_close_a_file_is_reported_by_the_next_flush(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    files = SegmentFiles(budget=FileBudget(limit=1, floor=1))
    unflushed, other = segment(tmp_path, "a", b"a" * 10, synced=False), segment(tmp_path, "b", b"")

    def failing(fd: int) -> None:
        raise OSError(errno.EIO, "Input/output error")

    with files.borrow(unflushed):
        pass
    monkeypatch.setattr(os, "fsync", failing)
    with files.borrow(other):  # the unflushed one's fsync fails: kept, and the file closed
        assert files.open_count == 1 and files.beyond_budget == 0
    monkeypatch.undo()
    with pytest.raises(OSError, match="Input/output error"):
        unflushed.flush(files)


async def test_a_thread_reading_keeps_its_descriptor_while_others_close_and_reuse_numbers(
    tmp_path: Path,
) -> None:
    """The race a shared descriptor invites: a reader between taking the number and its pread
    while the file is closed and the number given to another file."""
    files = SegmentFiles(budget=FileBudget(limit=1, floor=1))
    a = segment(tmp_path, "a", b"a" * 10)
    others = [segment(tmp_path, f"x{i}", b"x" * 10) for i in range(5)]
    borrowed, go_on = threading.Event(), threading.Event()

    def reader() -> bytes:
        with files.borrow(a) as fd:
            borrowed.set()
            go_on.wait(10)
            return os.pread(fd, 10, 0)

    async with trio.open_nursery() as nursery:
        got: list[bytes] = []

        async def read() -> None:
            got.append(await trio.to_thread.run_sync(reader))

        nursery.start_soon(read)
        await trio.to_thread.run_sync(borrowed.wait, 10)
        files.discard(a)
        for other in others:  # each opens where a closed one would have freed a number
            with files.borrow(other) as fd:
                assert os.pread(fd, 1, 0) == b"x"
            files.discard(other)
        go_on.set()
    assert got == [b"a" * 10]


async def test_partitions_beyond_the_budget_read_back_right_through_reopened_files(
    tmp_path: Path,
) -> None:
    budget = FileBudget(limit=3, floor=3)
    for policy in FsyncPolicy:
        config = LogConfig(fsync=policy, segment_bytes=2000)
        files = SegmentFiles.of(budget, config)
        limiter = trio.CapacityLimiter(2)
        logs = [
            await open_partition_log(
                tmp_path / policy.value / f"t-{p}", config, limiter, files, topic_id=uuid.uuid4()
            )
            for p in range(10)
        ]
        for round_ in range(3):  # ~1.2 KB a batch: a new segment every other round
            for p, log in enumerate(logs):
                # under interval nothing flushes here but what the files need to close
                await append(log, make_records(10, start=100 * p + 10 * round_))
                assert files.open_count <= 3 and budget.files <= 3
        for p, log in enumerate(logs):
            assert len(log.segments) == 3
            assert await read_all(log, 0) == stamped(make_records(30, start=100 * p), 0)
        assert files.opened > 3 * 10  # every append and read of a partition reopened its file
        assert files.beyond_budget == 0
        for log in logs:
            await log.aclose()
        assert files.open_count == 0 and budget.files == 0
