"""Where a topic's partitions go (docs/design.md#placement): round robin over the live brokers,
or over those named, from a random start; added partitions go on where the topic left off."""

from __future__ import annotations

import itertools
import random
from collections import Counter
from pathlib import Path

from broker import placement
from broker.dispatch import add_partitions, create_topic
from coordinator.limits import RequestLimits
from protocol import ConfigEntry, CreatePartitionsRequest, CreateTopicRequest, ErrorCode
from protocol.types import BrokerInfo
from store import open_embedded_store


def test_a_new_topic_spreads_evenly_from_a_varying_start() -> None:
    starts = set()
    for seed in range(20):
        placed = placement.new_topic((1, 2, 3), 7, random.Random(seed))
        counts = Counter(placed)
        assert set(counts) == {1, 2, 3}
        assert max(counts.values()) - min(counts.values()) <= 1
        # round robin: each partition's broker follows the previous one's
        assert all((b - a) % 3 == 1 for a, b in itertools.pairwise(placed))
        starts.add(placed[0])
    assert starts == {1, 2, 3}


def test_added_partitions_go_on_after_the_last_one() -> None:
    assert placement.added((1, 2, 3), (2, 3, 1, 2), 4) == (3, 1, 2, 3)
    # the last partition's broker is not among those named: from the first
    assert placement.added((1, 3), (2,), 3) == (1, 3, 1)


def test_brokers_named_must_be_live_and_named_once() -> None:
    live = {1, 2, 3}
    assert placement.chosen_brokers(None, live) == ((1, 2, 3), ErrorCode.NONE)
    assert placement.chosen_brokers([3, 1], live) == ((1, 3), ErrorCode.NONE)
    for asked in ([4], [1, 1], []):
        assert placement.chosen_brokers(asked, live)[1] is ErrorCode.INVALID_REPLICA_ASSIGNMENT


async def test_create_topic_places_over_every_live_broker(tmp_path: Path) -> None:
    limits = RequestLimits(max_partitions_per_broker=3)
    async with open_embedded_store(tmp_path) as store:
        for broker_id in (1, 2, 3):
            await store.register_broker(BrokerInfo(broker_id=broker_id, host="h", port=broker_id))
        request = CreateTopicRequest(topic="t", partitions=6)
        assert await create_topic(store, request, limits, random.Random(0)) is ErrorCode.NONE
        assert Counter((await store.topics())["t"].brokers) == {1: 2, 2: 2, 3: 2}

        named = CreateTopicRequest(topic="u", partitions=2, broker_ids=(1, 3))
        assert await create_topic(store, named, limits) is ErrorCode.NONE
        assert sorted((await store.topics())["u"].brokers) == [1, 3]

        # broker 2 has room for one more partition, 1 and 3 for none
        grow = CreatePartitionsRequest(topic="t", total_partitions=8, broker_ids=(2,))
        assert await add_partitions(store, grow, limits) is ErrorCode.POLICY_VIOLATION
        grow = CreatePartitionsRequest(topic="t", total_partitions=7, broker_ids=(2,))
        assert await add_partitions(store, grow, limits) is ErrorCode.NONE
        assert (await store.topics())["t"].brokers[6] == 2

        dead = CreateTopicRequest(topic="v", partitions=1, broker_ids=(4,))
        assert await create_topic(store, dead, limits) is ErrorCode.INVALID_REPLICA_ASSIGNMENT
        assert "v" not in await store.topics()


async def test_a_setting_checked_against_the_replication_factor_is_refused_with_its_code(
    tmp_path: Path,
) -> None:
    """min.insync.replicas above the factor passes the request's own check (it does not know the
    factor) and is refused by the store's: INVALID_CONFIG, nothing created."""
    limits = RequestLimits()
    async with open_embedded_store(tmp_path) as store:
        await store.register_broker(BrokerInfo(broker_id=1, host="h", port=1))
        too_many = CreateTopicRequest(
            topic="t",
            partitions=1,
            configs=(ConfigEntry(name="min.insync.replicas", value="2"),),
        )
        assert await create_topic(store, too_many, limits) is ErrorCode.INVALID_CONFIG
        assert "t" not in await store.topics()
        one = CreateTopicRequest(
            topic="t",
            partitions=1,
            configs=(ConfigEntry(name="min.insync.replicas", value="1"),),
        )
        assert await create_topic(store, one, limits) is ErrorCode.NONE
