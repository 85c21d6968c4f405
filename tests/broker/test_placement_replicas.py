"""Where a replicated topic's replicas go (DESIGN37 §2.4 CreateTopic): Kafka's rack-unaware
assignment, the preferred leaders round robin from a random start and the followers shifted so
that one broker's partitions do not all follow it onto the same neighbour; a factor the brokers
cannot hold is refused, never placed short."""

from __future__ import annotations

import random
from collections import Counter

from hypothesis import given
from hypothesis import strategies as st

from broker import placement
from protocol import ErrorCode
from statemachine.partition_state import ReplicationCode


def test_factor_one_places_as_today() -> None:
    for seed in range(10):
        replicas, code = placement.new_topic_replicas((1, 2, 3), 7, 1, random.Random(seed))
        assert code is ErrorCode.NONE
        assert replicas == tuple(
            (b,) for b in placement.new_topic((1, 2, 3), 7, random.Random(seed))
        )
        grown, code = placement.added_replicas((1, 2, 3), replicas, 4)
        assert code is ErrorCode.NONE
        assert grown == tuple((b,) for b in placement.added((1, 2, 3), [r[0] for r in replicas], 4))


def test_three_replicas_on_three_brokers() -> None:
    replicas, code = placement.new_topic_replicas((1, 2, 3), 6, 3, random.Random(0))
    assert code is ErrorCode.NONE
    assert all(sorted(r) == [1, 2, 3] for r in replicas)
    assert Counter(r[0] for r in replicas) == {1: 2, 2: 2, 3: 2}


def test_a_factor_the_brokers_cannot_hold_is_refused() -> None:
    for factor in (0, 4):
        assert placement.new_topic_replicas((1, 2, 3), 2, factor, random.Random(0)) == (
            (),
            ReplicationCode.INVALID_REPLICATION_FACTOR,
        )
    assert ReplicationCode.INVALID_REPLICATION_FACTOR.value == 38
    placed = ((1, 2, 3), (2, 3, 1))
    assert placement.added_replicas((1, 2), placed, 1) == (
        (),
        ReplicationCode.INVALID_REPLICATION_FACTOR,
    )


def test_added_partitions_take_the_topics_factor_and_go_on_round_robin() -> None:
    placed, _ = placement.new_topic_replicas((1, 2, 3, 4), 5, 2, random.Random(3))
    grown, code = placement.added_replicas((1, 2, 3, 4), placed, 6)
    assert code is ErrorCode.NONE
    assert all(len(r) == 2 and len(set(r)) == 2 for r in grown)
    assert [r[0] for r in grown] == list(placement.added((1, 2, 3, 4), [r[0] for r in placed], 6))


@given(
    st.lists(st.integers(0, 50), min_size=1, max_size=7, unique=True),
    st.integers(1, 60),
    st.data(),
)
def test_replicas_are_distinct_and_spread(
    ids: list[int], partitions: int, data: st.DataObject
) -> None:
    brokers = tuple(sorted(ids))
    n = len(brokers)
    factor = data.draw(st.integers(1, n))
    replicas, code = placement.new_topic_replicas(
        brokers, partitions, factor, random.Random(data.draw(st.integers(0, 2**32)))
    )
    assert code is ErrorCode.NONE and len(replicas) == partitions
    assert all(
        len(r) == factor and len(set(r)) == factor and set(r) <= set(brokers) for r in replicas
    )
    leaders = Counter(r[0] for r in replicas)
    assert max(leaders.values()) - min(leaders.get(b, 0) for b in brokers) <= 1
    # every round of n partitions puts `factor` replicas on each broker: only the last is short
    held = Counter(b for r in replicas for b in r)
    assert max(held.values()) - min(held.get(b, 0) for b in brokers) <= factor


@given(st.integers(3, 7), st.integers(0, 2**32))
def test_the_followers_of_one_brokers_leaders_spread_over_every_other_broker(
    n: int, seed: int
) -> None:
    """After n - 1 rounds each broker's partitions have had each other broker as their first
    follower: when it dies, their leadership spreads instead of piling on one neighbour."""
    brokers = tuple(range(1, n + 1))
    replicas, _ = placement.new_topic_replicas(brokers, n * (n - 1), 2, random.Random(seed))
    for b in brokers:
        assert {r[1] for r in replicas if r[0] == b} == set(brokers) - {b}
