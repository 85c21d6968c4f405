"""A topic deleted and created again under its name while a group reads it is another topic
(docs/design.md#topic-ids, SPEC.md §11.12): every member holding a partition of the old
incarnation is stopped, even one the new assignment gives the same partition; the new
incarnation starts only once no member may fetch the old one, from the reset policy, and no
offset of the old one is ever applied to it.

The re-creation is seen by the coordinator's topic watch as one change (``recreate_topic``), as
a slow watch or a broker down through both writes would see it: the name and the partition
count stay, only the id tells the incarnations apart. T = 6 s, the lease margin 0.5 s; a new
group's first rebalance waits the initial delay of 3 s.
"""

from pathlib import Path

import pytest
import trio
import trio.testing

from coordinator.config import CoordinatorConfig, RebalanceProtocol
from protocol.types import TopicPartition
from simulation import SimulatedCluster, SimulatedConsumer, open_simulated_cluster
from statemachine.group import GroupState

OLD, NEW = b"old", b"new"


def _config(protocol: RebalanceProtocol) -> CoordinatorConfig:
    return CoordinatorConfig(initial_rebalance_delay=3.0, rebalance_protocol=protocol)


PROTOCOLS = pytest.mark.parametrize("protocol", list(RebalanceProtocol), ids=lambda p: p.value)


def _events(*partitions: int) -> frozenset[TopicPartition]:
    return frozenset(TopicPartition(topic="events", partition=p) for p in partitions)


async def _consuming(cluster: SimulatedCluster) -> tuple[SimulatedConsumer, SimulatedConsumer]:
    """Group g's a and b each read one of the two partitions of "events" (10 records tagged
    OLD each), from generation 1 at 3.0 on; by 10.0 each has reported offset 10."""
    await cluster.create_topic("events", partitions=2)
    cluster.produce("events", records=10, value=OLD)
    a = await cluster.start_consumer("a", group="g", topics={"events": 1})
    b = await cluster.start_consumer("b", group="g", topics={"events": 1})
    with trio.fail_after(10):
        assert await cluster.wait_stable("g", members=2) == 1
    await trio.sleep_until(10.0)
    assert await cluster.store.fetch_offsets("g") == {tp: 10 for tp in _events(0, 1)}
    assert a.owned | b.owned == _events(0, 1)
    return a, b


def _check_incarnations(consumer: SimulatedConsumer, recreated_at: float) -> None:
    """Nothing of the old incarnation reached the application once the stop that the
    re-creation caused was answered, and the new incarnation's records, read from the log
    start (``smallest``, nothing committed), all did, each once."""
    stopped = min(at for at in consumer.stopped_at if at >= recreated_at)
    assert all(value == NEW for at, _, _, value in consumer.delivered if at > stopped)
    new = [(tp, offset) for _, tp, offset, value in consumer.delivered if value == NEW]
    assert sorted(new, key=lambda r: (r[0].partition, r[1])) == [
        (tp, offset) for tp in sorted(consumer.owned) for offset in range(3)
    ]


@PROTOCOLS
async def test_a_topic_created_again_stops_every_holder_and_starts_afresh(
    tmp_path: Path, autojump_clock: trio.testing.MockClock, protocol: RebalanceProtocol
) -> None:
    async with open_simulated_cluster(tmp_path, _config(protocol)) as cluster:
        a, b = await _consuming(cluster)
        held = {a.consumer_id: a.owned, b.consumer_id: b.owned}
        new_id = await cluster.recreate_topic("events", partitions=2)
        assert trio.current_time() == 10.0
        cluster.produce("events", records=3, value=NEW)
        group = cluster.coordinator.groups["g"]
        with trio.fail_after(5):
            await group.status.wait_value(lambda status: status == (GroupState.STABLE, 2))
            await cluster.wait_settled()
        assert trio.current_time() == 10.0  # a re-creation rebalances at once
        for consumer in (a, b):
            # Stopped on what it held, though the sticky assignment gives it the same again.
            assert consumer.owned == held[consumer.consumer_id]
            assert consumer.stopped_partitions[-1] in (None, held[consumer.consumer_id])
            assert consumer.started_generations[-1] == 2
        assert group.group.topic_ids == {"events": new_id}
        await trio.sleep_until(20.0)  # Pings report, the committer writes
        for consumer in (a, b):
            _check_incarnations(consumer, 10.0)
        # Only the new incarnation's offsets: 3, never the old 10.
        assert await cluster.store.fetch_offsets("g") == {tp: 3 for tp in _events(0, 1)}
        assert (await cluster.store.groups())["g"].topic_ids == {"events": new_id}
        await cluster.check_invariants(settled=True)


@PROTOCOLS
async def test_the_new_incarnation_waits_for_a_frozen_holder_of_the_old_ones_lease(
    tmp_path: Path, autojump_clock: trio.testing.MockClock, protocol: RebalanceProtocol
) -> None:
    """Created again with one partition: a, frozen holding the old partition 1, is not given
    the new partition 0 (no partition 1 exists now), yet b is started on it only once a's lease
    on the old partition 1 has run out."""
    async with open_simulated_cluster(tmp_path, _config(protocol)) as cluster:
        a, b = await _consuming(cluster)
        frozen, other = (a, b) if a.owned == _events(1) else (b, a)
        lease_end = frozen.lease_end
        frozen.freeze(30.0)
        await cluster.recreate_topic("events", partitions=1)
        cluster.produce("events", records=3, value=NEW)
        await trio.sleep_until(30.0)  # a is still frozen
        assert other.owned == _events(0)
        started = other.started_at[-1]
        # The coordinator waited out the frozen member's lease on the old partition 1: its own
        # count of it, from the StopFetcher it sent at 10.0 (which, had it arrived, renewed the
        # lease): T + margin. The member's own count ended sooner, at its last Ping before.
        assert started >= lease_end
        assert started == 10.0 + 6.0 + cluster.config.lease_margin
        # The stop (generation 2) went unanswered; the start is generation 3's, once a died.
        assert other.started_generations == [1, 3]
        _check_incarnations(other, 10.0)
        await cluster.check_invariants()


@PROTOCOLS
async def test_a_successor_finds_the_old_incarnation_in_the_record_and_quarantines_it(
    tmp_path: Path, autojump_clock: trio.testing.MockClock, protocol: RebalanceProtocol
) -> None:
    """The topic is created again unseen by the coordinator, which then restarts, while a frozen
    member holds the old incarnation: the successor reads the group's record, made under the
    old id, finds another in force, stops b, which came back still fetching its old partition,
    and starts the new incarnation only after the frozen member's lease as it counts it (from
    taking office)."""
    async with open_simulated_cluster(tmp_path, _config(protocol)) as cluster:
        a, b = await _consuming(cluster)
        old_id = cluster.coordinator.topics["events"].topic_id
        frozen, other = a, b
        held = other.owned
        frozen.freeze(60.0)
        cluster.latency.topics_held.value = True  # the coordinator never hears of it
        await cluster.store.delete_topic("events")
        new_id = (await cluster.store.create_topic("events", (1, 1))).topic_id
        await trio.sleep_until(11.0)
        assert cluster.coordinator.topics["events"].topic_id == old_id
        assert (await cluster.store.groups())["g"].topic_ids == {"events": old_id}
        await cluster.restart_coordinator()
        cluster.latency.topics_held.value = False
        assert cluster.coordinator.topics["events"].topic_id == new_id
        took_office = trio.current_time()
        assert took_office == 11.0
        cluster.produce("events", records=3, value=NEW)
        await trio.sleep_until(40.0)  # a is still frozen
        assert other.owned == _events(0, 1)
        # b came back to the successor still fetching its old partition: it was stopped on it
        # before the start that gave it the new incarnation's two.
        assert other.stopped_partitions[-1] in (None, held)
        assert other.stopped_at[-1] <= other.started_at[-1]
        started = other.started_at[-1]
        # The successor counts the frozen member's lease from taking office: T + margin.
        assert started == took_office + 6.0 + cluster.config.lease_margin
        assert cluster.coordinator.groups["g"].group.topic_ids == {"events": new_id}
        await trio.sleep_until(started + 10.0)
        _check_incarnations(other, 10.0)
        assert await cluster.store.fetch_offsets("g") == {tp: 3 for tp in _events(0, 1)}
        await cluster.check_invariants()
