"""``groups reset-offsets`` as Kafka's tool has it: ``--dry-run`` shows the plan (group, topic,
partition, current and new offset) and changes nothing; ``--execute`` (or neither: this tool
has always executed, docs/cli.md#groups-reset-offsets) moves the offsets; ``--shift-by N``
moves each committed offset by N, clamped to the log; ``--all-topics`` takes every topic the
group has offsets for."""

from __future__ import annotations

from pathlib import Path

import pytest

from launch.processes import BrokerProcess, run_broker
from tests.cli.cli_process import bootstrap, cli_json, describe_group, run_cli

pytestmark = pytest.mark.realtime

FAST_GROUP = ("--initial-rebalance-delay", "0")


async def committed(broker: BrokerProcess, group: str) -> dict[str, int]:
    report = await describe_group(broker, group)
    return {f"{p['topic']}-{p['partition']}": p["committed"] for p in report["partitions"]}


async def test_dry_run_shows_the_plan_and_execute_shift_by_all_topics_move(
    tmp_path: Path,
) -> None:
    async with run_broker(tmp_path / "data", *FAST_GROUP) as broker:
        at = ("--bootstrap", bootstrap(broker))
        for topic, records in (("a", 10), ("b", 6), ("c", 3)):
            done = await run_cli("topics", "create", topic, "--partitions", "1", *at)
            assert done.returncode == 0, done.stderr
            lines = b"".join(b"%s-%d\n" % (topic.encode(), i) for i in range(records))
            assert (await run_cli("produce", topic, *at, stdin=lines)).returncode == 0
        reset = ("groups", "reset-offsets", "g")
        # neither --dry-run nor --execute: executed, as before, and said so
        done = await run_cli(*reset, "--topic", "a", "--to-offset", "4", *at)
        assert done.returncode == 0, done.stderr
        assert "without --execute or --dry-run: done" in done.stderr.decode()
        assert (await cli_json(broker, *reset, "--topic", "b", "--to-offset", "2", "--execute"))[0][
            "new"
        ] == 2
        assert await committed(broker, "g") == {"a-0": 4, "b-0": 2}

        # --dry-run: the plan, in both forms, and nothing moved
        plan = await cli_json(broker, *reset, "--all-topics", "--shift-by", "-3", "--dry-run")
        assert plan == [
            {"group": "g", "topic": "a", "partition": 0, "current": 4, "new": 1,
             "committed": 4, "executed": False},
            {"group": "g", "topic": "b", "partition": 0, "current": 2, "new": 0,
             "committed": 2, "executed": False},
        ]  # fmt: skip
        done = await run_cli(*reset, "--all-topics", "--shift-by", "-3", "--dry-run", *at)
        assert done.returncode == 0, done.stderr
        assert [line.split() for line in done.stdout.decode().splitlines()] == [
            ["GROUP", "TOPIC", "PARTITION", "CURRENT-OFFSET", "NEW-OFFSET"],
            ["g", "a", "0", "4", "1"],
            ["g", "b", "0", "2", "0"],
            ["(dry", "run:", "nothing", "changed;", "--execute", "moves", "the", "offsets)"],
        ]
        assert done.stderr == b""
        assert await committed(broker, "g") == {"a-0": 4, "b-0": 2}

        # --execute --shift-by: moved, clamped to the log's end as Kafka's tool does
        moved = await cli_json(broker, *reset, "--all-topics", "--shift-by", "5", "--execute")
        assert [(r["topic"], r["current"], r["new"], r["executed"]) for r in moved] == [
            ("a", 4, 9, True),
            ("b", 2, 6, True),
        ]
        assert await committed(broker, "g") == {"a-0": 9, "b-0": 6}
        # c was never committed: --all-topics leaves it alone, and a shift of it is refused
        done = await run_cli(*reset, "--topic", "c", "--shift-by", "1", *at)
        assert done.returncode == 2
        assert done.stderr.decode().splitlines() == [
            "coordinator: group g has no committed offset for c-0: nothing to shift"
            " (use --to-earliest, --to-latest or --to-offset)"
        ]
        done = await run_cli(*reset, "--all-topics", "--to-earliest", "--dry-run", *at)
        assert done.returncode == 0, done.stderr
        assert [line.split()[1] for line in done.stdout.decode().splitlines()[1:3]] == ["a", "b"]

        done = await run_cli("groups", "reset-offsets", "new", "--all-topics", "--to-earliest", *at)
        assert done.returncode == 2
        assert done.stderr.decode().splitlines() == [
            "coordinator: group new has no committed offsets: name a --topic"
        ]
        done = await run_cli(*reset, "--dry-run", "--execute", "--topic", "a", "--to-earliest", *at)
        assert done.returncode == 2
        assert "not allowed with argument" in done.stderr.decode()
