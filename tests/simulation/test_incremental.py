"""Incremental rebalancing against the eager one, on the autojump clock with exact virtual times
(docs/design.md#rebalance, SPEC.md §11.4-§11.8).

Three members a, b, c over six partitions, T = 6 s (a Ping every 2 s, due within 4 s, one miss
kills), settled at 3.0 with a: 0 1, b: 2 3, c: 4 5. Then one thing happens at 10.5. Under the
incremental protocol only the members whose assignment changes get a request, and a partition
that does not move is never stopped; under the eager one every member stops everything and
starts again.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

from coordinator.config import CoordinatorConfig, RebalanceProtocol
from protocol import ErrorCode, OffsetCommitRequest, OffsetCommitResponse
from protocol.types import PartitionOffset, TopicPartition
from simulation import SimulatedCluster, SimulatedConsumer, open_simulated_cluster
from statemachine.group import GroupState
from tests.support.protocols import under
from tests.support.standin_consumer import StandInConsumer, open_stand_in_cluster

INCREMENTAL, EAGER = RebalanceProtocol.INCREMENTAL, RebalanceProtocol.EAGER
CONFIG = CoordinatorConfig(initial_rebalance_delay=3.0, lease_margin=0.5)


def _tp(partition: int) -> TopicPartition:
    return TopicPartition(topic="events", partition=partition)


def _parts(*partitions: int) -> frozenset[TopicPartition]:
    return frozenset(_tp(p) for p in partitions)


async def _three(
    cluster: SimulatedCluster, *, report_stopped: bool = False
) -> dict[str, SimulatedConsumer | StandInConsumer]:
    await cluster.create_topic("events", partitions=6)
    # a consumer that reports what it no longer fetches is one of the tests' own
    buggy: dict[str, Any] = {"member": StandInConsumer, "report_stopped": True}
    consumers = {
        name: await cluster.start_consumer(
            name,
            group="g",
            topics={"events": 1},
            **(buggy if report_stopped else {}),
        )
        for name in "abc"
    }
    with trio.fail_after(10):
        await cluster.wait_settled()
    assert trio.current_time() == 3.0
    assert {n: c.owned for n, c in consumers.items()} == {
        "a": _parts(0, 1),
        "b": _parts(2, 3),
        "c": _parts(4, 5),
    }
    return consumers


def _spans(cluster: SimulatedCluster, consumer_id: str) -> dict[int, list[tuple[float, float]]]:
    """Each partition's fetch intervals by this consumer, in order."""
    spans: dict[int, list[tuple[float, float]]] = {}
    for i in sorted(cluster.ledger.intervals(trio.current_time()), key=lambda i: i.start):
        if i.consumer_id == consumer_id:
            spans.setdefault(i.partition.partition, []).append((i.start, i.end))
    return spans


def _handovers(consumer: SimulatedConsumer | StandInConsumer) -> tuple[int, int]:
    return consumer.stops_received, consumer.starts_received


async def _commit_sent_earlier(
    consumer: SimulatedConsumer,
    generation: int,
    positions: Mapping[TopicPartition, int] | None = None,
) -> ErrorCode:
    """An OffsetCommit under ``generation`` on the member's own coordinator connection (the
    coordinator takes a member's commits from that connection alone), as one the member sent
    before a start it has since carried out and the coordinator reads only now: the library
    commits only under its current generation, so the test speaks on its connection."""
    offsets = consumer.positions if positions is None else positions
    assert consumer.channel is not None
    response = await consumer.channel.request(
        OffsetCommitRequest(
            group_id=consumer.group_id,
            consumer_id=consumer.consumer_id,
            generation=generation,
            offsets=tuple(
                PartitionOffset(topic=tp.topic, partition=tp.partition, offset=offset)
                for tp, offset in sorted(offsets.items())
            ),
        )
    )
    assert isinstance(response, OffsetCommitResponse)
    return response.error_code


@pytest.mark.parametrize("protocol", [INCREMENTAL, EAGER])
async def test_one_member_joining(
    protocol: RebalanceProtocol, tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with open_simulated_cluster(tmp_path, under(protocol, CONFIG)) as cluster:
        c = await _three(cluster)
        await trio.sleep_until(10.5)
        c["d"] = await cluster.start_consumer("d", group="g", topics={"events": 1})
        with trio.fail_after(10):
            await cluster.wait_settled()
        assert trio.current_time() == 10.5
        await trio.sleep_until(12.0)
        assert {n: x.owned for n, x in c.items()} == {
            "a": _parts(0, 1),
            "b": _parts(2, 3),
            "c": _parts(4),
            "d": _parts(5),
        }
        assert c["d"].started_generations == [2]
        if protocol is INCREMENTAL:
            # Only c loses (5) and only d gains: a and b hear nothing after their first start,
            # keep generation 1, and never stop; c stops 5 alone and fetches 4 on.
            assert [_handovers(c[n]) for n in "abcd"] == [(0, 1), (0, 1), (1, 1), (0, 1)]
            assert c["c"].stopped_partitions == [_parts(5)]
            assert [c[n].generation for n in "abcd"] == [1, 1, 1, 2]
            assert _spans(cluster, "a") == {0: [(3.0, 12.0)], 1: [(3.0, 12.0)]}
            assert _spans(cluster, "c") == {4: [(3.0, 12.0)], 5: [(3.0, 10.5)]}
        else:
            # Everyone stops everything (the first attempt stopped everyone too) and starts.
            assert [_handovers(c[n]) for n in "abcd"] == [(2, 2), (2, 2), (2, 2), (1, 1)]
            assert [c[n].generation for n in "abcd"] == [2, 2, 2, 2]
            assert _spans(cluster, "a") == {
                0: [(3.0, 10.5), (10.5, 12.0)],
                1: [(3.0, 10.5), (10.5, 12.0)],
            }
        assert _spans(cluster, "d") == {5: [(10.5, 12.0)]}
        await cluster.check_invariants(settled=True)


def _survivors_took_over(
    cluster: SimulatedCluster,
    c: dict[str, SimulatedConsumer | StandInConsumer],
    protocol: RebalanceProtocol,
    *,
    stopped: float,
    started: float,
) -> None:
    """c's 4 went to a and its 5 to b at ``started``. Incremental: a and b only gained, one
    start each, and their own partitions went on. Eager: they stopped everything at ``stopped``
    and started again at ``started``."""
    now = trio.current_time()
    assert (c["a"].owned, c["b"].owned) == (_parts(0, 1, 4), _parts(2, 3, 5))
    for name, (first, second, gained) in {"a": (0, 1, 4), "b": (2, 3, 5)}.items():
        if protocol is INCREMENTAL:
            assert _handovers(c[name]) == (0, 2)
            own = [(3.0, now)]
        else:
            assert _handovers(c[name]) == (2, 2)
            own = [(3.0, stopped), (started, now)]
        assert _spans(cluster, name) == {first: own, second: own, gained: [(started, now)]}


@pytest.mark.parametrize("protocol", [INCREMENTAL, EAGER])
@pytest.mark.parametrize("departure", ["leave", "kill"])
async def test_one_member_leaving_cleanly_or_killed(
    protocol: RebalanceProtocol,
    departure: str,
    tmp_path: Path,
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with open_simulated_cluster(tmp_path, under(protocol, CONFIG)) as cluster:
        c = await _three(cluster)
        await trio.sleep_until(10.5)
        await (c["c"].leave() if departure == "leave" else c["c"].kill())
        with trio.fail_after(10):
            await cluster.wait_settled()
        # It stopped before it closed: its partitions are free at once.
        assert trio.current_time() == 10.5
        await trio.sleep_until(12.0)
        assert _spans(cluster, "c") == {4: [(3.0, 10.5)], 5: [(3.0, 10.5)]}
        _survivors_took_over(cluster, c, protocol, stopped=10.5, started=10.5)
        assert c["a"].started_generations == c["b"].started_generations == [1, 2]
        await cluster.check_invariants(settled=True)


@pytest.mark.parametrize("protocol", [INCREMENTAL, EAGER])
async def test_one_member_frozen_past_its_session(
    protocol: RebalanceProtocol, tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    """The issue's case: c frozen at 10.5 misses the deadline of the Ping of 12.0 at 16.0; its
    partitions wait out its lease, T + 0.5 s after that Ping, until 18.5. Under the eager
    protocol the survivors stop their own partitions at 16.0 and get them back at 18.5 (the
    issue measured 16.1 over real sockets); under the incremental one they never stop, and only
    4 and 5 are unowned, from c's own lease end (14.0) until 18.5."""
    async with open_simulated_cluster(tmp_path, under(protocol, CONFIG)) as cluster:
        c = await _three(cluster)
        await trio.sleep_until(10.5)
        c["c"].freeze(20)
        with trio.fail_after(30):
            await cluster.wait_stable("g", members=2)
        assert trio.current_time() == 18.5
        await trio.sleep_until(20.0)
        assert _spans(cluster, "c") == {4: [(3.0, 14.0)], 5: [(3.0, 14.0)]}
        _survivors_took_over(cluster, c, protocol, stopped=16.0, started=18.5)
        await cluster.check_invariants()


async def test_members_whose_assignment_does_not_change_get_no_request(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    """Ten members over twenty partitions; an eleventh joins: the sticky assignor moves only
    what it gives the newcomer, and the members it takes nothing from hear nothing."""
    async with open_simulated_cluster(tmp_path, under(INCREMENTAL, CONFIG)) as cluster:
        await cluster.create_topic("events", partitions=20)
        names = [f"m{i:02}" for i in range(10)]
        members = {
            n: await cluster.start_consumer(n, group="g", topics={"events": 1}) for n in names
        }
        with trio.fail_after(10):
            await cluster.wait_settled()
        assert trio.current_time() == 3.0
        before = {n: m.owned for n, m in members.items()}
        await trio.sleep_until(10.5)
        members["new"] = await cluster.start_consumer("new", group="g", topics={"events": 1})
        with trio.fail_after(10):
            await cluster.wait_settled()
        assert trio.current_time() == 10.5
        losers = sorted(n for n in names if members[n].owned != before[n])
        assert len(losers) == len(members["new"].owned) >= 1
        # Exactly the members that lose a partition get a StopFetcher (and no start); the new
        # one gets a StartFetcher; the others get nothing at all.
        for n in names:
            expected = (1, 1) if n in losers else (0, 1)
            assert _handovers(members[n]) == expected, n
        assert _handovers(members["new"]) == (0, 1)
        await cluster.check_invariants(settled=True)


async def test_a_member_left_alone_commits_under_its_own_generation_and_a_stale_commit_is_refused(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    """Hazard (a): a member that gets no StartFetcher does not learn the new generation; its
    commits under its own still count, for the partitions it held then. A commit under a
    generation older than the start that gave a partition, or newer than the member's own, is
    refused (SPEC.md §11.8)."""
    async with open_simulated_cluster(tmp_path, under(INCREMENTAL, CONFIG)) as cluster:
        c = await _three(cluster)
        await trio.sleep_until(10.5)
        await c["c"].leave()
        with trio.fail_after(10):
            await cluster.wait_settled()
        a = c["a"]
        assert isinstance(a, SimulatedConsumer)
        assert (a.generation, a.owned) == (2, _parts(0, 1, 4))
        # Sent under generation 1, before the start of 10.5 gave it 4, and read only now: it
        # counts for 0 and 1, which it held then, and not for 4.
        assert ErrorCode.ILLEGAL_GENERATION is await _commit_sent_earlier(a, 1)
        old = {tp: a.positions[tp] for tp in _parts(0, 1)}
        assert ErrorCode.NONE is await _commit_sent_earlier(a, 1, old)
        assert ErrorCode.ILLEGAL_GENERATION is await _commit_sent_earlier(a, 3)
        # d joins: a and b each give up one partition and are not started, so they keep
        # generation 2 while the group's is 3; their commits under 2 count.
        await trio.sleep_until(11.0)
        c["d"] = await cluster.start_consumer("d", group="g", topics={"events": 1})
        with trio.fail_after(10):
            await cluster.wait_settled()
        assert trio.current_time() == 11.0
        assert cluster.coordinator.groups["g"].machine.generation == 3
        assert [_handovers(c[n]) for n in "ab"] == [(1, 2), (1, 2)]
        assert (a.generation, len(a.owned)) == (2, 2)
        await trio.sleep_until(12.5)
        assert ErrorCode.NONE is await a.commit()
        committed = await cluster.coordinator.offsets.committed("g")
        assert all(committed[tp] == a.positions[tp] for tp in a.owned)
        await cluster.check_invariants(settled=True)


async def test_reports_for_partitions_a_member_stopped_are_refused_though_it_is_still_a_member(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    """Hazard (b): c answers the StopFetcher for 5 at 10.5 and goes on fetching 4. Its Pings
    still report 5 (far ahead), and it commits 5: refused, while its reports and commits for 4
    count, and 5's offset is d's alone. c breaks the rules on purpose (the library's consumer
    reports only what it fetches), so it is the tests' own stand-in."""
    async with open_stand_in_cluster(tmp_path, under(INCREMENTAL, CONFIG)) as cluster:
        c = await _three(cluster, report_stopped=True)
        await trio.sleep_until(10.5)
        c["d"] = await cluster.start_consumer("d", group="g", topics={"events": 1})
        with trio.fail_after(10):
            await cluster.wait_settled()
        assert c["c"].stopped_partitions == [_parts(5)]
        await trio.sleep_until(16.5)  # Pings of 12.0, 14.0 and 16.0 answered
        committed = await cluster.coordinator.offsets.committed("g")
        assert committed[_tp(5)] == c["d"].positions[_tp(5)]
        assert committed[_tp(4)] == c["c"].positions[_tp(4)]
        member = cluster.coordinator.groups["g"].members["c"]
        assert member.machine.alive
        stale = {_tp(5): committed[_tp(5)] + 1}
        assert ErrorCode.ILLEGAL_GENERATION is await c["c"].commit(positions=stale)
        assert ErrorCode.NONE is await c["c"].commit()
        committed = await cluster.coordinator.offsets.committed("g")
        assert committed[_tp(5)] == c["d"].positions[_tp(5)]
        await cluster.check_invariants(settled=True)


@pytest.mark.parametrize("protocol", [INCREMENTAL, EAGER])
async def test_a_death_between_revoke_and_start_cancels_the_attempt_and_nothing_is_held_twice(
    protocol: RebalanceProtocol, tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    """c answers each request 1 s late from 10.5 (it carries each out as it arrives; its frames
    leave one after another, each 1 s after the one before). d joins at 10.5: attempt 2 revokes
    from c (incremental: 5 alone; eager: everything from everyone). a is killed at 11.0, before
    c's answer: attempt 2 is cancelled, c's late answer (11.5) is dropped, and attempt 3 runs
    for b, c and d. What c was asked to stop stays c's until it says otherwise: it is given back
    to c, which is not Stable, by a start."""
    async with open_simulated_cluster(tmp_path, under(protocol, CONFIG)) as cluster:
        c = await _three(cluster)
        await trio.sleep_until(10.5)
        c["c"].answer_slowly(1.0)
        c["d"] = await cluster.start_consumer("d", group="g", topics={"events": 1})
        await trio.sleep_until(11.0)
        group = cluster.coordinator.groups["g"]
        assert group.status.value[1] == 2
        await c["a"].kill()
        # The instant the group is Stable again (wait_settled, which looks again when a group's
        # state or a consumer's fetching changes, at times finds the eager run's 14.5 not yet
        # settled and returns only at its next poll, 15.5).
        with trio.fail_after(10):
            await cluster.wait_stable("g", members=3)
        assert (group.attempts, group.completed, group.machine.generation) == (3, 2, 3)
        # Incremental: c's start of 11.0 is answered at 12.5, after the stop queued before it.
        # Eager: c answers attempt 2's stop (11.5), attempt 3's (12.5), then its start (14.5).
        assert trio.current_time() == (12.5 if protocol is INCREMENTAL else 14.5)
        await trio.sleep_until(20.0)
        assert [c[n].owned for n in "bcd"] == [_parts(2, 3), _parts(4, 5), _parts(0, 1)]
        if protocol is INCREMENTAL:
            assert [_handovers(c[n]) for n in "bcd"] == [(0, 1), (1, 2), (0, 1)]
            assert _spans(cluster, "b") == {2: [(3.0, 20.0)], 3: [(3.0, 20.0)]}
            # c carries out each request as it arrives; only its frames leave late: it stopped
            # 5 as the StopFetcher came (10.5) and fetched it again as the start came (11.0).
            assert _spans(cluster, "c") == {4: [(3.0, 20.0)], 5: [(3.0, 10.5), (11.0, 20.0)]}
            assert _spans(cluster, "d") == {0: [(11.0, 20.0)], 1: [(11.0, 20.0)]}
        else:
            assert [_handovers(c[n]) for n in "bcd"] == [(3, 2), (3, 2), (2, 1)]
            assert _spans(cluster, "b") == {
                2: [(3.0, 10.5), (12.5, 20.0)],
                3: [(3.0, 10.5), (12.5, 20.0)],
            }
            # c stopped as attempt 2's StopFetcher came (10.5) and started as the StartFetcher
            # came (12.5, when its answer to attempt 3's stop got out), answering it at 14.5.
            assert _spans(cluster, "c") == {
                4: [(3.0, 10.5), (12.5, 20.0)],
                5: [(3.0, 10.5), (12.5, 20.0)],
            }
        await cluster.check_invariants(settled=True)


@pytest.mark.parametrize("protocol", [INCREMENTAL, EAGER])
async def test_a_trigger_that_moves_nothing_costs_no_attempt(
    protocol: RebalanceProtocol, tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    """A trigger after which the assignment computed is the one in force, every member Stable
    (the group's topics_changed, which the topic watch feeds, fed here directly): neither
    protocol takes a new generation or asks anyone anything."""
    async with open_simulated_cluster(tmp_path, under(protocol, CONFIG)) as cluster:
        c = await _three(cluster)
        group = cluster.coordinator.groups["g"]
        await trio.sleep_until(10.5)
        group.feed(group.group.topics_changed, ["events"], trio.current_time())
        await trio.sleep_until(12.0)
        assert (group.attempts, group.machine.generation) == (1, 1)
        assert group.machine.state is GroupState.STABLE
        before = [_handovers(c[n]) for n in "abc"]
        # Only the first attempt's requests (eager: it stopped the new members too).
        assert before == ([(0, 1)] * 3 if protocol is INCREMENTAL else [(1, 1)] * 3)
        await cluster.check_invariants(settled=True)
