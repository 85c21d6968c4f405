"""How ``bench/failover.py`` turns what the consumer processes printed into its figures: gaps, two
consumers at once, duplicates and missing records. Pure functions on made-up records, so the
realtime run's figures mean what their names say."""

from __future__ import annotations

import math

import pytest

from bench.failover import (
    Consumed,
    Observed,
    firsts,
    gaps_within,
    longest_gap_after,
    two_consumers_at_once,
)
from bench.measure import percentile


def consumed(received: float, consumer: int, generation: int, seq: int) -> Consumed:
    return Consumed(received=received, consumer=consumer, generation=generation, seq=seq, sent=0.0)


def test_a_redelivered_record_is_no_progress() -> None:
    events = [consumed(1.0, 0, 1, 0), consumed(2.0, 0, 1, 1), consumed(5.0, 1, 2, 1)]
    assert firsts(events) == [1.0, 2.0]


def test_steady_gaps_are_those_inside_the_window() -> None:
    assert gaps_within([0.5, 1.0, 1.25, 2.0, 3.5], 1.0, 2.0) == [0.25, 0.75]


def test_the_longest_gap_spans_the_fault_and_counts_an_open_stretch_at_the_end() -> None:
    # The last record before the fault at 10 starts the stretch; none after: to the end.
    assert longest_gap_after([9.0, 9.5], fault=10.0, end=16.0) == pytest.approx(6.5)
    # Records resumed at 13 after the fault at 10: 3.5 s from the last one at 9.5.
    times = [9.0, 9.5, 13.0, 13.1, 13.2]
    assert longest_gap_after(times, fault=10.0, end=14.0) == pytest.approx(3.5)
    # Gaps wholly before the fault do not count.
    assert longest_gap_after([1.0, 8.0, 10.5, 11.0], fault=10.0, end=11.0) == pytest.approx(2.5)


def test_a_handover_is_not_two_consumers_at_once() -> None:
    # Consumer 0 under generation 1, then consumer 1 under 2, redelivering record 2.
    events = [consumed(1.0, 0, 1, 1), consumed(2.0, 0, 1, 2), consumed(3.0, 1, 2, 2)]
    assert not two_consumers_at_once(events)
    # Back to consumer 0 under a newer generation: a second rebalance, still one at a time.
    assert not two_consumers_at_once([*events, consumed(4.0, 0, 3, 3)])


def test_another_consumer_between_two_records_of_one_generation_is_two_at_once() -> None:
    events = [consumed(1.0, 0, 1, 1), consumed(2.0, 1, 2, 2), consumed(3.0, 0, 1, 3)]
    assert two_consumers_at_once(events)


def test_duplicates_and_missing_come_from_the_stamps() -> None:
    observed = Observed()
    observed.take(0, "1.5 3 orders-2 0 17 4 1.25")
    observed.take(1, "2.5 4 orders-2 0 17 4 1.25")
    (event, again) = observed.consumed[("orders-2", 0)]
    assert (event.received, event.consumer, event.generation, event.seq) == (1.5, 0, 3, 4)
    assert event.sent == 1.25
    assert again.consumer == 1 and again.seq == 4
    observed.acknowledged[("orders-2", 0)] = {4}
    assert observed.drained([("orders-2", 0)])
    observed.acknowledged[("orders-2", 0)].add(5)
    assert not observed.drained([("orders-2", 0)])


def test_the_p99_baseline_is_a_measured_gap_and_none_without_gaps() -> None:
    assert math.isnan(percentile([], 99))
    assert percentile([0.1], 99) == 0.1
    # One outlier in a hundred gaps is above the 99th percentile, two are not.
    assert percentile([0.01] * 99 + [1.0], 99) == 0.01
    assert percentile([0.01] * 98 + [1.0, 2.0], 99) == 1.0
