"""``groups reset-offsets`` names a topic by name only (a standalone OffsetCommit carries no topic
id, SPEC.md §11.12): after the topic is deleted and created again it applies to the new topic,
checked against the new topic's log, and a consumer of the group then starts where it put it.
``topics list`` and ``describe`` tell the two apart by their ids."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
import trio

from launch.processes import run_broker
from tests.cli.cli_process import bootstrap, cli_json, describe_group, run_cli

pytestmark = pytest.mark.realtime

FAST_GROUP = ("--initial-rebalance-delay", "0")
#: The broker deletes a partition's files as its topic watch hears of the delete.
FILES_GONE_WITHIN = 20.0


async def test_a_reset_after_a_topic_was_created_again_moves_the_new_topics_offsets(
    tmp_path: Path,
) -> None:
    data = tmp_path / "data"
    async with run_broker(data, *FAST_GROUP) as broker:
        at = ("--bootstrap", bootstrap(broker))
        done = await run_cli("topics", "create", "t", "--partitions", "1", *at)
        assert done.returncode == 0, done.stderr
        old = b"".join(b"old-%d\n" % i for i in range(10))
        assert (await run_cli("produce", "t", *at, stdin=old)).returncode == 0
        consume = ("consume", "t", "--group", "g", *at)
        done = await run_cli(*consume, "--from-beginning", "--max-messages", "10")
        assert done.returncode == 0, done.stderr
        (listed,) = await cli_json(broker, "topics", "list")
        old_id = listed["topic_id"]
        assert uuid.UUID(old_id) != uuid.UUID(int=0)

        assert (await run_cli("topics", "delete", "t", *at)).returncode == 0
        with trio.fail_after(FILES_GONE_WITHIN):  # the old log is no part of this test
            while (data / "log" / "t-0").exists():
                await trio.sleep(0.05)
        done = await run_cli("topics", "create", "t", "--partitions", "1", *at)
        assert done.returncode == 0, done.stderr
        new = b"".join(b"new-%d\n" % i for i in range(5))
        assert (await run_cli("produce", "t", *at, stdin=new)).returncode == 0
        (described,) = await cli_json(broker, "topics", "describe", "t")
        assert (described["end"], described["topic_id"] != old_id) == (5, True)
        table = (await run_cli("topics", "describe", "t", *at)).stdout.decode().splitlines()
        assert table[0].split() == [
            "TOPIC",
            "TOPIC",
            "ID",
            "PARTITION",
            "LEADER",
            "UP",
            "START",
            "END",
            "REPLICAS",
            "ISR",
            "EPOCH",
        ]
        assert table[1].split()[1] == described["topic_id"]

        # checked against the new topic's log: offset 7 was inside the old one's
        reset_to = ("groups", "reset-offsets", "g", "--topic", "t", "--to-offset")
        outside = await run_cli(*reset_to, "7", *at)
        assert outside.returncode == 2
        assert outside.stderr.decode().splitlines() == [
            "coordinator: offset 7 is outside t-0's log [0, 5]"
        ]

        reset = await cli_json(broker, *reset_to, "2")
        assert [(r["topic"], r["partition"], r["committed"]) for r in reset] == [("t", 0, 2)]
        (partition,) = (await describe_group(broker, "g"))["partitions"]
        assert (partition["committed"], partition["end"], partition["lag"]) == (2, 5, 3)

        done = await run_cli(*consume, "--max-messages", "3")
        assert done.returncode == 0, done.stderr
        assert done.stdout.splitlines() == [b"new-2", b"new-3", b"new-4"]
