"""A follower's log, on real files: truncation to where it diverged from its leader (in the active
segment, across sealed ones, to the log start, and a crash at each step of it), the append
of its leader's batches as the leader stored them, and a log emptied and started again where its
leader's now starts (a crash at each step of that too)."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest
import trio
from hypothesis import given, settings
from hypothesis import strategies as st

from broker.log import (
    CorruptSegment,
    FsyncPolicy,
    LogConfig,
    NotContiguous,
    OffsetOutOfRange,
    PartitionLog,
    open_partition_log,
)
from broker.log import partition as partition_module
from broker.log import segment as segment_module
from protocol import RemoteProtocolError
from protocol.batches import batch_spans
from protocol.records import Record
from tests.broker.test_log import (
    NOW_MS,
    TOPIC_ID,
    append,
    batch_of,
    decoded,
    make_records,
    read_all,
    record_scans,
    segment_files,
    stamped,
)

#: About four batches of 7 records a segment, one index entry a batch or two.
SMALL = LogConfig(segment_bytes=3000, index_interval_bytes=512)


async def open_log(directory: Path, config: LogConfig = SMALL) -> PartitionLog:
    return await open_partition_log(directory, config, trio.CapacityLimiter(4), topic_id=TOPIC_ID)


async def filled(directory: Path, batches: int, config: LogConfig = SMALL) -> list[Record]:
    """A log of ``batches`` batches of 7 records, batch i appended at NOW_MS + 1000 * i."""
    log = await open_log(directory, config)
    records: list[Record] = []
    for i in range(batches):
        chunk = make_records(7, start=7 * i, size=90)
        records.extend(chunk)
        await append(log, chunk, now_ms=NOW_MS + 1000 * i)
    await log.aclose()
    return stamped(records, 0)


def batch_size(i: int) -> int:
    """The size of :func:`filled`'s batch ``i``."""
    return len(batch_of(make_records(7, start=7 * i, size=90)))


def index_files(directory: Path) -> list[str]:
    return [p.stem for p in sorted(directory.glob("*.index"))]


async def test_truncate_in_the_active_segment_cuts_the_file_and_its_index(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    directory = tmp_path / "t-0"
    config = LogConfig(index_interval_bytes=512)
    records = await filled(directory, 10, config)
    log = await open_log(directory, config)
    (segment,) = segment_files(directory)
    assert await log.truncate_to(42) == 42
    assert (log.log_end_offset, log.high_watermark) == (42, 42)
    assert segment.stat().st_size == sum(batch_size(i) for i in range(6))
    assert await read_all(log, 0) == records[:42]
    # the time index describes what is left: record i was made at NOW_MS + i
    assert log.segments[-1].max_timestamp_ms == NOW_MS + 41
    assert await log.batch_at_time(NOW_MS + 41) != b""
    assert await log.batch_at_time(NOW_MS + 42) == b""
    # the index file written by the cut describes the whole cut segment: no scan at the next start
    scanned_from = record_scans(monkeypatch)
    reopened = await open_log(directory, config)
    assert scanned_from == []
    assert reopened.log_end_offset == 42
    assert await read_all(reopened, 0) == records[:42]
    # appends go on from the cut, and a crash (no clean stop) after them recovers them
    more = make_records(3, start=100)
    assert await append(reopened, more) == 42
    again = await open_log(directory, config)
    assert await read_all(again, 0) == records[:42] + stamped(more, 42)


async def test_an_offset_inside_a_batch_takes_the_whole_batch(tmp_path: Path) -> None:
    directory = tmp_path / "t-0"
    records = await filled(directory, 4)
    log = await open_log(directory)
    assert await log.truncate_to(17) == 14
    assert await read_all(log, 0) == records[:14]


async def test_truncate_at_or_past_the_end_does_nothing_and_below_the_start_is_refused(
    tmp_path: Path,
) -> None:
    directory = tmp_path / "t-0"
    records = await filled(directory, 12)
    log = await open_log(directory)
    files = [p.read_bytes() for p in segment_files(directory)]
    assert await log.truncate_to(84) == 84
    assert await log.truncate_to(1000) == 84
    assert [p.read_bytes() for p in segment_files(directory)] == files
    retained = await open_log(directory, LogConfig(segment_bytes=3000, retention_bytes=3000))
    assert await retained.enforce_retention(NOW_MS) > 0
    start = retained.log_start_offset
    with pytest.raises(OffsetOutOfRange):
        await retained.truncate_to(start - 1)
    assert await read_all(retained, start) == records[start:]


async def test_truncate_at_the_end_drops_the_epochs_that_hold_no_record(tmp_path: Path) -> None:
    """A replica elected at its log end that wrote nothing, then deposed: as a follower it
    appends the new leader's records there, of the leader's epochs, so its own empty epoch
    must not name them (it would answer later fetches with a wrong epoch end)."""
    directory = tmp_path / "t-0"
    await filled(directory, 2)
    log = await open_log(directory)
    await log.assign_epoch(1, 0)
    await log.assign_epoch(2, 14)  # led from the log end, wrote nothing
    assert await log.truncate_to(14) == 14
    assert [(e.epoch, e.start_offset) for e in (await log.leader_epochs()).entries] == [(1, 0)]
    await log.aclose()
    reopened = await open_log(directory)
    assert [(e.epoch, e.start_offset) for e in (await reopened.leader_epochs()).entries] == [(1, 0)]


async def test_truncate_into_a_sealed_segment_deletes_the_later_ones(tmp_path: Path) -> None:
    directory = tmp_path / "t-0"
    records = await filled(directory, 20)
    before = [int(p.stem) for p in segment_files(directory)]
    assert len(before) >= 4
    log = await open_log(directory)
    target = before[1] + 7  # the second batch of the second segment
    assert await log.truncate_to(target) == target
    assert [int(p.stem) for p in segment_files(directory)] == before[:2]
    assert index_files(directory) == [f"{b:020d}" for b in before[:2]]
    assert log.segments[-1].next_offset == target
    assert await read_all(log, 0) == records[:target]
    # what only the deleted segments held is gone from the time index too
    newest = NOW_MS + target - 1
    assert log.segments[-1].max_timestamp_ms == newest
    assert await log.batch_at_time(newest + 1) == b""
    # the cut segment is the active one: appends go into it until it is full, then roll
    more: list[Record] = []
    for i in range(6):
        chunk = make_records(7, start=500 + 7 * i, size=90)
        more.extend(chunk)
        await append(log, chunk)
    expected = records[:target] + stamped(more, target)
    assert await read_all(log, 0) == expected
    await log.aclose()
    reopened = await open_log(directory)
    assert await read_all(reopened, 0) == expected
    assert reopened.log_end_offset == target + 42


async def test_truncate_to_the_log_start_leaves_an_empty_log_there(tmp_path: Path) -> None:
    directory = tmp_path / "t-0"
    records = await filled(directory, 20)
    log = await open_log(directory)
    assert await log.truncate_to(0) == 0
    assert (log.log_start_offset, log.log_end_offset) == (0, 0)
    assert [p.name for p in segment_files(directory)] == [f"{0:020d}.log"]
    assert segment_files(directory)[0].stat().st_size == 0
    assert await log.read(0, 1000) == b""
    await append(log, records[:3])
    reopened = await open_log(directory)
    assert await read_all(reopened, 0) == stamped(records[:3], 0)
    # the log start after retention: the oldest segment left is emptied, and keeps its name
    await filled(tmp_path / "t-1", 20)
    retained = await open_log(tmp_path / "t-1", LogConfig(segment_bytes=3000, retention_bytes=3000))
    await retained.enforce_retention(NOW_MS)
    start = retained.log_start_offset
    assert start > 0
    assert await retained.truncate_to(start) == start
    assert (retained.log_start_offset, retained.log_end_offset) == (start, start)
    assert await (await open_log(tmp_path / "t-1")).read(start, 1000) == b""


class Crash(Exception):
    """The process dies here: nothing after it runs, nothing is closed."""


def crash_on_call(number: int) -> object:
    calls = 0

    def crash(*args: object, **kwargs: object) -> None:
        nonlocal calls
        calls += 1
        if calls == number:
            raise Crash

    return crash


@pytest.mark.parametrize("policy", [FsyncPolicy.ALWAYS, FsyncPolicy.NEVER])
@pytest.mark.parametrize(
    "where",
    ["after the newest segment went", "after the old index went", "after the cut"],
)
async def test_a_crash_during_truncation_leaves_a_log_that_truncates_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, where: str, policy: FsyncPolicy
) -> None:
    directory = tmp_path / "t-0"
    config = LogConfig(segment_bytes=3000, index_interval_bytes=512, fsync=policy)
    records = await filled(directory, 20, config)
    bases = [int(p.stem) for p in segment_files(directory)]
    target = bases[1] + 7
    log = await open_log(directory, config)
    if where == "after the newest segment went":
        # the newest segment's two files are unlinked; the crash comes before anything else
        unlinks = 0
        original = Path.unlink

        def unlink_then_crash(path: Path, missing_ok: bool = False) -> None:
            nonlocal unlinks
            original(path, missing_ok=missing_ok)
            unlinks += 1
            if unlinks == 2:  # the index and the segment file of the newest
                raise Crash

        monkeypatch.setattr(Path, "unlink", unlink_then_crash)
        survives = bases[-1]
    elif where == "after the old index went":
        monkeypatch.setattr(os, "ftruncate", crash_on_call(1))
        survives = bases[2]
    else:
        monkeypatch.setattr(segment_module.Segment, "_write_index", crash_on_call(1))
        survives = target
    with pytest.raises(Crash):
        await log.truncate_to(target)
    monkeypatch.undo()
    recovered = await open_log(directory, config)
    assert recovered.log_end_offset == survives
    assert await read_all(recovered, 0) == records[:survives]
    assert await recovered.truncate_to(target) == target
    more = make_records(5, start=900)
    await append(recovered, more)
    # and a crash after those appends too (no clean stop)
    again = await open_log(directory, config)
    assert await read_all(again, 0) == records[:target] + stamped(more, target)


async def test_a_cut_segment_grown_again_and_torn_by_a_crash_recovers_its_whole_batches(
    tmp_path: Path,
) -> None:
    """A cut segment grows again with other batches where the cut ones were: the index
    checkpoints written since describe the new ones, and recovery cuts only the torn tail."""
    directory = tmp_path / "t-0"
    config = LogConfig(index_interval_bytes=256, index_checkpoint_bytes=256)
    records = await filled(directory, 10, config)
    log = await open_log(directory, config)
    assert await log.truncate_to(21) == 21
    other = make_records(30, start=300, size=10)  # smaller batches: other positions
    for i in range(0, 30, 3):
        await append(log, other[i : i + 3])
    (segment,) = segment_files(directory)
    torn = segment.stat().st_size - 5
    os.truncate(segment, torn)  # and the crash tore the last one
    recovered = await open_log(directory, config)
    assert await read_all(recovered, 0) == records[:21] + stamped(other[:27], 21)


async def test_a_damaged_sealed_segment_is_refused_before_anything_is_cut(
    tmp_path: Path,
) -> None:
    directory = tmp_path / "t-0"
    await filled(directory, 20)
    bases = [int(p.stem) for p in segment_files(directory)]
    victim = segment_files(directory)[1]
    victim.with_suffix(".index").unlink()  # opened unscanned, so scanned by the truncation
    data = bytearray(victim.read_bytes())
    data[100] ^= 0xFF
    victim.write_bytes(bytes(data))
    log = await open_log(directory)
    end = log.log_end_offset
    with pytest.raises(CorruptSegment):
        await log.truncate_to(bases[1] + 7)
    assert [int(p.stem) for p in segment_files(directory)] == bases
    assert log.log_end_offset == end


# --- a follower's append -------------------------------------------------------------------------


async def leader_with(directory: Path) -> tuple[PartitionLog, list[Record]]:
    log = await open_log(directory)
    records: list[Record] = []
    for i in range(12):
        chunk = make_records(5, start=5 * i, size=60)
        records.extend(chunk)
        await append(log, chunk, now_ms=NOW_MS + 7 * i)
    # records without timestamps: the log indexes them by their append time
    bare = bytearray(batch_of([Record(offset=-1, timestamp_ms=-1, key=None, value=b"x")] * 2))
    await log.append(bare, batch_spans(bare), NOW_MS + 999)
    return log, stamped(records, 0)


async def test_a_follower_appends_its_leaders_batches_byte_for_byte(tmp_path: Path) -> None:
    leader, _ = await leader_with(tmp_path / "leader" / "t-0")
    follower = await open_log(tmp_path / "follower" / "t-0")
    offset = 0
    while offset < leader.log_end_offset:
        chunk = await leader.read(offset, 1500)
        offset = await follower.append_replicated(chunk)
    assert follower.log_end_offset == leader.log_end_offset == 62
    # offsets and append times as the leader stamped them: the same bytes, the same time index
    leader_bytes = b"".join(p.read_bytes() for p in segment_files(tmp_path / "leader" / "t-0"))
    follower_bytes = b"".join(p.read_bytes() for p in segment_files(tmp_path / "follower" / "t-0"))
    assert follower_bytes == leader_bytes
    assert await read_all(follower, 0) == await read_all(leader, 0)
    for probe in (NOW_MS, NOW_MS + 20, NOW_MS + 77, NOW_MS + 999, NOW_MS + 1000):
        assert await follower.batch_at_time(probe) == await leader.batch_at_time(probe)
    assert await follower.batch_at_time(NOW_MS + 999) != b""
    await follower.aclose()
    reopened = await open_log(tmp_path / "follower" / "t-0")
    assert await read_all(reopened, 0) == await read_all(leader, 0)


@pytest.mark.parametrize("case", ["gap", "overlap", "gap inside", "corrupt"])
async def test_a_follower_refuses_batches_that_do_not_continue_its_log(
    tmp_path: Path, case: str
) -> None:
    leader, _ = await leader_with(tmp_path / "leader" / "t-0")
    follower = await open_log(tmp_path / "follower" / "t-0")
    await follower.append_replicated(await leader.read(0, 1))  # the first batch: offsets 0-4
    first = await leader.read(5, 1)
    second = await leader.read(10, 1)
    third = await leader.read(15, 1)
    error: type[Exception]
    if case == "gap":
        chunk, error, message = second, NotContiguous, "offset 10 where offset 5 comes next"
    elif case == "overlap":
        chunk, error, message = await leader.read(0, 1), NotContiguous, "an overlap"
    elif case == "gap inside":
        chunk, error, message = first + third, NotContiguous, "offset 15 where offset 10"
    else:
        broken = bytearray(first + second)
        broken[len(first) + 70] ^= 0xFF
        chunk, error, message = bytes(broken), RemoteProtocolError, "crc"
    (segment,) = segment_files(tmp_path / "follower" / "t-0")
    size = segment.stat().st_size
    with pytest.raises(error, match=message):
        await follower.append_replicated(chunk)
    assert (follower.log_end_offset, segment.stat().st_size) == (5, size)
    assert await follower.append_replicated(first + second) == 15


async def test_a_follower_truncated_to_the_divergence_takes_the_leaders_records_from_there(
    tmp_path: Path,
) -> None:
    leader, _ = await leader_with(tmp_path / "leader" / "t-0")
    follower = await open_log(tmp_path / "follower" / "t-0")
    await follower.append_replicated(await leader.read(0, 1500))
    # records of a deposed leader's that the new leader never had
    await append(follower, make_records(9, start=700))
    diverged = follower.log_end_offset
    assert diverged > 15
    await follower.truncate_to(15)
    assert await follower.append_replicated(await leader.read(15, 100_000)) == 62
    assert await read_all(follower, 0) == await read_all(leader, 0)


async def test_read_with_a_limit_leaves_out_what_is_past_it(tmp_path: Path) -> None:
    leader, records = await leader_with(tmp_path / "t-0")
    assert [r.offset for r in await read_all_below(leader, 0, 25)] == list(range(25))
    # between the limit and the log end: empty, not out of range (a new leader's high watermark
    # may lag its predecessor's)
    assert await leader.read(40, 1000, limit=25) == b""
    assert await leader.read(62, 1000, limit=25) == b""
    with pytest.raises(OffsetOutOfRange):
        await leader.read(63, 1000, limit=25)
    # a limit past the log end is the log end
    assert [r.offset for r in await read_all_below(leader, 55, 10_000)] == [
        *range(55, 60),
        60,
        61,
    ]
    del records


async def read_all_below(log: PartitionLog, start: int, limit: int) -> list[Record]:
    out: list[Record] = []
    offset = start
    while True:
        got = decoded(await log.read(offset, 300, limit=limit), offset)
        if not got:
            return out
        out.extend(got)
        offset = got[-1].offset + 1


# --- any sequence of appends, truncations and restarts ---------------------------------------

Step = tuple[str, int]
steps = st.lists(
    st.one_of(
        st.tuples(st.just("append"), st.integers(1, 9)),
        st.tuples(st.just("truncate"), st.integers(0, 1000)),
        st.tuples(st.sampled_from(["restart", "crash"]), st.just(0)),
    ),
    max_size=25,
)


@settings(max_examples=40, deadline=None)
@given(steps=steps, interval=st.sampled_from([64, 512, 4096]))
async def test_a_log_is_what_its_appends_and_truncations_left(
    steps: list[Step], interval: int
) -> None:
    config = LogConfig(segment_bytes=1500, index_interval_bytes=interval)
    with tempfile.TemporaryDirectory() as scratch:
        directory = Path(scratch) / "t-0"
        log = await open_log(directory, config)
        model: list[Record] = []
        for i, (what, n) in enumerate(steps):
            if what == "append":
                chunk = make_records(n, start=100 * i, size=40)
                await append(log, chunk)
                model.extend(stamped(chunk, len(model)))
            elif what == "truncate":
                target = n * (len(model) + 3) // 1000
                end = await log.truncate_to(target)
                # the cut falls on the start of the batch holding the target
                assert end <= target
                assert end >= min(target, len(model)) - 8
                del model[end:]
            else:
                if what == "restart":
                    await log.aclose()
                log = await open_log(directory, config)
            assert log.log_end_offset == len(model)
        assert await read_all(log, 0) == model
        for segment in log.segments:  # each read above scanned what was not
            held = [r for r in model if segment.base_offset <= r.offset < segment.next_offset]
            assert segment.max_timestamp_ms == max((r.timestamp_ms for r in held), default=-1)
        for probe in {r.timestamp_ms for r in model[-3:]}:
            assert await log.batch_at_time(probe) != b""
        assert await log.batch_at_time(max((r.timestamp_ms for r in model), default=0) + 1) == b""
        crashed = await open_log(directory, config)
        assert await read_all(crashed, 0) == model
        await log.aclose()


# --- a follower's log started over where its leader's now starts --------------------------------


async def with_epochs(directory: Path) -> tuple[PartitionLog, list[Record]]:
    """:func:`filled`'s log of 12 batches, its records of epochs 0 and 2."""
    records = await filled(directory, 12)
    log = await open_log(directory)
    await log.assign_epoch(0, 0)
    await log.assign_epoch(2, 42)
    return log, records


async def test_start_at_empties_the_log_and_its_epochs_and_starts_it_there(
    tmp_path: Path,
) -> None:
    directory = tmp_path / "t-0"
    log, _ = await with_epochs(directory)
    assert len(segment_files(directory)) > 1
    await log.start_at(500)
    assert (log.log_start_offset, log.log_end_offset, log.high_watermark) == (500, 500, 500)
    assert [p.name for p in segment_files(directory)] == [f"{500:020d}.log"]
    assert index_files(directory) == []
    assert (await log.leader_epochs()).entries == ()
    with pytest.raises(OffsetOutOfRange):
        await log.read(0, 1000)
    assert await log.read(500, 1000) == b""
    # the leader's records from there on, under its epoch
    leader, _ = await leader_with(tmp_path / "leader" / "t-0")
    await leader.start_at(500)  # (a leader's log where retention moved the start to 500)
    await append(leader, make_records(6, start=800))
    await log.assign_epoch(7, 500)
    assert await log.append_replicated(await leader.read(500, 100_000)) == 506
    reopened = await open_log(directory)
    assert (reopened.log_start_offset, reopened.log_end_offset) == (500, 506)
    assert await read_all(reopened, 500) == await read_all(leader, 500)
    assert [(e.epoch, e.start_offset) for e in (await reopened.leader_epochs()).entries] == [
        (7, 500)
    ]


@pytest.mark.parametrize(
    "where", ["before the intent", "after the intent", "after the new segment", "after it all"]
)
async def test_a_crash_during_start_at_leaves_the_old_log_or_the_new_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, where: str
) -> None:
    directory = tmp_path / "t-0"
    log, records = await with_epochs(directory)
    if where == "before the intent":
        monkeypatch.setattr(partition_module, "replace_atomically", crash_on_call(1))
    elif where == "after the intent":
        monkeypatch.setattr(partition_module, "create_segment", crash_on_call(1))
    elif where == "after the new segment":
        original = Path.unlink

        def unlink(path: Path, missing_ok: bool = False) -> None:
            if path.name == partition_module.START_OVER:
                raise Crash
            original(path, missing_ok=missing_ok)

        monkeypatch.setattr(Path, "unlink", unlink)
    else:
        monkeypatch.setattr(partition_module, "fsync_directory", crash_on_call(2))
    with pytest.raises(Crash):
        await log.start_at(500)
    monkeypatch.undo()
    recovered = await open_log(directory)
    epochs = [(e.epoch, e.start_offset) for e in (await recovered.leader_epochs()).entries]
    if where == "before the intent":
        assert (recovered.log_start_offset, recovered.log_end_offset) == (0, 84)
        assert await read_all(recovered, 0) == records
        assert epochs == [(0, 0), (2, 42)]
    else:
        assert (recovered.log_start_offset, recovered.log_end_offset) == (500, 500)
        assert [p.name for p in segment_files(directory)] == [f"{500:020d}.log"]
        assert epochs == []
        assert not (directory / partition_module.START_OVER).exists()
    # and the log takes records from where it starts, through a crash (no clean stop) too
    more = make_records(3, start=900)
    start = recovered.log_end_offset
    await append(recovered, more)
    again = await open_log(directory)
    assert await read_all(again, start) == stamped(more, start)
