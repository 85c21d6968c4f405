"""A cluster of three brokers as a user meets it: a topic's partitions spread over the brokers,
and every CLI verb works with each broker as the only bootstrap (issue 18). Brokers and the CLI
run as real processes, on the test run's ZooKeeper server."""

from __future__ import annotations

import contextlib
import json
from collections import Counter
from pathlib import Path
from typing import Any, Protocol

import pytest
import trio

from consumer.admin import AdminError, open_admin
from coordinator.config import CoordinatorConfig
from launch.cluster import eventually
from launch.processes import stop_process
from tests.cli.cli_process import run_cli
from tests.zookeeper.test_failover import broker_processes
from transport.channel import ChannelClosed
from transport.connect import Address

pytestmark = pytest.mark.realtime

DEADLINE = 60  # generous: CI has two busy cores, ZooKeeper's JVM among them
#: What the tests that run brokers in this process give them (the broker processes of
#: test_failover.broker_processes run with the same options).
CONFIG = CoordinatorConfig(initial_rebalance_delay=0.2, commit_interval=0.2)


class Reachable(Protocol):
    """A broker of a test cluster, in this process or a process of its own."""

    @property
    def address(self) -> Address: ...


def bootstrap(broker: Reachable) -> str:
    host, port = broker.address
    return f"{host}:{port}"


async def cli(broker: Reachable, *args: str, stdin: bytes = b"") -> str:
    """``coordinator ARGS... --bootstrap BROKER``, which must succeed; its stdout."""
    done = await run_cli(*args, "--bootstrap", bootstrap(broker), stdin=stdin)
    assert done.returncode == 0, (args, done.stderr.decode(errors="replace"))
    return done.stdout.decode()


async def cli_json(broker: Reachable, *args: str) -> Any:
    return json.loads(await cli(broker, *args, "--json"))


async def brokers_seen_by(address: Address) -> set[int]:
    """The live brokers that the broker at ``address`` lists in ClusterMetadata (none while it
    cannot answer)."""
    with contextlib.suppress(OSError, AdminError, ChannelClosed, trio.TooSlowError):
        with trio.fail_after(5):
            async with open_admin([address]) as admin:
                return {b.broker_id for b in (await admin.metadata()).brokers}
    return set()


async def every_broker_sees(addresses: list[Address], wanted: set[int]) -> bool:
    return all([await brokers_seen_by(address) == wanted for address in addresses])


async def test_every_verb_works_through_each_broker_and_partitions_spread(
    zookeeper_hosts: str, tmp_path: Path
) -> None:
    async with broker_processes(zookeeper_hosts, tmp_path, 3) as brokers:
        one, two, three = brokers
        everyone = {b.broker_id for b in brokers}
        await eventually(
            lambda: every_broker_sees([b.address for b in brokers], everyone), deadline=DEADLINE
        )

        await cli(two, "topics", "create", "t", "--partitions", "6", "--replication-factor", "1")
        await cli(
            three,
            "topics",
            "create",
            "u",
            "--partitions",
            "4",
            "--brokers",
            "1,3",
            "--replication-factor",
            "1",
        )
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

        # Each broker alone serves every verb: a topic of its own created and grown (the added
        # partitions spread too), records produced to it and consumed from it in a group of its
        # own, whichever brokers hold its partitions and coordinate the group.
        for broker in brokers:
            n = broker.broker_id
            await cli(
                broker,
                "topics",
                "create",
                f"t{n}",
                "--partitions",
                "1",
                "--replication-factor",
                "1",
            )
            await cli(broker, "topics", "alter", f"t{n}", "--partitions", "3")
            rows = await cli_json(broker, "topics", "describe", f"t{n}")
            assert Counter(r["broker"] for r in rows) == dict.fromkeys(everyone, 1)
            lines = b"".join(b"record-%d-%d\n" % (n, i) for i in range(30))
            await cli(broker, "produce", f"t{n}", stdin=lines)
            consumed = await cli(
                broker, "consume", f"t{n}", "--group", f"g{n}", "--from-beginning",
                "--max-messages", "30",
            )  # fmt: skip
            assert sorted(consumed.split()) == sorted(lines.decode().split())
        groups = {f"g{b.broker_id}" for b in brokers}
        for broker in brokers:
            assert {t["topic"] for t in await cli_json(broker, "topics", "list")} == {
                "t", "u", "t1", "t2", "t3",
            }  # fmt: skip
            assert {g["group"] for g in await cli_json(broker, "groups", "list")} == groups
            for group in sorted(groups):
                report = await cli_json(broker, "groups", "describe", group)
                assert sum(p["committed"] for p in report["partitions"]) == 30
            view = await cli_json(broker, "cluster")
            assert [(b["broker"], b["up"]) for b in view["brokers"]] == [
                (b, True) for b in sorted(everyone)
            ]
        # A group's verbs through another broker than the one it was consumed through.
        for broker, other in zip(brokers, [two, three, one], strict=True):
            group, topic = f"g{broker.broker_id}", f"t{broker.broker_id}"
            await cli(other, "groups", "reset-offsets", group, "--topic", topic, "--to-earliest")
            report = await cli_json(broker, "groups", "describe", group)
            assert {p["committed"] for p in report["partitions"]} == {0}
            await cli(other, "groups", "delete", group)
        assert await cli_json(one, "groups", "list") == []

        # A broker that stops takes its partitions with it, and topics describe says so.
        await stop_process(three.running.process)

        async def three_is_down() -> bool:
            rows = await cli_json(one, "topics", "describe", "u")
            return {r["broker"]: r["broker_up"] for r in rows} == {1: True, 3: False}

        await eventually(three_is_down, deadline=DEADLINE)
        refused = await run_cli(
            "topics", "create", "v", "--partitions", "1", "--brokers", "3",
            "--replication-factor", "1", "--bootstrap", bootstrap(one),
        )  # fmt: skip
        assert refused.returncode != 0
        assert b"INVALID_REPLICA_ASSIGNMENT" in refused.stderr
