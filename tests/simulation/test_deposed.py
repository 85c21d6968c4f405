"""A coordinator that may have been deposed renews no lease
(docs/design.md#coordinator-epochs-and-the-election, docs/design.md#ownership-lease), on the
autojump clock with exact virtual times.

T = 6 s throughout: Pings every 2 s, each due within 4 s, one miss kills, a lease runs T plus the
0.5 s margin after the coordinator's last contact with the member, a failed attempt waits T/3 =
2 s, and the group first forms 3 s after its first join.
"""

import logging
from pathlib import Path

import pytest
import trio
import trio.testing

from protocol import ErrorCode
from protocol.types import TopicPartition
from simulation import SimulatedCluster, open_simulated_cluster
from tests.simulation.test_faults import CONFIG, _pair


def _intervals(cluster: SimulatedCluster) -> list[tuple[str, TopicPartition, float]]:
    return sorted(
        (i.consumer_id, i.partition, i.start) for i in cluster.ledger.intervals(trio.current_time())
    )


async def test_out_of_contact_it_pings_nobody_and_counts_no_miss(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with open_simulated_cluster(tmp_path, CONFIG) as cluster:
        a, b = await _pair(cluster)
        owned = (a.owned, b.owned)
        leases = _intervals(cluster)
        await trio.sleep_until(5.5)
        # Registered at 0.0, Pinged every 2 s since: the last Ping, at 4.0, named the answer each
        # consumer queued at 3.0 (to StartFetcher), where their leases run from.
        assert (a.last_request_at, b.last_request_at) == (3.0, 3.0)
        cluster.lose_store_contact(3.0)
        await trio.sleep_until(8.5 - 0.001)
        # The Pings due at 6.0 were not sent: nothing reached the consumers while out of contact.
        assert (a.last_request_at, b.last_request_at) == (3.0, 3.0)
        # Held back Pings are tried again every 0.5 s: the one at 8.5 goes, within the leases
        # the consumers count from 3.0 (to 9.0), and names their answers of 4.0.
        await trio.sleep_until(8.5 + 0.001)
        assert (a.last_request_at, b.last_request_at) == (4.0, 4.0)
        # No Ping was sent, so none was missed: both still members, nothing counted against them,
        # fetching what they fetched since 3.0 under the same generation.
        group = cluster.coordinator.groups["g"]
        assert sorted(group.members) == ["a", "b"]
        assert [m.machine.missed for m in group.members.values()] == [0, 0]
        assert (a.owned, b.owned) == owned
        assert _intervals(cluster) == leases
        assert a.started_generations == b.started_generations == [1]
        await cluster.check_invariants(settled=True)


async def test_out_of_contact_it_stops_starts_and_registers_nobody(
    tmp_path: Path, autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    async with open_simulated_cluster(tmp_path, CONFIG) as cluster:
        a, b = await _pair(cluster)
        leases = _intervals(cluster)
        await trio.sleep_until(5.5)
        cluster.lose_store_contact(3.0)
        # New partitions: a rebalance is due at once, and a StopFetcher would renew leases.
        await cluster.add_partitions("events", added=2)
        # A registration's answer renews the lease of whatever its consumer holds.
        c = await cluster.start_consumer("c", group="g", topics={"events": 1}, rejoin=False)
        assert c.last_register_error is ErrorCode.COORDINATOR_NOT_AVAILABLE
        await c.kill()
        await trio.sleep_until(8.5 - 0.001)
        # Attempts at 5.5 and 7.5 (a failed attempt waits T/3) failed before sending anything:
        # a and b fetch on, untouched, under generation 1.
        assert a.fetching and b.fetching
        assert _intervals(cluster) == leases
        assert a.started_generations == b.started_generations == [1]
        failed = [r.message for r in caplog.records if "out of contact with the store" in r.message]
        assert len(failed) == 2
        with trio.fail_after(10):
            await cluster.wait_settled()
        # The next attempt, at 9.5, is in contact again and moves the new partitions.
        assert trio.current_time() == 9.5
        # Generations 2 and 3 went to the attempts that failed.
        assert a.started_generations == b.started_generations == [1, 4]
        assert len(a.owned | b.owned) == 8
        await cluster.check_invariants(settled=True)


async def test_after_a_pause_past_the_leases_a_due_ping_is_a_death_not_a_renewal(
    tmp_path: Path, autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    """The broker is paused for 10 s (GC, SIGSTOP) while its consumers' network is cut: they
    stop at their leases' end and close, but the broker, resuming first, hears nothing. The
    Pings that fell due meanwhile must not go out as renewals: the members' leases ran out, so
    they are dead, their partitions free the instant the broker resumes."""
    caplog.set_level(logging.INFO, logger="coordinator")
    async with open_simulated_cluster(tmp_path, CONFIG) as cluster:
        a, b = await _pair(cluster)
        await trio.sleep_until(5.0)
        # The Pings of 4.0 named the answers of 3.0; the next Pings are due at 6.0.
        assert (a.last_request_at, b.last_request_at) == (3.0, 3.0)
        a.cut_network(12.0)
        b.cut_network(12.0)
        cluster.pause_coordinator(10.0)
        await trio.sleep(0)
        assert trio.current_time() == 15.0
        with trio.fail_after(30):
            await cluster.wait_settled()
        deaths = sorted(r.getMessage() for r in caplog.records if "is dead" in r.getMessage())
        # The coordinator counts their leases to 4.0 + 6 + 0.5 = 10.5, long past at 15.0.
        assert deaths == [
            f"group g: {c} is dead (lease ran out before its next Ping); its partitions are free "
            "now"
            for c in ("a", "b")
        ]
        # The consumers stopped by their own rule at 9.0 (T after the answers the Pings of 4.0
        # named).
        ended = sorted((i.consumer_id, i.start, i.end) for i in cluster.ledger.closed)
        assert ended == [("a", 3.0, 9.0)] * 3 + [("b", 3.0, 9.0)] * 3
        # Their lease timers fired as the clock resumed at 15.0; they looked for their
        # coordinator at once and then after the library's backoff (15.1, 15.3, 15.7, 16.5: the
        # network still cut), and at 18.1, the cut healed at 17.0, came back to a group emptied
        # at 15.0, which forms again 3 s later.
        assert trio.current_time() == pytest.approx(21.1)
        assert a.started_generations == b.started_generations == [1, 2]
        await cluster.check_invariants(settled=True)
