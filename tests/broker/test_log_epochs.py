"""The leader-epoch cache (KIP-101) and the high-watermark checkpoint, on real files: what a
follower and a leader ask of them, their truncation with the log, and what a crash leaves."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from broker.log import (
    UNDEFINED_EPOCH,
    UNDEFINED_OFFSET,
    CorruptCheckpoint,
    EpochEnd,
    EpochRefused,
    LeaderEpochCache,
    LogConfig,
    read_high_watermarks,
    write_high_watermarks,
)
from broker.log import epochs as epochs_module
from statemachine.partition_state import EpochStart, PartitionKey
from tests.broker.test_log import NOW_MS, append, make_records
from tests.broker.test_log_truncate import filled, open_log


def starts(*pairs: tuple[int, int]) -> tuple[EpochStart, ...]:
    return tuple(EpochStart(epoch=e, start_offset=s) for e, s in pairs)


def cache_of(directory: Path, *pairs: tuple[int, int]) -> LeaderEpochCache:
    directory.mkdir(parents=True, exist_ok=True)
    cache = LeaderEpochCache.load(directory)
    for epoch, start in pairs:
        cache.assign(epoch, start)
    return cache


def test_assign_is_durable_and_in_kafkas_text(tmp_path: Path) -> None:
    cache = cache_of(tmp_path, (0, 0), (2, 40), (5, 90))
    assert (tmp_path / "leader-epoch-checkpoint").read_text() == "0\n3\n0 0\n2 40\n5 90\n"
    assert (
        LeaderEpochCache.load(tmp_path).entries == cache.entries == starts((0, 0), (2, 40), (5, 90))
    )
    assert LeaderEpochCache.load(tmp_path / "none").entries == ()


def test_an_epoch_out_of_order_is_refused_and_nothing_written(tmp_path: Path) -> None:
    cache = cache_of(tmp_path, (3, 10))
    text = (tmp_path / "leader-epoch-checkpoint").read_text()
    with pytest.raises(EpochRefused, match="epoch 3 is not above the latest, 3"):
        cache.assign(3, 20)
    with pytest.raises(EpochRefused, match="epoch 2 is not above"):
        cache.assign(2, 20)
    with pytest.raises(EpochRefused, match="starts before epoch 3, at 10"):
        cache.assign(4, 9)
    with pytest.raises(EpochRefused, match="negative"):
        cache.assign(4, -1)
    assert cache.entries == starts((3, 10))
    assert (tmp_path / "leader-epoch-checkpoint").read_text() == text
    # an epoch that wrote nothing is replaced by the next one starting where it did
    cache.assign(4, 10)
    assert LeaderEpochCache.load(tmp_path).entries == starts((4, 10))


@pytest.mark.parametrize(
    ("asked", "answer"),
    [
        (5, (5, 120)),  # the latest: the log end
        (2, (2, 90)),  # an earlier one: where the next starts
        (0, (0, 40)),
        (3, (2, 90)),  # unknown, between: the largest below it, and its end
        (4, (2, 90)),
        (6, (UNDEFINED_EPOCH, UNDEFINED_OFFSET)),  # above every one known
        (-1, (UNDEFINED_EPOCH, UNDEFINED_OFFSET)),
    ],
)
def test_end_offset_for_answers_as_kafka_does(
    tmp_path: Path, asked: int, answer: tuple[int, int]
) -> None:
    cache = cache_of(tmp_path, (0, 0), (2, 40), (5, 90))
    assert cache.end_offset_for(asked, 120) == EpochEnd(epoch=answer[0], end_offset=answer[1])


def test_end_offset_for_an_epoch_below_every_one_known_and_for_none(tmp_path: Path) -> None:
    cache = cache_of(tmp_path / "a", (3, 30), (4, 50))
    # Kafka's answer: the epoch asked for, ending where the first known one starts
    assert cache.end_offset_for(1, 80) == EpochEnd(epoch=1, end_offset=30)
    empty = cache_of(tmp_path / "b")
    assert empty.end_offset_for(0, 80) == EpochEnd(epoch=UNDEFINED_EPOCH, end_offset=-1)


def test_epoch_at_and_the_starts_a_range_of_records_was_written_under(tmp_path: Path) -> None:
    cache = cache_of(tmp_path, (1, 10), (2, 40), (5, 90))
    assert [cache.epoch_at(o) for o in (0, 9, 10, 39, 40, 89, 90, 1000)] == [
        UNDEFINED_EPOCH,
        UNDEFINED_EPOCH,
        1,
        1,
        2,
        2,
        5,
        5,
    ]
    assert cache.starts_in(45, 90) == starts((2, 40))
    assert cache.starts_in(45, 91) == starts((2, 40), (5, 90))
    assert cache.starts_in(0, 40) == starts((1, 10))
    assert cache.starts_in(10, 200) == starts((1, 10), (2, 40), (5, 90))
    assert cache.starts_in(95, 200) == starts((5, 90))


def test_truncation_from_the_end_and_from_the_start(tmp_path: Path) -> None:
    cache = cache_of(tmp_path, (1, 10), (2, 40), (5, 90), (6, 95))
    cache.truncate_from_end(95)
    assert LeaderEpochCache.load(tmp_path).entries == starts((1, 10), (2, 40), (5, 90))
    cache.truncate_from_end(91)  # epoch 5 keeps its first record
    assert cache.entries == starts((1, 10), (2, 40), (5, 90))
    cache.truncate_from_start(50)  # epoch 2's first records went: it starts at the log start
    assert LeaderEpochCache.load(tmp_path).entries == starts((2, 50), (5, 90))
    cache.truncate_from_start(90)
    assert cache.entries == starts((5, 90))
    cache.truncate_from_start(90)
    assert cache.entries == starts((5, 90))
    cache.truncate_from_end(90)
    assert LeaderEpochCache.load(tmp_path).entries == ()


@pytest.mark.parametrize(
    "text",
    [
        "",
        "1\n0\n",  # another version
        "0\n2\n0 0\n",  # fewer entries than it says
        "0\n1\n0\n",
        "0\n1\nzero 0\n",
        "0\n2\n3 10\n2 20\n",  # epochs out of order
        "0\n2\n2 10\n3 10\n",  # starts not rising
        "0\n1\n-1 0\n",
    ],
)
def test_a_damaged_cache_is_refused_not_read_as_empty(tmp_path: Path, text: str) -> None:
    (tmp_path / "leader-epoch-checkpoint").write_text(text)
    with pytest.raises(CorruptCheckpoint):
        LeaderEpochCache.load(tmp_path)


def test_a_crash_while_writing_the_cache_leaves_the_old_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cache = cache_of(tmp_path, (1, 10))

    def torn_write(path: Path, data: bytes) -> None:
        # what replace_atomically leaves if the process dies before its rename
        path.with_name(path.name + ".tmp").write_bytes(data[:5])
        raise OSError("killed")

    monkeypatch.setattr(epochs_module, "replace_atomically", torn_write)
    with pytest.raises(OSError, match="killed"):
        cache.assign(2, 20)
    assert cache.entries == starts((1, 10))
    assert LeaderEpochCache.load(tmp_path).entries == starts((1, 10))


# --- the cache of a partition log ----------------------------------------------------------------


async def test_a_new_leader_starts_its_epoch_at_the_log_end(tmp_path: Path) -> None:
    directory = tmp_path / "t-0"
    await filled(directory, 3)
    log = await open_log(directory)
    await log.assign_epoch(0, 0)
    await log.assign_epoch(1)
    assert (await log.leader_epochs()).entries == starts((0, 0), (1, 21))
    await append(log, make_records(4, start=50))
    assert await log.end_offset_for(0) == EpochEnd(epoch=0, end_offset=21)
    assert await log.end_offset_for(1) == EpochEnd(epoch=1, end_offset=25)
    # a log never asked for its epochs writes no cache file
    await filled(tmp_path / "t-1", 3)
    assert not (tmp_path / "t-1" / "leader-epoch-checkpoint").exists()


async def test_truncate_to_cuts_the_cache_with_the_log(tmp_path: Path) -> None:
    directory = tmp_path / "t-0"
    await filled(directory, 10)
    log = await open_log(directory)
    for epoch, start in ((0, 0), (1, 21), (3, 42), (4, 63)):
        await log.assign_epoch(epoch, start)
    assert await log.truncate_to(42) == 42
    assert (await log.leader_epochs()).entries == starts((0, 0), (1, 21))
    assert LeaderEpochCache.load(directory).entries == starts((0, 0), (1, 21))
    assert await log.end_offset_for(1) == EpochEnd(epoch=1, end_offset=42)
    assert await log.end_offset_for(3) == EpochEnd(epoch=UNDEFINED_EPOCH, end_offset=-1)


async def test_a_crash_between_the_logs_cut_and_the_caches_drops_the_entries_past_the_end(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    directory = tmp_path / "t-0"
    await filled(directory, 10)
    log = await open_log(directory)
    for epoch, start in ((0, 0), (1, 21), (3, 42), (4, 63)):
        await log.assign_epoch(epoch, start)

    def crash(self: LeaderEpochCache, end_offset: int) -> None:
        raise RuntimeError("killed")

    monkeypatch.setattr(LeaderEpochCache, "truncate_from_end", crash)
    with pytest.raises(RuntimeError, match="killed"):
        await log.truncate_to(35)
    monkeypatch.undo()
    assert LeaderEpochCache.load(directory).entries == starts((0, 0), (1, 21), (3, 42), (4, 63))
    restarted = await open_log(directory)
    assert restarted.log_end_offset == 35
    assert (await restarted.leader_epochs()).entries == starts((0, 0), (1, 21))
    assert LeaderEpochCache.load(directory).entries == starts((0, 0), (1, 21))


async def test_retention_moves_the_first_epoch_to_the_new_log_start(tmp_path: Path) -> None:
    directory = tmp_path / "t-0"
    await filled(directory, 20)
    log = await open_log(directory, LogConfig(segment_bytes=3000, retention_bytes=6000))
    for epoch, start in ((0, 0), (1, 10), (2, 100)):
        await log.assign_epoch(epoch, start)
    await log.enforce_retention(NOW_MS)
    start = log.log_start_offset
    assert 10 < start < 100
    assert (await log.leader_epochs()).entries == starts((1, start), (2, 100))
    assert LeaderEpochCache.load(directory).entries == starts((1, start), (2, 100))


# --- the high-watermark checkpoint ---------------------------------------------------------------

ONE = uuid.UUID("00000000-0000-4000-8000-000000000001")
TWO = uuid.UUID("00000000-0000-4000-8000-000000000002")


def test_high_watermarks_round_trip_keyed_by_topic_id(tmp_path: Path) -> None:
    assert read_high_watermarks(tmp_path) == {}
    marks = {
        PartitionKey(topic_id=TWO, partition=0): 7,
        PartitionKey(topic_id=ONE, partition=3): 0,
        PartitionKey(topic_id=ONE, partition=1): 12345678901,
    }
    write_high_watermarks(tmp_path, marks)
    assert read_high_watermarks(tmp_path) == marks
    assert (tmp_path / "replication-offset-checkpoint").read_text() == (
        f"0\n3\n{ONE} 1 12345678901\n{ONE} 3 0\n{TWO} 0 7\n"
    )
    # a partition left out is forgotten
    write_high_watermarks(tmp_path, {PartitionKey(topic_id=TWO, partition=0): 9})
    assert read_high_watermarks(tmp_path) == {PartitionKey(topic_id=TWO, partition=0): 9}


@pytest.mark.parametrize(
    "text",
    ["0\n1\n", f"0\n1\n{ONE} 0\n", "0\n1\nnot-a-uuid 0 4\n", f"0\n1\n{ONE} 0 -4\n", "\xff\n"],
)
def test_a_damaged_high_watermark_checkpoint_reads_as_none(tmp_path: Path, text: str) -> None:
    """Less is safe: a leader restarted with a lower high watermark serves less, never more."""
    (tmp_path / "replication-offset-checkpoint").write_text(text, encoding="latin-1")
    assert read_high_watermarks(tmp_path) == {}


def test_a_crash_while_writing_high_watermarks_leaves_the_old_ones(tmp_path: Path) -> None:
    marks = {PartitionKey(topic_id=ONE, partition=0): 5}
    write_high_watermarks(tmp_path, marks)
    # the temporary file a killed writer left behind is not read
    (tmp_path / "replication-offset-checkpoint.tmp").write_text(f"0\n1\n{ONE} 0 9")
    assert read_high_watermarks(tmp_path) == marks
    write_high_watermarks(tmp_path, {PartitionKey(topic_id=ONE, partition=0): 6})
    assert read_high_watermarks(tmp_path) == {PartitionKey(topic_id=ONE, partition=0): 6}
