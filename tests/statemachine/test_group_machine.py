"""The group machine against an outcome table written out by hand, not derived from TABLE."""

import attrs
import pytest

from protocol.errors import IllegalInput
from statemachine import group as g
from statemachine.table import IllegalTransition

S = g.GroupState
INPUTS = {
    "Joined": g.MemberJoined(member_id="c9"),
    "Departed": g.MemberDeparted(member_id="c1", remaining=2),
    "Topics": g.TopicsChanged(),
    "Began": g.AttemptBegan(generation=5),
    "NotNeeded": g.AttemptNotNeeded(),
    "Stopped": g.MembersStopped(),
    "Completed": g.AttemptCompleted(),
    "Failed": g.AttemptFailed(),
    "Deleted": g.Deleted(),
    "Recovered": g.Recovered(awaiting=frozenset({"c1"})),
    "Adopted": g.RecordAdopted(),
    "Away": g.MemberAway(member_id="c1"),
    "Replaced": g.MemberReplaced(member_id="c1"),
}
X = None
# fmt: off
EXPECTED: dict[S, dict[str, S | None]] = {
    S.EMPTY: {"Joined": S.PENDING, "Departed": S.EMPTY, "Topics": S.EMPTY, "Began": X,
              "NotNeeded": X, "Stopped": X, "Completed": X, "Failed": X, "Deleted": S.DEAD,
              "Recovered": S.EMPTY, "Adopted": X, "Away": X, "Replaced": X},
    S.PENDING: {"Joined": S.PENDING, "Departed": S.PENDING, "Topics": S.PENDING,
                "Began": S.STOPPING, "NotNeeded": S.STABLE, "Stopped": X, "Completed": X,
                "Failed": S.PENDING, "Deleted": X, "Recovered": X, "Adopted": S.STABLE,
                "Away": S.PENDING, "Replaced": S.PENDING},
    S.STOPPING: {"Joined": S.STOPPING, "Departed": S.PENDING, "Topics": S.STOPPING, "Began": X,
                 "NotNeeded": X, "Stopped": S.STARTING, "Completed": X, "Failed": S.PENDING,
                 "Deleted": X, "Recovered": X, "Adopted": X, "Away": S.PENDING,
                 "Replaced": S.PENDING},
    S.STARTING: {"Joined": S.STARTING, "Departed": S.PENDING, "Topics": S.STARTING, "Began": X,
                 "NotNeeded": X, "Stopped": X, "Completed": S.STABLE, "Failed": S.PENDING,
                 "Deleted": X, "Recovered": X, "Adopted": X, "Away": S.PENDING,
                 "Replaced": S.PENDING},
    S.STABLE: {"Joined": S.PENDING, "Departed": S.PENDING, "Topics": S.PENDING, "Began": X,
               "NotNeeded": X, "Stopped": X, "Completed": X, "Failed": X, "Deleted": X,
               "Recovered": X, "Adopted": X, "Away": S.STABLE, "Replaced": S.PENDING},
    S.DEAD: {name: X for name in INPUTS},
}
# fmt: on


def test_the_table_covers_exactly_the_expected_inputs() -> None:
    assert {type(e) for e in INPUTS.values()} == set(g.TABLE.inputs())


@pytest.mark.parametrize("state", list(S))
@pytest.mark.parametrize("name", list(INPUTS))
def test_every_state_and_input(state: S, name: str) -> None:
    machine = g.GroupMachine(group_id="g", state=state, generation=4)
    expected = EXPECTED[state][name]
    if expected is None:
        before = attrs.asdict(machine)
        with pytest.raises(IllegalTransition):
            machine.handle(INPUTS[name])
        assert attrs.asdict(machine) == before
    else:
        machine.handle(INPUTS[name])
        assert machine.state is expected


def test_a_crowd_of_joins_postpones_one_first_rebalance() -> None:
    machine = g.GroupMachine(group_id="g")
    effects = [e for i in range(100) for e in machine.handle(g.MemberJoined(member_id=f"c{i}"))]
    assert effects == [g.ScheduleRebalance(delay=g.Delay.INITIAL)] + 99 * [
        g.ScheduleRebalance(delay=g.Delay.INITIAL_AGAIN)
    ]
    # A topic change or a departure while forming neither brings the attempt forward nor ends
    # the forming.
    assert machine.handle(g.TopicsChanged()) == []
    assert machine.handle(g.MemberDeparted(member_id="c0", remaining=99)) == []
    assert machine.handle(g.MemberJoined(member_id="c100")) == [
        g.ScheduleRebalance(delay=g.Delay.INITIAL_AGAIN)
    ]


def test_only_the_first_rebalance_after_empty_is_postponed_by_joins() -> None:
    machine = g.GroupMachine(group_id="g")
    machine.handle(g.MemberJoined(member_id="c1"))
    machine.handle(g.AttemptBegan(generation=1))
    assert machine.handle(g.MemberJoined(member_id="c2")) == []  # coalesced, not postponed
    machine.handle(g.MembersStopped())
    assert machine.handle(g.AttemptCompleted()) == [g.ScheduleRebalance(delay=g.Delay.NONE)]
    machine.handle(g.AttemptNotNeeded())
    assert machine.handle(g.MemberJoined(member_id="c3")) == [
        g.ScheduleRebalance(delay=g.Delay.NONE)
    ]
    # Emptied, the group forms again: the next crowd gets the initial delay again.
    machine.handle(g.MemberDeparted(member_id="c1", remaining=0))
    assert machine.state is S.EMPTY
    assert machine.handle(g.MemberJoined(member_id="c4")) == [
        g.ScheduleRebalance(delay=g.Delay.INITIAL)
    ]
    assert machine.handle(g.MemberJoined(member_id="c5")) == [
        g.ScheduleRebalance(delay=g.Delay.INITIAL_AGAIN)
    ]


def test_a_group_emptied_while_forming_forms_afresh() -> None:
    machine = g.GroupMachine(group_id="g")
    machine.handle(g.MemberJoined(member_id="c1"))
    machine.handle(g.MemberDeparted(member_id="c1", remaining=0))
    assert (machine.state, machine.forming) == (S.EMPTY, False)
    assert machine.handle(g.MemberJoined(member_id="c2")) == [
        g.ScheduleRebalance(delay=g.Delay.INITIAL)
    ]


def test_joins_during_an_attempt_coalesce_into_one_more_and_never_cancel() -> None:
    machine = g.GroupMachine(group_id="g", state=S.PENDING)
    machine.handle(g.AttemptBegan(generation=1))
    for i in range(5):
        assert machine.handle(g.MemberJoined(member_id=f"late{i}")) == []
    assert machine.handle(g.TopicsChanged()) == []
    machine.handle(g.MembersStopped())
    assert machine.handle(g.AttemptCompleted()) == [g.ScheduleRebalance(delay=g.Delay.NONE)]
    assert (machine.state, machine.rebalance_pending) == (S.PENDING, False)


def test_a_departure_cancels_the_attempt_in_flight() -> None:
    machine = g.GroupMachine(group_id="g", state=S.PENDING)
    machine.handle(g.AttemptBegan(generation=1))
    effects = machine.handle(g.MemberDeparted(member_id="c1", remaining=3))
    assert effects == [g.CancelAttempt(), g.ScheduleRebalance(delay=g.Delay.NONE)]
    assert machine.state is S.PENDING


def test_the_last_departure_empties_the_group() -> None:
    machine = g.GroupMachine(group_id="g", state=S.STARTING, generation=2)
    assert machine.handle(g.MemberDeparted(member_id="c1", remaining=0)) == [g.CancelAttempt()]
    assert machine.state is S.EMPTY


def test_a_failed_attempt_backs_off() -> None:
    machine = g.GroupMachine(group_id="g", state=S.STOPPING, generation=2)
    assert machine.handle(g.AttemptFailed()) == [g.ScheduleRebalance(delay=g.Delay.BACKOFF)]


def test_generations_only_increase() -> None:
    machine = g.GroupMachine(group_id="g", state=S.PENDING, generation=4)
    with pytest.raises(IllegalInput):
        machine.handle(g.AttemptBegan(generation=4))
    assert (machine.state, machine.generation) == (S.PENDING, 4)


def test_a_recovered_group_waits_for_the_members_its_record_names_and_no_initial_delay() -> None:
    machine = g.GroupMachine(group_id="g", generation=4)
    assert machine.handle(g.Recovered(awaiting=frozenset({"a", "b"}))) == []
    recovery = [g.ScheduleRebalance(delay=g.Delay.RECOVERY)]
    assert machine.handle(g.MemberJoined(member_id="a")) == recovery
    assert machine.handle(g.MemberJoined(member_id="c")) == recovery  # not in the record
    # The last member the record names is back: decide at once.
    assert machine.handle(g.MemberJoined(member_id="b")) == [
        g.ScheduleRebalance(delay=g.Delay.NONE)
    ]
    assert not machine.forming
    assert machine.handle(g.RecordAdopted()) == []
    assert (machine.state, machine.generation, machine.awaiting) == (S.STABLE, 4, None)
    # Recovery is over: a join rebalances a Stable group at once, as ever.
    assert machine.handle(g.MemberJoined(member_id="d")) == [
        g.ScheduleRebalance(delay=g.Delay.NONE)
    ]


def test_a_static_member_away_keeps_a_stable_group_stable_and_cuts_an_attempt_short() -> None:
    """docs/design.md#static-members: a process ending is no rebalance; an attempt in flight,
    which would wait on that process, is cancelled and begins again."""
    stable = g.GroupMachine(group_id="g", state=S.STABLE, generation=4)
    assert stable.handle(g.MemberAway(member_id="c1")) == []
    assert stable.state is S.STABLE
    for state in (S.STOPPING, S.STARTING):
        machine = g.GroupMachine(group_id="g", state=state, generation=4, rebalance_pending=True)
        assert machine.handle(g.MemberAway(member_id="c1")) == [
            g.CancelAttempt(),
            g.ScheduleRebalance(delay=g.Delay.NONE),
        ]
        assert machine.state is S.PENDING
        assert not machine.rebalance_pending


def test_a_fenced_member_moves_its_partitions_to_the_newer_process_at_once() -> None:
    stable = g.GroupMachine(group_id="g", state=S.STABLE, generation=4)
    assert stable.handle(g.MemberReplaced(member_id="c1")) == [
        g.ScheduleRebalance(delay=g.Delay.NONE)
    ]
    assert stable.state is S.PENDING
    stopping = g.GroupMachine(group_id="g", state=S.STOPPING, generation=4)
    assert stopping.handle(g.MemberReplaced(member_id="c1")) == [
        g.CancelAttempt(),
        g.ScheduleRebalance(delay=g.Delay.NONE),
    ]
