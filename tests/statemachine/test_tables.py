"""Every machine lands exactly where its table says, so the diagrams show every transition made.

Each machine is driven through every outcome its table lists, each guard outcome included, and
random legal and illegal sequences check after every step that the machine's state is the
table's answer for that input, looked up before the step: code that set the state after the
lookup would show up here as a state the table did not give.
"""

from __future__ import annotations

import copy
import enum
import itertools
from collections.abc import Callable, Iterable
from typing import Any

import attrs
import pytest
from hypothesis import given
from hypothesis import strategies as st

from protocol.errors import ErrorCode
from protocol.messages import AssignedPartition, AssignedStream
from protocol.types import BrokerInfo, TopicPartition
from statemachine import consumer as c
from statemachine import group as g
from statemachine import member as m
from statemachine.table import (
    Guard,
    GuardConflict,
    Guarded,
    IllegalTransition,
    Transition,
    TransitionTable,
)

# --- the table mechanism --------------------------------------------------------------------


class Light(enum.Enum):  # a machine of two states, only to exercise the table itself
    OFF = "off"
    ON = "on"


@attrs.frozen
class Press:
    hard: bool


HARD = Guard("hard", lambda machine, event: event.hard, otherwise="gently")


def test_a_guarded_entry_picks_the_outcome_whose_guard_holds() -> None:
    table = TransitionTable(
        "light", {(Light.OFF, Press): Guarded(((HARD, Light.OFF), (~HARD, Light.ON)))}
    )
    assert table.lookup(Light.OFF, Press(hard=True)) == Transition(
        source=Light.OFF, event_type=Press, guard="hard", target=Light.OFF
    )
    assert table.next_state(Light.OFF, Press(hard=False)) is Light.ON
    assert [t.guard for t in table.entries()] == ["hard", "gently"]
    assert (~Guard("x", lambda machine, event: True)).name == "not x"


def test_guards_that_do_not_single_out_one_outcome_are_a_broken_table() -> None:
    both = Guarded(((HARD, Light.OFF), (Guard("always", lambda machine, event: True), Light.ON)))
    table = TransitionTable("light", {(Light.OFF, Press): both})
    with pytest.raises(GuardConflict):
        table.lookup(Light.OFF, Press(hard=True))
    assert table.next_state(Light.OFF, Press(hard=False)) is Light.ON
    with pytest.raises(ValueError):
        Guarded(((HARD, Light.OFF),))
    with pytest.raises(ValueError):
        Guarded(((HARD, Light.OFF), (HARD, Light.ON)))


# --- the machines ---------------------------------------------------------------------------

T = 6.0
COORDINATOR = BrokerInfo(broker_id=2, host="127.0.0.1", port=9093)
ASSIGNED = (
    AssignedStream(
        stream_id="c-0",
        partitions=(AssignedPartition(topic="t", partition=0, offset=0, broker_id=1),),
    ),
)


def group_cases() -> Iterable[tuple[Any, object]]:
    events = [
        g.MemberJoined(member_id="c9"),
        g.MemberDeparted(member_id="c1", remaining=0),
        g.MemberDeparted(member_id="c1", remaining=2),
        g.TopicsChanged(),
        g.AttemptBegan(generation=5),
        g.AttemptNotNeeded(),
        g.MembersStopped(),
        g.AttemptCompleted(),
        g.AttemptFailed(),
        g.Deleted(),
        g.Recovered(awaiting=frozenset({"c1"})),
        g.RecordAdopted(),
        g.MemberAway(member_id="c1"),
        g.MemberReplaced(member_id="c1"),
    ]
    for state, pending, forming, event in itertools.product(
        g.GroupState, (False, True), (False, True), events
    ):
        machine = g.GroupMachine(
            group_id="g", state=state, generation=4, rebalance_pending=pending, forming=forming
        )
        yield machine, event


def member_cases() -> Iterable[tuple[Any, object]]:
    events = [
        m.StopFetcherSent(generation=7, now=1.0),
        m.StopFetcherSent(generation=7, now=1.0, start_follows=False),
        m.StopFetcherAnswered(now=1.0),
        m.StartFetcherSent(generation=7, now=1.0),
        m.StartFetcherAnswered(now=1.0),
        m.PingSent(now=1.0),
        m.PingSent(now=T + 1.0),  # past the lease (heard at 0.0: T plus the 0.5 margin)
        m.PingAnswered(now=1.0),
        m.DeadlineMissed(now=1.0),
        m.DeadlineMissed(now=1.0, handover=True),
        m.HandoverRefused(now=1.0),
        m.ConnectionClosed(now=1.0),
        m.ConnectionBroken(now=1.0),
        m.Left(now=1.0),
        m.ProtocolViolation(now=1.0),
        m.Adopted(generation=7),
        m.Fenced(now=1.0),
        m.Shed(now=1.0, told=True),
        m.Shed(now=1.0, told=False),
    ]
    for state, max_missed, missed, handovers, start_follows, event in itertools.product(
        m.MemberState, (1, 3), (0, 1, 2), (0, 1, 2), (True, False), events
    ):
        timeouts = m.MemberTimeouts(session_timeout=T, max_missed=max_missed)
        machine = m.MemberMachine(
            member_id="c1",
            timeouts=timeouts,
            last_heard=0.0,
            state=state,
            missed=missed,
            handovers_missed=handovers,
            start_follows=start_follows,
        )
        yield machine, event


def consumer_events(now: float, epoch: int) -> list[c.Input]:
    stop = c.StopFetcherReceived(now=now, anchor=now, correlation_id=8, epoch=epoch, generation=4)
    start = c.StartFetcherReceived(
        now=now, anchor=now, correlation_id=9, epoch=epoch, generation=4, streams=ASSIGNED
    )
    return [
        c.Start(),
        c.CoordinatorFound(now=now, coordinator=COORDINATOR, epoch=epoch),
        c.DiscoveryFailed(now=now),
        c.DiscoveryFailed(now=now, error_code=ErrorCode.COORDINATOR_LOAD_IN_PROGRESS),
        c.Registered(now=now, anchor=now, generation=3, epoch=epoch),
        c.RegistrationRejected(now=now, error_code=ErrorCode.DUPLICATE_MEMBER_ID),
        c.RegistrationRejected(now=now, error_code=ErrorCode.COORDINATOR_LOAD_IN_PROGRESS),
        c.PingReceived(now=now, anchor=now, correlation_id=7, epoch=epoch, generation=3),
        stop,
        start,
        c.CoordinatorMoved(now=now, error_code=ErrorCode.NOT_COORDINATOR),
        c.CoordinatorMoved(now=now, error_code=ErrorCode.REBALANCE_IN_PROGRESS),
        c.ConnectionLost(now=now),
        c.LeaseExpired(now=now),
        c.Close(),
        # incremental rebalancing and static members (SPEC.md §11.5, §11.6, §11.11)
        attrs.evolve(stop, partitions=(TopicPartition(topic="t", partition=0),)),
        attrs.evolve(stop, reason=ErrorCode.FENCED_INSTANCE_ID),
        attrs.evolve(start, incremental=True),
        c.RegistrationRejected(now=now, error_code=ErrorCode.FENCED_INSTANCE_ID),
        c.Fenced(now=now),
        # a group let go (SPEC.md §11.7): told over the connection, or refused while held out
        attrs.evolve(stop, reason=ErrorCode.BROKER_BUSY, retry_after=6.0),
        c.RegistrationRejected(now=now, error_code=ErrorCode.BROKER_BUSY, retry_after=2.0),
    ]


def consumer_cases() -> Iterable[tuple[Any, object]]:
    # Heard at 100.0, so the lease runs to 106.0: inputs at 101.0 arrive within it, and a
    # LeaseExpired at 106.0 is the deadline itself.
    events = [
        *consumer_events(101.0, 5),
        *consumer_events(101.0, 4),
        c.CoordinatorFound(now=101.0, coordinator=COORDINATOR, epoch=c.UNKNOWN_EPOCH),
        c.LeaseExpired(now=100.0 + T),
    ]
    for state, event in itertools.product(c.ConsumerState, events):
        machine = c.ConsumerMachine(
            config=c.ConsumerConfig(session_timeout=T),
            state=state,
            coordinator=COORDINATOR,
            generation=3,
            epoch=5,
            owned=(TopicPartition(topic="t", partition=0),),
            last_heard=100.0,
        )
        yield machine, event


MACHINES: dict[str, tuple[TransitionTable[Any], Callable[[], Iterable[tuple[Any, object]]]]] = {
    "group": (g.TABLE, group_cases),
    "member": (m.TABLE, member_cases),
    "consumer": (c.TABLE, consumer_cases),
}


def step_lands_where_the_table_says(
    table: TransitionTable[Any], machine: Any, event: object
) -> Transition[Any] | None:
    """Look ``event`` up, apply it, and check the machine is in the state the lookup gave; an
    input the table refuses must raise and change nothing. Returns the outcome taken."""
    before = copy.deepcopy(machine)
    try:
        expected = table.lookup(machine.state, event, machine)
    except IllegalTransition:
        with pytest.raises(IllegalTransition):
            machine.handle(event)
        assert machine == before
        return None
    assert machine == before, "a lookup changed the machine"
    machine.handle(event)
    assert machine.state is expected.target, (
        f"{type(event).__name__} in {before.state.name}: the table says "
        f"{expected.target.name} [{expected.guard}], the machine went to {machine.state.name}"
    )
    return expected


@pytest.mark.parametrize("name", list(MACHINES))
def test_every_outcome_of_the_table_is_driven_and_lands_where_the_table_says(name: str) -> None:
    table, cases = MACHINES[name]
    taken = set()
    for machine, event in cases():
        outcome = step_lands_where_the_table_says(table, machine, event)
        if outcome is not None:
            taken.add(outcome)
    assert taken == set(table.entries())


def test_the_guarded_outcomes_are_the_ones_the_diagrams_promise() -> None:
    guarded = {
        name: {
            (t.source.name, t.event_type.__name__, t.guard, t.target.name)
            for t in table.entries()
            if t.guard
        }
        for name, (table, _) in MACHINES.items()
    }
    assert ("STABLE", "MemberDeparted", "last", "EMPTY") in guarded["group"]
    assert ("STARTING", "AttemptCompleted", "rebalance owed", "PENDING") in guarded["group"]
    assert ("STABLE", "DeadlineMissed", "misses used up", "DEAD") in guarded["member"]
    assert ("STOPPING", "HandoverRefused", "misses left", "STOPPING") in guarded["member"]
    assert ("STABLE", "PingSent", "lease ran out", "DEAD") in guarded["member"]
    assert ("REGISTERING", "Registered", "stale epoch", "DISCOVERING") in guarded["consumer"]
    assert ("FETCHING", "LeaseExpired", "renewed since", "FETCHING") in guarded["consumer"]
    assert ("REGISTERING", "RegistrationRejected", "failover under way", "DISCOVERING") in (
        guarded["consumer"]
    )


# --- random sequences -----------------------------------------------------------------------


@given(st.lists(st.tuples(st.integers(0, 9), st.integers(0, 3)), max_size=60))
def test_random_group_sequences_follow_the_table(steps: list[tuple[int, int]]) -> None:
    machine = g.GroupMachine(group_id="g")
    for kind, members in steps:
        event = [
            g.MemberJoined(member_id="c"),
            g.MemberDeparted(member_id="c", remaining=members),
            g.TopicsChanged(),
            g.AttemptBegan(generation=machine.generation + 1),
            g.AttemptNotNeeded(),
            g.MembersStopped(),
            g.AttemptCompleted(),
            g.AttemptFailed(),
            g.Deleted(),
            g.MemberDeparted(member_id="c", remaining=0),
        ][kind]
        step_lands_where_the_table_says(g.TABLE, machine, event)


@given(
    st.integers(1, 3),
    st.lists(st.tuples(st.integers(0, 12), st.floats(0, 3)), max_size=60),
)
def test_random_member_sequences_follow_the_table(
    max_missed: int, steps: list[tuple[int, float]]
) -> None:
    timeouts = m.MemberTimeouts(session_timeout=T, max_missed=max_missed)
    machine = m.MemberMachine(member_id="c1", timeouts=timeouts, last_heard=0.0)
    now = 0.0
    for kind, delay in steps:
        now += delay
        event = [
            m.StopFetcherSent(generation=machine.generation + 1, now=now),
            m.StopFetcherAnswered(now=now),
            m.StartFetcherSent(generation=machine.generation, now=now),
            m.StartFetcherAnswered(now=now),
            m.PingSent(now=now),
            m.PingAnswered(now=now),
            m.DeadlineMissed(now=now),
            m.DeadlineMissed(now=now, handover=True),
            m.HandoverRefused(now=now),
            m.ConnectionClosed(now=now),
            m.ConnectionBroken(now=now),
            m.Left(now=now),
            m.ProtocolViolation(now=now),
        ][kind]
        step_lands_where_the_table_says(m.TABLE, machine, event)


@given(
    st.lists(
        st.tuples(
            # neither LeaseExpired nor Close (12, 13): a timer fires at the deadline anyway
            st.sampled_from([*range(12), *range(14, len(consumer_events(0.0, 5)))]),
            st.sampled_from([4, 5, 6, c.UNKNOWN_EPOCH]),
            st.floats(0, T),
        ),
        max_size=60,
    )
)
def test_random_consumer_sequences_follow_the_table(steps: list[tuple[int, int, float]]) -> None:
    machine = c.ConsumerMachine(config=c.ConsumerConfig(session_timeout=T), epoch=5)
    now = 0.0
    for kind, epoch, delay in steps:
        now += delay
        deadline = machine.lease_deadline()
        if deadline is not None and now >= deadline:
            # The trio layer's timer fires at the deadline, before the next input is read.
            step_lands_where_the_table_says(c.TABLE, machine, c.LeaseExpired(now=deadline))
        event = consumer_events(now, epoch)[kind]
        if isinstance(event, c.LeaseExpired):
            # A timer fires for the deadline it was set for, which may have moved on since.
            event = c.LeaseExpired(now=now - delay)
        step_lands_where_the_table_says(c.TABLE, machine, event)
