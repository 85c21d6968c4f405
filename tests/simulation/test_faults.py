"""The faults a test can choose, each on the autojump clock with exact virtual times.

T = 6 s throughout: Pings every 2 s, each due within 4 s, one miss kills, and a silent member's
partitions wait out its lease plus 0.5 s. A consumer that lost its coordinator fetches on under
its lease and looks for it at once, then at the failover pace (50 ms) while its lease lasts and at
the library's backoff (0.1 s, doubling) after; the tests' own stand-in, kept where a test needs
its slow handling of requests, waits T/3 = 2 s first.
"""

from pathlib import Path

import pytest
import trio
import trio.testing

from coordinator.config import CoordinatorConfig
from protocol import ErrorCode
from protocol.types import TopicPartition
from simulation import SimulatedCluster, open_simulated_cluster
from statemachine.group import GroupState
from tests.support.protocols import eager
from tests.support.standin_consumer import StandInConsumer, open_stand_in_cluster, stand_in_options

CONFIG = CoordinatorConfig(initial_rebalance_delay=3.0, lease_margin=0.5)
ALL = {TopicPartition(topic="events", partition=p) for p in range(6)}


async def _pair(
    cluster: SimulatedCluster, *, fetch_through_failover: bool = False
) -> tuple[StandInConsumer, StandInConsumer]:
    await cluster.create_topic("events", partitions=6)
    a, b = [
        await cluster.start_consumer(
            name,
            group="g",
            topics={"events": 1},
            **stand_in_options(cluster, fetch_through_failover=fetch_through_failover),
        )
        for name in "ab"
    ]
    with trio.fail_after(10):
        await cluster.wait_settled()
    assert trio.current_time() == 3.0
    return a, b


def _starts(cluster: SimulatedCluster, consumer_id: str) -> set[float]:
    return {
        i.start
        for i in cluster.ledger.intervals(trio.current_time())
        if i.consumer_id == consumer_id
    }


async def test_a_connection_reset_under_a_consumer_leaves_its_partitions_with_it_when_it_comes_back(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with open_simulated_cluster(tmp_path, CONFIG) as cluster:
        a, b = await _pair(cluster)
        await trio.sleep_until(5.0)
        held = a.owned
        group = cluster.coordinator.groups["g"]
        a.drop_connection()
        with trio.fail_after(10):
            await group.status.wait_value(lambda s: s[0] is not GroupState.STABLE)
            await cluster.wait_settled()
        # A reset is not the consumer's own close, so not proof that it stopped: a fetched on
        # under its lease, found its coordinator again at once and came back at 5.0 claiming
        # what it fetched. The attempt begun at its death failed on those partitions, and the
        # next one, T/3 later at 7.0, left them with a: nobody else fetched them meanwhile.
        assert trio.current_time() == 7.0
        assert a.registrations == 2
        assert not [
            i for i in cluster.ledger.intervals(7.0) if i.consumer_id == "b" and i.partition in held
        ]
        assert a.owned | b.owned == ALL and a.owned
        await cluster.check_invariants(settled=True)


async def test_a_connection_reset_under_a_paused_consumer_does_not_move_its_partitions(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    """A reset proves nothing about a paused consumer, which fetches on, and on under its lease
    once it resumes and notices: a coordinator that moved the partitions at the reset would give
    them two owners (docs/design.md#ownership-lease)."""
    async with open_simulated_cluster(tmp_path, CONFIG) as cluster:
        a, _b = await _pair(cluster)
        held = a.owned
        await trio.sleep_until(5.0)
        group = cluster.coordinator.groups["g"]
        a.freeze(2.0)
        a.drop_connection()
        with trio.fail_after(10):
            await group.status.wait_value(lambda s: s[0] is not GroupState.STABLE)
            await cluster.wait_settled()
        # a noticed the reset only when it resumed at 7.0; it fetched on under its lease and
        # came back claiming its partitions. The attempt begun at the reset failed on them, the
        # next one (T/3 later, at 9.0) left them with a: b never fetched them.
        assert trio.current_time() == 9.0
        assert a.registrations == 2
        assert not [
            i
            for i in cluster.ledger.intervals(trio.current_time())
            if i.consumer_id == "b" and i.partition in held
        ]
        await cluster.check_invariants(settled=True)


async def test_a_cut_network_silences_both_sides_until_it_heals(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with open_simulated_cluster(tmp_path, CONFIG) as cluster:
        a, _b = await _pair(cluster)
        await trio.sleep_until(10.5)  # a answered the Ping of 10.0
        a.cut_network(10)
        with trio.fail_after(20):
            await cluster.wait_stable("g", members=1)
        # The Ping of 12.0 never arrives: a is dead at its deadline, 16.0; its partitions wait
        # until the last request sent to it (12.0) + T + margin.
        assert trio.current_time() == 18.5
        # a's lease ran from 8.0, when it queued its answer to the Ping of 8.0, the frame the
        # Ping of 10.0 named (docs/design.md#ownership-lease): it stopped by itself at 14.0.
        assert {i.end for i in cluster.ledger.closed if i.consumer_id == "a"} == {14.0}
        assert _starts(cluster, "b") == {3.0, 18.5}
        # a looked for its coordinator at 14.0 and then after the library's backoff (0.1 s,
        # doubling, at most 5 s): it found the network down at 14.0, 14.1, 14.3, 14.7, 15.5, 17.1
        # and 20.3, and connects again at 25.3, after the network came back at 20.5.
        with trio.fail_after(20):
            await cluster.wait_settled()
        assert trio.current_time() == pytest.approx(25.3)
        assert a.registrations == 2 and a.owned
        await cluster.check_invariants(settled=True)


async def test_a_request_that_arrives_when_its_answer_cannot_still_renews_the_lease(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    """The Ping of 12.0 reaches a, which takes a second over its answer; the network is cut in
    that second. That Ping still renews a's lease, from 14.0 to 16.0: it names a's answer to the
    Ping of 10.0, queued at 10.0, though the coordinator never hears a's answer to it."""
    async with open_simulated_cluster(tmp_path, CONFIG) as cluster:
        a, _b = await _pair(cluster)
        await trio.sleep_until(11.0)
        a.answer_slowly(1.0)
        await trio.sleep_until(12.5)
        a.cut_network(30)
        with trio.fail_after(20):
            await cluster.wait_stable("g", members=1)
        assert trio.current_time() == 18.5  # the last request sent to a (12.0) + T + margin
        await trio.sleep_until(19.0)
        assert {i.end for i in cluster.ledger.closed if i.consumer_id == "a"} == {16.0}
        cluster.ledger.check()


async def test_a_restarted_coordinator_frees_at_once_what_re_registered_members_no_longer_fetch(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    """The coordinator is down from 10.5 past a's and b's leases (the Ping of 10.0 named their
    answers to the Ping of 8.0: both stop fetching at 14.0, docs/design.md#ownership-lease), so
    they come back holding nothing, which frees their partitions at once, long before the
    recovered record's lease (15.0 + T + margin)."""
    async with open_simulated_cluster(tmp_path, CONFIG) as cluster:
        a, b = await _pair(cluster)
        held = {"a": a.owned, "b": b.owned}
        cluster.produce("events", records=4)
        await trio.sleep_until(10.5)
        await cluster.check_invariants()
        committed = dict(await cluster.coordinator.offsets.committed("g"))
        assert committed and all(offset == 4 for offset in committed.values())
        before = cluster.coordinator
        with trio.fail_after(10):
            await cluster.restart_coordinator(down_for=4.5)
        assert cluster.coordinator is not before
        assert trio.current_time() == 15.0
        assert not a.fetching and not b.fetching  # their leases ran out at 14.0
        assert {i.end for i in cluster.ledger.closed} == {14.0}
        assert await cluster.coordinator.offsets.committed("g") == committed
        assert cluster.coordinator.groups["g"].machine.generation == 1  # recovered
        with trio.fail_after(20):
            await cluster.wait_settled()
        # Both looked for their coordinator at the failover pace under their leases, then, once
        # these ran out at 14.0, at once and after the library's backoff (0.1 s, doubling): 14.1,
        # 14.3, 14.7 found it down, 15.5 found it serving. They re-registered then under
        # generation 1, the recovered record's, holding nothing: their partitions need no lease
        # wait, and a recovered group has no initial delay: it decides once the members its
        # record names are back.
        assert trio.current_time() == pytest.approx(15.5)
        assert a.generation == b.generation == 2
        # The recovered assignment was the sticky assignor's start: each got its own back.
        assert {"a": a.owned, "b": b.owned} == held
        assert all(a.positions[tp] >= committed[tp] for tp in a.owned)
        await cluster.check_invariants(settled=True)


async def test_a_restarted_coordinator_waits_out_the_lease_of_a_member_that_does_not_return(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with open_simulated_cluster(tmp_path, CONFIG) as cluster:
        a, b = await _pair(cluster)
        await trio.sleep_until(10.4)
        b.cut_network(30)  # b sees neither the restart nor the new coordinator
        await trio.sleep_until(10.5)
        with trio.fail_after(5):
            await cluster.restart_coordinator(down_for=1.0)
        assert trio.current_time() == 11.5
        with trio.fail_after(20):
            await cluster.wait_stable("g", members=1)
        # a came back at 12.5 and the recovered group waited for b, whom its record names, until
        # b's lease ran out: nothing of the old assignment starts before the new coordinator
        # took office (11.5) + T + margin, when its one attempt began.
        assert trio.current_time() == 18.0
        assert a.owned == ALL
        assert max(i.end for i in cluster.ledger.closed if i.consumer_id == "b") <= 18.0
        await cluster.check_invariants()


async def test_a_recovered_group_waits_for_a_member_back_late_holding_nothing(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with open_simulated_cluster(tmp_path, CONFIG) as cluster:
        a, b = await _pair(cluster)
        held = {"a": a.owned, "b": b.owned}
        await trio.sleep_until(10.4)
        b.freeze(4.0)  # paused through the restart: b comes back 3.9 s after a
        await trio.sleep_until(10.5)
        with trio.fail_after(5):
            await cluster.restart_coordinator(down_for=1.0)
        with trio.fail_after(20):
            await cluster.wait_settled()
        # a, looking at the failover pace, re-registered as the coordinator served (11.5); the
        # recovered group waited for b, whom its record names, at most until the record's lease
        # (18.0): b resumed at 14.4, found its connection closed and looked for its coordinator
        # at once, re-registering at 14.4 holding nothing (its lease had run out at 14.0),
        # freeing its partitions: one attempt, for both, at 14.4.
        assert trio.current_time() == 14.4
        group = cluster.coordinator.groups["g"]
        assert (group.attempts, group.machine.generation) == (1, 2)
        assert {"a": a.owned, "b": b.owned} == held
        await cluster.check_invariants(settled=True)


async def test_a_new_process_under_an_old_member_id_proves_nothing_and_the_lease_stands(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with open_simulated_cluster(tmp_path, CONFIG) as cluster:
        _a, b = await _pair(cluster)
        await trio.sleep_until(10.5)
        with trio.fail_after(5):
            await cluster.restart_coordinator(down_for=1.0)
        await b.kill()
        # Another process under b's id registers before a does: it never took part in the
        # recovered generation, so it cannot speak for what the old b may still fetch.
        await cluster.start_consumer("b", group="g", topics={"events": 1})
        assert trio.current_time() == 11.5
        with trio.fail_after(20):
            await cluster.wait_settled()
        assert trio.current_time() == 18.0  # 11.5 + T + margin
        await cluster.check_invariants(settled=True)


async def test_a_coordinator_that_stops_does_not_take_the_connections_it_ends_for_closes(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    """Stopping at 10.5 for a restart, the coordinator ends a's and b's connections itself. That
    is no end of stream from them, so no proof that they stopped (docs/design.md#ownership-lease):
    they fetch on under their leases, and the stopping coordinator counts their partitions
    leased (until the Ping of 10.0 + T + margin = 16.5), not free, whatever it does with them
    before it is gone (a rebalance, a record written for a successor)."""
    async with open_simulated_cluster(tmp_path, CONFIG) as cluster:
        a, b = await _pair(cluster, fetch_through_failover=True)
        await trio.sleep_until(10.5)
        stopping = cluster.coordinator.groups["g"]
        with trio.fail_after(5):
            await cluster.restart_coordinator(down_for=1.0)
        assert trio.current_time() == 11.5
        assert a.fetching and b.fetching
        assert not stopping.members
        assert stopping.ownership.free_at(ALL) == 16.5
        with trio.fail_after(20):
            await cluster.wait_settled()
        await cluster.check_invariants(settled=True)


async def test_a_member_back_under_its_generation_before_a_start_it_missed_keeps_its_partitions(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    """a answers 3 s late from 10.0, when new partitions start it (generation 2) just after the
    Ping of 10.0: it answers that Ping at 13.0, and misses the start's deadline at 14.0. Dead,
    its partitions leased under generation 2 until the last request sent to it (the Ping of
    13.0) + T + margin = 19.5. It fetches on under its lease and registers again at 16.0 under
    generation 1, the start it never carried out, holding 0-2. That proves nothing about the
    lease, which stands; but accepting the registration renews a's lease on what it fetches, so
    a holds those partitions from then on (docs/design.md#adoption-after-a-failover), and a
    start waits for them no longer than for a stop. A coordinator that left them to the lease
    started them on b at 19.5, while a, renewed by the registration and its Pings, fetched them
    until it carried out its next start at 20.5 (it answers 1 s late from 17.0).

    The consumers are the tests' own stand-in, whose slowness delays carrying out each request:
    the library's consumer carries a request out as soon as it reads it (only the frames it
    sends leave late), so a would start the new partitions at 10.0 and never come back under
    generation 1."""
    async with open_stand_in_cluster(tmp_path, CONFIG) as cluster:
        a, _b = await _pair(cluster, fetch_through_failover=True)
        held = a.owned
        await trio.sleep_until(10.0)
        a.answer_slowly(3.0)
        await cluster.add_partitions("events", added=2)
        await trio.sleep_until(17.0)
        assert (a.registrations, a.generation, a.owned) == (2, 1, held)
        a.answer_slowly(1.0)
        with trio.fail_after(30):
            await cluster.wait_settled()
        # The attempt in flight failed at once; the next one (18.0) started a at 19.5, once the
        # lease of what a was to gain ran out, and a answered a second later.
        assert trio.current_time() == 20.5
        await cluster.check_invariants(settled=True)
        assert held <= a.owned
        assert not any(i.partition in held for i in cluster.ledger.closed)  # a never stopped them


async def test_a_member_back_during_the_stops_fails_the_attempt_though_its_lease_instant_passed(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    """b answers 3 s late from 10.0. New partitions at 11.75 begin an eager attempt (generation
    2), whose StopFetcher b takes up only after the Ping of 10.0: b is dead at its deadline,
    15.75, its partitions leased until the last request sent to it (the Ping of 13.0) + T +
    margin = 19.5. The next attempt begins at once without b and stops a, which answers 3.875 s
    late, at 19.625. Meanwhile b, fetching on under its lease, registers again at 17.75 under
    generation 1 still holding its partitions, and adopts them. When a's answer comes the
    lease's instant has passed, so the attempt waits on no lease; but b holds those partitions,
    renewed by this coordinator since its registration: the attempt fails rather than start them
    on a, and the next one stops b first (docs/design.md#adoption-after-a-failover). Going on to
    the starts, the group would have its start refused by the ownership table and be rebuilt,
    every member's connection closed.

    The consumers are the tests' own stand-in, whose slowness delays carrying out each request:
    the library's consumer carries a request out as soon as it reads it (only the frames it
    sends leave late), so b would stop at once and never come back holding its partitions."""
    async with open_stand_in_cluster(tmp_path, eager(CONFIG)) as cluster:
        a, b = await _pair(cluster, fetch_through_failover=True)
        held = b.owned
        await trio.sleep_until(10.0)
        b.answer_slowly(3.0)
        await trio.sleep_until(11.75)
        await cluster.add_partitions("events", added=2)
        await trio.sleep_until(15.0)
        a.answer_slowly(3.875)
        await trio.sleep_until(17.0)
        a.answer_slowly(0)
        b.answer_slowly(0)
        await trio.sleep_until(18.0)
        assert (b.registrations, b.generation, b.owned) == (2, 1, held)
        with trio.fail_after(30):
            await cluster.wait_settled()
        # Generation 3 failed at 19.625; after the backoff (T/3), generation 4 stopped a and b
        # and started both.
        assert trio.current_time() == 21.625
        assert cluster.coordinator.groups["g"].machine.generation == 4
        assert a.registrations == 1  # the group was not rebuilt
        assert {i.end for i in cluster.ledger.closed if i.partition in held} == {21.625}
        await cluster.check_invariants(settled=True)


# --- delayed delivery: a request late past the lease margin cannot stretch a lease ---------------
#
# Every Ping names the frame of the consumer's answer to the Ping before it, so after the Ping of
# 10.0 a's lease runs from 8.0 to 14.0 (docs/design.md#ownership-lease).


def _spans(cluster: SimulatedCluster, consumer_id: str) -> set[tuple[float, float]]:
    now = trio.current_time()
    return {(i.start, i.end) for i in cluster.ledger.intervals(now) if i.consumer_id == consumer_id}


@pytest.mark.parametrize("fetch_through_failover", [False, True])
async def test_a_ping_delayed_past_the_margin_then_cut_off_does_not_outlast_the_coordinators_count(
    tmp_path: Path, autojump_clock: trio.testing.MockClock, fetch_through_failover: bool
) -> None:
    """The Ping of 12.0 reaches a 1.5 s late, at 13.4, three times the lease margin; a takes
    0.5 s over its answer and the network is cut before it leaves. The coordinator counts a's
    lease from that Ping's send: a is dead at its deadline (16.0) and its partitions start on b
    at 12.0 + T + 0.5 = 18.5. A lease counted from the Ping's arrival would run to 19.4, and both
    would fetch from 18.5 to 19.4; counted from the frame the Ping names (a's answer to the Ping
    of 10.0, queued at 10.0), it ends at 16.0."""
    async with open_simulated_cluster(tmp_path, eager(CONFIG)) as cluster:
        a, b = await _pair(cluster, fetch_through_failover=fetch_through_failover)
        await trio.sleep_until(11.9)
        a.answer_slowly(0.5)
        a.delay_delivery(1.5)
        await trio.sleep_until(13.5)
        a.cut_network(6.0)
        with trio.fail_after(20):
            await cluster.wait_stable("g", members=1)
        assert trio.current_time() == 18.5
        assert b.owned == ALL
        await trio.sleep_until(19.5)  # the cut heals: a reads the close that followed the Ping
        await cluster.check_invariants()
        assert _spans(cluster, "a") == {(3.0, 16.0)}
        assert _spans(cluster, "b") == {(3.0, 16.0), (18.5, 19.5)}
        with trio.fail_after(30):
            await cluster.wait_settled()
        await cluster.check_invariants(settled=True)


async def test_a_start_fetcher_delayed_past_the_margin_does_not_stretch_the_lease(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    """c joins at 13.0 and the rebalance stops a, b and c; a stops at once and queues its
    answer at 13.0, but takes a second over sending it, so StartFetcher goes out at 14.0, after
    a's StopFetcher answer. a's is held in the network until 15.5, and a's own bytes are held
    from 15.0 on, so its answer never comes: a is dead at the StartFetcher's deadline (18.0) and
    its partitions start elsewhere at 14.0 + T + 0.5 = 20.5. Counted from its arrival, a's
    lease would run to 21.5; the StartFetcher names a's StopFetcher answer, which a's code
    queued at 13.0 (a frame is dated when the process queued it, however long a slow process
    keeps it), so it runs to 19.0."""
    async with open_simulated_cluster(tmp_path, eager(CONFIG)) as cluster:
        a, b = await _pair(cluster, fetch_through_failover=True)
        await trio.sleep_until(12.9)
        a.answer_slowly(1.0)
        await trio.sleep_until(13.0)
        c = await cluster.start_consumer("c", group="g", topics={"events": 1})
        await trio.sleep_until(13.5)
        a.delay_delivery(2.0)
        await trio.sleep_until(14.5)
        assert not a.fetching  # it stopped at the StopFetcher, at 13.0
        a.answer_slowly(0.0)
        await trio.sleep_until(15.0)
        a.delay_delivery(10.0, to_consumer=False, to_broker=True)
        with trio.fail_after(20):
            await cluster.wait_stable("g", members=2)
        assert trio.current_time() == 20.5
        assert b.owned | c.owned == ALL
        await trio.sleep_until(24.9)
        await cluster.check_invariants()
        assert _spans(cluster, "a") == {(3.0, 13.0), (15.5, 19.0)}
        with trio.fail_after(30):
            await cluster.wait_settled()
        await cluster.check_invariants(settled=True)


async def test_a_group_being_rebuilt_answers_load_in_progress_until_its_record_is_read(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with open_simulated_cluster(tmp_path, CONFIG) as cluster:
        await _pair(cluster)
        cluster.slow_group_reads(1.5)
        group = cluster.coordinator.groups["g"]
        group.fail(RuntimeError("injected"))
        await trio.sleep(0.5)  # the rebuild reads the group's record until 4.5
        late = await cluster.start_consumer("c", group="g", topics={"events": 1}, rejoin=False)
        assert trio.current_time() == 3.5
        assert late.last_register_error is ErrorCode.COORDINATOR_LOAD_IN_PROGRESS
        await trio.sleep_until(4.5)
        again = await cluster.start_consumer("d", group="g", topics={"events": 1}, rejoin=False)
        assert again.last_register_error is ErrorCode.NONE
        assert "d" in cluster.coordinator.groups["g"].members
