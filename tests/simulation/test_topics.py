"""A new topic or new partitions rebalance every interested group — including groups with
wildcard subscriptions — and no group that is not interested (docs/design.md#rebalance-triggers).

T = 6 s; a new group's first rebalance waits the initial delay of 3 s.
"""

import logging
from pathlib import Path

import pytest
import trio
import trio.testing

from coordinator.config import CoordinatorConfig
from protocol import ErrorCode, OffsetFetchRequest, OffsetFetchResponse
from protocol.types import Subscription, TopicPartition
from simulation import SimulatedCluster, open_simulated_cluster
from statemachine.group import GroupState

CONFIG = CoordinatorConfig(initial_rebalance_delay=3.0)


def _partitions(topic: str, count: int) -> set[TopicPartition]:
    return {TopicPartition(topic=topic, partition=p) for p in range(count)}


async def test_added_partitions_rebalance_the_group_and_get_owners(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with open_simulated_cluster(tmp_path, CONFIG) as cluster:
        await cluster.create_topic("events", partitions=4)
        a = await cluster.start_consumer("a", group="g", topics={"events": 1})
        b = await cluster.start_consumer("b", group="g", topics={"events": 1})
        with trio.fail_after(10):
            assert await cluster.wait_stable("g", members=2) == 1
        await trio.sleep_until(10.0)
        await cluster.add_partitions("events", added=2)
        with trio.fail_after(5):
            await cluster.wait_settled()
        assert trio.current_time() == 10.0  # a topic change rebalances at once
        assert cluster.coordinator.groups["g"].machine.generation == 2
        assert a.owned | b.owned == _partitions("events", 6)
        assert (len(a.owned), len(b.owned)) == (3, 3)
        await cluster.check_invariants(settled=True)


async def test_a_new_topic_matching_a_whitelist_rebalances_only_the_interested_group(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with open_simulated_cluster(tmp_path, CONFIG) as cluster:
        await cluster.create_topic("metrics.cpu", partitions=2)
        await cluster.create_topic("orders", partitions=2)
        wildcard = Subscription(pattern=r"metrics\..*", pattern_streams=1)
        w1 = await cluster.start_consumer("w1", group="watchers", subscription=wildcard)
        w2 = await cluster.start_consumer("w2", group="watchers", subscription=wildcard)
        o = await cluster.start_consumer("o", group="orders", topics={"orders": 1})
        with trio.fail_after(10):
            await cluster.wait_settled()
        assert w1.owned | w2.owned == _partitions("metrics.cpu", 2)
        await trio.sleep_until(20.0)
        await cluster.create_topic("metrics.disk", partitions=4)
        await cluster.create_topic("payments", partitions=1)  # matches nobody
        with trio.fail_after(5):
            await cluster.wait_settled()
        assert trio.current_time() == 20.0
        assert w1.owned | w2.owned == _partitions("metrics.cpu", 2) | _partitions("metrics.disk", 4)
        assert cluster.coordinator.groups["watchers"].machine.generation == 2
        assert cluster.coordinator.groups["orders"].machine.generation == 1  # not disturbed
        assert o.owned == _partitions("orders", 2)
        await cluster.check_invariants(settled=True)


async def test_a_blacklist_takes_every_topic_but_those_it_matches(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with open_simulated_cluster(tmp_path, CONFIG) as cluster:
        for topic in ("orders", "internal.audit", "payments"):
            await cluster.create_topic(topic, partitions=2)
        everything_but_internal = Subscription(
            pattern=r"internal\..*", pattern_is_blacklist=True, pattern_streams=1
        )
        a = await cluster.start_consumer("a", group="g", subscription=everything_but_internal)
        with trio.fail_after(10):
            await cluster.wait_settled()
        assert a.owned == _partitions("orders", 2) | _partitions("payments", 2)
        await trio.sleep_until(10.0)
        await cluster.create_topic("internal.metrics", partitions=3)  # excluded: no rebalance
        await cluster.create_topic("refunds", partitions=1)  # not excluded: taken
        with trio.fail_after(5):
            await cluster.wait_settled()
        assert a.owned == (
            _partitions("orders", 2) | _partitions("payments", 2) | _partitions("refunds", 1)
        )
        assert not any(tp.topic.startswith("internal.") for tp in a.owned)
        assert cluster.coordinator.groups["g"].machine.generation == 2
        await cluster.check_invariants(settled=True)


async def _offset_fetch(cluster: SimulatedCluster, group_id: str) -> set[TopicPartition]:
    """The partitions OffsetFetch names a committed offset for, as a client asks."""
    async with cluster.open_client() as client:
        response = await client.request(OffsetFetchRequest(group_id=group_id, partitions=None))
    assert isinstance(response, OffsetFetchResponse)
    assert response.error_code is ErrorCode.NONE
    return {po.topic_partition for po in response.offsets if po.offset >= 0}


async def test_a_deleted_topic_leaves_its_groups_and_takes_their_offsets_for_it_along(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with open_simulated_cluster(tmp_path, CONFIG) as cluster:
        await cluster.create_topic("events", partitions=4)
        await cluster.create_topic("orders", partitions=2)
        a = await cluster.start_consumer("a", group="g", topics={"events": 1, "orders": 1})
        b = await cluster.start_consumer("b", group="g", topics={"events": 1, "orders": 1})
        o = await cluster.start_consumer("o", group="orders-only", topics={"orders": 1})
        with trio.fail_after(10):
            await cluster.wait_settled()
        await trio.sleep_until(20.0)  # Ping answers report offsets, the committer writes them
        assert await _offset_fetch(cluster, "g") == _partitions("events", 4) | _partitions(
            "orders", 2
        )
        assert ErrorCode.NONE is await cluster.delete_topic("events")
        with trio.fail_after(5):
            await cluster.coordinator.groups["g"].status.wait_value(
                lambda status: status == (GroupState.STABLE, 2)
            )
            await cluster.wait_settled()
        assert trio.current_time() == 20.0  # a deleted topic rebalances at once
        assert cluster.coordinator.groups["g"].machine.generation == 2
        assert cluster.coordinator.groups["orders-only"].machine.generation == 1
        assert a.owned | b.owned == _partitions("orders", 2)
        assert o.owned == _partitions("orders", 2)
        assert await _offset_fetch(cluster, "g") == _partitions("orders", 2)
        # Reports go on; none writes the deleted topic's offsets again.
        await trio.sleep_until(40.0)
        assert await _offset_fetch(cluster, "g") == _partitions("orders", 2)
        assert {tp.topic for tp in await cluster.store.fetch_offsets("g")} == {"orders"}
        await cluster.check_invariants(settled=True)
        assert ErrorCode.UNKNOWN_TOPIC_OR_PARTITION is await cluster.delete_topic("events")

        await cluster.restart_coordinator()
        assert await _offset_fetch(cluster, "g") == _partitions("orders", 2)
        # Created again under the name, the topic starts with no committed offsets.
        await cluster.create_topic("events", partitions=2)
        assert await _offset_fetch(cluster, "g") == _partitions("orders", 2)
        with trio.fail_after(10):
            await cluster.wait_settled()
        assert a.owned | b.owned == _partitions("orders", 2) | _partitions("events", 2)
        await cluster.check_invariants(settled=True)


async def test_offsets_the_committer_wrote_after_the_store_deleted_their_topic_are_deleted_too(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with open_simulated_cluster(tmp_path, CONFIG) as cluster:
        await cluster.create_topic("events", partitions=2)
        await cluster.start_consumer("a", group="g", topics={"events": 1})
        with trio.fail_after(10):
            await cluster.wait_settled()
        coordinator = cluster.coordinator
        generation = coordinator.groups["g"].machine.generation
        # An offset accepted before the delete, and written by the committer after the store
        # deleted the topic with its offsets but before the coordinator's watch saw it gone.
        reported = {TopicPartition(topic="events", partition=0): 7}
        assert coordinator.offsets.accept_nowait("g", generation, reported, monotonic=True)
        await cluster.store.delete_topic("events")
        await coordinator.offsets.flush()
        for _ in range(1000):  # the watch and the coordinator's clean-up, at this same instant
            if "events" not in coordinator.topics and not await cluster.store.fetch_offsets("g"):
                break
            await trio.sleep(0)
        assert trio.current_time() == 3.0  # the group's first rebalance, after its 3 s delay
        assert await cluster.store.fetch_offsets("g") == {}
        assert await _offset_fetch(cluster, "g") == set()
        await cluster.check_invariants()


async def test_a_topic_deleted_while_an_attempt_waits_for_a_lease_fails_the_attempt_not_the_group(
    tmp_path: Path, autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    """The attempt after a's death plans with ``events`` and waits for a's lease; ``events`` is
    deleted meanwhile. Building its StartFetchers for a partition of a topic that is gone raised
    KeyError, which failed the whole group (rebuilt from its record, a traceback at ERROR; found
    by scripts/fuzz_broker.py). Now the attempt fails and is retried without the topic."""
    caplog.set_level(logging.INFO)
    async with open_simulated_cluster(tmp_path, CONFIG) as cluster:
        await cluster.create_topic("events", partitions=4)
        await cluster.create_topic("orders", partitions=2)
        a = await cluster.start_consumer("a", group="g", topics={"events": 1, "orders": 1})
        b = await cluster.start_consumer("b", group="g", topics={"events": 1, "orders": 1})
        with trio.fail_after(10):
            await cluster.wait_settled()
        await trio.sleep_until(10.0)
        a.freeze(60)
        a.drop_connection()  # dead at once, but it may fetch on until its lease has run out
        group = cluster.coordinator.groups["g"]
        with trio.fail_after(5):
            await group.status.wait_value(lambda status: status[0] is not GroupState.STABLE)
        assert ErrorCode.NONE is await cluster.delete_topic("events")
        with trio.fail_after(60):
            await cluster.wait_stable("g", members=1)
        # Attempt 2 (generation 2) waited for a's lease until 16.5 and then failed; attempt 3
        # came a third of T later without the topic.
        assert trio.current_time() == 18.5
        assert (group.attempts, group.machine.generation) == (3, 3)
        assert b.owned == _partitions("orders", 2)
        assert group is cluster.coordinator.groups["g"]  # never failed and rebuilt
        assert not [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
        await cluster.check_invariants()
