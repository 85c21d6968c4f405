"""``topics create --replication-factor`` and what ``topics describe`` says of each partition's
replicas: its leader (still under the ``broker`` key), replicas, in-sync replicas and leader
epoch, as ``kafka-topics --describe`` shows Leader, Replicas and Isr."""

from __future__ import annotations

from pathlib import Path

import pytest

from launch.processes import run_broker
from tests.cli.cli_process import bootstrap, cli_json, run_cli

pytestmark = pytest.mark.realtime


async def test_describe_shows_each_partitions_leader_replicas_and_isr(tmp_path: Path) -> None:
    async with run_broker(tmp_path / "data") as broker:
        created = await cli_json(
            broker, "topics", "create", "r", "--partitions", "2", "--replication-factor", "1"
        )
        assert created == {"topic": "r", "partitions": 2, "created": True}
        described = await cli_json(broker, "topics", "describe", "r")
        me = described[0]["broker"]
        assert [
            {k: row[k] for k in ("partition", "broker", "broker_up", "leader", "replicas", "isr")}
            | {"leader_epoch": row["leader_epoch"]}
            for row in described
        ] == [
            {
                "partition": p,
                "broker": me,
                "broker_up": True,
                "leader": me,
                "replicas": [me],
                "isr": [me],
                "leader_epoch": 0,
            }
            for p in (0, 1)
        ]
        table = await run_cli("topics", "describe", "r", "--bootstrap", bootstrap(broker))
        assert table.returncode == 0, table.stderr
        head, *rows = table.stdout.decode().splitlines()
        assert head.split() == [
            "TOPIC", "TOPIC", "ID", "PARTITION", "LEADER", "UP", "START", "END", "REPLICAS",
            "ISR", "EPOCH",
        ]  # fmt: skip
        assert [row.split()[2:] for row in rows] == [
            [str(p), str(me), "yes", "0", "0", str(me), str(me), "0"] for p in (0, 1)
        ]
