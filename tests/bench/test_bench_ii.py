"""Benchmarks II's ``--quick`` modes (failover, ZooKeeper commits, seed 02's baseline) run against
real ZooKeeper and real broker processes and print the figures they promise, one parseable JSON
line each (docs/benchmarks.md). Times and rates are never asserted (a benchmark reports, it does
not fail a run on a busy machine); what is asserted is what the figures mean."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
import trio

from launch.zookeeper import zookeeper_available

REPO = Path(__file__).resolve().parents[2]
KEYS = {"benchmark", "figure", "value", "unit", "baseline", "ratio"}

pytestmark = [
    pytest.mark.realtime,
    pytest.mark.skipif(not zookeeper_available(), reason="needs java and Debian's zookeeper"),
]


async def run_quick(
    name: str, tmp_path: Path, deadline: float = 120
) -> dict[str, list[dict[str, Any]]]:
    """Run ``bench.<name> --quick``; its figures by name. A "skipped" line fails."""
    with trio.fail_after(deadline):
        result = await trio.run_process(
            [sys.executable, "-m", f"bench.{name}", "--quick", "--work-dir", str(tmp_path)],
            cwd=REPO,
            capture_stdout=True,
            capture_stderr=True,
            check=False,
        )
    assert result.returncode == 0, result.stderr.decode(errors="replace")[-4000:]
    figures: dict[str, list[dict[str, Any]]] = {}
    for text in result.stdout.decode().splitlines():
        line = json.loads(text)
        assert line["benchmark"] == name and "skipped" not in line, line
        assert line.keys() >= KEYS, line
        figures.setdefault(line["figure"], []).append(line)
    return figures


async def test_failover_quick(tmp_path: Path) -> None:
    # Two scenarios, each on fresh brokers with six consumer processes: about 40 s alone.
    figures = await run_quick("failover", tmp_path, deadline=300)
    for scenario in ("kill_9", "sigstop"):
        (gap,) = figures[f"{scenario}_longest_gap"]
        (elected,) = figures[f"{scenario}_to_elected"]
        (stable,) = figures[f"{scenario}_to_stable"]
        (generation,) = figures[f"{scenario}_generation"]
        # Records flowed on every surviving broker's partition before the fault (the baseline),
        # and the gap figure covers each of them.
        assert gap["surviving_partitions"] == 8 and len(gap["longest_gap_ms"]) == 8
        assert gap["steady_gaps"] > 0 and gap["baseline"] > 0
        assert gap["target_ms"] == pytest.approx(
            max(2 * gap["baseline"], gap["baseline"] + 100), abs=0.1
        )
        assert gap["value"] == pytest.approx(max(gap["longest_gap_ms"].values()), abs=0.1)
        # A successor first, then the group Stable at it, against the target.
        assert stable["reached"] and 0 < elected["value"] < stable["value"]
        zk, t = stable["zookeeper_session_timeout_ms"], stable["consumer_session_timeout_ms"]
        bound = zk if scenario == "kill_9" else max(zk, 2 * t / 3)
        assert stable["baseline"] == bound + 1500
        # The group formed before the fault and is whole again after it.
        assert generation["baseline"] >= 1 and generation["value"] >= generation["baseline"]
        # At least once, one consumer at a time: redeliveries may happen, losses may not.
        (missing,) = figures[f"{scenario}_missing"]
        (overlaps,) = figures[f"{scenario}_two_consumers_at_once"]
        assert missing["acknowledged"] > 0 and missing["value"] == 0
        assert overlaps["value"] == 0
        assert f"{scenario}_duplicates" in figures


async def test_zk_commits_quick(tmp_path: Path) -> None:
    figures = await run_quick("zk_commits", tmp_path)
    (offsets,) = figures["offsets_per_s"]
    (commits,) = figures["commits_per_s"]
    assert offsets["batch"] == 100
    assert offsets["value"] > 0 and offsets["baseline"] > 0
    assert offsets["ratio"] == commits["ratio"]


async def test_seed02_quick(tmp_path: Path) -> None:
    figures = await run_quick("seed02", tmp_path)
    (claims,) = figures["failed_claims"]
    assert claims["consumers"] == 10
    assert claims["value"] == 0  # the coordinator assigns; nobody claims
    (overlaps,) = figures["two_owner_instants"]
    assert overlaps["value"] == 0
    # A consumer paused past its session: seed 02's wakes still believing it owns what others
    # took meanwhile; the coordinator's stopped at its lease's end.
    (paused,) = figures["two_owner_instants_pause"]
    assert paused["value"] == 0 and paused["baseline"] >= 1
    for phase in ("formed", "joined", "died"):
        (operations,) = figures[f"zk_operations_{phase}"]
        (settle,) = figures[f"settle_time_{phase}"]
        assert operations["baseline"] > 0  # every seed-02 rebalance reads ZooKeeper
        assert settle["value"] > 0 and settle["baseline"] > 0
