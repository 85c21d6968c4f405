"""The broker's metrics, fed by the real coordinator under the simulation's virtual clock, and the
per-partition lag's cap on the series it adds."""

from __future__ import annotations

from pathlib import Path

import attrs
import trio
import trio.testing
from prometheus_client.parser import text_string_to_metric_families

from broker.metrics import (
    BrokerMetrics,
    GroupView,
    MetricsConfig,
    PartitionLag,
    Snapshot,
)
from broker.status import render_page
from coordinator.config import CoordinatorConfig
from protocol.types import BrokerInfo, Subscription, TopicPartition
from simulation import open_simulated_cluster
from statemachine.consumer_group import MemberStatistics
from statemachine.group import GroupState
from tests.support.invisible import DISGUISED, INVISIBLE, shown_escaped

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def samples(metrics: BrokerMetrics) -> Samples:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(metrics.exposition().decode())
        for s in family.samples
    }


def value(got: Samples, name: str, **labels: str) -> float:
    return got[(name, tuple(sorted(labels.items())))]


async def test_rebalances_by_cause_and_deaths_by_cause(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    metrics = BrokerMetrics()
    config = CoordinatorConfig(initial_rebalance_delay=3.0)
    async with open_simulated_cluster(tmp_path, config) as cluster:
        cluster.coordinator.observer = metrics
        await cluster.create_topic("clicks", partitions=6)
        wanted = Subscription(pattern=r"clicks|views", pattern_streams=1)
        a = await cluster.start_consumer("a", group="web", subscription=wanted)
        b = await cluster.start_consumer("b", group="web", subscription=wanted)
        c = await cluster.start_consumer("c", group="web", subscription=wanted)
        await cluster.start_consumer("d", group="web", subscription=wanted)
        with trio.fail_after(30):
            await cluster.wait_settled()
        assert trio.current_time() == 3.0
        got = samples(metrics)
        assert value(got, "coordinator_rebalances_total", cause="join") == 1
        assert value(got, "coordinator_rebalance_duration_seconds_sum", cause="join") == 0.0

        await trio.sleep_until(10.5)  # every member answered the Ping of 10.0 (T = 6 s)
        a.freeze(60)
        with trio.fail_after(30):
            await cluster.wait_stable("web", members=3)
        # a missed the deadline of its Ping of 12.0 at 16.0 and died; the rebalance began then
        # and waited out a's lease, T + 0.5 s after that Ping.
        assert trio.current_time() == 18.5
        got = samples(metrics)
        assert value(got, "coordinator_member_deaths_total", cause="silent") == 1
        assert value(got, "coordinator_pings_missed_total") == 1
        assert value(got, "coordinator_rebalances_total", cause="death") == 1
        assert value(got, "coordinator_rebalance_duration_seconds_sum", cause="death") == 2.5

        await b.kill()
        with trio.fail_after(30):
            await cluster.wait_stable("web", members=2)
        await c.leave()
        with trio.fail_after(30):
            await cluster.wait_stable("web", members=1)
        left_at = trio.current_time()
        await cluster.create_topic("views", partitions=2)
        web = cluster.coordinator.group("web")
        with trio.fail_after(30):
            await web.status.wait_value((GroupState.STABLE, 5))
        # The lone member's rebalance for the new topic ended at once (no lease to wait out).
        assert trio.current_time() == left_at
        got = samples(metrics)
        assert value(got, "coordinator_member_deaths_total", cause="closed") == 1
        assert value(got, "coordinator_member_leaves_total") == 1
        assert value(got, "coordinator_rebalances_total", cause="death") == 2
        assert value(got, "coordinator_rebalances_total", cause="leave") == 1
        assert value(got, "coordinator_rebalances_total", cause="topic_change") == 1
        assert value(got, "coordinator_ping_round_trip_seconds_count") > 0
        # The page's last rebalances, newest first, with their generations.
        assert [(r.cause, r.generation) for r in reversed(metrics.rebalances)] == [
            ("topic_change", 5),
            ("leave", 4),
            ("death", 3),
            ("death", 2),
            ("join", 1),
        ]


def _snapshot(partitions: int) -> Snapshot:
    lag = tuple(
        PartitionLag(
            group_id="g",
            tp=TopicPartition(topic="t", partition=p),
            records=p,
            seconds=float(p),
            offset=0,
            end=p,
        )
        for p in range(partitions)
    )
    group = GroupView(group_id="g", state="Stable", generation=1, members=(), lag=lag)
    broker = BrokerInfo(broker_id=1, host="127.0.0.1", port=9092)
    return Snapshot(
        broker=broker,
        coordinator_id=1,
        brokers=(broker,),
        topics={},
        log_ends={},
        groups=(group,),
        rebalances=(),
        taken_at=0.0,
    )


def _series(got: Samples, name: str) -> int:
    return sum(1 for metric, _ in got if metric == name)


def test_a_group_with_no_reported_offset_has_no_lag_series() -> None:
    metrics = BrokerMetrics()
    metrics.snapshot = _snapshot(0)
    assert _series(samples(metrics), "coordinator_group_lag_records_max") == 0


def test_partition_lag_is_off_unless_asked_and_capped_when_on() -> None:
    off = BrokerMetrics()
    off.snapshot = _snapshot(10)
    got = samples(off)
    assert _series(got, "coordinator_partition_lag_records") == 0
    assert value(got, "coordinator_group_lag_records_sum", group="g") == 45
    assert value(got, "coordinator_group_lag_records_max", group="g") == 9
    assert value(got, "coordinator_group_lag_seconds_max", group="g") == 9.0

    capped = BrokerMetrics(config=MetricsConfig(partition_lag=True, partition_lag_max_series=5))
    capped.snapshot = _snapshot(10)
    got = samples(capped)
    # Each partition adds two series (records and seconds): two fit under 5.
    assert _series(got, "coordinator_partition_lag_records") == 2
    assert _series(got, "coordinator_partition_lag_seconds") == 2
    assert value(got, "coordinator_partition_lag_series_dropped") == 16
    assert value(got, "coordinator_partition_lag_records", group="g", topic="t", partition="1") == 1


def test_the_page_escapes_every_id() -> None:
    snapshot = _snapshot(1)
    hostile = '<script>alert("x")</script>'
    group = GroupView(group_id=hostile, state="Stable", generation=1, members=(), lag=())
    page = render_page(attrs.evolve(snapshot, groups=(group,)))
    assert "<script>" not in page
    # no offset reported yet: the lag is unknown, not zero
    assert "<td class='num lag-max'>-</td>" in page
    assert "&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt;" in page


def test_the_page_shows_invisible_characters_escaped() -> None:
    """A bidirectional override or a zero-width space in an id would disguise it on the page:
    each is shown as its escape."""
    member = MemberStatistics(
        member_id=DISGUISED,
        client_id=INVISIBLE,
        session_timeout_ms=6000,
        subscription=Subscription(),
        partitions=(),
    )
    group = GroupView(group_id=DISGUISED, state="Stable", generation=1, members=(member,), lag=())
    page = render_page(attrs.evolve(_snapshot(1), groups=(group,)))
    assert [c for c in INVISIBLE if c in page] == []
    assert page.count(shown_escaped(DISGUISED)) == 4  # the group's row (twice), heading; the member
    assert shown_escaped(INVISIBLE) in page
