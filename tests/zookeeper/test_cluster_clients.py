"""A cluster of three brokers as a user meets it: a topic's partitions spread over the brokers,
and every CLI verb works with any one broker as the only bootstrap (issue 18's first steps).
Brokers run in this process on real ZooKeeper; the CLI runs as real processes."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from coordinator.config import CoordinatorConfig
from launch.cluster import agreed_coordinator, eventually
from tests.cli.cli_process import run_cli
from tests.support.node_cluster import Broker, cluster, ids

pytestmark = pytest.mark.realtime

DEADLINE = 60  # generous: CI has two busy cores, ZooKeeper's JVM among them
CONFIG = CoordinatorConfig(initial_rebalance_delay=0.2, commit_interval=0.2)


def bootstrap(broker: Broker) -> str:
    return f"127.0.0.1:{broker.port}"


async def cli(broker: Broker, *args: str, stdin: bytes = b"") -> str:
    """``coordinator ARGS... --bootstrap BROKER``, which must succeed; its stdout."""
    done = await run_cli(*args, "--bootstrap", bootstrap(broker), stdin=stdin)
    assert done.returncode == 0, (args, done.stderr.decode(errors="replace"))
    return done.stdout.decode()


async def cli_json(broker: Broker, *args: str) -> Any:
    return json.loads(await cli(broker, *args, "--json"))


async def test_every_verb_works_through_any_broker_and_partitions_spread(
    zookeeper_hosts: str, tmp_path: Path
) -> None:
    async with cluster(zookeeper_hosts, tmp_path, CONFIG, 3) as brokers:
        coordinator_id = await agreed_coordinator(ids(brokers), group="g", deadline=DEADLINE)
        followers = [b for b in brokers if b.broker_id != coordinator_id]
        one, two, three = brokers

        await cli(two, "topics", "create", "t", "--partitions", "6")
        await cli(three, "topics", "create", "u", "--partitions", "4", "--brokers", "1,3")
        for broker in brokers:
            rows = await cli_json(broker, "topics", "describe")
            placed = {(r["topic"], r["partition"]): r["broker"] for r in rows}
            assert Counter(b for (topic, _), b in placed.items() if topic == "t") == {
                1: 2,
                2: 2,
                3: 2,
            }
            assert Counter(b for (topic, _), b in placed.items() if topic == "u") == {1: 2, 3: 2}
            assert all(r["broker_up"] for r in rows)

        # Records go to each partition's broker whichever broker the producer knew first.
        lines = b"".join(b"record-%d\n" % i for i in range(30))
        await cli(followers[0], "produce", "t", stdin=lines)
        consumed = await cli(
            followers[1], "consume", "t", "--group", "g", "--from-beginning", "--max-messages", "30"
        )
        assert sorted(consumed.split()) == sorted(lines.decode().split())

        # The group's verbs find its coordinator from any broker, a follower included.
        for broker in brokers:
            assert {g["group"] for g in await cli_json(broker, "groups", "list")} == {"g"}
            report = await cli_json(broker, "groups", "describe", "g")
            assert sum(p["committed"] for p in report["partitions"]) == 30
        await cli(followers[0], "groups", "reset-offsets", "g", "--topic", "t", "--to-earliest")
        report = await cli_json(followers[1], "groups", "describe", "g")
        assert {p["committed"] for p in report["partitions"]} == {0}
        await cli(followers[1], "groups", "delete", "g")
        assert await cli_json(one, "groups", "list") == []

        # A broker that stops takes its partitions with it, and topics describe says so.
        three.scope.cancel()

        async def three_is_down() -> bool:
            rows = await cli_json(one, "topics", "describe", "u")
            return {r["broker"]: r["broker_up"] for r in rows} == {1: True, 3: False}

        await eventually(three_is_down, deadline=DEADLINE)
        refused = await run_cli(
            "topics", "create", "v", "--partitions", "1", "--brokers", "3",
            "--bootstrap", bootstrap(one),
        )  # fmt: skip
        assert refused.returncode != 0
        assert b"INVALID_REPLICA_ASSIGNMENT" in refused.stderr
