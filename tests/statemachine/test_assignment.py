"""The assignors' promises, checked against the definitions rather than against the code.

Every expectation here is computed from ``Subscription.streams_for`` and the partition counts
directly, so a shared mistake in the assignors' own bookkeeping cannot hide itself.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Mapping
from typing import TypeVar

import attrs
from hypothesis import given
from hypothesis import strategies as st

from protocol.types import ConsumerThread, Subscription, TopicPartition, TopicStreams
from statemachine.assignment import (
    Assignment,
    imbalance,
    moved,
    range_assign,
    sticky_assign,
)

TOPICS = ["t0", "t1", "t2", "t3", "t4"]
MEMBERS = ["a", "b", "c", "m1", "m2", "m9", "m10", "z"]
PATTERNS = ["t[0-2]", "t.*", "t1|t3", "x.*", "t4"]

K = TypeVar("K")
V = TypeVar("V")


def sub(**streams: int) -> Subscription:
    return Subscription(topics=tuple(TopicStreams(topic=t, streams=n) for t, n in streams.items()))


def thread(member: str, index: int) -> ConsumerThread:
    return ConsumerThread(member_id=member, index=index)


def tp(topic: str, partition: int) -> TopicPartition:
    return TopicPartition(topic=topic, partition=partition)


# --- strategies ---------------------------------------------------------------------------------

named_subscriptions = st.builds(
    lambda entries: Subscription(
        topics=tuple(TopicStreams(topic=t, streams=n) for t, n in entries)
    ),
    st.lists(st.tuples(st.sampled_from(TOPICS), st.integers(0, 3)), max_size=4),
)
wildcard_subscriptions = st.builds(
    lambda entries, pattern, blacklist, streams: Subscription(
        topics=tuple(TopicStreams(topic=t, streams=n) for t, n in entries),
        pattern=pattern,
        pattern_is_blacklist=blacklist,
        pattern_streams=streams,
    ),
    st.lists(st.tuples(st.sampled_from(TOPICS), st.integers(0, 2)), max_size=2),
    st.sampled_from(PATTERNS),
    st.booleans(),
    st.integers(1, 3),
)
subscriptions_st = st.dictionaries(
    st.sampled_from(MEMBERS), st.one_of(named_subscriptions, wildcard_subscriptions), max_size=7
)
counts_st = st.dictionaries(st.sampled_from([*TOPICS, "t10"]), st.integers(0, 17), max_size=6)


@st.composite
def previous_st(draw: st.DrawFn) -> dict[TopicPartition, ConsumerThread]:
    """Any earlier assignment at all: owners gone, indexes out of range, partitions vanished."""
    keys = draw(
        st.lists(st.tuples(st.sampled_from([*TOPICS, "t10"]), st.integers(0, 20)), max_size=40)
    )
    owners = st.builds(thread, st.sampled_from([*MEMBERS, "gone"]), st.integers(0, 3))
    return {tp(t, p): draw(owners) for t, p in keys}


# --- independent checks -------------------------------------------------------------------------


def threads_of(subs: Mapping[str, Subscription], topic: str) -> list[ConsumerThread]:
    return [thread(member, i) for member, s in subs.items() for i in range(s.streams_for(topic))]


def wanted_partitions(
    subs: Mapping[str, Subscription], counts: Mapping[str, int]
) -> set[TopicPartition]:
    return {
        tp(topic, p) for topic, n in counts.items() if threads_of(subs, topic) for p in range(n)
    }


def check_valid(
    assignment: Assignment, subs: Mapping[str, Subscription], counts: Mapping[str, int]
) -> None:
    """Every wanted partition has exactly one owner, and that owner is a thread wanting it."""
    assert set(assignment) == wanted_partitions(subs, counts)
    for partition, owner in assignment.items():
        assert owner.member_id in subs
        assert 0 <= owner.index < subs[owner.member_id].streams_for(partition.topic)


def spread(
    assignment: Assignment, subs: Mapping[str, Subscription], counts: Mapping[str, int]
) -> int:
    held = Counter((p.topic, owner) for p, owner in assignment.items())
    worst = 0
    for topic, n in counts.items():
        threads = threads_of(subs, topic)
        if threads and n > 0:
            sizes = [held[(topic, t)] for t in threads]
            worst = max(worst, max(sizes) - min(sizes))
    return worst


def fewest_moves(
    previous: Assignment, subs: Mapping[str, Subscription], counts: Mapping[str, int]
) -> int:
    """The least number of partitions any balanced assignment must move or newly place.

    Per topic, a balanced thread holds q or q + 1 with exactly r at q + 1; a thread can keep at most
    min(kept, q), plus one more for at most r threads that kept more than q.
    """
    total = 0
    for topic, n in counts.items():
        threads = set(threads_of(subs, topic))
        if not threads or n <= 0:
            continue
        q, r = divmod(n, len(threads))
        kept = Counter(
            owner
            for p, owner in previous.items()
            if p.topic == topic and p.partition < n and owner in threads
        )
        best = sum(min(c, q) for c in kept.values()) + min(r, sum(c > q for c in kept.values()))
        total += n - best
    return total


def reordered(mapping: Mapping[str, Subscription]) -> dict[str, Subscription]:
    return dict(reversed(list(mapping.items())))


# --- range --------------------------------------------------------------------------------------


def test_seed02_worked_example() -> None:
    """Seed 02: 5 partitions over 2 consumers x 2 threads."""
    subs = {"C1": sub(topic=2), "C2": sub(topic=2)}
    got = range_assign(subs, {"topic": 5})
    assert got == {
        tp("topic", 0): thread("C1", 0),
        tp("topic", 1): thread("C1", 0),
        tp("topic", 2): thread("C1", 1),
        tp("topic", 3): thread("C2", 0),
        tp("topic", 4): thread("C2", 1),
    }


def test_range_orders_threads_by_index_number_not_by_string() -> None:
    got = range_assign({"m": sub(t=11)}, {"t": 11})
    assert got[tp("t", 10)] == thread("m", 10)
    assert got[tp("t", 2)] == thread("m", 2)


def test_range_more_threads_than_partitions_leaves_the_last_threads_empty() -> None:
    got = range_assign({"a": sub(t=2), "b": sub(t=2)}, {"t": 3})
    assert got == {
        tp("t", 0): thread("a", 0),
        tp("t", 1): thread("a", 1),
        tp("t", 2): thread("b", 0),
    }


def test_topics_nobody_wants_or_without_partitions_are_not_assigned() -> None:
    subs = {"a": sub(t0=1, t1=1)}
    for assign in (
        range_assign(subs, {"t0": 2, "t1": 0, "t9": 4}),
        sticky_assign(subs, {"t0": 2, "t1": 0, "t9": 4}, {}),
    ):
        assert set(assign) == {tp("t0", 0), tp("t0", 1)}


@given(subscriptions_st, counts_st)
def test_range_is_valid_balanced_and_deterministic(
    subs: dict[str, Subscription], counts: dict[str, int]
) -> None:
    got = range_assign(subs, counts)
    check_valid(got, subs, counts)
    assert spread(got, subs, counts) <= 1
    assert range_assign(reordered(subs), dict(reversed(list(counts.items())))) == got
    assert imbalance(got, subs, counts) == spread(got, subs, counts)


@given(subscriptions_st, counts_st)
def test_range_gives_consecutive_partitions_in_thread_order(
    subs: dict[str, Subscription], counts: dict[str, int]
) -> None:
    got = range_assign(subs, counts)
    for topic, n in counts.items():
        owners = [got[tp(topic, p)] for p in range(n) if tp(topic, p) in got]
        keys = [(o.member_id, o.index) for o in owners]
        assert keys == sorted(keys)


# --- sticky -------------------------------------------------------------------------------------


@given(subscriptions_st, counts_st)
def test_sticky_from_nothing_is_valid_and_balanced(
    subs: dict[str, Subscription], counts: dict[str, int]
) -> None:
    got = sticky_assign(subs, counts, {})
    check_valid(got, subs, counts)
    assert spread(got, subs, counts) <= 1
    assert moved({}, got) == len(got)


@given(subscriptions_st, counts_st, previous_st())
def test_sticky_is_valid_balanced_and_moves_the_fewest(
    subs: dict[str, Subscription],
    counts: dict[str, int],
    previous: dict[TopicPartition, ConsumerThread],
) -> None:
    got = sticky_assign(subs, counts, previous)
    check_valid(got, subs, counts)
    assert spread(got, subs, counts) <= 1
    assert moved(previous, got) == fewest_moves(previous, subs, counts)


@given(subscriptions_st, counts_st, previous_st(), st.randoms(use_true_random=False))
def test_sticky_is_deterministic_whatever_the_input_order(
    subs: dict[str, Subscription],
    counts: dict[str, int],
    previous: dict[TopicPartition, ConsumerThread],
    rnd: random.Random,
) -> None:
    got = sticky_assign(subs, counts, previous)
    assert sticky_assign(subs, counts, previous) == got

    def shuffled(mapping: Mapping[K, V]) -> dict[K, V]:
        items = list(mapping.items())
        rnd.shuffle(items)
        return dict(items)

    # Equal but distinct subscription objects (as decoded from the wire) change nothing either.
    copies = {m: attrs.evolve(s) for m, s in subs.items()}
    assert sticky_assign(shuffled(copies), shuffled(counts), shuffled(previous)) == got


@given(subscriptions_st, counts_st, st.data())
def test_sticky_leaver_moves_only_its_own_partitions(
    subs: dict[str, Subscription], counts: dict[str, int], data: st.DataObject
) -> None:
    if not subs:
        return
    before = sticky_assign(subs, counts, {})
    leaver = data.draw(st.sampled_from(sorted(subs)))
    rest = {m: s for m, s in subs.items() if m != leaver}
    after = sticky_assign(rest, counts, before)
    check_valid(after, rest, counts)
    assert spread(after, rest, counts) <= 1
    changed = {p for p, owner in after.items() if before.get(p) != owner}
    assert changed == {p for p in after if before[p].member_id == leaver}
    assert moved(before, after) == len(changed)


@given(subscriptions_st, counts_st, st.one_of(named_subscriptions, wildcard_subscriptions))
def test_sticky_joiner_takes_only_what_balance_demands(
    subs: dict[str, Subscription], counts: dict[str, int], joiner_sub: Subscription
) -> None:
    joiner = "new"
    before = range_assign(subs, counts)  # any balanced assignment will do
    after = sticky_assign({**subs, joiner: joiner_sub}, counts, before)
    check_valid(after, {**subs, joiner: joiner_sub}, counts)
    changed = {p for p, owner in after.items() if before.get(p) != owner}
    gained = {p for p, owner in after.items() if owner.member_id == joiner}
    assert changed == gained  # no partition moves between the members already there
    taken_from_others = {p for p in gained if p in before}
    left_others = {p for p, owner in before.items() if after[p] != owner}
    assert taken_from_others == left_others
    assert moved(before, after) == len(left_others) + len(gained - set(before))
    assert moved(before, after) == fewest_moves(before, {**subs, joiner: joiner_sub}, counts)


def test_sticky_leaver_at_scale_moves_exactly_the_leavers_partitions() -> None:
    topics = [f"t{i}" for i in range(20)]
    everything = sub(**dict.fromkeys(topics, 1))
    subs = {f"member-{i:03d}": everything for i in range(300)}
    counts = dict.fromkeys(topics, 150)
    before = sticky_assign(subs, counts, {})
    totals = Counter(owner.member_id for owner in before.values())
    assert max(totals.values()) - min(totals.values()) <= 1  # 3,000 partitions: 10 each
    del subs["member-123"]
    after = sticky_assign(subs, counts, before)
    assert moved(before, after) == totals["member-123"] == 10
    assert imbalance(after, subs, counts) <= 1


@given(st.integers(1, 12), st.integers(1, 30), st.integers(1, 5))
def test_sticky_spreads_many_small_topics_evenly_over_members(
    members: int, topics: int, partitions: int
) -> None:
    """Range hands every small topic's partitions to the first members; sticky's load tie-break
    spreads them, so member totals differ by at most one."""
    names = [f"t{i:02d}" for i in range(topics)]
    everything = sub(**dict.fromkeys(names, 1))
    subs = {f"m{i:02d}": everything for i in range(members)}
    counts = dict.fromkeys(names, partitions)
    got = sticky_assign(subs, counts, {})
    totals = Counter(owner.member_id for owner in got.values())
    sizes = [totals[m] for m in subs]
    assert max(sizes) - min(sizes) <= 1


def test_sticky_hands_a_freed_partition_to_the_least_loaded_thread() -> None:
    # t has 2 partitions over 4 threads; a leaves, so one of c and d takes a's partition. c already
    # holds all of u: d, though later in name order, is the less loaded and takes it.
    subs = {"a": sub(t=1), "b": sub(t=1), "c": sub(t=1, u=1), "d": sub(t=1)}
    before = {tp("t", 0): thread("a", 0), tp("t", 1): thread("b", 0)}
    before |= {tp("u", p): thread("c", 0) for p in range(3)}
    del subs["a"]
    after = sticky_assign(subs, {"t": 2, "u": 3}, before)
    assert after[tp("t", 0)] == thread("d", 0)
    assert moved(before, after) == 1


def test_range_starves_members_with_many_small_topics_where_sticky_does_not() -> None:
    everything = sub(**{f"t{i}": 1 for i in range(10)})
    subs = {"a": everything, "b": everything, "c": everything}
    counts = {f"t{i}": 1 for i in range(10)}
    assert Counter(o.member_id for o in range_assign(subs, counts).values()) == {"a": 10}
    assert sorted(
        Counter(o.member_id for o in sticky_assign(subs, counts, {}).values()).values()
    ) == [3, 3, 4]


def test_sticky_keeps_a_balanced_assignment_unchanged() -> None:
    subs = {"a": sub(t=2), "b": sub(t=1), "c": sub(t=1, u=1)}
    counts = {"t": 7, "u": 3}
    before = range_assign(subs, counts)
    assert sticky_assign(subs, counts, before) == before


def test_sticky_drops_owners_that_no_longer_want_the_topic_or_lost_a_stream() -> None:
    before = {tp("t", 0): thread("a", 0), tp("t", 1): thread("a", 1), tp("u", 0): thread("a", 0)}
    subs = {"a": sub(t=1), "b": sub(t=1, u=1)}
    after = sticky_assign(subs, {"t": 2, "u": 1}, before)
    assert after == {
        tp("t", 0): thread("a", 0),
        tp("t", 1): thread("b", 0),
        tp("u", 0): thread("b", 0),
    }


def test_sticky_gives_from_the_most_loaded_owner() -> None:
    # a and b each hold 2 of t; c joins t, so one of them must give. a also holds u, so a gives.
    subs = {"a": sub(t=1, u=1), "b": sub(t=1), "c": sub(t=1)}
    before = {
        tp("t", 0): thread("a", 0),
        tp("t", 1): thread("a", 0),
        tp("t", 2): thread("b", 0),
        tp("t", 3): thread("b", 0),
        tp("u", 0): thread("a", 0),
    }
    after = sticky_assign(subs, {"t": 4, "u": 1}, before)
    assert after[tp("t", 1)] == thread("c", 0)
    assert moved(before, after) == 1


# --- wildcards ----------------------------------------------------------------------------------


def test_wildcard_whitelist_and_blacklist() -> None:
    subs = {
        "w": Subscription(pattern="logs-.*", pattern_streams=2),
        "b": Subscription(pattern="logs-.*", pattern_is_blacklist=True),
    }
    counts = {"logs-a": 3, "logs-b": 1, "metrics": 2}
    for got in (range_assign(subs, counts), sticky_assign(subs, counts, {})):
        check_valid(got, subs, counts)
        assert {o.member_id for p, o in got.items() if p.topic.startswith("logs-")} == {"w"}
        assert {o.member_id for p, o in got.items() if p.topic == "metrics"} == {"b"}
        assert spread(got, subs, counts) <= 1


def test_named_entry_wins_over_the_pattern_and_the_first_entry_wins() -> None:
    s = Subscription(
        topics=(TopicStreams(topic="t", streams=3), TopicStreams(topic="t", streams=1)),
        pattern=".*",
        pattern_streams=1,
    )
    got = range_assign({"m": s}, {"t": 3, "u": 2})
    assert {o.index for p, o in got.items() if p.topic == "t"} == {0, 1, 2}
    assert {o.index for p, o in got.items() if p.topic == "u"} == {0}


# --- helpers ------------------------------------------------------------------------------------


def test_moved_counts_changed_and_new_partitions_only() -> None:
    before = {tp("t", 0): thread("a", 0), tp("t", 1): thread("a", 0), tp("t", 2): thread("b", 0)}
    after = {tp("t", 0): thread("a", 0), tp("t", 1): thread("b", 0), tp("t", 3): thread("b", 0)}
    assert moved(before, after) == 2
    assert moved(after, after) == 0


def test_imbalance_counts_threads_that_hold_nothing() -> None:
    subs = {"a": sub(t=1), "b": sub(t=1), "c": sub(u=2)}
    counts = {"t": 4, "u": 1}
    lopsided = {tp("t", p): thread("a", 0) for p in range(4)} | {tp("u", 0): thread("c", 0)}
    assert imbalance(lopsided, subs, counts) == 4
    assert imbalance(range_assign(subs, counts), subs, counts) == 1
    assert imbalance({}, {}, counts) == 0
