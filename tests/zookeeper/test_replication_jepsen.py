"""Nothing acknowledged is lost (issue 37's Jepsen-style target), the short version: bench.jepsen's
whole run (three broker processes on a three-node ZooKeeper ensemble, factor 3, min.insync 2, a
steady producer; leaders killed with SIGKILL, some restarted before ZooKeeper noticed; leaders
and followers paused with SIGSTOP; one data directory wiped) for tens of seconds instead of
minutes. At acks=all
every acknowledged record must be read back at its offset, in order, with nothing there that was
not sent; at acks=1 with unclean election on, the same nemesis must make the check report loss,
or it could not see any.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from pathlib import Path

import pytest

from bench.jepsen import Settings, run_jepsen
from launch.zookeeper import Ensemble, open_ensemble
from tests.support.zookeeper_fixtures import require_zookeeper

pytestmark = pytest.mark.realtime

_chroots = itertools.count(1)


@pytest.fixture(scope="module")
def ensemble(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Ensemble]:
    """One 3-node quorum for both tests; each keeps to a chroot of its own."""
    require_zookeeper()
    with open_ensemble(3, base_dir=tmp_path_factory.mktemp("ensemble")) as running:
        yield running


def hosts(ensemble: Ensemble) -> str:
    return f"{ensemble.hosts}/jepsen-{next(_chroots)}"


async def test_acks_all_loses_nothing_through_kills_pauses_and_a_wiped_disk(
    ensemble: Ensemble, tmp_path: Path
) -> None:
    # Every kind of round twice (a loaded machine makes rounds longer, not fewer).
    settings = Settings(
        nemesis_seconds=30,
        min_rounds=8,
        acks="all",
        wipe_once=True,
        rate=50,
        baseline_seconds=2,
        seed=37,
    )
    outcome = await run_jepsen(settings, hosts(ensemble), tmp_path)
    assert outcome.kills >= 6 and outcome.lagging_rounds >= 2, outcome
    assert outcome.quick_rounds >= 2 and outcome.paused_rounds >= 2, outcome
    assert outcome.wipes == 1, outcome
    assert outcome.healed, outcome
    assert outcome.acknowledged > 0, outcome
    assert outcome.lost == 0, outcome
    assert outcome.out_of_order == 0, outcome
    assert outcome.unexpected == 0, outcome


async def test_acks_1_with_unclean_election_is_seen_to_lose_records(
    ensemble: Ensemble, tmp_path: Path
) -> None:
    # One round suffices: the first is a lagging one, whose acks=1 records only the killed
    # leader has.
    settings = Settings(
        nemesis_seconds=1, acks=1, unclean=True, rate=50, baseline_seconds=2, seed=37
    )
    outcome = await run_jepsen(settings, hosts(ensemble), tmp_path)
    assert outcome.kills == 1 and outcome.lagging_rounds == 1, outcome
    assert outcome.lost > 0, outcome
    assert outcome.unexpected == 0, outcome
