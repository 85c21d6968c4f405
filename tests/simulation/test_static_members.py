"""Static members (docs/design.md#static-members, SPEC.md §11.11), on the autojump clock with
exact virtual times.

Three static members a, b, c share six partitions; T = 6 s throughout: Pings every 2 s (at 2.0,
4.0, ... from the registrations at 0.0), each due within 4 s, a silent process's partitions wait
out its lease (the last request sent to it + T + 0.5 s). The group forms at 3.0 (its initial
delay). A member "receives only Pings" when it gets no StopFetcher or StartFetcher after its
first start: the simulated consumer counts both.
"""

from pathlib import Path

import pytest
import trio
import trio.testing

from coordinator.config import CoordinatorConfig, RebalanceProtocol
from protocol import ErrorCode, RegisterConsumerRequest, RegisterConsumerResponse
from protocol.types import Subscription, TopicPartition, TopicStreams
from simulation import SimulatedCluster, SimulatedConsumer, open_simulated_cluster
from tests.support.protocols import under
from tests.support.standin_consumer import StandInConsumer, open_stand_in_cluster

CONFIG = CoordinatorConfig(initial_rebalance_delay=3.0, lease_margin=0.5)
ALL = {TopicPartition(topic="events", partition=p) for p in range(6)}


Member = SimulatedConsumer | StandInConsumer


async def _static_trio(cluster: SimulatedCluster) -> tuple[Member, Member, Member]:
    await cluster.create_topic("events", partitions=6)
    a, b, c = [
        await cluster.start_consumer(
            f"{name}-1",
            group="g",
            topics={"events": 1},
            instance_id=name,
        )
        for name in "abc"
    ]
    with trio.fail_after(10):
        await cluster.wait_settled()
    assert trio.current_time() == 3.0
    assert a.owned | b.owned | c.owned == ALL
    assert [starts for _, starts in _handovers(a, b, c)] == [1, 1, 1]
    return a, b, c


def _handovers(*consumers: Member) -> list[tuple[int, int]]:
    """The StopFetcher and StartFetcher requests each consumer carried out so far."""
    return [(consumer.stops_received, consumer.starts_received) for consumer in consumers]


def _only_pinged_since_the_start(
    *consumers: Member, protocol: RebalanceProtocol = RebalanceProtocol.INCREMENTAL
) -> None:
    """Under the incremental protocol nothing but Pings after the group formed; the eager one
    stops and starts everyone (it is measured beside it, docs/design.md#rebalance)."""
    if protocol is RebalanceProtocol.INCREMENTAL:
        assert _handovers(*consumers) == [(0, 1)] * len(consumers)


def _starts(cluster: SimulatedCluster, consumer_id: str) -> set[float]:
    return {
        i.start
        for i in cluster.ledger.intervals(trio.current_time())
        if i.consumer_id == consumer_id
    }


def _ends(cluster: SimulatedCluster, consumer_id: str) -> set[float]:
    return {i.end for i in cluster.ledger.closed if i.consumer_id == consumer_id}


@pytest.mark.parametrize("protocol", list(RebalanceProtocol))
async def test_a_static_member_restarted_after_a_clean_stop_gets_exactly_its_partitions_back(
    tmp_path: Path, autojump_clock: trio.testing.MockClock, protocol: RebalanceProtocol
) -> None:
    async with open_simulated_cluster(tmp_path, under(protocol, CONFIG)) as cluster:
        a, b, c = await _static_trio(cluster)
        mine, theirs = a.owned, {"b": b.owned, "c": c.owned}
        await trio.sleep_until(5.0)
        a2 = await cluster.restart_consumer(a, "a-2", end="stop", down_for=1.0)
        with trio.fail_after(10):
            await cluster.wait_settled()
        # A clean close proves a stopped at 5.0: the new process, back at 6.0, is started at
        # once on exactly a's partitions; nobody else was asked anything but Pings.
        assert trio.current_time() == 6.0
        assert a.last_error is ErrorCode.NONE  # its final commit counted
        assert a2.owned == mine
        assert {"b": b.owned, "c": c.owned} == theirs
        _only_pinged_since_the_start(b, c, protocol=protocol)
        assert _starts(cluster, "a-2") == {6.0}
        assert cluster.coordinator.groups["g"].members["a"].consumer_id == "a-2"
        await cluster.check_invariants(settled=True)


@pytest.mark.parametrize("protocol", list(RebalanceProtocol))
async def test_a_rolling_restart_of_every_static_member_moves_no_partition(
    tmp_path: Path, autojump_clock: trio.testing.MockClock, protocol: RebalanceProtocol
) -> None:
    """a, b and c restart one after the other (a clean stop, back 1 s later, the next one 2 s
    after that): each new process is started at once on exactly its member's partitions, and
    under the incremental protocol nobody else hears anything but Pings; under the eager one
    every return stops and starts the two others."""
    async with open_simulated_cluster(tmp_path, under(protocol, CONFIG)) as cluster:
        members = list(await _static_trio(cluster))
        owned = {m.member_id: m.owned for m in members}
        for turn, old in enumerate(list(members)):
            await trio.sleep_until(5.0 + 3 * turn)
            name = old.member_id
            new = await cluster.restart_consumer(old, f"{name}-2", end="stop", down_for=1.0)
            with trio.fail_after(10):
                await cluster.wait_settled()
            assert trio.current_time() == 6.0 + 3 * turn
            assert new.owned == owned[name]
            assert _starts(cluster, f"{name}-2") == {6.0 + 3 * turn}
            members[turn] = new
        assert {m.member_id: m.owned for m in members} == owned
        if protocol is RebalanceProtocol.INCREMENTAL:
            # each new process got its one start and nothing else
            assert _handovers(*members) == [(0, 1)] * 3
        else:
            # every return stops and starts every live process, the returning one included
            assert _handovers(*members) == [(3, 3), (2, 2), (1, 1)]
        await cluster.check_invariants(settled=True)


@pytest.mark.parametrize("protocol", list(RebalanceProtocol))
async def test_a_static_member_killed_with_a_reset_gets_its_partitions_back_at_its_lease_end(
    tmp_path: Path, autojump_clock: trio.testing.MockClock, protocol: RebalanceProtocol
) -> None:
    """A reset proves nothing: a's partitions wait for its lease (the Ping of 4.0 + T + 0.5),
    and only they wait; the restarted process gets exactly them then."""
    async with open_simulated_cluster(tmp_path, under(protocol, CONFIG)) as cluster:
        a, b, c = await _static_trio(cluster)
        mine = a.owned
        await trio.sleep_until(5.0)
        a2 = await cluster.restart_consumer(a, "a-2", end="reset", down_for=1.0)
        with trio.fail_after(20):
            await cluster.wait_settled()
        assert trio.current_time() == 10.5
        assert a2.owned == mine
        assert _starts(cluster, "a-2") == {10.5}
        _only_pinged_since_the_start(b, c, protocol=protocol)
        if protocol is RebalanceProtocol.INCREMENTAL:
            assert _starts(cluster, "b-1") == _starts(cluster, "c-1") == {3.0}
        await cluster.check_invariants(settled=True)


@pytest.mark.parametrize("protocol", list(RebalanceProtocol))
async def test_a_static_member_away_for_its_session_timeout_departs_and_the_group_rebalances(
    tmp_path: Path, autojump_clock: trio.testing.MockClock, protocol: RebalanceProtocol
) -> None:
    async with open_simulated_cluster(tmp_path, under(protocol, CONFIG)) as cluster:
        a, b, c = await _static_trio(cluster)
        await trio.sleep_until(5.0)
        before = _handovers(b, c)
        await a.stop()
        group = cluster.coordinator.groups["g"]
        await trio.sleep_until(10.9)
        # Away: still a subscriber, its partitions unowned, nobody asked anything.
        assert set(group.away) == {"a"}
        assert _handovers(b, c) == before
        with trio.fail_after(10):
            await cluster.wait_settled()
        # T after it went away it departs, and its partitions move at once (it closed cleanly).
        assert trio.current_time() == 11.0
        assert not group.away
        assert b.owned | c.owned == ALL
        await cluster.check_invariants(settled=True)


async def test_leave_group_ends_a_static_member_at_once(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    """A static member that sends LeaveGroup is the tests' own stand-in: the library's consumer
    sends none for a static member (its process is expected back, docs/design.md#static-members)."""
    async with open_stand_in_cluster(tmp_path, CONFIG) as cluster:
        a, b, c = await _static_trio(cluster)
        await trio.sleep_until(5.0)
        await a.leave()
        with trio.fail_after(10):
            await cluster.wait_settled()
        assert trio.current_time() == 5.0
        assert a.last_error is ErrorCode.NONE
        assert not cluster.coordinator.groups["g"].away
        assert b.owned | c.owned == ALL
        await cluster.check_invariants(settled=True)


@pytest.mark.parametrize("protocol", list(RebalanceProtocol))
async def test_a_second_live_process_fences_the_older_which_stops_before_the_newer_starts(
    tmp_path: Path, autojump_clock: trio.testing.MockClock, protocol: RebalanceProtocol
) -> None:
    async with open_simulated_cluster(tmp_path, under(protocol, CONFIG)) as cluster:
        a, b, c = await _static_trio(cluster)
        mine = a.owned
        await trio.sleep_until(5.0)
        a2 = await cluster.restart_consumer(a, "a-2", end="keep")
        with trio.fail_after(10):
            await cluster.wait_settled()
        # The older answered its FENCED_INSTANCE_ID StopFetcher at once: the newer is started
        # on exactly its partitions at that instant, not before it stopped.
        assert trio.current_time() == 5.0
        assert a.fenced and not a.alive and not a.fetching
        assert a.stopped_partitions[-1] is None
        assert _ends(cluster, "a-1") == {5.0}
        assert a2.owned == mine and _starts(cluster, "a-2") == {5.0}
        _only_pinged_since_the_start(b, c, protocol=protocol)
        # It does not register again, and what it asks afterwards is refused.
        await trio.sleep_until(12.0)
        assert a.registrations == 1
        assert await a.commit() is ErrorCode.FENCED_INSTANCE_ID
        async with cluster.open_client() as client:
            response = await client.request(
                RegisterConsumerRequest(
                    group_id="g",
                    consumer_id="a-1",
                    subscription=a.subscription,
                    auto_commit=True,
                    auto_offset_reset="smallest",
                    session_timeout_ms=6000,
                    generation=-1,
                    owned_partitions=(),
                    instance_id="a",
                )
            )
        assert isinstance(response, RegisterConsumerResponse)
        assert response.error_code is ErrorCode.FENCED_INSTANCE_ID
        await cluster.check_invariants(settled=True)


@pytest.mark.parametrize("protocol", list(RebalanceProtocol))
async def test_a_paused_process_told_it_is_fenced_keeps_its_partitions_until_its_lease_end(
    tmp_path: Path, autojump_clock: trio.testing.MockClock, protocol: RebalanceProtocol
) -> None:
    """Hazard (d): FENCED_INSTANCE_ID sent to a paused process proves nothing. The StopFetcher
    of 5.0 renews its lease on the coordinator's count to 5.0 + T + 0.5 = 11.5, and the newer
    process starts only then; the paused one's own lease ended at 9.0 (it ran from its answer
    to the StartFetcher of 3.0, queued at 3.0, which the Ping of 4.0 named)."""
    async with open_simulated_cluster(tmp_path, under(protocol, CONFIG)) as cluster:
        a, b, c = await _static_trio(cluster)
        mine = a.owned
        await trio.sleep_until(4.5)
        a.freeze(20.0)
        await trio.sleep_until(5.0)
        a2 = await cluster.restart_consumer(a, "a-2", end="keep")
        with trio.fail_after(20):
            await a2.fetching_state.wait_value(True)
        assert trio.current_time() == 11.5
        assert _ends(cluster, "a-1") == {9.0}
        assert a2.owned == mine and _starts(cluster, "a-2") == {11.5}
        _only_pinged_since_the_start(b, c, protocol=protocol)
        await cluster.check_invariants()
        # It wakes at 24.5 past its lease, finds its connection closed (at its StopFetcher's
        # deadline, 9.0), looks for its coordinator at once and is refused FENCED_INSTANCE_ID
        # when it registers again, at 24.5 (not T/3 later: the library's consumer registers
        # again as soon as it finds a connection lost).
        await trio.sleep_until(24.4)
        assert not a.fenced
        await trio.sleep_until(24.6)
        assert a.fenced and a.registrations == 1
        assert a.last_register_error is ErrorCode.FENCED_INSTANCE_ID
        await cluster.check_invariants(settled=True)


async def test_a_fenced_process_that_closes_cleanly_before_it_answers_frees_its_partitions(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    """Its clean close is the same proof as its StopFetcher answer (docs/design.md#static-members):
    a, which takes 2 s over each answer, is fenced at 5.0 and stops cleanly at 6.0 (its commit
    refused FENCED_INSTANCE_ID) before it answers; the newer process starts at 6.0, not at a's
    lease end, 11.5. a is the tests' own stand-in: the library's consumer answers a request in
    the instant it carries it out, so its close only ever follows its answer on the connection
    (a slow process's frames leave in order, the close last), and a paused process's close waits
    for it to thaw even when it is killed."""
    async with open_stand_in_cluster(tmp_path, CONFIG) as cluster:
        a, b, c = await _static_trio(cluster)
        mine = a.owned
        await trio.sleep_until(4.5)
        a.answer_slowly(2.0)
        await trio.sleep_until(5.0)
        a2 = await cluster.restart_consumer(a, "a-2", end="keep")
        await trio.sleep_until(6.0)
        await a.stop()
        assert a.last_error is ErrorCode.FENCED_INSTANCE_ID
        with trio.fail_after(10):
            await a2.fetching_state.wait_value(True)
        assert trio.current_time() == 6.0
        assert _ends(cluster, "a-1") == {6.0}
        assert a2.owned == mine
        _only_pinged_since_the_start(b, c)
        await cluster.check_invariants()


async def test_a_late_commit_from_the_previous_process_cannot_move_an_offset_back(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    """Hazard (c): each process is a new incarnation. The older one, paused since 4.5 having
    consumed 5 records of each partition, wakes at 24.5 and commits the positions it had then;
    the newer one has consumed 5 more and reported them since 11.5. The late commit is refused
    and the committed offsets stay the newer process's."""
    async with open_simulated_cluster(tmp_path, CONFIG) as cluster:
        a, _b, _c = await _static_trio(cluster)
        cluster.produce("events", records=5)
        await trio.sleep_until(4.5)
        stale = dict(a.positions)  # what it had when it paused
        assert set(stale) == a.owned and set(stale.values()) == {5}
        a.freeze(20.0)
        await trio.sleep_until(5.0)
        a2 = await cluster.restart_consumer(a, "a-2", end="keep")
        await trio.sleep_until(12.0)
        cluster.produce("events", records=5)
        await trio.sleep_until(24.5)
        committed = dict(await cluster.coordinator.offsets.committed("g"))
        assert all(committed[tp] == 10 > offset for tp, offset in stale.items())
        assert await a.commit(positions=stale) is ErrorCode.FENCED_INSTANCE_ID
        await trio.sleep_until(26.0)
        after = await cluster.coordinator.offsets.committed("g")
        assert all(after[tp] >= committed[tp] > stale[tp] for tp in stale)
        assert a2.owned == set(stale)
        await cluster.check_invariants(settled=True)


@pytest.mark.parametrize("protocol", list(RebalanceProtocol))
async def test_a_failover_keeps_the_static_members(
    tmp_path: Path, autojump_clock: trio.testing.MockClock, protocol: RebalanceProtocol
) -> None:
    """Hazard (e): the record names the instance ids, so a successor coordinator knows a is a
    static member away, not a member gone: a's new process, registering after the failover,
    gets exactly a's partitions back, once the successor's lease on them (counted from its
    taking office at 6.0: 6.0 + T + 0.5 = 12.5) is over. Under the incremental protocol b and
    c, which fetch through the failover and are adopted, are never stopped."""
    async with open_simulated_cluster(tmp_path, under(protocol, CONFIG)) as cluster:
        a, b, c = await _static_trio(cluster)
        mine = a.owned
        await trio.sleep_until(5.0)
        await a.stop()
        await trio.sleep_until(6.0)
        with trio.fail_after(5):
            await cluster.restart_coordinator()
        recovered = cluster.coordinator.groups["g"]
        assert set(recovered.away) == {"a", "b", "c"}  # none back yet
        await trio.sleep_until(9.0)
        a2 = await cluster.restart_consumer(a, "a-2", end="keep")
        with trio.fail_after(20):
            await cluster.wait_settled()
        assert trio.current_time() == 12.5
        assert a2.owned == mine and _starts(cluster, "a-2") == {12.5}
        if protocol is RebalanceProtocol.INCREMENTAL:
            # No stop, and never a pause: their fetching runs on from 3.0 unbroken (an adopted
            # member is confirmed by an incremental StartFetcher: docs/design.md#rebalance).
            assert b.stops_received == c.stops_received == 0
            assert _starts(cluster, "b-1") == _starts(cluster, "c-1") == {3.0}
            assert not [i for i in cluster.ledger.closed if i.consumer_id in ("b-1", "c-1")]
        description = await cluster.coordinator.describe("g")
        assert [m.member_id for m in description.members] == ["a", "b", "c"]
        await cluster.check_invariants(settled=True)


async def test_static_members_a_successor_recovered_depart_if_none_comes_back(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    """A successor counts each static member of the record away from its taking office (6.0):
    if no process comes back they depart at 6.0 + T = 12.0 from an empty group, which stays
    the group it recovered; a process that registers afterwards joins it, and gets every
    partition."""
    async with open_simulated_cluster(tmp_path, CONFIG) as cluster:
        a, b, c = await _static_trio(cluster)
        await trio.sleep_until(5.0)
        for consumer in (a, b, c):
            await consumer.stop()
        await trio.sleep_until(6.0)
        with trio.fail_after(5):
            await cluster.restart_coordinator()
        recovered = cluster.coordinator.groups["g"]
        assert set(recovered.away) == {"a", "b", "c"}
        await trio.sleep_until(12.1)
        assert not recovered.away
        assert cluster.coordinator.groups["g"] is recovered  # not failed and rebuilt
        await trio.sleep_until(13.0)
        a2 = await cluster.restart_consumer(a, "a-2", end="keep")
        with trio.fail_after(20):
            await cluster.wait_settled()
        # It is the member a of the record, which the recovered group still awaits: no initial
        # delay, and the successor's lease on the partitions ran out at 12.5.
        assert trio.current_time() == 13.0
        assert a2.owned == ALL
        await cluster.check_invariants(settled=True)


async def test_a_dynamic_member_may_not_take_a_static_members_id(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with open_simulated_cluster(tmp_path, CONFIG) as cluster:
        await _static_trio(cluster)
        subscription = Subscription(topics=(TopicStreams(topic="events", streams=1),))
        intruder = await cluster.start_consumer(
            "a", group="g", subscription=subscription, rejoin=False
        )
        assert intruder.last_register_error is ErrorCode.INVALID_REQUEST


async def test_a_partition_given_to_a_member_away_is_not_freed_by_its_return_after_a_failover(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    """Under the eager protocol: s (static) and x (dynamic) fetch through lost connections. s's
    connection breaks at 10.5 as it pauses for 2 s (away); x's at 11.0 as it pauses for 2 s
    (departed), so the group, with no live member left, gives x's partitions to s, away, and
    writes that record at 11.0. The coordinator
    restarts at 11.25 and takes office again at 11.75. s, back at 12.5 under its generation 1,
    never held x's partitions, so its word cannot free them: the record names s under the
    attempt's generation (docs/design.md#static-members), and they stay leased (until 11.75 +
    T + margin = 18.25) until x, back at 13.0 still fetching them, adopts them; the attempt of
    15.0 stops both and starts them again. A record that named s under generation 1 let s's
    registration free them at 12.5 and start them on s while x still fetched them."""
    async with open_simulated_cluster(tmp_path, under(RebalanceProtocol.EAGER, CONFIG)) as cluster:
        await cluster.create_topic("events", partitions=6)
        s, x = [
            await cluster.start_consumer(
                name,
                group="g",
                topics={"events": 1},
                instance_id="s" if name == "s-1" else None,
            )
            for name in ("s-1", "x")
        ]
        with trio.fail_after(10):
            await cluster.wait_settled()
        assert trio.current_time() == 3.0
        theirs = x.owned
        # Each is paused 2 s as its connection breaks, so it is away that long (the library's
        # consumer would otherwise register again at once): s until 12.5, x until 13.0.
        await trio.sleep_until(10.5)
        s.freeze(2.0)
        s.drop_connection()
        await trio.sleep_until(11.0)
        x.freeze(2.0)
        x.drop_connection()
        await trio.sleep_until(11.25)
        record = (await cluster.store.groups())["g"]
        assert {thread.member_id for thread in record.assignment.values()} == {"s"}
        with trio.fail_after(5):
            await cluster.restart_coordinator(down_for=0.5)
        assert trio.current_time() == 11.75
        with trio.fail_after(30):
            await cluster.wait_settled()
        await cluster.check_invariants(settled=True)
        assert trio.current_time() == 15.0
        assert x.owned == theirs and s.owned == ALL - theirs
        assert {(i.start, i.end) for i in cluster.ledger.closed if i.partition in theirs} == {
            (3.0, 15.0)
        }
