"""The coordinator's log lines in a person's words: a clean leave is "left", not "dead", and an
instant is "now" or "in 4.2 s", not a reading of the monotonic clock nobody can place."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import trio
import trio.testing

from simulation import open_simulated_cluster
from tests.simulation.test_faults import CONFIG, _pair


def _deaths(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if "its partitions are free" in r.getMessage()]


async def test_a_member_that_leaves_cleanly_left_and_its_partitions_are_free_now(
    tmp_path: Path, autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="coordinator")
    async with open_simulated_cluster(tmp_path, CONFIG) as cluster:
        a, _ = await _pair(cluster)
        await a.leave()
        with trio.fail_after(10):
            await cluster.wait_settled()
        assert _deaths(caplog) == ["group g: a left; its partitions are free now"]


async def test_a_silent_member_is_dead_and_its_partitions_free_in_so_many_seconds(
    tmp_path: Path, autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="coordinator")
    async with open_simulated_cluster(tmp_path, CONFIG) as cluster:
        a, _ = await _pair(cluster)
        a.cut_network(30.0)
        with trio.fail_after(60):
            await cluster.wait_settled()
        # missed deadlines: it may still be fetching, so its partitions wait for its lease
        assert _deaths(caplog) == [
            "group g: a is dead (missed deadlines); its partitions are free in 2.5 s"
        ]
