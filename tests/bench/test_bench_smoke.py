"""Each benchmark's ``--quick`` mode runs against real processes and prints the figures it
promises, one parseable JSON line each (docs/benchmarks.md). Times are never asserted: a benchmark
reports, it does not fail a run on a slow machine; what is asserted is what the figures mean."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
import trio

REPO = Path(__file__).resolve().parents[2]
KEYS = {"benchmark", "figure", "value", "unit", "baseline", "ratio"}

pytestmark = pytest.mark.realtime


async def run_quick(name: str, tmp_path: Path, *arguments: str) -> list[dict[str, Any]]:
    """The benchmark's ``--quick`` mode, with ``arguments`` (smaller sizes) after it."""
    with trio.fail_after(240):
        result = await trio.run_process(
            [
                sys.executable,
                "-m",
                f"bench.{name}",
                "--quick",
                "--work-dir",
                str(tmp_path),
                *arguments,
            ],
            cwd=REPO,
            capture_stdout=True,
            capture_stderr=True,
            check=False,
        )
    assert result.returncode == 0, result.stderr.decode(errors="replace")[-4000:]
    lines = [json.loads(line) for line in result.stdout.decode().splitlines() if line.strip()]
    for line in lines:
        assert line["benchmark"] == name
        assert "skipped" in line or line.keys() >= KEYS, line
    return lines


def by_figure(lines: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    figures: dict[str, list[dict[str, Any]]] = {}
    for line in lines:
        figures.setdefault(line["figure"], []).append(line)
    return figures


async def test_heartbeat_quick(tmp_path: Path) -> None:
    figures = by_figure(await run_quick("heartbeat", tmp_path))
    (cpu,) = figures["cpu_per_round_trip"]
    assert cpu["consumers"] == 200
    assert cpu["false_deaths"] == 0
    assert cpu["value"] > 0 and cpu["baseline"] > 0
    assert {"probe_latency_p50", "probe_latency_p99", "round_trips_per_s"} <= figures.keys()


async def test_capacity_quick(tmp_path: Path) -> None:
    figures = by_figure(await run_quick("capacity", tmp_path))
    (held,) = figures["consumers_held"]
    (deaths,) = figures["false_deaths"]
    assert deaths["value"] == 0
    assert held["value"] == held["baseline"] == 200


async def test_rebalance_quick(tmp_path: Path) -> None:
    figures = by_figure(await run_quick("rebalance", tmp_path))
    latencies = figures["rebalance_latency"]
    assert [line["members"] for line in latencies] == [10, 50]
    for line in latencies:
        assert len(line["samples_ms"]) == line["repeats"]
        assert line["value"] > 0 and line["baseline"] > 0
    formations = figures["formation"]
    assert [line["members"] for line in formations] == [10, 50]
    assert all(line["value"] > 0 and line["generation"] >= 1 for line in formations)


async def test_detection_quick(tmp_path: Path) -> None:
    figures = by_figure(await run_quick("detection", tmp_path))
    (frozen,) = figures["frozen_last_heard_to_stable"]
    # A frozen member's partitions never start elsewhere before its lease has run out.
    assert frozen["value"] >= frozen["session_timeout_ms"]
    (killed,) = figures["killed_to_stable"]
    # A killed process's kernel closes its connection: a death at once when that is a clean
    # close, a lease wait when it is a reset (a request was still unread, which the coordinator
    # cannot tell from a reset under a live process). Never later than a frozen member.
    assert 0 < killed["value"] <= frozen["baseline"]


async def test_assignment_quick(tmp_path: Path) -> None:
    pytest.importorskip("kafka", reason="the bench extra (kafka-python) is not installed")
    lines = await run_quick("assignment", tmp_path)
    figures = {(line["figure"], line["assignor"]): line for line in lines if "skipped" not in line}
    assignors = {"range", "sticky", "kafka_range", "kafka_roundrobin", "kafka_sticky"}
    assert {assignor for _, assignor in figures} == assignors
    sticky_moved = figures[("moved", "sticky")]
    assert sticky_moved["value"] == sticky_moved["baseline"] > 0  # only the leaver's partitions
    assert figures[("imbalance", "sticky")]["value"] <= 1


async def test_incremental_quick(tmp_path: Path) -> None:
    # Both protocols on fresh brokers: the load generator's join and leave, then real consumer
    # processes joining, leaving, killed, frozen and restarted one by one: about 80 s alone.
    figures = by_figure(await run_quick("incremental", tmp_path))
    scenarios = {
        "loadgen": ("join", "leave"),
        "consumers": ("join", "leave", "kill", "freeze", "rolling_restart"),
    }
    for part, names in scenarios.items():
        for scenario in names:
            for kind in ("settle", "unowned", "moved", "contacted"):
                lines = figures[f"{part}_{scenario}_{kind}"]
                assert sorted(line["protocol"] for line in lines) == ["eager", "incremental"]
            for line in figures[f"{part}_{scenario}_unowned"]:
                # Every partition stopped was handed on, and never to two members at once.
                assert line["never_handed_on"] == 0 and line["doubly_held"] == []
            for line in figures[f"{part}_{scenario}_contacted"]:
                assert line["value"] >= 1 or scenario == "rolling_restart"
            # The incremental protocol is set against the eager one of the same run.
            (incremental,) = [
                line
                for line in figures[f"{part}_{scenario}_unowned"]
                if line["protocol"] == "incremental"
            ]
            assert incremental["eager"] > 0
            if scenario in ("join", "leave"):
                # The target: at most 1.5 x the eager figure scaled to what moved.
                assert incremental["target_ratio"] == 1.5
                assert incremental["baseline"] == pytest.approx(
                    incremental["eager"] * len_moved(figures, part, scenario), rel=1e-3
                )
    for line in figures["loadgen_join_settle"]:
        # The bare baseline: round trips to the members involved, the assignor and the store.
        assert line["baseline"] == pytest.approx(line["bare_ms"] + line["assign_store_ms"], 1e-3)
    assert all("skipped" not in line for lines in figures.values() for line in lines)


def len_moved(figures: dict[str, list[dict[str, Any]]], part: str, scenario: str) -> float:
    """The incremental protocol's share of partitions moved in ``scenario``."""
    (moved,) = [
        line for line in figures[f"{part}_{scenario}_moved"] if line["protocol"] == "incremental"
    ]
    return float(moved["value"]) / float(moved["all_partitions"])


async def test_tls_quick(tmp_path: Path) -> None:
    figures = by_figure(await run_quick("tls", tmp_path))
    (cpu,) = figures["cpu_per_round_trip"]
    assert cpu["value"] > 0 and cpu["baseline"] > 0 and cpu["baseline_is"] == "plaintext"
    (held,) = figures["consumers_held"]
    (deaths,) = figures["false_deaths"]
    assert held["value"] == 200 and deaths["value"] == 0
    for rate in ("produce_rate", "fetch_rate"):
        (line,) = figures[rate]
        assert line["value"] > 0 and line["baseline"] > 0


async def test_throttled_quick(tmp_path: Path) -> None:
    """Busy loops beside the broker (a cgroup quota needs root: not asked here), 100 newcomers
    offered while they run, every consumer live once they stop."""
    figures = by_figure(await run_quick("throttled", tmp_path, "--offer", "100", "--rejoin"))
    (deaths,) = figures["false_deaths"]
    assert deaths["consumers"] == 300 and deaths["baseline"] == 0
    assert deaths["throttle"] == "busy" and deaths["busy_loops"] == 3
    (newcomers,) = figures["newcomers_in_during_throttle"]
    assert newcomers["baseline"] == 100
    (back,) = figures["all_back_after_throttle"]
    assert back["expected"] == 400 and back["live"] == 400
    (lag,) = figures["loop_lag_max_under"]
    assert lag["wakes"] > 0 and lag["loop_lag_p99_under_s"] <= lag["value"]
    (cpu,) = figures["server_cpu_share"]
    assert cpu["value"] > 0 and cpu["baseline"] > 0


async def test_replication_quick(tmp_path: Path) -> None:
    figures = by_figure(await run_quick("replication", tmp_path, "--seconds", "1"))
    (cpu,) = figures["cpu_per_record"]
    assert cpu["value"] > 0 and cpu["baseline"] > 0 and cpu["target_ratio"] == 3.5
    assert cpu["acknowledged"] > 0 and cpu["acknowledged_baseline"] > 0 and cpu["failed"] == 0
    for name in ("throughput", "produce_latency_p50", "produce_latency_p99", "max_throughput"):
        (line,) = figures[name]
        assert line["value"] > 0 and line["baseline"] > 0
    (catch_up,) = figures["follower_catch_up"]
    # The follower was behind by everything the leader accepted while it was stopped.
    assert catch_up["behind"] >= catch_up["accepted"] > 0
    assert catch_up["value"] > 0 and catch_up["baseline"] > 0


async def test_leader_failover_quick(tmp_path: Path) -> None:
    figures = by_figure(await run_quick("leader_failover", tmp_path))
    (leader,) = figures["to_new_leader"]
    assert leader["value"] > 0 and leader["baseline"] == leader["zookeeper_session_timeout_ms"]
    assert leader["partitions_moved"] >= 1 and leader["victim"] != leader["coordinator"]
    (after,) = figures["new_leader_to_consumed"]
    assert after["value"] > 0 and after["baseline"] > 0
    (consumed,) = figures["to_consumed"]
    assert consumed["value"] > leader["first_ms"]
    (generation,) = figures["generation"]
    # A leader change is not a group event, and every acknowledged record was consumed.
    assert generation["generations_after"] == [generation["generations_before"][-1]]
    assert generation["missing"] == 0 and generation["acknowledged"] > 0
