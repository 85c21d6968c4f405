"""The ownership machine against outcome tables written out by hand, and properties over random
input sequences: no partition is ever held by two processes, and a lease ends before its instant
only by its own process's word."""

from __future__ import annotations

import copy
import math
from collections.abc import Callable
from typing import Any

import attrs
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from protocol.errors import IllegalInput
from protocol.types import TopicPartition
from statemachine import ownership as o
from statemachine.table import IllegalTransition

S = o.PartitionState
X = None
P = TopicPartition(topic="t", partition=0)
Q = TopicPartition(topic="t", partition=1)


def _start(
    *,
    owner: str,
    incarnation: int,
    generation: int,
    partitions: frozenset[TopicPartition],
    now: float,
) -> o.Started:
    return o.Started(generation=generation, starts={incarnation: (owner, partitions)}, now=now)


# --- the table itself -----------------------------------------------------------------------

INPUTS: dict[str, type] = {
    "Started": o.Started,
    "StartUnsent": o.StartUnsent,
    "StopAnswered": o.StopAnswered,
    "OwnerDied": o.OwnerDied,
    "StillFetching": o.StillFetching,
    "NoLongerFetching": o.NoLongerFetching,
    "FetchingUnproven": o.FetchingUnproven,
    "Recovered": o.Recovered,
    "LeaseRanOut": o.LeaseRanOut,
    "OwnerClosed": o.OwnerClosed,
}
# fmt: off
TABLE_EXPECTED: dict[S, dict[str, S | None]] = {
    S.FREE: {"Started": S.HELD, "StartUnsent": X, "StopAnswered": S.FREE, "OwnerDied": X,
             "StillFetching": X, "NoLongerFetching": X, "FetchingUnproven": X,
             "Recovered": S.LEASED, "LeaseRanOut": X, "OwnerClosed": S.FREE},
    S.HELD: {"Started": X, "StartUnsent": S.FREE, "StopAnswered": S.FREE, "OwnerDied": S.LEASED,
             "StillFetching": X, "NoLongerFetching": X, "FetchingUnproven": X, "Recovered": X,
             "LeaseRanOut": X, "OwnerClosed": X},
    S.ADOPTED: {"Started": X, "StartUnsent": X, "StopAnswered": S.FREE, "OwnerDied": S.LEASED,
                "StillFetching": X, "NoLongerFetching": X, "FetchingUnproven": X,
                "Recovered": X, "LeaseRanOut": S.HELD, "OwnerClosed": X},
    S.LEASED: {"Started": X, "StartUnsent": X, "StopAnswered": S.FREE, "OwnerDied": X,
               "StillFetching": S.ADOPTED, "NoLongerFetching": S.FREE,
               "FetchingUnproven": S.ADOPTED, "Recovered": S.LEASED, "LeaseRanOut": S.FREE,
               "OwnerClosed": S.FREE},
}
# fmt: on


@pytest.mark.parametrize("state", list(S))
@pytest.mark.parametrize("name", list(INPUTS))
def test_table(state: S, name: str) -> None:
    expected = TABLE_EXPECTED[state][name]
    assert o.TABLE.allows(state, INPUTS[name]) is (expected is not None)
    if expected is not None:
        assert o.TABLE.transitions[(state, INPUTS[name])] is expected


def test_the_table_knows_no_other_input() -> None:
    assert set(o.TABLE.inputs()) == set(INPUTS.values())


# --- every state of one partition against every input aimed at it ---------------------------

# Each set-up leaves P in one state at t=5 (the inputs below come at t=5) and returns the
# incarnation it concerns: its holder, or one never started.


def _free() -> tuple[o.Ownership, int]:
    return o.Ownership(), 7


def _held() -> tuple[o.Ownership, int]:
    m = o.Ownership()
    m.handle(_start(owner="a", incarnation=1, generation=1, partitions=frozenset({P}), now=0))
    return m, 1


def _adopted(until_margin: float) -> Callable[[], tuple[o.Ownership, int]]:
    def build() -> tuple[o.Ownership, int]:
        m = o.Ownership()
        claim = o.Claim(owner="a", generation=1, partitions=frozenset({P}))
        m.handle(o.Recovered(claims=(claim,), since=0, longest_session=2, margin=until_margin))
        effects = m.handle(
            o.OwnerRegistered(owner="a", incarnation=2, generation=1, holding=(P,), now=1)
        )
        assert effects == [o.LeaseAdopted(partitions=frozenset({P}))]
        return m, 2

    return build


def _leased(until: float) -> Callable[[], tuple[o.Ownership, int]]:
    def build() -> tuple[o.Ownership, int]:
        m, incarnation = _held()
        m.handle(o.OwnerDied(incarnation=incarnation, until=until, now=1))
        return m, incarnation

    return build


SETUPS: dict[str, Callable[[], tuple[o.Ownership, int]]] = {
    "free": _free,
    "held": _held,
    "adopted": _adopted(until_margin=8.5),  # leased until 10.5
    "adopted, lease ran out": _adopted(until_margin=0.5),  # until 2.5
    "leased": _leased(until=20),
    "leased, lease ran out": _leased(until=3),
}

EVENTS: dict[str, Callable[[int], o.Event]] = {
    "Start": lambda _: _start(
        owner="b", incarnation=9, generation=5, partitions=frozenset({P}), now=5
    ),
    "Unsent": lambda inc: o.StartUnsent(incarnation=inc),
    "Stop": lambda inc: o.StopAnswered(incarnation=inc, now=5),
    "Died": lambda inc: o.OwnerDied(incarnation=inc, until=30, now=5),
    "Kept": lambda _: o.OwnerRegistered(
        owner="a", incarnation=8, generation=1, holding=(P,), now=5
    ),
    "Released": lambda _: o.OwnerRegistered(
        owner="a", incarnation=8, generation=1, holding=(), now=5
    ),
    "OtherGeneration": lambda _: o.OwnerRegistered(
        owner="a", incarnation=8, generation=2, holding=(), now=5
    ),
    "OtherOwner": lambda _: o.OwnerRegistered(
        owner="b", incarnation=8, generation=1, holding=(), now=5
    ),
    # Still fetching under another claim: its registration renews its own lease on P.
    "OtherGenerationKept": lambda _: o.OwnerRegistered(
        owner="a", incarnation=8, generation=2, holding=(P,), now=5
    ),
    "OtherOwnerKept": lambda _: o.OwnerRegistered(
        owner="b", incarnation=8, generation=1, holding=(P,), now=5
    ),
    "Recovered": lambda _: o.Recovered(
        claims=(o.Claim(owner="a", generation=1, partitions=frozenset({P})),),
        since=5,
        longest_session=10,
        margin=0.5,
    ),
    "Completed": lambda _: o.AttemptCompleted(now=5),
    "Closed": lambda inc: o.OwnerClosed(incarnation=inc, now=5),
}
# What P is at t=5 after the input; X: the input raises and changes nothing.
# fmt: off
MACHINE_EXPECTED: dict[str, dict[str, S | None]] = {
    "free": {"Start": S.HELD, "Unsent": X, "Stop": S.FREE, "Died": S.FREE, "Kept": S.FREE,
             "Released": S.FREE, "OtherGeneration": S.FREE, "OtherOwner": S.FREE,
             "OtherGenerationKept": S.FREE, "OtherOwnerKept": S.FREE,
             "Recovered": S.LEASED, "Completed": S.FREE, "Closed": S.FREE},
    "held": {"Start": X, "Unsent": S.FREE, "Stop": S.FREE, "Died": S.LEASED, "Kept": S.HELD,
             "Released": S.HELD, "OtherGeneration": S.HELD, "OtherOwner": S.HELD,
             "OtherGenerationKept": S.HELD, "OtherOwnerKept": S.HELD,
             "Recovered": X, "Completed": S.HELD, "Closed": X},
    "adopted": {"Start": X, "Unsent": X, "Stop": S.FREE, "Died": S.LEASED, "Kept": S.ADOPTED,
                "Released": S.ADOPTED, "OtherGeneration": S.ADOPTED, "OtherOwner": S.ADOPTED,
                "OtherGenerationKept": S.ADOPTED, "OtherOwnerKept": S.ADOPTED,
                "Recovered": X, "Completed": S.ADOPTED, "Closed": X},
    "adopted, lease ran out": {"Start": X, "Unsent": X, "Stop": S.FREE, "Died": S.LEASED,
                               "Kept": S.HELD, "Released": S.HELD, "OtherGeneration": S.HELD,
                               "OtherOwner": S.HELD, "OtherGenerationKept": S.HELD,
                               "OtherOwnerKept": S.HELD, "Recovered": X, "Completed": S.HELD,
                               "Closed": X},
    "leased": {"Start": X, "Unsent": X, "Stop": S.FREE, "Died": X, "Kept": S.ADOPTED,
               "Released": S.FREE, "OtherGeneration": S.LEASED, "OtherOwner": S.LEASED,
               "OtherGenerationKept": S.ADOPTED, "OtherOwnerKept": S.ADOPTED,
               "Recovered": S.LEASED, "Completed": S.LEASED, "Closed": S.FREE},
    "leased, lease ran out": {"Start": S.HELD, "Unsent": X, "Stop": S.FREE, "Died": X,
                              "Kept": S.FREE, "Released": S.FREE, "OtherGeneration": S.FREE,
                              "OtherOwner": S.FREE, "OtherGenerationKept": S.FREE,
                              "OtherOwnerKept": S.FREE, "Recovered": S.LEASED,
                              "Completed": S.FREE, "Closed": S.FREE},
}
# fmt: on
KIND = {o.Free: S.FREE, o.Held: S.HELD, o.Adopted: S.ADOPTED, o.Leased: S.LEASED}


@pytest.mark.parametrize("setup", list(SETUPS))
@pytest.mark.parametrize("event", list(EVENTS))
def test_every_state_against_every_input(setup: str, event: str) -> None:
    machine, incarnation = SETUPS[setup]()
    expected = MACHINE_EXPECTED[setup][event]
    before = copy.deepcopy(machine)
    if expected is None:
        with pytest.raises(IllegalInput):
            machine.handle(EVENTS[event](incarnation))
        assert machine == before
    else:
        machine.handle(EVENTS[event](incarnation))
        assert KIND[type(machine.state(P, now=5))] is expected


def test_a_lease_ends_early_only_by_its_owners_word_and_says_so() -> None:
    machine, incarnation = _leased(until=20)()
    assert machine.free_at({P}) == 20
    released = o.OwnerRegistered(owner="a", incarnation=8, generation=1, holding=(), now=5)
    assert machine.handle(released) == [o.LeaseEnded(partitions=frozenset({P}))]
    assert machine.free_at({P}) == -math.inf
    machine, incarnation = _leased(until=20)()
    stop = o.StopAnswered(incarnation=incarnation, now=5)
    assert machine.handle(stop) == [o.LeaseEnded(partitions=frozenset({P}))]
    assert machine.free_at({P}) == -math.inf


def test_a_registrant_still_fetching_under_another_claim_holds_it_with_the_lease_standing() -> None:
    """a held P under generation 1 and was started under 2 (P kept), a start it never carried
    out; it died with P leased under 2 until 20, and registers again under 1 still fetching P.
    That names another claim, so it ends nothing early; but accepting the registration renews
    a's lease on P, so a holds P: nobody else is started on it, even after the lease's instant,
    until a answers its stop (docs/design.md#adoption-after-a-failover)."""
    machine = o.Ownership()
    machine.handle(_start(owner="a", incarnation=1, generation=1, partitions=frozenset({P}), now=0))
    machine.handle(_start(owner="a", incarnation=1, generation=2, partitions=frozenset({P}), now=1))
    machine.handle(o.OwnerDied(incarnation=1, until=20, now=2))
    back = o.OwnerRegistered(owner="a", incarnation=2, generation=1, holding=(P, Q), now=5)
    assert machine.handle(back) == [o.LeaseAdopted(partitions=frozenset({P}))]
    assert machine.state(P, now=5) == o.Adopted(owner="a", incarnation=2, generation=1, until=20)
    assert machine.free_at({P}) == 20
    assert machine.holding(2).partitions == frozenset({P})
    assert machine.holding(1) == o.NOTHING
    b_gains_p = _start(owner="b", incarnation=3, generation=3, partitions=frozenset({P}), now=21)
    with pytest.raises(IllegalTransition):
        machine.handle(b_gains_p)
    machine.handle(o.StopAnswered(incarnation=2, now=22))
    machine.handle(attrs.evolve(b_gains_p, now=22))
    assert machine.state(P, now=22) == o.Held(owner="b", incarnation=3, generation=3)


def test_a_fenced_process_that_closes_cleanly_ends_its_lease_and_says_so() -> None:
    """docs/design.md#static-members: its clean close is its word, like its StopFetcher answer."""
    machine, incarnation = _leased(until=20)()
    closed = o.OwnerClosed(incarnation=incarnation, now=5)
    assert machine.handle(closed) == [o.LeaseEnded(partitions=frozenset({P}))]
    assert machine.free_at({P}) == -math.inf
    assert machine.holding(incarnation) == o.NOTHING


def test_a_member_that_closes_leaves_its_partitions_free_at_once() -> None:
    machine, incarnation = _held()
    machine.handle(o.OwnerDied(incarnation=incarnation, until=5, now=5))
    assert machine.state(P, now=5) == o.FREE
    assert not machine.under_lease(5)
    machine.handle(_start(owner="b", incarnation=3, generation=2, partitions=frozenset({P}), now=5))
    assert machine.state(P, now=5) == o.Held(owner="b", incarnation=3, generation=2)
    assert machine.holding(incarnation) == o.NOTHING  # the dead process's holding is gone


def test_holding_is_what_offsets_are_fenced_by() -> None:
    machine = o.Ownership()
    assert machine.holding(1) == o.NOTHING
    both = frozenset({P, Q})
    machine.handle(_start(owner="a", incarnation=1, generation=4, partitions=both, now=0))
    holding = machine.holding(1)
    assert (holding.owner, holding.generation, holding.partitions) == ("a", 4, both)
    assert holding.counted_under(4) == both
    machine.handle(o.StopAnswered(incarnation=1, now=1))
    # It holds nothing, last under generation 4.
    assert machine.holding(1).partitions == frozenset()
    assert machine.holding(1).generation == 4
    machine.handle(_start(owner="a", incarnation=1, generation=5, partitions=both, now=2))
    machine.handle(o.StartUnsent(incarnation=1))
    assert machine.holding(1).generation == 4
    assert machine.holding(1).partitions == frozenset()
    assert machine.state(P, now=2) == o.FREE


def test_a_member_started_with_nothing_is_started_under_the_generation() -> None:
    machine = o.Ownership()
    machine.handle(_start(owner="a", incarnation=1, generation=3, partitions=frozenset(), now=0))
    assert machine.holding(1).generation == 3


def test_one_attempt_starts_a_partition_once() -> None:
    machine = o.Ownership()
    twice = o.Started(
        generation=1, starts={1: ("a", frozenset({P})), 2: ("b", frozenset({P, Q}))}, now=0
    )
    with pytest.raises(IllegalTransition):
        machine.handle(twice)
    assert machine == o.Ownership()


def test_an_incarnation_is_started_only_while_holding_nothing_outside_its_start() -> None:
    machine, incarnation = _held()
    before = copy.deepcopy(machine)
    again = _start(
        owner="a", incarnation=incarnation, generation=2, partitions=frozenset({Q}), now=1
    )
    with pytest.raises(IllegalInput):
        machine.handle(again)
    assert machine == before


# --- incremental starts and partial stops (SPEC.md §11.5, §11.6, §11.8) ----------------------

R = TopicPartition(topic="t", partition=2)


def _started_with_p_and_q_under_4() -> o.Ownership:
    machine = o.Ownership()
    machine.handle(
        _start(owner="a", incarnation=1, generation=4, partitions=frozenset({P, Q}), now=0)
    )
    return machine


def test_a_partial_stop_frees_only_the_partitions_named() -> None:
    machine = _started_with_p_and_q_under_4()
    machine.handle(o.StopAnswered(incarnation=1, now=1, partitions=frozenset({Q, R})))
    holding = machine.holding(1)
    assert (holding.generation, holding.partitions) == (4, frozenset({P}))
    assert machine.state(Q, now=1) == o.FREE
    assert machine.state(P, now=1) == o.Held(owner="a", incarnation=1, generation=4)
    # Its later reports for Q count no more, though it is still a member (hazard b).
    assert holding.counted_under(4) == frozenset({P})


def test_an_incremental_start_keeps_what_the_member_holds_under_its_assignment_generation() -> None:
    machine = _started_with_p_and_q_under_4()
    machine.handle(
        _start(owner="a", incarnation=1, generation=6, partitions=frozenset({P, Q, R}), now=1)
    )
    holding = machine.holding(1)
    assert holding.generation == 6
    assert holding.partitions == frozenset({P, Q, R})
    assert [holding.assignment_generation(tp) for tp in (P, Q, R)] == [4, 4, 6]
    # A commit sent under 4 before the start and read after it counts for what it held then;
    # under 5 (never its generation, but between the two) the same; under 7, nothing.
    assert holding.counted_under(4) == frozenset({P, Q})
    assert holding.counted_under(5) == frozenset({P, Q})
    assert holding.counted_under(6) == frozenset({P, Q, R})
    assert holding.counted_under(3) == frozenset()
    assert holding.counted_under(7) == frozenset()


def test_a_partition_revoked_and_given_back_counts_only_from_its_new_start() -> None:
    machine = _started_with_p_and_q_under_4()
    machine.handle(o.StopAnswered(incarnation=1, now=1, partitions=frozenset({Q})))
    machine.handle(
        _start(owner="a", incarnation=1, generation=6, partitions=frozenset({P, Q}), now=1)
    )
    holding = machine.holding(1)
    assert holding.counted_under(4) == frozenset({P})
    assert holding.counted_under(6) == frozenset({P, Q})


def test_an_incremental_start_may_gain_only_free_partitions() -> None:
    machine = _started_with_p_and_q_under_4()
    before = copy.deepcopy(machine)
    taking = o.Started(
        generation=6,
        starts={1: ("a", frozenset({P, Q})), 2: ("b", frozenset({Q, R}))},
        now=1,
    )
    with pytest.raises(IllegalTransition):
        machine.handle(taking)
    assert machine == before


def test_a_start_that_leaves_out_a_held_partition_is_refused() -> None:
    machine = _started_with_p_and_q_under_4()
    before = copy.deepcopy(machine)
    with pytest.raises(IllegalInput):
        machine.handle(
            _start(owner="a", incarnation=1, generation=6, partitions=frozenset({P, R}), now=1)
        )
    assert machine == before


def test_an_unsent_incremental_start_reverts_to_the_holding_before_it() -> None:
    machine = _started_with_p_and_q_under_4()
    machine.handle(o.StopAnswered(incarnation=1, now=1, partitions=frozenset({Q})))
    machine.handle(
        _start(owner="a", incarnation=1, generation=6, partitions=frozenset({P, R}), now=1)
    )
    machine.handle(o.StartUnsent(incarnation=1))
    holding = machine.holding(1)
    assert (holding.generation, holding.partitions) == (4, frozenset({P}))
    assert holding.assignment_generation(P) == 4
    assert machine.state(R, now=1) == o.FREE
    with pytest.raises(IllegalInput):  # once: there is nothing left to revert
        machine.handle(o.StartUnsent(incarnation=1))


def test_a_partial_stop_of_a_dead_member_ends_the_lease_of_those_partitions_only() -> None:
    machine = _started_with_p_and_q_under_4()
    machine.handle(o.OwnerDied(incarnation=1, until=20, now=1))
    effects = machine.handle(o.StopAnswered(incarnation=1, now=2, partitions=frozenset({P})))
    assert effects == [o.LeaseEnded(partitions=frozenset({P}))]
    assert machine.free_at({P}) == -math.inf
    assert machine.free_at({Q}) == 20
    assert machine.holding(1).partitions == frozenset({Q})


def test_a_dead_owners_final_report_is_fenced_by_what_it_held() -> None:
    machine, incarnation = _leased(until=20)()
    holding = machine.holding(incarnation)
    assert (holding.generation, holding.partitions) == (1, frozenset({P}))


def _recovered_at_10(*claims: o.Claim) -> o.Ownership:
    """A machine recovered at t=10 with a longest session of 6 and a margin of 0.5."""
    machine = o.Ownership()
    machine.handle(o.Recovered(claims=claims, since=10, longest_session=6, margin=0.5))
    return machine


def test_recovery_leases_every_claim_until_since_plus_longest_session_plus_margin() -> None:
    machine = _recovered_at_10(
        o.Claim(owner="a", generation=3, partitions=frozenset({P})),
        o.Claim(owner="b", generation=2, partitions=frozenset({Q}), until=40),
    )
    assert machine.free_at({P}) == 16.5
    assert machine.free_at({Q}) == 40
    assert machine.free_at({P, Q}) == 40
    assert machine.under_lease(39.9) and not machine.under_lease(40)
    # Under another generation it proves nothing.
    stale = o.OwnerRegistered(owner="a", incarnation=1, generation=2, holding=(), now=11)
    assert machine.handle(stale) == []
    assert machine.free_at({P}) == 16.5


def test_two_claims_on_one_partition_end_only_with_time() -> None:
    machine = _recovered_at_10(
        o.Claim(owner="a", generation=3, partitions=frozenset({P})),
        o.Claim(owner="b", generation=3, partitions=frozenset({P}), until=20),
    )
    for owner in "ab":
        registered = o.OwnerRegistered(
            owner=owner, incarnation=ord(owner), generation=3, holding=(), now=11
        )
        assert machine.handle(registered) == []
    assert machine.free_at({P}) == 20


def test_a_rebuild_carries_over_holdings_and_leases_in_force() -> None:
    machine = o.Ownership()
    machine.handle(_start(owner="a", incarnation=1, generation=2, partitions=frozenset({P}), now=0))
    machine.handle(_start(owner="b", incarnation=2, generation=2, partitions=frozenset({Q}), now=0))
    machine.handle(o.OwnerDied(incarnation=2, until=9, now=1))
    assert set(machine.carryover(now=5)) == {
        o.Claim(owner="a", generation=2, partitions=frozenset({P})),
        o.Claim(owner="b", generation=2, partitions=frozenset({Q}), until=9),
    }
    assert machine.carryover(now=9) == (
        o.Claim(owner="a", generation=2, partitions=frozenset({P})),
    )


def test_an_attempt_completed_forgets_leases_that_ran_out() -> None:
    machine, _ = _leased(until=3)()
    machine.handle(o.AttemptCompleted(now=5))
    assert machine == o.Ownership()


# --- properties over random input sequences -------------------------------------------------

PARTITIONS = [TopicPartition(topic="t", partition=i) for i in range(4)]
OWNERS = ["a", "b", "c"]
partition_sets = st.frozensets(st.sampled_from(PARTITIONS))
STEPS = st.one_of(
    st.tuples(st.just("register"), st.sampled_from(OWNERS), st.integers(0, 3), partition_sets),
    st.lists(
        st.tuples(
            st.integers(0, 3), st.frozensets(st.sampled_from(PARTITIONS), min_size=1, max_size=2)
        ),
        min_size=1,
        max_size=3,
    ).map(lambda starts: ("start", *starts)),
    st.tuples(st.just("unsent"), st.integers(0, 3)),
    # None: a stop of everything; a set: a revocation of those partitions only
    st.tuples(st.just("stop"), st.integers(0, 3), st.one_of(st.none(), partition_sets)),
    st.tuples(st.just("died"), st.integers(0, 3), st.floats(0, 30)),
    st.tuples(
        st.just("recovered"),
        st.lists(
            st.tuples(st.sampled_from([*OWNERS, None]), st.integers(0, 3), partition_sets),
            max_size=3,
        ),
        st.floats(0, 20),
    ),
    st.tuples(st.just("completed")),
    st.tuples(st.just("wait"), st.floats(0, 10)),
)


@settings(max_examples=1000, deadline=None)
@given(steps=st.lists(STEPS, min_size=5, max_size=60))
@example(  # one death must not free another member's partitions
    steps=[
        ("register", "a", 0, frozenset()),
        ("register", "b", 0, frozenset()),
        ("start", (0, frozenset(PARTITIONS[:1])), (1, frozenset(PARTITIONS[1:2]))),
        ("died", 1, 5.0),
        ("register", "c", 0, frozenset()),
        ("start", (2, frozenset(PARTITIONS[:1]))),
    ]
)
@example(  # a dead process's word must not end a lease another claim shares
    steps=[
        ("register", "a", 0, frozenset()),
        ("start", (0, frozenset(PARTITIONS[:1]))),
        ("died", 0, 1.0),
        ("recovered", [("a", 0, frozenset(PARTITIONS[:1]))], 0.0),
        ("stop", 0),
    ]
)
def test_no_partition_has_two_holders_and_a_lease_ends_early_only_by_its_owners_word(
    steps: list[tuple[Any, ...]],
) -> None:
    machine = o.Ownership()
    now = 0.0
    generation = 0
    registered: list[tuple[str, int]] = []  # (owner, incarnation), alive
    dead: set[int] = set()
    #: per partition, the lease it is under (owner, generation, incarnation, until), as seen
    leases: dict[TopicPartition, tuple[str | None, int, int | None, float]] = {}
    for step in steps:
        event: o.Event | None = None
        kind = step[0]
        if kind == "wait":
            now += float(step[1])
            continue
        if kind == "register":
            _, owner, gen, holding = step
            incarnation = len(registered) + len(dead) + 100
            event = o.OwnerRegistered(
                owner=owner,
                incarnation=incarnation,
                generation=gen,
                holding=tuple(holding),
                now=now,
            )
        elif kind == "start" and registered:
            # One attempt starts one or more members: ``step[1:]`` holds (which, partitions).
            starts = {}
            for which, partitions in step[1:]:
                owner, incarnation = registered[int(which) % len(registered)]
                starts[incarnation] = (owner, partitions)
            generation += 1
            event = o.Started(generation=generation, starts=starts, now=now)
        elif kind in ("unsent", "stop", "died") and (registered or dead):
            known = [inc for _, inc in registered] + sorted(dead)
            incarnation = known[int(step[1]) % len(known)]
            if kind == "unsent":
                event = o.StartUnsent(incarnation=incarnation)
            elif kind == "stop":
                partitions = step[2] if len(step) > 2 else None
                event = o.StopAnswered(incarnation=incarnation, now=now, partitions=partitions)
            else:
                event = o.OwnerDied(
                    incarnation=incarnation,
                    until=now + float(step[2]),
                    now=now,
                )
        elif kind == "recovered":
            claims = tuple(
                o.Claim(owner=owner, generation=gen, partitions=tps) for owner, gen, tps in step[1]
            )
            event = o.Recovered(
                claims=claims, since=now, longest_session=float(step[2]), margin=0.5
            )
        elif kind == "completed":
            event = o.AttemptCompleted(now=now)
        if event is None:
            continue
        before = copy.deepcopy(machine)
        free_before = {tp: max(machine.free_at({tp}), now) for tp in PARTITIONS}
        try:
            machine.handle(event)
        except IllegalInput:
            assert machine == before  # refused, and nothing changed
            continue
        if isinstance(event, o.OwnerRegistered):
            registered.append((event.owner, event.incarnation))
        if isinstance(event, o.OwnerDied):
            registered = [(w, i) for w, i in registered if i != event.incarnation]
            dead.add(event.incarnation)

        # A lease ends before its instant only by its own process's word: a registrant that
        # still fetches the partition adopts it with the instant (under another claim too, as
        # accepting it renews its own lease), and is its process from then on.
        for tp in PARTITIONS:
            lease = leases.get(tp)
            state = machine.state(tp, now)
            if lease is not None and now < lease[3] and not isinstance(state, o.Leased | o.Adopted):
                owner, gen, inc, _ = lease
                own_word = (
                    isinstance(event, o.OwnerRegistered)
                    and (event.owner, event.generation) == (owner, gen)
                ) or (isinstance(event, o.StopAnswered) and event.incarnation == inc)
                assert own_word, (tp, lease, event, state)
            # free_at never decreases except by the owner's word
            if not isinstance(event, o.OwnerRegistered | o.StopAnswered):
                assert max(machine.free_at({tp}), now) >= free_before[tp]
            if isinstance(state, o.Leased | o.Adopted):
                if isinstance(state, o.Adopted) and lease is not None and now < lease[3]:
                    assert state.until == lease[3], (tp, lease, event, state)
                leases[tp] = (state.owner, state.generation, state.incarnation, state.until)
            else:
                leases.pop(tp, None)

        # No partition is held by two processes, and a holding says what its process holds.
        live = [inc for _, inc in registered]
        for tp in PARTITIONS:
            holders = [inc for inc in live if tp in machine.holding(inc).partitions]
            assert len(holders) <= 1, (tp, holders)
            state = machine.state(tp, now)
            if isinstance(state, o.Held | o.Adopted):
                assert state.incarnation in holders or state.incarnation in dead
                assert tp in machine.holding(state.incarnation).partitions
            if isinstance(state, o.Free):
                assert holders == [], (tp, holders)
        # Each holding's layers are its partitions, each once, none given after its generation.
        for inc in live + sorted(dead):
            holding = machine.holding(inc)
            layered = [tp for _, tps in holding.layers for tp in tps]
            assert sorted(layered) == sorted(holding.partitions), holding
            assert all(given <= holding.generation for given, _ in holding.layers), holding


def test_held_among_names_the_partitions_some_process_holds() -> None:
    machine, _ = _adopted(until_margin=8.5)()
    assert machine.held_among({P, Q}) == {P}
    machine.handle(_start(owner="b", incarnation=5, generation=2, partitions=frozenset({Q}), now=5))
    assert machine.held_among({P, Q}) == {P, Q}
    assert machine.held_among({Q}) == {Q}
    machine.handle(o.StopAnswered(incarnation=2, now=6))
    assert machine.held_among({P, Q}) == {Q}


def test_a_start_is_never_older_than_what_it_keeps() -> None:
    machine = _started_with_p_and_q_under_4()
    before = copy.deepcopy(machine)
    with pytest.raises(IllegalInput):
        machine.handle(
            _start(owner="a", incarnation=1, generation=4, partitions=frozenset({P, Q, R}), now=1)
        )
    assert machine == before
