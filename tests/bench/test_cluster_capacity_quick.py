"""The cluster capacity benchmark (bench/cluster_capacity.py) at a tiny size: three brokers on
ZooKeeper, consumers that find their groups' coordinators through ClusterMetadata, and every
figure it promises printed, with no false death."""

from __future__ import annotations

from pathlib import Path

import pytest

from launch.zookeeper import zookeeper_available
from tests.bench.test_bench_smoke import by_figure, run_quick

pytestmark = [
    pytest.mark.realtime,
    pytest.mark.skipif(not zookeeper_available(), reason="needs java and Debian's zookeeper"),
]

CONSUMERS = 60
GROUPS = 6


async def test_cluster_capacity_holds_every_consumer_with_no_false_death(tmp_path: Path) -> None:
    lines = await run_quick(
        "cluster_capacity",
        tmp_path,
        f"--consumers={CONSUMERS}",
        f"--groups={GROUPS}",
        "--hold=10",
    )
    figures = by_figure(lines)
    assert not [line for line in lines if "skipped" in line], lines
    (held,) = figures["consumers_held"]
    (deaths,) = figures["false_deaths"]
    (told,) = figures["told_to_stop_or_start_in_hold"]
    assert deaths["value"] == 0, deaths
    assert told["value"] == 0, told
    assert held["value"] == held["baseline"] == CONSUMERS
    assert held["hold_s"] >= 10 and held["all_groups_formed"]
    # Every consumer is counted at the broker it registered with, and each broker's own count
    # (its metrics) agrees with the consumers'.
    members = figures["broker_members"]
    assert sorted(line["broker"] for line in members) == [1, 2, 3]
    assert sum(line["value"] for line in members) == CONSUMERS
    assert sum(line["groups_coordinated"] for line in members) == GROUPS
    for line in members:
        assert line["broker_reports_members"] == line["value"], line
        assert line["slots_shared_at_start"] and line["slots_unchanged"], line
    # The groups' slots (9, 12, 26, 37, 39 and 47 of 50) are not all one broker's share.
    assert len([line for line in members if line["value"] > 0]) >= 2, members
    for name in ("broker_open_files_peak", "broker_cpu_seconds", "broker_cpu_share"):
        assert len(figures[name]) == 3
    for line in figures["broker_peak_rss"]:
        assert line["value"] > 0 and line["baseline"] > 0
    for line in figures["broker_open_files_peak"]:
        assert 0 < line["value"] < line["file_limit"]
    # The join is timed on both sides from the first client started to the last joined, every
    # client counted: the consumers registered, the bare clients through their second connection.
    (joined,) = figures["connect_and_register_time"]
    assert joined["registered"] == joined["bare_connected"] == CONSUMERS, joined
    assert joined["value"] > 0 and joined["baseline"] > 0
    # Every group rebalanced at least once, each completed rebalance writing its record twice.
    (rebalances,) = figures["rebalances"]
    assert rebalances["value"] >= GROUPS, rebalances
    assert rebalances["group_record_writes"] >= 2 * rebalances["value"], rebalances
    # The join's CPU is every process's on each side, as itemized.
    (cpu,) = figures["join_cpu_seconds"]
    ours = cpu["consumers_cpu"] + sum(cpu["brokers_cpu"]) + cpu["zookeeper_cpu"]
    bare = cpu["bare_clients_cpu"] + sum(cpu["bare_servers_cpu"])
    assert cpu["value"] == pytest.approx(ours, abs=0.3), cpu
    assert cpu["baseline"] == pytest.approx(bare, abs=0.3), cpu
    assert len(cpu["brokers_cpu"]) == len(cpu["bare_servers_cpu"]) == 3, cpu
