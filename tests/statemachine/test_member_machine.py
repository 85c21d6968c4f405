"""The member machine against an outcome table written out by hand, not derived from TABLE."""

import attrs
import pytest

from statemachine import member as m
from statemachine.table import IllegalTransition

S = m.MemberState
INPUTS = {
    "StopSent": m.StopFetcherSent(generation=7, now=1.0),
    "StopAnswered": m.StopFetcherAnswered(now=1.0),
    "RevokeSent": m.StopFetcherSent(generation=7, now=1.0, start_follows=False),
    "StartSent": m.StartFetcherSent(generation=7, now=1.0),
    "StartAnswered": m.StartFetcherAnswered(now=1.0),
    "PingSent": m.PingSent(now=1.0),
    "PingAnswered": m.PingAnswered(now=1.0),
    "Missed": m.DeadlineMissed(now=1.0),
    "Closed": m.ConnectionClosed(now=1.0),
    "Broken": m.ConnectionBroken(now=1.0),
    "Left": m.Left(now=1.0),
    "Violation": m.ProtocolViolation(now=1.0),
    "Refused": m.HandoverRefused(now=1.0),
    "Adopted": m.Adopted(generation=7),
    "Fenced": m.Fenced(now=1.0),
    "Shed": m.Shed(now=1.0, told=True),
    "ShedClosed": m.Shed(now=1.0, told=False),
}
X = None  # illegal
# fmt: off
EXPECTED: dict[S, dict[str, S | None]] = {
    S.REGISTERED: {"RevokeSent": S.STOPPING, "StopSent": S.STOPPING, "StopAnswered": X,
                   "StartSent": S.STARTING, "StartAnswered": X, "PingSent": S.REGISTERED,
                   "PingAnswered": S.REGISTERED, "Missed": S.DEAD,
                   "Closed": S.DEAD, "Broken": S.DEAD, "Left": S.DEAD, "Violation": S.DEAD,
                   "Refused": S.DEAD, "Adopted": S.STABLE, "Fenced": S.DEAD,
               "Shed": S.DEAD, "ShedClosed": S.DEAD},
    S.STOPPING: {"RevokeSent": S.STOPPING, "StopSent": S.STOPPING, "StopAnswered": S.STOPPING,
                 "StartSent": S.STARTING,
                 "StartAnswered": X, "PingSent": S.STOPPING, "PingAnswered": S.STOPPING,
                 "Missed": S.DEAD, "Closed": S.DEAD, "Broken": S.DEAD, "Left": S.DEAD,
                 "Violation": S.DEAD, "Refused": S.DEAD, "Adopted": X, "Fenced": S.DEAD,
               "Shed": S.DEAD, "ShedClosed": S.DEAD},
    S.STARTING: {"RevokeSent": S.STOPPING, "StopSent": S.STOPPING, "StopAnswered": X,
                 "StartSent": S.STARTING,
                 "StartAnswered": S.STABLE, "PingSent": S.STARTING, "PingAnswered": S.STARTING,
                 "Missed": S.DEAD, "Closed": S.DEAD, "Broken": S.DEAD, "Left": S.DEAD,
                 "Violation": S.DEAD, "Refused": S.DEAD, "Adopted": X, "Fenced": S.DEAD,
               "Shed": S.DEAD, "ShedClosed": S.DEAD},
    S.STABLE: {"RevokeSent": S.STOPPING, "StopSent": S.STOPPING, "StopAnswered": X,
               "StartSent": S.STARTING, "StartAnswered": X, "PingSent": S.STABLE,
               "PingAnswered": S.STABLE, "Missed": S.DEAD,
               "Closed": S.DEAD, "Broken": S.DEAD, "Left": S.DEAD, "Violation": S.DEAD,
               "Refused": S.DEAD, "Adopted": X, "Fenced": S.DEAD,
               "Shed": S.DEAD, "ShedClosed": S.DEAD},
    S.DEAD: {"RevokeSent": X, "StopSent": X, "StopAnswered": X, "StartSent": X, "StartAnswered": X,
             "PingSent": X, "PingAnswered": X, "Missed": S.DEAD, "Closed": S.DEAD,
             "Broken": S.DEAD, "Left": X, "Violation": X, "Refused": S.DEAD,
             "Adopted": X, "Fenced": X, "Shed": X, "ShedClosed": X},
}
# fmt: on


def _machine(state: S) -> m.MemberMachine:
    timeouts = m.MemberTimeouts(session_timeout=6.0, max_missed=1, lease_margin=0.5)
    return m.MemberMachine(member_id="c1", timeouts=timeouts, last_heard=0.0, state=state)


def test_the_table_covers_exactly_the_expected_inputs() -> None:
    assert {type(e) for e in INPUTS.values()} == set(m.TABLE.inputs())


@pytest.mark.parametrize("state", list(S))
@pytest.mark.parametrize("name", list(INPUTS))
def test_every_state_and_input(state: S, name: str) -> None:
    machine = _machine(state)
    expected = EXPECTED[state][name]
    if expected is None:
        before = attrs.asdict(machine)
        with pytest.raises(IllegalTransition):
            machine.handle(INPUTS[name])
        assert attrs.asdict(machine) == before
    else:
        machine.handle(INPUTS[name])
        assert machine.state is expected


def test_one_missed_deadline_kills_by_default_and_frees_partitions_after_the_lease() -> None:
    machine = _machine(S.STABLE)
    machine.handle(m.PingAnswered(now=10.0))
    machine.handle(m.PingSent(now=12.0))
    (effect,) = machine.handle(m.DeadlineMissed(now=16.0))
    assert machine.state is S.DEAD
    # The Ping of 12.0 may have arrived and renewed the lease though its answer never came back:
    # the lease counts from the last request sent (12.0), plus T (6) and the margin (0.5).
    assert effect == m.DeclaredDead(cause=m.DeathCause.MISSED_DEADLINES, partitions_free_at=18.5)


def test_a_closed_connection_frees_at_once_but_a_broken_one_waits_for_the_lease() -> None:
    # The member closes its connection only after it stopped fetching; a connection reset under
    # it (or under a paused process) is no such proof.
    closed, broken = _machine(S.STABLE), _machine(S.STABLE)
    for machine in (closed, broken):
        machine.handle(m.PingAnswered(now=10.0))
        machine.handle(m.PingSent(now=12.0))
    assert closed.handle(m.ConnectionClosed(now=13.0)) == [
        m.DeclaredDead(cause=m.DeathCause.CONNECTION_CLOSED, partitions_free_at=13.0)
    ]
    assert broken.handle(m.ConnectionBroken(now=13.0)) == [
        m.DeclaredDead(cause=m.DeathCause.CONNECTION_BROKEN, partitions_free_at=18.5)
    ]


def test_a_ping_due_after_the_lease_ran_out_is_a_death_not_a_renewal() -> None:
    """The coordinator was paused (or out of contact with its store) past the member's lease:
    the member stopped by its own rule, and a Ping would restart its lease, which only a
    StartFetcher or an adoption may do. So the member is dead, its partitions free at once."""
    timeouts = m.MemberTimeouts(session_timeout=6.0, max_missed=3, lease_margin=0.5)
    on_time = m.MemberMachine(member_id="c1", timeouts=timeouts, last_heard=0.0)
    on_time.handle(m.PingAnswered(now=10.0))
    assert on_time.handle(m.PingSent(now=16.4)) == []
    assert (on_time.state, on_time.last_sent) == (S.REGISTERED, 16.4)

    late = m.MemberMachine(member_id="c1", timeouts=timeouts, last_heard=5.0, state=S.STABLE)
    late.handle(m.PingSent(now=8.0))
    late.handle(m.PingAnswered(now=10.0))
    # Heard at 10.0: its lease, as the coordinator counts it, ends at 10.0 + 6 + 0.5 = 16.5.
    assert late.handle(m.PingSent(now=16.5)) == [
        m.DeclaredDead(cause=m.DeathCause.LEASE_LAPSED, partitions_free_at=16.5)
    ]
    assert (late.state, late.last_sent) == (S.DEAD, 8.0)


def test_misses_are_counted_and_an_answer_resets_them() -> None:
    timeouts = m.MemberTimeouts(session_timeout=3.0, max_missed=3)
    machine = m.MemberMachine(member_id="c1", timeouts=timeouts, last_heard=0.0)
    assert machine.handle(m.DeadlineMissed(now=2.0)) == []
    assert machine.handle(m.DeadlineMissed(now=4.0)) == []
    machine.handle(m.PingAnswered(now=4.5))
    assert machine.missed == 0
    assert machine.handle(m.DeadlineMissed(now=6.5)) == []
    assert machine.handle(m.DeadlineMissed(now=8.5)) == []
    (effect,) = machine.handle(m.DeadlineMissed(now=10.5))
    # last heard at 4.5: its lease (T=3 plus the 0.5 margin) ran out at 8.0, before it was declared
    assert effect.partitions_free_at == 10.5


def test_a_closed_connection_frees_partitions_at_once() -> None:
    machine = _machine(S.STABLE)
    (effect,) = machine.handle(m.ConnectionClosed(now=3.0))
    assert effect == m.DeclaredDead(cause=m.DeathCause.CONNECTION_CLOSED, partitions_free_at=3.0)
    assert machine.handle(m.ConnectionClosed(now=4.0)) == []


def test_timings_follow_the_seeds() -> None:
    timeouts = m.MemberTimeouts(session_timeout=6.0)
    assert (timeouts.ping_interval, timeouts.response_deadline) == (2.0, 4.0)


def test_generation_follows_the_requests_sent() -> None:
    machine = _machine(S.STABLE)
    machine.handle(m.StopFetcherSent(generation=3, now=0.0))
    # A stop changes no generation: Pings carry that of the last start (SPEC.md §11.4).
    assert (machine.generation, machine.stop_answered) == (-1, False)
    machine.handle(m.StopFetcherAnswered(now=0.5))
    machine.handle(m.StartFetcherSent(generation=3, now=0.6))
    machine.handle(m.StartFetcherAnswered(now=0.7))
    assert (machine.state, machine.generation, machine.last_heard) == (S.STABLE, 3, 0.7)


def test_a_member_only_revoked_is_stable_again_under_its_own_generation() -> None:
    machine = _machine(S.STABLE)
    machine.handle(m.StartFetcherSent(generation=2, now=0.0))
    machine.handle(m.StartFetcherAnswered(now=0.1))
    machine.handle(m.StopFetcherSent(generation=3, now=1.0, start_follows=False))
    assert machine.state is S.STOPPING
    machine.handle(m.StopFetcherAnswered(now=1.2))
    assert (machine.state, machine.generation, machine.last_heard) == (S.STABLE, 2, 1.2)


def test_a_member_only_started_goes_from_stable_to_starting() -> None:
    machine = _machine(S.STABLE)
    machine.handle(m.StartFetcherSent(generation=4, now=1.0))
    assert (machine.state, machine.generation) == (S.STARTING, 4)
    machine.handle(m.StartFetcherAnswered(now=1.1))
    assert machine.state is S.STABLE


def test_refused_handovers_count_as_misses_that_ping_answers_do_not_clear() -> None:
    """A member that answers every Ping but refuses every StopFetcher still uses up its misses,
    and dies silently: it may still be fetching, so its lease holds."""
    timeouts = m.MemberTimeouts(session_timeout=6.0, max_missed=2, lease_margin=0.5)
    machine = m.MemberMachine(member_id="c1", timeouts=timeouts, last_heard=0.0)
    machine.handle(m.StopFetcherSent(generation=2, now=10.0))
    assert machine.handle(m.HandoverRefused(now=10.0)) == []
    machine.handle(m.PingSent(now=12.0))
    machine.handle(m.PingAnswered(now=12.0))
    assert (machine.missed, machine.handovers_missed) == (0, 1)
    machine.handle(m.StopFetcherSent(generation=3, now=12.5))
    (effect,) = machine.handle(m.HandoverRefused(now=12.5))
    assert machine.state is S.DEAD
    assert effect == m.DeclaredDead(cause=m.DeathCause.REFUSED_HANDOVERS, partitions_free_at=19.0)


def test_a_missed_handover_deadline_is_not_cleared_by_ping_answers_either() -> None:
    timeouts = m.MemberTimeouts(session_timeout=6.0, max_missed=2, lease_margin=0.5)
    machine = m.MemberMachine(member_id="c1", timeouts=timeouts, last_heard=0.0)
    assert machine.handle(m.DeadlineMissed(now=4.0, handover=True)) == []
    machine.handle(m.PingAnswered(now=5.0))
    (effect,) = machine.handle(m.DeadlineMissed(now=9.0, handover=True))
    assert effect.cause is m.DeathCause.REFUSED_HANDOVERS
    other = m.MemberMachine(member_id="c2", timeouts=timeouts, last_heard=0.0)
    other.handle(m.HandoverRefused(now=1.0))
    other.handle(m.StopFetcherSent(generation=2, now=2.0))
    other.handle(m.StopFetcherAnswered(now=2.0))  # carried one out: the count starts over
    assert other.handle(m.HandoverRefused(now=3.0)) == []


def test_a_fenced_member_is_gone_and_its_partitions_wait_for_the_lease_its_stop_renewed() -> None:
    """docs/design.md#static-members: telling a paused process it is fenced proves nothing, and
    the StopFetcher that tells it renews its lease."""
    machine = _machine(S.STABLE)
    (death,) = machine.handle(m.Fenced(now=4.0))
    assert death == m.DeclaredDead(cause=m.DeathCause.FENCED, partitions_free_at=4.0 + 6.0 + 0.5)
    assert not machine.alive
