"""Failure domains (docs/failure-domains.md) on the autojump clock, with exact virtual times.

T = 6 s throughout: Pings every 2 s, each due within 4 s, a silent member's partitions wait T +
0.5 s after the last request sent to it. A consumer whose connection ended without its choosing
fetches on under its lease and looks for its coordinator again at once (the tests' own stand-in,
kept for a member breaking the rules, waits T/3 = 2 s first).
"""

import logging
from collections.abc import Mapping
from pathlib import Path

import pytest
import trio
import trio.testing

from coordinator.config import CoordinatorConfig
from protocol import (
    DeleteGroupRequest,
    DeleteGroupResponse,
    ErrorCode,
    OffsetCommitRequest,
    OffsetCommitResponse,
)
from protocol.types import PartitionOffset, TopicPartition
from simulation import RecordingStore, SimulatedCluster, open_simulated_cluster
from statemachine.consumer_group import Assignment, ConsumerGroup
from statemachine.group import Effect, GroupMachine, GroupState, MemberDeparted
from store import Deposed, OffsetBatch, StoreUnavailable
from tests.support.standin_consumer import StandInConsumer

CONFIG = CoordinatorConfig(initial_rebalance_delay=3.0, lease_margin=0.5)
ALL = {TopicPartition(topic="events", partition=p) for p in range(6)}


def _inject_assignor_bug(
    monkeypatch: pytest.MonkeyPatch, group_id: str, error: Exception
) -> list[bool]:
    """An injected bug: the assignment of ``group_id`` raises ``error`` once the returned switch
    is turned on, then works again."""
    armed = [False]
    real = ConsumerGroup.compute_assignment

    def compute(group: ConsumerGroup, partition_counts: Mapping[str, int]) -> Assignment:
        if group.group_id == group_id and armed[0]:
            armed[0] = False
            raise error
        return real(group, partition_counts)

    monkeypatch.setattr(ConsumerGroup, "compute_assignment", compute)
    return armed


async def _two_groups(cluster: SimulatedCluster) -> None:
    await cluster.create_topic("events", partitions=6)
    for name in ("a1", "a2"):
        await cluster.start_consumer(name, group="good", topics={"events": 1})
    for name in ("b1", "b2"):
        await cluster.start_consumer(name, group="bad", topics={"events": 1})
    with trio.fail_after(10):
        await cluster.wait_settled()
    assert trio.current_time() == 3.0


async def test_a_bug_in_one_groups_rebalance_fails_that_group_alone(
    tmp_path: Path,
    autojump_clock: trio.testing.MockClock,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    armed = _inject_assignor_bug(monkeypatch, "bad", RuntimeError("injected bug"))
    async with open_simulated_cluster(tmp_path, CONFIG) as cluster:
        await _two_groups(cluster)
        good = cluster.coordinator.groups["good"]
        failed = cluster.coordinator.groups["bad"]
        b1, b2 = cluster.consumers["b1"], cluster.consumers["b2"]
        b2_partitions = b2.owned
        await trio.sleep_until(10.5)  # every consumer answered the Ping of 10.0
        b2.freeze(20)  # cannot come back: its partitions must wait out its lease
        armed[0] = True
        # b3's join begins an attempt in the same instant, which hits the bug at once: the group
        # is rebuilt and its members cut off. Whether b3 heard its registration's answer first
        # is up to trio's scheduling; if not, it registers again at once like b1.
        b3 = await cluster.start_consumer("b3", group="bad", topics={"events": 1})
        await trio.sleep_until(11.0)
        assert cluster.coordinator.groups["bad"] is not failed
        # b1, cut off by a failure it did not choose, which proves nothing, fetched on under its
        # lease and registered again at once, claiming its partitions.
        assert b1.registrations == 2 and b1.owned
        assert b2.fetching  # b2 is frozen: it has not noticed
        failures = [r for r in caplog.records if "group bad failed" in r.getMessage()]
        assert len(failures) == 1 and failures[0].exc_info is not None
        with trio.fail_after(20):
            assert await cluster.wait_stable("bad", members=2) == 2
        # The rebuilt group left b1's partitions with it, and its first attempt waited for b2's,
        # whose lease is counted from the failure: 10.5 + T + margin.
        assert trio.current_time() == 17.0
        assert b1.registrations == 2 and b3.registrations in (1, 2)
        assert not [i for i in cluster.ledger.closed if i.consumer_id == "b1"]
        assert b1.owned | b3.owned == ALL
        starts = {
            i.start
            for i in cluster.ledger.intervals(trio.current_time())
            if i.group_id == "bad" and i.partition in b2_partitions and i.consumer_id != "b2"
        }
        assert starts == {17.0}
        await cluster.check_invariants()
        # The other group never noticed: same group, same generation, fetching since 3.0.
        assert cluster.coordinator.groups["good"] is good
        assert good.status.value == (GroupState.STABLE, 1)
        assert (good.attempts, good.completed) == (1, 1)
        good_leases = [i for i in cluster.ledger.closed if i.consumer_id in ("a1", "a2")]
        assert good_leases == []
        assert cluster.incarnation.value == 1  # the coordinator never restarted
        with trio.fail_after(40):
            await cluster.wait_settled()  # b2 resumes at 30.5, sees the close, comes back
        # b2 looked for its coordinator at once (the stand-in waited T/3 first).
        assert trio.current_time() == 30.5
        await cluster.check_invariants(settled=True)


async def test_a_bug_met_outside_the_driver_fails_only_that_group_too(
    tmp_path: Path, autojump_clock: trio.testing.MockClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A group machine input comes from a connection's task here (a member's close): a bug
    there fails the group, not the connection task, nor the broker."""
    armed = [False]
    real = GroupMachine.handle

    def handle(machine: GroupMachine, event: object) -> list[Effect]:
        if machine.group_id == "bad" and isinstance(event, MemberDeparted) and armed[0]:
            armed[0] = False
            raise RuntimeError("injected bug")
        return real(machine, event)

    monkeypatch.setattr(GroupMachine, "handle", handle)
    async with open_simulated_cluster(tmp_path, CONFIG) as cluster:
        await _two_groups(cluster)
        good = cluster.coordinator.groups["good"]
        failed = cluster.coordinator.groups["bad"]
        b2 = cluster.consumers["b2"]
        await trio.sleep_until(10.5)
        armed[0] = True
        await cluster.consumers["b1"].kill()
        await trio.sleep_until(11.0)
        assert cluster.coordinator.groups["bad"] is not failed
        # b2, disconnected with its group by an ending it did not choose, which proves nothing,
        # fetched on under its lease and registered again at once, claiming its partitions.
        assert b2.registrations == 2
        with trio.fail_after(20):
            assert await cluster.wait_stable("bad", members=1) == 2
        # b1 closed its connection, but that was the failed group's knowledge: its partitions
        # wait until 10.5 + T + margin. The rebuilt group left b2's partitions with it and
        # waited for b1, whom its record names, until b1's partitions were free, then started
        # them on b2.
        assert trio.current_time() == 17.0
        assert b2.owned == ALL
        assert not [i for i in cluster.ledger.closed if i.consumer_id == "b2"]
        assert cluster.coordinator.groups["good"] is good
        assert good.status.value == (GroupState.STABLE, 1)
        await cluster.check_invariants(settled=True)


async def test_a_store_error_in_a_groups_work_is_the_stores_and_ends_the_coordinator(
    tmp_path: Path, autojump_clock: trio.testing.MockClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Containing a group's failure must not hide a shared component's: a store that is gone
    ends the coordinator (crash-only: a restart recovers what is durable)."""
    armed = _inject_assignor_bug(monkeypatch, "bad", StoreUnavailable("injected: store gone"))
    with pytest.raises(BaseExceptionGroup) as failure:
        async with open_simulated_cluster(tmp_path, CONFIG) as cluster:
            await _two_groups(cluster)
            await trio.sleep_until(10.5)
            armed[0] = True
            await cluster.start_consumer("b3", group="bad", topics={"events": 1})
            await trio.sleep_forever()
    assert failure.value.subgroup(StoreUnavailable) is not None
    assert trio.current_time() == 10.5


async def test_a_failing_committer_ends_the_coordinator(
    tmp_path: Path, autojump_clock: trio.testing.MockClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The committer is shared by every group: its failure is the process's (a deposed
    coordinator's write here), not any group's."""
    with pytest.raises(BaseExceptionGroup) as failure:
        async with open_simulated_cluster(tmp_path, CONFIG) as cluster:
            await _two_groups(cluster)
            await trio.sleep_until(9.0)
            # Consumed before the Ping of 10.0, which reports it: the committer has something
            # to write at its next interval.
            cluster.produce("events", records=1)
            await trio.sleep_until(10.5)

            async def deposed(
                store: RecordingStore, epoch: int, batches: list[OffsetBatch]
            ) -> None:
                raise Deposed("injected: deposed")

            monkeypatch.setattr(RecordingStore, "commit_offsets", deposed)
            with trio.fail_after(10):  # a committer with nothing to write would never fail
                await trio.sleep_forever()
    assert failure.value.subgroup(Deposed) is not None
    assert trio.current_time() == 11.0  # the committer's next interval


async def test_a_member_that_refuses_every_stop_fetcher_dies_and_the_others_go_on(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    """c breaks the rules on purpose (it refuses every handover), which the library's consumer
    never does: c is the tests' own stand-in."""
    config = CoordinatorConfig(initial_rebalance_delay=3.0, lease_margin=0.5, max_missed_pings=2)
    async with open_simulated_cluster(tmp_path, config) as cluster:
        await cluster.create_topic("events", partitions=6)
        a = await cluster.start_consumer("a", group="g", topics={"events": 1})
        b = await cluster.start_consumer("b", group="g", topics={"events": 1})
        c = await cluster.start_consumer(
            "c", group="g", topics={"events": 1}, rejoin=False, member=StandInConsumer
        )
        assert await cluster.wait_stable("g", members=3) == 1
        c_partitions = c.owned
        await trio.sleep_until(10.5)
        c.refuse_handovers(ErrorCode.UNKNOWN_SERVER_ERROR)
        await cluster.add_partitions("events", added=3)
        with trio.fail_after(30):
            await cluster.wait_stable("g", members=2)
        # 10.5: attempt 2, c refuses StopFetcher: one miss of two, the attempt fails. It answers
        # the Ping of 12.0, which does not clear that miss. 12.5: attempt 3, c refuses again and
        # is dead; it may still be fetching, so its partitions wait until 12.5 + T + margin.
        assert trio.current_time() == 19.0
        everything = {TopicPartition(topic="events", partition=p) for p in range(9)}
        assert a.owned | b.owned == everything
        assert {a.generation, b.generation} == {4}
        starts = {
            i.start
            for i in cluster.ledger.intervals(trio.current_time())
            if i.partition in c_partitions and i.consumer_id != "c"
        }
        assert starts == {19.0}
        await cluster.check_invariants()  # c's process lives on, without a coordinator


async def test_delete_group_is_refused_while_a_lease_is_in_force(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with open_simulated_cluster(tmp_path, CONFIG) as cluster:
        await cluster.create_topic("events", partitions=6)
        a = await cluster.start_consumer("a", group="g", topics={"events": 1})
        b = await cluster.start_consumer("b", group="g", topics={"events": 1})
        assert await cluster.wait_stable("g", members=2) == 1
        await trio.sleep_until(5.0)  # a answered the Ping of 4.0
        a.freeze(20)
        a.drop_connection()  # dead at once, but it may fetch on: its lease runs to 10.5
        await b.kill()  # closed: b's partitions are free at once; the group has no members
        await cluster.coordinator.groups["g"].status.wait_value(lambda s: s[0] is GroupState.EMPTY)
        async with cluster.open_client() as admin:
            deleted = await admin.request(DeleteGroupRequest(group_id="g"))
            assert deleted == DeleteGroupResponse(error_code=ErrorCode.REBALANCE_IN_PROGRESS)
            # A reset of the offsets is refused too: a, which may still fetch, would come back
            # holding its partitions and its next report would undo the reset.
            reset = OffsetCommitRequest(
                group_id="g",
                consumer_id=None,
                generation=-1,
                offsets=tuple(
                    PartitionOffset(topic=tp.topic, partition=tp.partition, offset=0)
                    for tp in sorted(ALL)
                ),
            )
            refused = OffsetCommitResponse(error_code=ErrorCode.REBALANCE_IN_PROGRESS)
            assert await admin.request(reset) == refused
        assert trio.current_time() == 5.0
        c = await cluster.start_consumer("c", group="g", topics={"events": 1})
        with trio.fail_after(20):
            await cluster.wait_stable("g", members=1)
        # c's first attempt began at 8.0 and waited for a's lease: 4.0 + T + margin.
        assert trio.current_time() == 10.5
        assert c.owned == ALL
        assert {i.start for i in cluster.ledger.intervals(10.5) if i.consumer_id == "c"} == {10.5}
        await cluster.check_invariants()  # no two owners
        await c.kill()  # closed, no lease left: now the group can go
        async with cluster.open_client() as admin:
            deleted = await admin.request(DeleteGroupRequest(group_id="g"))
            assert deleted == DeleteGroupResponse(error_code=ErrorCode.NONE)
        assert "g" not in cluster.coordinator.groups


async def test_a_start_fetcher_too_large_for_a_frame_closes_only_its_member(
    tmp_path: Path, autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    config = CoordinatorConfig(initial_rebalance_delay=3.0, lease_margin=0.5, max_frame_size=2048)
    async with open_simulated_cluster(tmp_path, config) as cluster:
        await cluster.create_topic("events", partitions=6)
        await cluster.create_topic("wide", partitions=200)
        x = await cluster.start_consumer("x", group="g", topics={"wide": 1}, rejoin=False)
        y = await cluster.start_consumer("y", group="g", topics={"events": 1})
        with trio.fail_after(10):
            generation = await cluster.wait_stable("g", members=1)
        # x's StartFetcher (200 partitions) does not fit 2,048 bytes: x was told why and closed
        # when its attempt began at 3.0, and the next attempt started y alone at once.
        assert trio.current_time() == 3.0
        assert generation == 2
        assert y.owned == ALL and not x.fetching
        assert set(cluster.coordinator.groups["g"].members) == {"y"}
        told = [r.getMessage() for r in caplog.records if r.name == "transport.channel"]
        assert any(
            "reported FRAME_TOO_LARGE" in line and "cannot send you" in line for line in told
        )
        await cluster.check_invariants()
