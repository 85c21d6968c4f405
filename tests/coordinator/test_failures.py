"""Failure paths on the autojump clock, with exact virtual times (docs/design.md#failure-detection,
docs/design.md#rebalance).

Every test uses a session timeout T = 6 s: Pings every 2 s, each due within 4 s, one miss kills,
and a silent member's partitions wait T + 0.5 s after the last request sent to it.
"""

from pathlib import Path

import trio
import trio.testing

from coordinator.config import CoordinatorConfig
from protocol import ErrorCode
from protocol.types import TopicPartition
from simulation import SimulatedCluster, SimulatedConsumer, open_simulated_cluster
from statemachine.group import GroupState
from tests.support.protocols import eager

CONFIG = CoordinatorConfig(initial_rebalance_delay=3.0, lease_margin=0.5)
ALL = {TopicPartition(topic="events", partition=p) for p in range(6)}


async def _pair(cluster: SimulatedCluster) -> tuple[SimulatedConsumer, SimulatedConsumer]:
    await cluster.create_topic("events", partitions=6)
    a = await cluster.start_consumer("a", group="g", topics={"events": 1})
    b = await cluster.start_consumer("b", group="g", topics={"events": 1})
    assert await cluster.wait_stable("g", members=2) == 1
    assert trio.current_time() == 3.0
    return a, b


async def _wait_departure(cluster: SimulatedCluster, group_id: str) -> None:
    group = cluster.coordinator.groups[group_id]
    await group.status.wait_value(lambda s: s[0] is GroupState.PENDING)


async def test_a_silent_consumer_dies_two_thirds_t_after_its_unanswered_ping(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with open_simulated_cluster(tmp_path, CONFIG) as cluster:
        a, b = await _pair(cluster)
        a_partitions = a.owned
        await trio.sleep_until(10.5)
        a.freeze(60)  # last answered the Ping sent at 10.0; the one sent at 12.0 goes unanswered
        await _wait_departure(cluster, "g")
        assert trio.current_time() == 12.0 + 4.0
        await cluster.wait_stable("g", members=1)
        # a's lease: its last request arrived at 10.0, so it could fetch until 16.0. The
        # coordinator cannot tell whether the Ping of 12.0 arrived (a lost answer looks the
        # same), so it waits until that last request sent + T + margin before starting them.
        assert trio.current_time() == 18.5
        assert b.owned == ALL
        starts = {
            i.partition: i.start
            for i in cluster.ledger.intervals(trio.current_time())
            if i.consumer_id == "b" and i.partition in a_partitions
        }
        assert starts == dict.fromkeys(a_partitions, 18.5)
        # a's fetchers stopped at its lease's end, frozen or not (its timers run on): it fetches
        # nothing by the time b starts
        assert not a.fetching
        # (its own count: the Ping of 10.0 named its answer to the Ping of 8.0, so 8.0 + T)
        assert {i.end for i in cluster.ledger.closed if i.consumer_id == "a"} == {14.0}
        cluster.ledger.check()


async def test_a_killed_consumers_partitions_move_at_once(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with open_simulated_cluster(tmp_path, CONFIG) as cluster:
        a, b = await _pair(cluster)
        await trio.sleep_until(5.0)
        await a.kill()
        await cluster.wait_stable("g", members=1)
        assert trio.current_time() == 5.0
        assert b.owned == ALL
        assert b.generation == 2
        cluster.ledger.check()


async def test_a_death_during_a_rebalance_cancels_it_and_the_next_one_succeeds(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with open_simulated_cluster(tmp_path, eager(CONFIG)) as cluster:
        a, b = await _pair(cluster)
        c = await cluster.start_consumer("c", group="g", topics={"events": 1})
        assert await cluster.wait_stable("g", members=3) == 2
        await trio.sleep_until(9.5)  # between two Pings, so the delay applies to the next one
        b.answer_slowly(1.0)
        await trio.sleep_until(10.0)
        d = await cluster.start_consumer("d", group="g", topics={"events": 1})  # attempt 3 begins
        await trio.sleep_until(10.5)  # b has not answered StopFetcher yet
        group = cluster.coordinator.groups["g"]
        assert group.status.value == (GroupState.STOPPING, 3)
        async with trio.open_nursery() as killing:
            killing.start_soon(c.kill)
            await _wait_departure(cluster, "g")  # watching from before the kill
        assert trio.current_time() == 10.5
        generation = await cluster.wait_stable("g", members=3)
        assert generation == 4
        # attempt 3 never reached StartFetcher; attempt 4 did, for everyone left
        assert 3 not in cluster.generations["g"]
        assert {a.generation, b.generation, d.generation} == {4}
        assert a.owned | b.owned | d.owned == ALL
        assert (group.attempts, group.completed) == (4, 3)
        # b reads one request at a time and answers each 1 s later. Its queue: the Ping of 10.0
        # and attempt 3's StopFetcher, both sent at 10.0 in either order (answered at 11.0 and
        # 12.0; the stale StopFetcher answer is dropped), attempt 4's StopFetcher sent at 10.5
        # (13.0), the Ping of 12.0 (14.0), and StartFetcher, sent at 13.0 (15.0).
        assert trio.current_time() == 15.0
        cluster.ledger.check()


async def test_a_paused_consumer_stops_itself_its_commit_is_refused_and_it_rejoins(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with open_simulated_cluster(tmp_path, CONFIG) as cluster:
        a, b = await _pair(cluster)
        await trio.sleep_until(10.2)
        assert await cluster.coordinator.offsets.committed("g")  # auto-commit through Pings
        cluster.produce("events", records=50)  # a finishes its share, nobody hears of it yet
        await trio.sleep_until(10.5)
        finished = a.positions
        assert finished and all(offset == 50 for offset in finished.values())
        generation = a.generation
        a.freeze(20)
        await a.fetching_state.wait_value(False)
        assert trio.current_time() == 14.0  # its lease's end: its timers run on while frozen
        a_leases = [i for i in cluster.ledger.closed if i.consumer_id == "a"]
        # The Ping of 10.0 named a's answer to the Ping of 8.0: its lease ran to 8.0 + T.
        assert {i.end for i in a_leases} == {14.0}
        await trio.sleep_until(30.5)  # a thaws, long dead to the group
        # b has finished those records too since it took a's partitions at 18.5, so the refused
        # commit could not move anything: what it shows is the refusal itself.
        committed_before = dict(await cluster.coordinator.offsets.committed("g"))
        # refused: a is gone from the group, or (registered again meanwhile) in a new generation
        refused = await a.commit(generation=generation, positions=finished)
        assert refused in (ErrorCode.UNKNOWN_MEMBER_ID, ErrorCode.ILLEGAL_GENERATION)
        assert await cluster.coordinator.offsets.committed("g") == committed_before
        await cluster.wait_stable("g", members=2)
        assert a.registrations == 2
        assert a.owned and b.owned and a.owned | b.owned == ALL
        cluster.ledger.check()


async def test_an_unanswered_stop_fetcher_kills_its_member_and_the_rebalance_goes_on(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with open_simulated_cluster(tmp_path, CONFIG) as cluster:
        a, b = await _pair(cluster)
        await trio.sleep_until(10.5)  # b last answered the Ping of 10.0
        b.freeze(60)
        c = await cluster.start_consumer("c", group="g", topics={"events": 1})
        group = cluster.coordinator.groups["g"]
        await group.status.wait_value((GroupState.STOPPING, 2))
        assert trio.current_time() == 10.5
        # StopFetcher sent at 10.5 is due at 14.5: b dies then, before its Ping of 12.0 is due
        await _wait_departure(cluster, "g")
        assert trio.current_time() == 14.5
        assert await cluster.wait_stable("g", members=2) == 3
        assert trio.current_time() == 12.0 + 6.0 + 0.5  # the Ping of 12.0 may have reached b
        assert a.owned | c.owned == ALL
        cluster.ledger.check()


async def test_a_failed_attempt_backs_off_and_retries_until_it_succeeds(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    config = CoordinatorConfig(initial_rebalance_delay=3.0, max_missed_pings=2)
    async with open_simulated_cluster(tmp_path, config) as cluster:
        a, b = await _pair(cluster)
        await trio.sleep_until(10.5)
        # Slow, not frozen: a member frozen past a StopFetcher's deadline has no lease left when
        # it resumes (it runs T from b's answer to the Ping of 8.0, to 14.0), and starts over.
        b.answer_slowly(4.5)
        c = await cluster.start_consumer("c", group="g", topics={"events": 1})
        group = cluster.coordinator.groups["g"]
        # StopFetcher of attempt 2 goes unanswered until 14.5: one miss of two allowed, so the
        # attempt fails and the next waits a third of the session timeout (2 s)
        await group.status.wait_value(lambda s: s == (GroupState.PENDING, 2))
        assert trio.current_time() == 14.5
        b.answer_slowly(0.0)  # b answers that StopFetcher at 15.0, the Ping of 12.0 right after
        assert set(group.members) == {"a", "b", "c"}
        assert await cluster.wait_stable("g", members=3) == 3
        assert trio.current_time() == 16.5
        assert (group.attempts, group.completed) == (3, 2)
        assert a.owned | b.owned | c.owned == ALL
        cluster.ledger.check()


async def test_several_members_dying_at_once_during_a_rebalance_leave_the_coordinator_serving(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with open_simulated_cluster(tmp_path, CONFIG) as cluster:
        await cluster.create_topic("events", partitions=6)
        members = {
            name: await cluster.start_consumer(name, group="g", topics={"events": 1})
            for name in "abcd"
        }
        assert await cluster.wait_stable("g", members=4) == 1
        await trio.sleep_until(9.5)
        members["b"].answer_slowly(1.0)
        await trio.sleep_until(10.0)
        e = await cluster.start_consumer("e", group="g", topics={"events": 1})
        group = cluster.coordinator.groups["g"]
        await group.status.wait_value((GroupState.STOPPING, 2))
        async with trio.open_nursery() as killing:  # all at once, while b holds the attempt up
            for name in "acd":
                killing.start_soon(members[name].kill)
        assert await cluster.wait_stable("g", members=2) == 3
        assert members["b"].owned | e.owned == ALL
        cluster.ledger.check()


async def test_every_member_dying_mid_rebalance_leaves_an_empty_group_and_a_serving_coordinator(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with open_simulated_cluster(tmp_path, CONFIG) as cluster:
        await cluster.create_topic("events", partitions=6)
        members = [
            await cluster.start_consumer(name, group="g", topics={"events": 1}, rejoin=False)
            for name in "abc"
        ]
        assert await cluster.wait_stable("g", members=3) == 1
        await trio.sleep_until(9.5)
        members[1].answer_slowly(1.0)
        await trio.sleep_until(10.0)
        members.append(
            await cluster.start_consumer("d", group="g", topics={"events": 1}, rejoin=False)
        )
        group = cluster.coordinator.groups["g"]
        await group.status.wait_value((GroupState.STOPPING, 2))
        for member in members:  # all at once, while b holds the attempt up
            await member.kill()
        await group.status.wait_value(lambda s: s[0] is GroupState.EMPTY)
        assert trio.current_time() == 10.0
        late = await cluster.start_consumer("e", group="g", topics={"events": 1})
        assert await cluster.wait_stable("g", members=1) > 2
        assert late.owned == ALL
        cluster.ledger.check()
