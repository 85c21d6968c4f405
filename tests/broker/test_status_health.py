"""The status page says whether the broker keeps up (issue 36): its loop's lag now and at worst
in the last minute, how long its store took to answer, and what it shed or excused for being
behind, marked when the worst lag is past the door's bound."""

from __future__ import annotations

import re
from pathlib import Path

import attrs
import trio
import trio.testing

from broker.door import BOUND
from broker.metrics import BrokerMetrics, Health, take_snapshot
from broker.status import render_page
from coordinator.loop_lag import LoopLag, watch_loop
from protocol.types import BrokerInfo
from store.embedded import open_embedded_store
from tests.broker.test_record_viewer import _snapshot

BROKER = BrokerInfo(broker_id=1, host="127.0.0.1", port=9092)


def _health(page: str) -> tuple[str, dict[str, str]]:
    found = re.search(r"<p id=health( class=behind)?>(.*?)</p>", page)
    assert found is not None, "no health line"
    spans = dict(re.findall(r"<span id=([\w-]+)>(.*?)</span>", found.group(2)))
    return found.group(1) or "", spans


def test_the_page_shows_the_loop_lag_the_store_and_what_was_shed() -> None:
    health = Health(loop_lag=0.004, worst_loop_lag=0.2, store_read=0.012, shed=3, pings_excused=1)
    mark, spans = _health(render_page(attrs.evolve(_snapshot(), health=health)))
    assert mark == ""
    assert spans == {
        "loop-lag": "0.004 s",
        "worst-loop-lag": "0.200 s",
        "store-read": "12 ms",
        "shed": "3",
        "excused": "1",
    }
    behind = attrs.evolve(health, worst_loop_lag=BOUND + 0.1, store_read=None)
    mark, spans = _health(render_page(attrs.evolve(_snapshot(), health=behind)))
    assert (mark, spans["store-read"]) == (" class=behind", "-")


async def test_a_snapshot_carries_the_loops_worst_lag_and_the_doors_count(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    metrics = BrokerMetrics()
    async with open_embedded_store(tmp_path / "metadata") as store, trio.open_nursery() as nursery:
        await nursery.start(watch_loop)
        await trio.sleep(1.0)
        autojump_clock.jump(0.7)  # the loop stopped for 0.7 s: the watcher wakes that late
        await trio.sleep(0.2)
        metrics.request_shed()
        snapshot = await take_snapshot(metrics, BROKER, {}, store, {}, _no_timestamp)
        nursery.cancel_scope.cancel()
    assert snapshot.health is not None
    assert snapshot.health.worst_loop_lag >= 0.6
    assert snapshot.health.loop_lag < 0.1  # the latest wake was on time again
    assert (snapshot.health.shed, snapshot.health.store_read) == (1, None)
    assert LoopLag.of_run().worst_since(trio.current_time() - 60) == snapshot.health.worst_loop_lag


async def _no_timestamp(*_: object) -> None:
    return None
