"""Benchmark 5, assignment: time, balance and partitions moved when one member leaves, for
``statemachine.assignment``'s range and sticky assignors next to kafka-python's range, roundrobin
and sticky assignors on the same inputs.

Inputs: M members, each subscribed with one stream to all of 100 topics that share P partitions
evenly (100 x 1,000; 1,000 x 10,000; 5,000 x 10,000). Every assignor first assigns all M members
(untimed for range and roundrobin, which ignore history), then the middle member leaves and the
assignor runs again on M - 1 members, given its own previous result where it takes one (the two
sticky assignors): that second run is timed, best of three (kafka-python's sticky: once).
Figures per assignor and size:

* ``leave_time`` (ms), baseline kafka-python's assignor of the same kind (sticky for sticky,
  range for range; kafka-python's roundrobin has no counterpart and is printed with no baseline);
* ``moved``: partitions whose owner changed, baseline the leaver's partitions (the least any
  assignor can move);
* ``imbalance``: the worst per-topic max - min partitions over the members, and
  ``total_imbalance``: max - min of each member's total.

kafka-python's sticky assignor is skipped (a JSON line with "skipped") where its two runs are
predicted to exceed ``--kafka-limit`` seconds: its time at the previous size with as many
partitions, scaled by the growth in members (its cost grows at least linearly with members).

    python -m bench.assignment [--quick]
"""

from __future__ import annotations

import json
import math
import time
from collections import Counter
from collections.abc import Callable, Mapping
from typing import Any

from kafka.coordinator.assignors.range import RangePartitionAssignor  # type: ignore[import-untyped,import-not-found,unused-ignore]
from kafka.coordinator.assignors.roundrobin import RoundRobinPartitionAssignor  # type: ignore[import-untyped,import-not-found,unused-ignore]
from kafka.coordinator.assignors.sticky.sticky_assignor import StickyPartitionAssignor  # type: ignore[import-untyped,import-not-found,unused-ignore]
from kafka.coordinator.assignors.sticky.user_data import StickyAssignorUserData  # type: ignore[import-untyped,import-not-found,unused-ignore]
from kafka.protocol.consumer.metadata import (  # type: ignore[import-untyped,import-not-found,unused-ignore]
    ConsumerProtocolSubscription,
)

from bench.harness import bench_arguments
from bench.measure import figure
from protocol.types import ConsumerThread, Subscription, TopicPartition, TopicStreams
from statemachine.assignment import Assignment, imbalance, moved, range_assign, sticky_assign

BENCH = "assignment"
TOPICS = 100
#: Timed runs per assignor, best kept; kafka-python's sticky runs once (seconds per run).
REPEATS = 3


class _Cluster:
    """The two methods kafka-python's assignors ask of ClusterMetadata."""

    def __init__(self, counts: Mapping[str, int]) -> None:
        self.counts = counts

    def topics(self) -> set[str]:
        return set(self.counts)

    def partitions_for_topic(self, topic: str) -> set[int] | None:
        n = self.counts.get(topic)
        return None if n is None else set(range(n))


class _Member:
    """A JoinGroup member as kafka-python's assignors read it."""

    def __init__(self, member_id: str, topics: list[str], user_data: Any = b"") -> None:
        self.member_id = member_id
        self.group_instance_id = None
        self.metadata = ConsumerProtocolSubscription(version=0, topics=topics, user_data=user_data)


def _kafka_run(
    assignor: Any,
    counts: Mapping[str, int],
    members: list[str],
    previous: Assignment | None,
) -> tuple[dict[TopicPartition, ConsumerThread], float]:
    """kafka-python's result in our terms, and the seconds its ``assign`` alone took."""
    topics = sorted(counts)
    held: dict[str, dict[str, list[int]]] = {}
    if previous is not None:
        for tp, owner in previous.items():
            held.setdefault(owner.member_id, {}).setdefault(tp.topic, []).append(tp.partition)
    kafka_members = [
        _Member(
            m,
            topics,
            b""
            if previous is None
            else StickyAssignorUserData(
                previous_assignment=sorted(held.get(m, {}).items()), generation=1
            ),
        )
        for m in members
    ]
    cluster = _Cluster(counts)
    started = time.perf_counter()
    result = assignor.assign(cluster, kafka_members)
    seconds = time.perf_counter() - started
    return {
        TopicPartition(topic=tp.topic, partition=tp.partition): ConsumerThread(
            member_id=member_id, index=0
        )
        for member_id, assignment in result.items()
        for tp in assignment.partitions()
    }, seconds


def _total_imbalance(assignment: Assignment, members: list[str]) -> int:
    totals = Counter(owner.member_id for owner in assignment.values())
    sizes = [totals.get(m, 0) for m in members]
    return max(sizes) - min(sizes)


def _timed(run: Callable[[], dict[TopicPartition, ConsumerThread]]) -> tuple[Any, float]:
    """The result, and the best of REPEATS runs' seconds (the machine is shared)."""
    best = math.inf
    for _ in range(REPEATS):
        started = time.perf_counter()
        result = run()
        best = min(best, time.perf_counter() - started)
    return result, best


def measure(
    n_members: int, n_partitions: int, kafka_limit: float, kafka_sticky_estimate: float | None
) -> float | None:
    """Print this size's figures; return kafka-python sticky's leave time (None: skipped)."""
    per_topic = n_partitions // TOPICS
    counts = {f"t{t:02d}": per_topic for t in range(TOPICS)}
    members = [f"m{i:05d}" for i in range(n_members)]
    leaver = members[n_members // 2]
    after_members = [m for m in members if m != leaver]
    subscription = Subscription(topics=tuple(TopicStreams(topic=t, streams=1) for t in counts))
    subs = dict.fromkeys(members, subscription)
    subs_after = dict.fromkeys(after_members, subscription)
    size = {"members": n_members, "partitions": n_partitions, "topics": TOPICS}

    results: dict[str, tuple[Assignment, Assignment, float]] = {}
    before: Assignment = range_assign(subs, counts)
    after, seconds = _timed(lambda: range_assign(subs_after, counts))
    results["range"] = (before, after, seconds)
    before = sticky_assign(subs, counts, {})
    after, seconds = _timed(lambda: sticky_assign(subs_after, counts, before))
    results["sticky"] = (before, after, seconds)
    for name, kafka_assignor in (
        ("kafka_range", RangePartitionAssignor),
        ("kafka_roundrobin", RoundRobinPartitionAssignor),
    ):
        before, _ = _kafka_run(kafka_assignor, counts, members, None)
        runs = [_kafka_run(kafka_assignor, counts, after_members, None) for _ in range(REPEATS)]
        after, seconds = runs[0][0], min(run[1] for run in runs)
        results[name] = (before, after, seconds)
    kafka_sticky_time: float | None = None
    # It runs twice per size (all members, then after the leave).
    if kafka_sticky_estimate is not None and 2 * kafka_sticky_estimate > kafka_limit:
        print(
            json.dumps(
                {
                    "benchmark": BENCH,
                    "figure": "kafka_sticky",
                    "skipped": f"predicted 2 x {kafka_sticky_estimate:.0f} s (all members, "
                    f"then after the leave), over the {kafka_limit:.0f} s limit",
                    **size,
                }
            ),
            flush=True,
        )
    else:
        before, _ = _kafka_run(StickyPartitionAssignor(), counts, members, None)
        after, kafka_sticky_time = _kafka_run(
            StickyPartitionAssignor(), counts, after_members, before
        )
        results["kafka_sticky"] = (before, after, kafka_sticky_time)

    baselines = {"range": "kafka_range", "sticky": "kafka_sticky"}
    for name, (before, after, seconds) in results.items():
        leaver_partitions = sum(1 for owner in before.values() if owner.member_id == leaver)
        base = results.get(baselines.get(name, ""))
        extra = {"assignor": name, **size}
        figure(
            BENCH,
            "leave_time",
            seconds * 1e3,
            "ms",
            base[2] * 1e3 if base else None,
            **extra,
            baseline_assignor=baselines.get(name) if base else None,
        )
        figure(BENCH, "moved", moved(before, after), "partitions", leaver_partitions, **extra)
        figure(BENCH, "imbalance", imbalance(after, subs_after, counts), "partitions", 1, **extra)
        figure(
            BENCH,
            "total_imbalance",
            _total_imbalance(after, after_members),
            "partitions",
            1,
            **extra,
        )
    return kafka_sticky_time


def main() -> None:
    parser = bench_arguments(__doc__ or BENCH)
    parser.add_argument("--kafka-limit", type=float, default=60.0)
    args = parser.parse_args()
    sizes = [(100, 1000)] if args.quick else [(100, 1000), (1000, 10_000), (5000, 10_000)]
    previous: tuple[int, int, float] | None = None  # members, partitions, kafka sticky seconds
    for n_members, n_partitions in sizes:
        estimate = None
        if previous is not None and previous[1] == n_partitions:
            estimate = previous[2] * n_members / previous[0]
        measured = measure(n_members, n_partitions, args.kafka_limit, estimate)
        if measured is not None:
            previous = (n_members, n_partitions, measured)


if __name__ == "__main__":
    main()
