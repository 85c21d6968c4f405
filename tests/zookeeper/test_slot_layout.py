"""The coordinator slot count is fixed when the cluster's ZooKeeper store is created: a broker
configured with another count refuses to start, with one line saying what the store holds
(docs/design.md#coordinator-slots). Real ZooKeeper, real processes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from kazoo.client import KazooClient  # type: ignore[import-untyped]

from store import LayoutMismatch
from store.zookeeper import LAYOUT, LAYOUT_VERSION, open_zookeeper_store
from tests.cli.cli_process import run_cli

pytestmark = pytest.mark.realtime


async def test_the_first_broker_pins_the_slot_count_and_others_must_match(
    zookeeper_hosts: str,
) -> None:
    async with open_zookeeper_store(zookeeper_hosts, coordinator_slots=16):
        pass
    async with open_zookeeper_store(zookeeper_hosts, coordinator_slots=16):
        pass  # the same count: welcome
    with pytest.raises(LayoutMismatch, match=r"has 16 coordinator slots, .* configured with 8"):
        async with open_zookeeper_store(zookeeper_hosts, coordinator_slots=8):
            pytest.fail("a broker with another slot count opened the store")


async def test_a_store_of_another_layout_version_is_refused(zookeeper_hosts: str) -> None:
    client = KazooClient(hosts=zookeeper_hosts)
    client.start(timeout=30)
    try:
        client.create(
            LAYOUT, json.dumps({"version": LAYOUT_VERSION + 1, "slots": 50}).encode(), makepath=True
        )
    finally:
        client.stop()
        client.close()
    with pytest.raises(LayoutMismatch, match=f"layout version {LAYOUT_VERSION + 1}"):
        async with open_zookeeper_store(zookeeper_hosts, coordinator_slots=50):
            pytest.fail("a broker opened a store of another layout")


async def test_a_broker_configured_otherwise_refuses_to_start(
    zookeeper_hosts: str, tmp_path: Path
) -> None:
    async with open_zookeeper_store(zookeeper_hosts, coordinator_slots=50):
        pass
    done = await run_cli(
        "serve",
        "--port",
        "0",
        "--data-dir",
        str(tmp_path / "data"),
        "--zookeeper",
        zookeeper_hosts,
        "--coordinator-slots",
        "8",
    )
    assert done.returncode == 1
    # Above it, the log lines of connecting to ZooKeeper; no traceback.
    lines = done.stderr.decode().splitlines()
    assert lines[-1] == (
        "coordinator: the cluster's ZooKeeper store has 50 coordinator slots, this broker is "
        "configured with 8 (start it with --coordinator-slots 50)"
    )
    assert not any("Traceback" in line for line in lines)
