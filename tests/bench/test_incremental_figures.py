"""How ``bench/incremental.py`` turns what members said they stopped and started into its
figures: unowned partition-seconds, partitions moved, members contacted. Pure functions on
made-up handoffs, so the realtime run's figures mean what their names say."""

from __future__ import annotations

import pytest

from bench.incremental_figures import Handoff, analyze


def stop(member: str, at: float, *partitions: str) -> Handoff:
    return Handoff(member=member, kind="stop", at=at, partitions=partitions)


def start(member: str, at: float, *partitions: str) -> Handoff:
    return Handoff(member=member, kind="start", at=at, partitions=partitions)


BEFORE = {"a": {"p0", "p1"}, "b": {"p2", "p3"}}


def test_eager_join_every_partition_is_unowned_from_its_stop_to_its_start() -> None:
    # Everyone stops at 10.1/10.2, c joins; everyone starts at 10.5.
    handoffs = [
        stop("a", 10.1, "p0", "p1"),
        stop("b", 10.2, "p2", "p3"),
        start("a", 10.5, "p0"),
        start("b", 10.5, "p2"),
        start("c", 10.6, "p1", "p3"),
    ]
    after = {"a": {"p0"}, "b": {"p2"}, "c": {"p1", "p3"}}
    outcome = analyze(BEFORE, after, handoffs, {}, t0=10.0, end=20.0)
    assert outcome.unowned == pytest.approx({"p0": 0.4, "p1": 0.5, "p2": 0.3, "p3": 0.4})
    assert outcome.unowned_seconds == pytest.approx(1.6)
    assert outcome.settle == pytest.approx(0.6)
    assert outcome.moved == {"p1", "p3"}
    # p0 and p2 did not move but were stopped all the same: the eager protocol's cost.
    assert sum(outcome.unowned_outside(outcome.moved).values()) == pytest.approx(0.7)
    assert outcome.contacted == {"a", "b", "c"} and outcome.changed == {"a", "b", "c"}
    assert (outcome.stops, outcome.starts) == (2, 3)
    assert not outcome.doubly_held and not outcome.never_restarted


def test_incremental_join_stops_only_what_moves_and_contacts_only_givers_and_takers() -> None:
    before = {**BEFORE, "d": {"p4"}}
    handoffs = [stop("a", 10.1, "p1"), start("c", 10.3, "p1")]
    after = {"a": {"p0"}, "b": {"p2", "p3"}, "c": {"p1"}, "d": {"p4"}}
    outcome = analyze(before, after, handoffs, {}, t0=10.0, end=20.0)
    assert outcome.unowned_seconds == pytest.approx(0.2)
    assert outcome.moved == {"p1"}
    assert outcome.unowned_outside(outcome.moved) == {}
    assert outcome.contacted == {"a", "c"} and outcome.contacted - outcome.changed == set()


def test_a_departure_without_a_word_counts_from_the_fault_and_leaves_out_the_departed() -> None:
    # b is killed at 10.0; its partitions start on a at 13.5 (its lease ran out).
    handoffs = [start("a", 13.5, "p2", "p3")]
    after = {"a": {"p0", "p1", "p2", "p3"}}
    outcome = analyze(BEFORE, after, handoffs, {"b": 10.0}, t0=10.0, end=20.0)
    assert outcome.unowned == pytest.approx({"p2": 3.5, "p3": 3.5})
    assert outcome.unowned_outside({"p2", "p3"}) == {}
    assert outcome.contacted == {"a"}


def test_a_leaver_that_says_so_is_not_contacted_by_its_own_stop() -> None:
    handoffs = [stop("b", 10.05, "p2", "p3"), start("a", 10.2, "p2", "p3")]
    after = {"a": {"p0", "p1", "p2", "p3"}}
    outcome = analyze(BEFORE, after, handoffs, {}, t0=10.0, end=20.0, leavers=("b",))
    assert outcome.unowned_seconds == pytest.approx(0.3)
    assert outcome.contacted == {"a"}


def test_a_partition_never_handed_on_is_unowned_until_the_end() -> None:
    outcome = analyze(BEFORE, {"a": {"p0", "p1"}}, [], {"b": 10.0}, t0=10.0, end=12.0)
    assert outcome.never_restarted == {"p2", "p3"}
    assert outcome.unowned_seconds == pytest.approx(4.0)


def test_a_start_before_the_owner_stopped_is_two_holders() -> None:
    handoffs = [start("c", 10.1, "p0"), stop("a", 10.2, "p0")]
    after = {"a": {"p1"}, "b": {"p2", "p3"}, "c": {"p0"}}
    outcome = analyze(BEFORE, after, handoffs, {}, t0=10.0, end=20.0)
    assert outcome.doubly_held == {"p0"}
    assert outcome.unowned["p0"] == 0.0


def test_handoffs_before_the_trigger_do_not_count() -> None:
    handoffs = [stop("a", 9.0, "p0"), start("a", 9.5, "p0")]
    outcome = analyze(BEFORE, BEFORE, handoffs, {}, t0=10.0, end=20.0)
    assert outcome.unowned_seconds == 0 and not outcome.contacted and outcome.settle == 0
