"""The invariant checker against members that break the rules on purpose, and a coordinator
that does: it works out who may fetch from the frames on the wire alone, so it catches them
whatever they believe they may do; and an honest run is not flagged."""

from pathlib import Path

import pytest
import trio
import trio.testing

from coordinator.config import CoordinatorConfig
from protocol.types import TopicPartition
from simulation import InvariantViolation, SimulatedCluster, StrayFetch, open_simulated_cluster
from statemachine.member import DeathCause, DeclaredDead, MemberMachine
from tests.simulation.adversary import Adversary, start_adversary
from tests.support.standin_consumer import StandInConsumer

#: T = 6 s for every member: a Ping every 2 s.
CONFIG = CoordinatorConfig(initial_rebalance_delay=3.0)


def _tp(p: int) -> TopicPartition:
    return TopicPartition(topic="events", partition=p)


async def _m_and_b(cluster: SimulatedCluster, **rules: bool) -> Adversary:
    """m (the adversary) and b (a simulated consumer) share "events"; stable at 3.0, m holding
    partitions 2 and 3. From then on m fetches each every 0.25 s (3.125, 3.375, ...)."""
    await cluster.create_topic("events", partitions=4)
    m = await start_adversary(cluster, "m", group="g", topic="events", **rules)
    await cluster.start_consumer("b", group="g", topics={"events": 1})
    assert await cluster.wait_stable("g", members=2) == 1
    assert trio.current_time() == 3.0 and m.fetching == {_tp(2), _tp(3)}
    return m


def _windows(cluster: SimulatedCluster, consumer_id: str) -> set[tuple[int, float, float]]:
    return {
        (w.partition.partition, w.start, w.end)
        for w in cluster.ledger.windows(trio.current_time())
        if w.consumer_id == consumer_id
    }


async def _silent_m_at_10(cluster: SimulatedCluster, m: Adversary) -> None:
    """m answers nothing from 9.9 on. The Ping it reads at 10.0 names its answer of 8.0, so
    its lease ends at 8.0 + T = 14.0, the wire says; the coordinator counts from its last
    request (10.0) and hands 2 and 3 to b at 10.0 + T + 0.5 = 16.5."""
    await trio.sleep_until(9.9)
    m.go_deaf()
    await trio.sleep_until(19.9)
    assert _windows(cluster, "m") == {(2, 3.0, 14.0), (3, 3.0, 14.0)}
    assert {(p, start) for p, start, _ in _windows(cluster, "b")} == {
        (0, 3.0),
        (1, 3.0),
        (2, 16.5),
        (3, 16.5),
    }


async def test_an_honest_member_whose_lease_runs_out_is_not_flagged(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with open_simulated_cluster(tmp_path, CONFIG) as cluster:
        m = await _m_and_b(cluster)
        await _silent_m_at_10(cluster, m)
        # Its own count, which the Ping of 10.0 it ignored did not renew, ended at 12.0.
        assert m.fetched[_tp(2)][-1] == 11.875
        assert not cluster.ledger.stray_fetches
        await cluster.check_invariants()


async def test_a_planted_member_that_fetches_after_its_lease_is_caught(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with open_simulated_cluster(tmp_path, CONFIG) as cluster:
        m = await _m_and_b(cluster, fetch_after_lease=True)
        await _silent_m_at_10(cluster, m)
        assert m.fetched[_tp(2)][-1] == 19.875
        with pytest.raises(
            InvariantViolation,
            match=r"^group g events-2: m fetched it at 14\.125, but its permission ended at "
            r"14\.000; ",
        ):
            await cluster.check_invariants()
        # From 16.5 on, each of its fetches is a two-owner instant.
        assert next(f for f in cluster.ledger.stray_fetches if f.alongside) == StrayFetch(
            group_id="g",
            consumer_id="m",
            partition=_tp(2),
            at=16.625,
            permitted_until=14.0,
            alongside=("b",),
        )


async def test_a_member_that_answers_a_stop_and_fetches_on_is_caught(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    """c joins at 10.0: the incremental rebalance revokes 3 from m, which answers at once and
    goes on fetching it; c is started on it at 10.0."""
    async with open_simulated_cluster(tmp_path, CONFIG) as cluster:
        m = await _m_and_b(cluster, fetch_after_stop=True)
        await trio.sleep_until(10.0)
        await cluster.start_consumer("c", group="g", topics={"events": 1})
        await trio.sleep_until(12.0)
        assert m.fetched[_tp(3)][-1] == 11.875
        assert _windows(cluster, "m") == {(2, 3.0, 12.0), (3, 3.0, 10.0)}
        assert _windows(cluster, "c") == {(3, 10.0, 12.0)}
        with pytest.raises(
            InvariantViolation,
            match=r"^group g events-3: m fetched it at 10\.125, but its permission ended at "
            r"10\.000, and c may fetch it; ",
        ):
            await cluster.check_invariants()


@pytest.mark.parametrize("stale_ids", [False, True], ids=["honest", "planted"])
async def test_a_member_that_fetches_a_topic_created_again_under_the_old_id_is_caught(
    tmp_path: Path, autojump_clock: trio.testing.MockClock, stale_ids: bool
) -> None:
    """ "events" is created again at 10.0: m is stopped on 2 and 3 and started on the new
    incarnation's 2 and 3 at once (b answers at once too), under the new id; planted, it goes on
    naming the old id in its fetches, which no permission it has names."""
    async with open_simulated_cluster(tmp_path, CONFIG) as cluster:
        m = await _m_and_b(cluster, stale_ids=stale_ids)
        old_id = cluster.coordinator.topics["events"].topic_id
        await trio.sleep_until(10.0)
        new_id = await cluster.recreate_topic("events", partitions=4)
        await trio.sleep_until(12.0)
        assert m.fetching == {_tp(2), _tp(3)}
        assert m.topic_ids == {"events": old_id if stale_ids else new_id}
        assert _windows(cluster, "m") == {
            (2, 3.0, 10.0),
            (3, 3.0, 10.0),
            (2, 10.0, 12.0),
            (3, 10.0, 12.0),
        }
        if not stale_ids:
            await cluster.check_invariants()
            return
        with pytest.raises(
            InvariantViolation,
            match=rf"^group g events-2: m fetched it at 10\.125 naming topic id {old_id}, but "
            r"its permission ended at 10\.000; ",
        ):
            await cluster.check_invariants()


async def test_a_member_that_closes_cleanly_while_fetching_is_caught(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    """An end of stream is a member's word that it stopped (the close rule): the coordinator
    frees its partitions at once, and b is started on them."""
    async with open_simulated_cluster(tmp_path, CONFIG) as cluster:
        m = await _m_and_b(cluster)
        await trio.sleep_until(10.1)
        await m.close_cleanly()
        await trio.sleep_until(12.0)
        assert _windows(cluster, "m") == {(2, 3.0, 10.1), (3, 3.0, 10.1)}
        assert cluster.ledger.permitted("g", _tp(2)) == {"b"}
        assert _windows(cluster, "b") >= {(2, 10.1, 12.0), (3, 10.1, 12.0)}
        with pytest.raises(
            InvariantViolation,
            match=r"^group g events-2: m fetched it at 10\.125, but its permission ended at "
            r"10\.100, and b may fetch it; ",
        ):
            await cluster.check_invariants()


async def test_a_coordinator_that_frees_a_broken_members_partitions_at_once_is_caught(
    tmp_path: Path, autojump_clock: trio.testing.MockClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A planted coordinator bug: a member whose connection broke is taken as one that closed
    it, its partitions free at once rather than at its lease's end. m, honest, fetches on under
    its lease (the Ping it read at 10.0 names its answer of 8.0: until 14.0) while b is started
    on its partitions at 10.5."""
    death = MemberMachine._death

    def hasty(self: MemberMachine, cause: DeathCause, now: float, *, silent: bool) -> DeclaredDead:
        return death(self, cause, now, silent=False)

    monkeypatch.setattr(MemberMachine, "_death", hasty)
    async with open_simulated_cluster(tmp_path, CONFIG) as cluster:
        m = await _m_and_b(cluster)
        await trio.sleep_until(10.5)
        m.reset_coordinator_connection()
        await trio.sleep_until(16.0)
        assert m.fetched[_tp(2)][-1] == 13.875  # it stopped by its own count
        assert not cluster.ledger.stray_fetches
        with pytest.raises(
            InvariantViolation,
            match=r"^group g events-2: m was permitted it until 14\.000 but b from 10\.500$",
        ):
            await cluster.check_invariants()


async def test_permissions_through_a_failover_follow_each_members_rule(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    """The coordinator restarts at 10.5 and is back at 11.5. a fetches through the failover
    under its lease, registers again at 12.5 claiming what it holds, and the new coordinator's
    requests on the new connection renew its lease: one unbroken permission per partition. o, a
    client of level 0 (no lease), may fetch only until it knows its connection ended."""
    async with open_simulated_cluster(tmp_path, CONFIG) as cluster:
        await cluster.create_topic("events", partitions=4)
        # The checker's rules, not a consumer's, are under test: both are the tests' own
        # stand-in, whose re-registration instants are fixed (T/3 after a lost connection).
        await cluster.start_consumer(
            "a",
            group="g",
            topics={"events": 1},
            fetch_through_failover=True,
            member=StandInConsumer,
        )
        await cluster.start_consumer(
            "o", group="g", topics={"events": 1}, level0=True, member=StandInConsumer
        )
        assert await cluster.wait_stable("g", members=2) == 1
        await trio.sleep_until(10.5)
        await cluster.restart_coordinator(down_for=1.0)
        await trio.sleep_until(30.0)
        assert _windows(cluster, "a") == {(0, 3.0, 30.0), (1, 3.0, 30.0)}
        # o read the old coordinator's end of stream at 10.5; it registered again at 12.5
        # under its generation holding nothing, and was started again at once.
        assert _windows(cluster, "o") == {
            (2, 3.0, 10.5),
            (3, 3.0, 10.5),
            (2, 12.5, 30.0),
            (3, 12.5, 30.0),
        }
        await cluster.check_invariants()
