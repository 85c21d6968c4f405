"""A follower's side of the diverging-epoch handshake (DESIGN37 §2.3): it truncates to where its
log and the leader's agree, never to its high watermark (KIP-101), converging after repeated
leader changes (KIP-279), and follows the leader's epochs from the entries an answer carries."""

from __future__ import annotations

import attrs
from hypothesis import example, given
from hypothesis import strategies as st

from protocol.errors import ErrorCode
from statemachine import replica_follower as rf
from statemachine.partition_state import (
    NO_EPOCH,
    EpochStart,
    assign_epoch,
    epoch_end,
)
from statemachine.replica_leader import diverging, epochs_between


def epochs(*pairs: tuple[int, int]) -> tuple[EpochStart, ...]:
    return tuple(EpochStart(epoch=e, start_offset=s) for e, s in pairs)


def test_a_fetch_names_the_log_end_and_the_epoch_of_the_last_record() -> None:
    cache = epochs((1, 0), (3, 10), (4, 25))
    assert rf.fetch_position(cache, 30) == rf.FetchPosition(fetch_offset=30, last_fetched_epoch=4)
    # epoch 4 was started (this broker led) but holds no record yet
    assert rf.fetch_position(cache, 25).last_fetched_epoch == 3
    assert rf.fetch_position((), 0).last_fetched_epoch == NO_EPOCH


def test_the_epoch_cache_answers_where_each_epoch_ends() -> None:
    cache = epochs((1, 0), (3, 10), (4, 25))
    assert epoch_end(cache, 30, 4) == (4, 30)
    assert epoch_end(cache, 30, 3) == (3, 25)
    assert epoch_end(cache, 30, 2) == (1, 10)  # the largest epoch at or below 2
    assert epoch_end(cache, 30, 0) == (0, 0)  # older than any: nothing of it here
    assert epoch_end(cache, 30, 5) == (NO_EPOCH, -1)
    assert epoch_end((), 0, 1) == (NO_EPOCH, -1)


def test_a_restart_drops_the_entries_past_the_recovered_log_end() -> None:
    cache = epochs((3, 10), (1, 0), (4, 25), (5, 40))
    assert rf.recovered_cache(cache, 25) == epochs((1, 0), (3, 10))
    # the first fetch names the epoch of the last record there really is
    assert rf.fetch_position(rf.recovered_cache(cache, 25), 25).last_fetched_epoch == 3


def test_kip_101_the_follower_truncates_to_the_epoch_boundary_not_its_high_watermark() -> None:
    """KIP-101's scenario: A led epoch 1 and wrote m1 (offset 1) that B never got; B leads epoch 2
    from offset 1 and writes m2. A, back, would keep m1 under a high-watermark truncation."""
    leader_cache, leader_end = epochs((1, 0), (2, 1)), 2
    follower_cache, follower_end = epochs((1, 0)), 2
    position = rf.fetch_position(follower_cache, follower_end)
    assert position.last_fetched_epoch == 1
    answer = diverging(leader_cache, leader_end, position.last_fetched_epoch, follower_end)
    assert answer == (1, 1)
    step = rf.next_step(
        follower_cache,
        follower_end,
        rf.LeaderAnswer(diverging_epoch=answer[0], diverging_end_offset=answer[1]),
    )
    assert step == rf.Truncate(offset=1, cache=epochs((1, 0)))
    # the next fetch from 1 agrees with the leader
    assert diverging(leader_cache, leader_end, 1, 1) is None


def test_kip_279_a_follower_that_does_not_know_the_leaders_epoch_cuts_back_to_its_own() -> None:
    """The follower led epochs 2 and 3 that the leader never had; the leader answers for its
    largest epoch at or below 3 (epoch 1); the follower does not know epoch 1's successor on the
    leader's side, and cuts to where its own epoch 1 ends, then the logs agree."""
    follower_cache, follower_end = epochs((0, 0), (2, 5), (3, 8)), 12
    leader_cache, leader_end = epochs((0, 0), (1, 4), (4, 9)), 15
    answer = diverging(leader_cache, leader_end, 3, follower_end)
    assert answer == (1, 9)
    step = rf.next_step(
        follower_cache,
        follower_end,
        rf.LeaderAnswer(diverging_epoch=1, diverging_end_offset=9),
    )
    # the follower's largest epoch at or below 1 is 0, which ends at 5 in its log
    assert step == rf.Truncate(offset=5, cache=epochs((0, 0)))
    # again: the follower's last record is of epoch 0, which the leader ended at 4
    assert diverging(leader_cache, leader_end, 0, 5) == (0, 4)
    step = rf.next_step(
        epochs((0, 0)), 5, rf.LeaderAnswer(diverging_epoch=0, diverging_end_offset=4)
    )
    assert step == rf.Truncate(offset=4, cache=epochs((0, 0)))
    assert diverging(leader_cache, leader_end, 0, 4) is None


def test_the_leaders_half_of_the_handshake() -> None:
    cache, end = epochs((1, 0), (3, 10), (4, 25)), 30
    assert diverging(cache, end, 4, 30) is None  # caught up
    assert diverging(cache, end, 4, 31) == (4, 30)  # past the leader's end
    assert diverging(cache, end, 3, 25) is None
    assert diverging(cache, end, 3, 27) == (3, 25)
    assert diverging(cache, end, 2, 12) == (1, 10)  # an epoch the leader never had
    assert diverging(cache, end, 9, 40) == (4, 30)  # newer than any: back to the leader's end
    # a follower with records but no epoch starts again where the leader's first epoch does
    assert diverging(cache, end, NO_EPOCH, 5) == (NO_EPOCH, 0)
    assert diverging(cache, end, NO_EPOCH, 0) is None
    # a log emptied and started at the leader's log start (retention moved it past the
    # follower's end: rf.StartOver) is served from there, not sent back to where it is
    retained = epochs((3, 12), (4, 25))
    assert diverging(retained, end, NO_EPOCH, 12) is None
    assert diverging(retained, end, NO_EPOCH, 20) == (NO_EPOCH, 12)
    # the entries an answer carries: those of the records it returns
    assert epochs_between(cache, 12, 27) == epochs((3, 10), (4, 25))
    assert epochs_between(cache, 25, 30) == epochs((4, 25))
    assert epochs_between(cache, 30, 30) == ()


def test_appended_records_bring_their_epochs_into_the_cache() -> None:
    cache = epochs((0, 0), (2, 5))
    answer = rf.LeaderAnswer(
        high_watermark=9, log_start_offset=0, epoch_starts=epochs((2, 5), (3, 8), (5, 12))
    )
    step = rf.next_step(cache, 7, answer)
    assert step == rf.Append(cache=epochs((0, 0), (2, 5), (3, 8), (5, 12)), leader_high_watermark=9)
    assert rf.learned_high_watermark(9, 8) == 8
    # an entry a former leader wrote for an epoch it wrote nothing in gives way
    led_nothing = epochs((0, 0), (6, 7))
    assert rf.next_step(led_nothing, 7, rf.LeaderAnswer(epoch_starts=epochs((5, 7)))) == rf.Append(
        cache=epochs((0, 0), (5, 7)), leader_high_watermark=-1
    )
    # an epoch before the log end that is not the follower's last: the logs did diverge
    step = rf.next_step(cache, 7, rf.LeaderAnswer(epoch_starts=epochs((1, 3), (3, 8))))
    assert isinstance(step, rf.BackOff)


def test_error_answers() -> None:
    cache = epochs((0, 0))
    for code in (ErrorCode.NOT_LEADER_OR_FOLLOWER, ErrorCode.FENCED_LEADER_EPOCH):
        assert rf.next_step(cache, 3, rf.LeaderAnswer(error_code=code)) == rf.RefreshLeader(
            code=code
        )
    assert rf.next_step(
        cache, 3, rf.LeaderAnswer(error_code=ErrorCode.UNKNOWN_TOPIC_ID)
    ) == rf.RefreshLeader(code=ErrorCode.UNKNOWN_TOPIC_ID)
    unknown = rf.next_step(cache, 3, rf.LeaderAnswer(error_code=ErrorCode.UNKNOWN_LEADER_EPOCH))
    assert isinstance(unknown, rf.BackOff) and unknown.code == 75
    # a leader that has not opened the partition yet: try it again
    not_open = rf.LeaderAnswer(error_code=ErrorCode.UNKNOWN_TOPIC_OR_PARTITION)
    assert isinstance(rf.next_step(cache, 3, not_open), rf.BackOff)
    gone = rf.LeaderAnswer(error_code=ErrorCode.OFFSET_OUT_OF_RANGE, log_start_offset=50)
    assert rf.next_step(cache, 3, gone) == rf.StartOver(offset=50)


# --- a property: repeated leader changes always converge on the leader's log -------------------


@attrs.define
class Replica:
    """A log as the epoch of each record, and its epoch cache."""

    records: list[int] = attrs.field(factory=list)
    cache: tuple[EpochStart, ...] = ()


def catch_up(follower: Replica, leader: Replica, rounds: int, batch: int) -> None:
    """Up to ``rounds`` fetches of at most ``batch`` records each, as the runtime would do."""
    for _ in range(rounds):
        position = rf.fetch_position(follower.cache, len(follower.records))
        answer: rf.LeaderAnswer
        found = diverging(
            leader.cache,
            len(leader.records),
            position.last_fetched_epoch,
            position.fetch_offset,
        )
        if found is not None:
            answer = rf.LeaderAnswer(diverging_epoch=found[0], diverging_end_offset=found[1])
        else:
            start = position.fetch_offset
            end = min(len(leader.records), start + batch)
            assert start <= len(leader.records), "a follower past a leader it agrees with"
            answer = rf.LeaderAnswer(
                high_watermark=0, epoch_starts=epochs_between(leader.cache, start, end)
            )
        step = rf.next_step(follower.cache, len(follower.records), answer)
        if isinstance(step, rf.Truncate):
            assert step.offset <= len(follower.records)
            del follower.records[step.offset :]
            follower.cache = step.cache
        else:
            assert isinstance(step, rf.Append), step
            follower.cache = step.cache
            follower.records += leader.records[position.fetch_offset : end]


def consistent(replica: Replica) -> bool:
    """Each record's epoch is the one its cache names for its offset."""
    for offset, epoch in enumerate(replica.records):
        named = [e.epoch for e in replica.cache if e.start_offset <= offset]
        if not named or named[-1] != epoch:
            return False
    return True


@given(
    st.lists(
        st.tuples(
            st.sampled_from(("elect", "append", "fetch", "fetch")),
            st.integers(0, 2),
            st.integers(1, 4),
        ),
        max_size=40,
    )
)
# A replica elected at its log end that wrote nothing, deposed, then fetching records of an
# older epoch at that offset: its empty epoch named them (found by a random example).
@example(
    [
        ("elect", 2, 1),
        ("append", 0, 1),
        ("fetch", 0, 1),
        ("append", 0, 1),
        ("elect", 0, 1),
        ("elect", 2, 1),
        ("fetch", 0, 1),
    ]
)
def test_logs_agree_after_any_history_of_leader_changes(
    history: list[tuple[str, int, int]],
) -> None:
    """Any replica may be elected (even one far behind: unclean), leaders append, followers
    fetch a few batches at a time. Two logs that hold a record of the same epoch at the same
    offset agree on everything before it (Log Matching), and a follower that fetches long
    enough ends with exactly the leader's log."""
    replicas = [Replica(), Replica(), Replica()]
    leader, epoch = 0, 0
    replicas[0].cache = epochs((0, 0))
    for kind, who, amount in history:
        if kind == "elect":
            leader, epoch = who, epoch + 1
            chosen = replicas[leader]
            chosen.cache = assign_epoch(chosen.cache, epoch, len(chosen.records))
        elif kind == "append":
            replicas[leader].records += [epoch] * amount
        elif who != leader:
            catch_up(replicas[who], replicas[leader], rounds=amount, batch=2)
        for replica in replicas:
            assert consistent(replica)
        for a in replicas:
            for b in replicas:
                for offset in range(min(len(a.records), len(b.records))):
                    if a.records[offset] == b.records[offset]:
                        assert a.records[:offset] == b.records[:offset]
    for who, follower in enumerate(replicas):
        if who != leader:
            catch_up(follower, replicas[leader], rounds=200, batch=1000)
            assert follower.records == replicas[leader].records
