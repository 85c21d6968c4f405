"""A new coordinator adopts the members that fetch through a failover, on the autojump clock with
exact virtual times (docs/design.md#adoption-after-a-failover).

T = 6 s throughout: Pings every 2 s, a lease of T after the frame a request names plus the 0.5 s
margin on the coordinator's side. The coordinator restarts at 10.5 and is back at 11.5; its
recovered lease ends at 11.5 + T + margin = 18.0. A consumer that lost its coordinator looks for
it at once, then at the failover pace while it is down, fetching on under its lease, so both
members are back as it serves, at 11.5.
"""

from pathlib import Path

import pytest
import trio
import trio.testing

from protocol import (
    DeleteGroupRequest,
    DeleteGroupResponse,
    DescribeGroupRequest,
    DescribeGroupResponse,
    ErrorCode,
    ListGroupsRequest,
    ListGroupsResponse,
    OffsetCommitRequest,
    OffsetCommitResponse,
)
from protocol.types import PartitionOffset
from simulation import SimulatedCluster, SimulatedConsumer, open_simulated_cluster
from tests.simulation.test_faults import ALL, CONFIG, _spans
from tests.simulation.test_faults import _pair as _any_pair
from tests.support.protocols import eager


async def _pair(cluster: SimulatedCluster) -> tuple[SimulatedConsumer, SimulatedConsumer]:
    a, b = await _any_pair(cluster)
    assert isinstance(a, SimulatedConsumer) and isinstance(b, SimulatedConsumer)
    return a, b


async def _restart(cluster: SimulatedCluster) -> None:
    await trio.sleep_until(10.5)
    with trio.fail_after(5):
        await cluster.restart_coordinator(down_for=1.0)
    assert trio.current_time() == 11.5


async def test_members_back_as_the_record_says_are_adopted_without_a_rebalance(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with open_simulated_cluster(tmp_path, CONFIG) as cluster:
        a, b = await _pair(cluster)
        held = {"a": a.owned, "b": b.owned}
        await _restart(cluster)
        with trio.fail_after(20):
            await cluster.wait_settled()
        # Both looked for their coordinator at the failover pace while it was down, and came
        # back as it served, at 11.5, under generation 1 holding what the completed record gave
        # them: the group is Stable at once, with no initial delay, no new generation, and no
        # StopFetcher or StartFetcher.
        assert trio.current_time() == pytest.approx(11.5)
        group = cluster.coordinator.groups["g"]
        assert group.machine.generation == 1
        assert group.attempts == 0
        assert a.started_generations == b.started_generations == [1]
        assert {"a": a.owned, "b": b.owned} == held
        cluster.produce("events", records=5)
        await trio.sleep_until(20.0)  # past the recovered lease: the new coordinator's Pings hold
        # One unbroken fetch per partition, from the first start to now.
        assert not cluster.ledger.closed
        assert _spans(cluster, "a") == _spans(cluster, "b") == {(3.0, 20.0)}
        # Their Ping answers to the new coordinator count: the offsets moved on since.
        committed = await cluster.coordinator.offsets.committed("g")
        assert all(a.positions[tp] == committed[tp] == 5 for tp in a.owned)
        await cluster.check_invariants(settled=True)


async def test_a_member_that_does_not_come_back_costs_one_rebalance_after_its_lease(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with open_simulated_cluster(tmp_path, eager(CONFIG)) as cluster:
        a, b = await _pair(cluster)
        held_by_a = a.owned
        await trio.sleep_until(10.4)
        b.cut_network(30)  # b sees neither the restart nor the new coordinator
        await _restart(cluster)
        with trio.fail_after(20):
            await cluster.wait_stable("g", members=1)
        # a came back at 11.5 and fetched on; the group waited for b until the recovered lease
        # ran out at 18.0 and then rebalanced once: a's own partitions stopped and started again
        # at 18.0, with b's.
        assert trio.current_time() == 18.0
        group = cluster.coordinator.groups["g"]
        assert (group.attempts, group.machine.generation) == (1, 2)
        assert a.owned == ALL
        assert {(i.start, i.end) for i in cluster.ledger.closed if i.consumer_id == "a"} == {
            (3.0, 18.0)
        }
        assert {i.partition for i in cluster.ledger.closed if i.consumer_id == "a"} == held_by_a
        assert max(i.end for i in cluster.ledger.closed if i.consumer_id == "b") <= 18.0
        await cluster.check_invariants()


async def test_a_member_back_late_within_its_lease_causes_no_rebalance(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with open_simulated_cluster(tmp_path, CONFIG) as cluster:
        a, b = await _pair(cluster)
        held = {"a": a.owned, "b": b.owned}
        await trio.sleep_until(10.4)
        b.freeze(1.4)  # paused through the restart: back 1.3 s after a, still fetching
        await _restart(cluster)
        with trio.fail_after(20):
            await cluster.wait_settled()
        # a came back at 11.5; the group waited for the other member its record names: b
        # resumed at 11.8, saw its connection closed, and came back at once still fetching (its
        # lease ran to 14.0). Both adopted at 11.8, generation 1, no attempt.
        assert trio.current_time() == pytest.approx(11.8)
        group = cluster.coordinator.groups["g"]
        assert (group.attempts, group.machine.generation) == (0, 1)
        assert {"a": a.owned, "b": b.owned} == held
        assert not cluster.ledger.closed
        await cluster.check_invariants(settled=True)


async def test_a_record_that_gave_a_member_nothing_is_not_adopted(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    """Three members, two partitions: the record gives c nothing. Paused from 10.4 to 15.4, c
    lets its lease run out (at 14.0, T after the frame of 8.0) and so waits for a start. It
    comes back as it wakes (it looks for its coordinator at once), at 15.4, within the recovered
    lease (to 18.0), under generation 1 holding nothing, as it would if it still ran under that
    start: only a start tells it which, so the group rebalances rather than adopt the record and
    leave c waiting for a start that never comes."""
    async with open_simulated_cluster(tmp_path, CONFIG) as cluster:
        await cluster.create_topic("events", partitions=2)
        a, b, c = [
            await cluster.start_consumer(name, group="g", topics={"events": 1}) for name in "abc"
        ]
        with trio.fail_after(10):
            await cluster.wait_settled()
        held = {"a": a.owned, "b": b.owned, "c": c.owned}
        assert held["c"] == frozenset()
        await trio.sleep_until(10.4)
        c.freeze(5.0)
        await _restart(cluster)
        with trio.fail_after(20):
            await cluster.wait_settled()
        # a and b came back as it served, at 11.5, holding their partitions; the group waited
        # for c, back as it woke at 15.4.
        assert trio.current_time() == pytest.approx(15.4)
        group = cluster.coordinator.groups["g"]
        assert (group.attempts, group.machine.generation) == (1, 2)
        assert c.started_generations == [1, 2] and c.fetching
        assert {"a": a.owned, "b": b.owned, "c": c.owned} == held
        await cluster.check_invariants(settled=True)


async def test_a_record_written_before_its_starts_were_answered_is_not_adopted(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with open_simulated_cluster(tmp_path, eager(CONFIG)) as cluster:
        a, b = await _pair(cluster)
        for consumer in (a, b):
            consumer.answer_slowly(1.0)
        await trio.sleep_until(5.0)
        await cluster.add_partitions("events", added=2)
        # The attempt of 5.0 takes generation 2: StopFetcher answered at 6.0, the record of
        # generation 2 written and StartFetcher sent at 6.0, carried out at 7.0; but the answers
        # are held in the network past the restart.
        await trio.sleep_until(6.5)
        for consumer in (a, b):
            consumer.delay_delivery(3.0, to_consumer=False, to_broker=True)
        await trio.sleep_until(8.5)
        assert a.started_generations == b.started_generations == [1, 2]
        records = await cluster.store.groups()
        assert (records["g"].generation, records["g"].complete) == (2, False)
        with trio.fail_after(5):
            await cluster.restart_coordinator(down_for=1.0)
        assert trio.current_time() == 9.5
        for consumer in (a, b):
            consumer.answer_slowly(0.0)
        with trio.fail_after(20):
            await cluster.wait_settled()
        # Both came back as it served, at 9.5, under generation 2 holding what its record gave
        # them (they looked at the failover pace while it was down), but no
        # StartFetcher answer of that generation was ever read: the record says only who was
        # meant to fetch what, so the group rebalanced, under generation 3, at once.
        assert trio.current_time() == pytest.approx(9.5)
        group = cluster.coordinator.groups["g"]
        assert (group.attempts, group.machine.generation) == (1, 3)
        assert a.started_generations == b.started_generations == [1, 2, 3]
        records = await cluster.store.groups()
        assert (records["g"].generation, records["g"].complete) == (3, True)
        await cluster.check_invariants(settled=True)


async def test_a_consumer_abandoning_a_live_connection_while_fetching_is_not_taken_as_stopped(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with open_simulated_cluster(tmp_path, eager(CONFIG)) as cluster:
        a, b = await _pair(cluster)
        held = {"a": a.owned, "b": b.owned}
        await trio.sleep_until(4.0)
        a.delay_delivery(2.5)  # the coordinator lives, but a hears nothing from it
        await trio.sleep_until(5.0)
        a.abandon_connection()  # gives up on it while still fetching: a reset, not a close

        with trio.fail_after(30):
            await cluster.wait_settled()
        cluster.ledger.check()  # a's partitions never had two owners
        # The coordinator read a reset at 5.0, not an end of stream: a's partitions stayed
        # leased (to 10.5: the Ping it sent a at 4.0, plus T and the margin), and the attempt
        # of 5.0 for b alone waited. a looked for its coordinator at once but heard nothing
        # from it until the delay ended at 6.5 (not T/3 after 5.0, 7.0, as a consumer that
        # waits before it looks again would): it came back then still fetching them, adopted
        # them, and so failed that attempt; after the backoff (T/3) the next one stopped both
        # at 8.5 and gave each its own back.
        assert trio.current_time() == 8.5
        assert _spans(cluster, "a") == {(3.0, 8.5), (8.5, 8.5)}
        assert cluster.coordinator.groups["g"].machine.generation == 3
        assert {"a": a.owned, "b": b.owned} == held
        await cluster.check_invariants(settled=True)


async def test_members_of_different_generations_are_adopted_each_under_its_own(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    """Under the incremental protocol a member the latest rebalance left alone keeps an older
    generation; the record names each member's own, so a successor adopts them all as they are
    (docs/design.md#adoption-after-a-failover): no Stop, no Start, no new generation."""
    async with open_simulated_cluster(tmp_path, CONFIG) as cluster:
        a, b = await _pair(cluster)
        await trio.sleep_until(6.0)
        c = await cluster.start_consumer("c", group="g", topics={"events": 1})
        with trio.fail_after(10):
            await cluster.wait_settled()
        # c gained; a and b each gave up a partition and were not started.
        assert (a.generation, b.generation, c.generation) == (1, 1, 2)
        held = {"a": a.owned, "b": b.owned, "c": c.owned}
        handovers = [(x.stops_received, x.starts_received) for x in (a, b, c)]
        await trio.sleep_until(9.0)  # the record is marked complete
        records = await cluster.store.groups()
        assert [m.generation for m in records["g"].members] == [1, 1, 2]
        await _restart(cluster)
        with trio.fail_after(20):
            await cluster.wait_settled()
        assert trio.current_time() == pytest.approx(11.5)  # back as it served
        group = cluster.coordinator.groups["g"]
        assert (group.machine.generation, group.attempts) == (2, 0)
        assert {"a": a.owned, "b": b.owned, "c": c.owned} == held
        assert [(x.stops_received, x.starts_received) for x in (a, b, c)] == handovers
        await cluster.check_invariants(settled=True)


async def test_a_group_awaiting_its_members_after_a_failover_is_described_so_and_not_reset(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    """Between the new coordinator's load (11.5) and its members' return (12.5) the group was
    described Empty with no members, and a reset of its offsets was accepted, which the members'
    next reports then undid (issue 28). Now it is AwaitingMembers, naming the members its record
    awaits with what they hold, and resets and deletes are refused with a retriable code.

    Both members are paused from 10.4 to 12.5 through the failover: they would otherwise come
    back as the new coordinator serves (they look for it at the failover pace while it is down),
    closing the window in the instant it opens."""
    async with open_simulated_cluster(tmp_path, CONFIG) as cluster:
        a, b = await _pair(cluster)
        held = {"a": a.owned, "b": b.owned}
        await trio.sleep_until(10.4)
        for consumer in (a, b):
            consumer.freeze(2.1)
        await _restart(cluster)
        reset = OffsetCommitRequest(
            group_id="g",
            consumer_id=None,
            generation=-1,
            offsets=tuple(
                PartitionOffset(topic=tp.topic, partition=tp.partition, offset=0)
                for tp in sorted(ALL)
            ),
        )
        async with cluster.open_client() as admin:
            described = await admin.request(DescribeGroupRequest(group_id="g"))
            assert isinstance(described, DescribeGroupResponse)
            assert (described.state, described.generation) == ("AwaitingMembers", 1)
            assert described.awaiting == ("a", "b")
            assert {m.member_id: frozenset(m.partitions) for m in described.members} == held
            assert described.member_hosts == ()  # none of them is connected
            refused = OffsetCommitResponse(error_code=ErrorCode.REBALANCE_IN_PROGRESS)
            assert await admin.request(reset) == refused
            deleted = await admin.request(DeleteGroupRequest(group_id="g"))
            assert deleted == DeleteGroupResponse(error_code=ErrorCode.REBALANCE_IN_PROGRESS)
            listed = await admin.request(ListGroupsRequest())
            assert isinstance(listed, ListGroupsResponse)
            assert [(g.group_id, g.state) for g in listed.groups] == [("g", "AwaitingMembers")]
        assert trio.current_time() == 11.5
        with trio.fail_after(20):
            await cluster.wait_settled()
        assert trio.current_time() == 12.5  # back as they woke, still fetching
        async with cluster.open_client() as admin:
            described = await admin.request(DescribeGroupRequest(group_id="g"))
            assert isinstance(described, DescribeGroupResponse)
            assert (described.state, described.awaiting) == ("Stable", ())
            assert [m.member_id for m in described.members] == ["a", "b"]
            refused = OffsetCommitResponse(error_code=ErrorCode.NON_EMPTY_GROUP)
            assert await admin.request(reset) == refused
        await cluster.check_invariants(settled=True)
