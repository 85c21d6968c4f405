"""The coordinator slot count is fixed when the cluster's ZooKeeper store is created: a broker
configured with another count refuses to start, with one line saying what the store holds
(docs/design.md#coordinator-slots). Real ZooKeeper, real processes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

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


def write_layout(hosts: str, layout: dict[str, int]) -> None:
    client = KazooClient(hosts=hosts)
    client.start(timeout=30)
    try:
        client.create(LAYOUT, json.dumps(layout).encode(), makepath=True)
    finally:
        client.stop()
        client.close()


def read_layout(hosts: str) -> Any:
    client = KazooClient(hosts=hosts)
    client.start(timeout=30)
    try:
        data, _stat = client.get(LAYOUT)
        return json.loads(data)
    finally:
        client.stop()
        client.close()


@pytest.mark.parametrize("version", [1, LAYOUT_VERSION + 1])
async def test_a_store_of_another_layout_version_is_refused(
    zookeeper_hosts: str, version: int
) -> None:
    write_layout(zookeeper_hosts, {"version": version, "slots": 50})
    with pytest.raises(LayoutMismatch) as refused:
        async with open_zookeeper_store(zookeeper_hosts, coordinator_slots=50):
            pytest.fail("a broker opened a store of another layout")
    assert str(refused.value) == (
        f"the cluster's ZooKeeper store has layout version {version}, this broker runs version "
        f"{LAYOUT_VERSION} (and upgrades versions 2 and 3)"
    )
    assert read_layout(zookeeper_hosts) == {"version": version, "slots": 50}


@pytest.mark.parametrize("version", [2, 3])
async def test_a_store_of_layout_2_or_3_is_upgraded_to_4(
    zookeeper_hosts: str, version: int
) -> None:
    """Topics get ids (docs/design.md#topic-ids) in layout 3, replicas in 4: the first broker
    of layout 4 on a store of layout 2 or 3 upgrades it, if the slot count is the one it runs;
    older brokers still running go on, and one started afterwards refuses the store in one line,
    as for any version it does not run ("has layout version 4, this broker runs version 3")."""
    assert LAYOUT_VERSION == 4
    write_layout(zookeeper_hosts, {"version": version, "slots": 50})
    with pytest.raises(LayoutMismatch, match=r"has 50 coordinator slots, .* configured with 8"):
        async with open_zookeeper_store(zookeeper_hosts, coordinator_slots=8):
            pytest.fail("a broker with another slot count opened the store")
    assert read_layout(zookeeper_hosts) == {"version": version, "slots": 50}
    async with open_zookeeper_store(zookeeper_hosts, coordinator_slots=50):
        assert read_layout(zookeeper_hosts) == {"version": 4, "slots": 50}
    async with open_zookeeper_store(zookeeper_hosts, coordinator_slots=50):
        pass  # layout 4: welcome


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
