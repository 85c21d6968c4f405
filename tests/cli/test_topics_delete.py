"""``topics delete``: the topic leaves the listing, its partitions' directories leave the disk, and
its group's committed offsets leave ``groups describe``, also after a restart; created again
under the name, it is a new, empty topic (another topic id) that the group reads from its
beginning."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
import trio

from launch.processes import run_broker
from tests.cli.cli_process import bootstrap, cli_json, describe_group, run_cli

pytestmark = pytest.mark.realtime

FAST_GROUP = ("--initial-rebalance-delay", "0")
#: A restarted broker waits a session timeout for the members its group's record names.
SHORT_SESSION = ("--session-timeout", "6")
#: The broker deletes a partition's files as its topic watch hears of the delete.
FILES_GONE_WITHIN = 20.0


def _committed_topics(report: dict[str, object]) -> set[str]:
    partitions = report["partitions"]
    assert isinstance(partitions, list)
    return {p["topic"] for p in partitions if p["committed"] is not None}


async def test_a_deleted_topic_goes_with_its_files_and_its_groups_offsets(tmp_path: Path) -> None:
    data = tmp_path / "data"
    old = [b"old-%d" % i for i in range(10)]
    async with run_broker(data, *FAST_GROUP) as broker:
        at = ("--bootstrap", bootstrap(broker))
        for topic, partitions in (("t", "2"), ("kept", "1")):
            done = await run_cli("topics", "create", topic, "--partitions", partitions, *at)
            assert done.returncode == 0, done.stderr
        for topic, lines in (("t", old), ("kept", [b"k"])):
            done = await run_cli("produce", topic, *at, stdin=b"\n".join(lines) + b"\n")
            assert done.returncode == 0, done.stderr
        for topic, count in (("t", len(old)), ("kept", 1)):
            done = await run_cli(
                "consume", topic, "--group", "g", "--from-beginning", "--max-messages", str(count),
                *SHORT_SESSION, *at,
            )  # fmt: skip
            assert done.returncode == 0, done.stderr
        assert _committed_topics(await describe_group(broker, "g")) == {"t", "kept"}
        assert (data / "log" / "t-0").is_dir() and (data / "log" / "t-1").is_dir()
        listed = await cli_json(broker, "topics", "list")
        (old_id,) = [uuid.UUID(entry["topic_id"]) for entry in listed if entry["topic"] == "t"]

        done = await run_cli("topics", "delete", "t", *at)
        assert done.returncode == 0, done.stderr
        assert done.stdout.decode().strip() == "deleted topic t"
        listed = await cli_json(broker, "topics", "list")
        assert [entry["topic"] for entry in listed] == ["kept"]
        assert _committed_topics(await describe_group(broker, "g")) == {"kept"}
        with trio.fail_after(FILES_GONE_WITHIN):
            while (data / "log" / "t-0").exists() or (data / "log" / "t-1").exists():
                await trio.sleep(0.05)
        assert sorted(p.name for p in (data / "log").iterdir() if p.is_dir()) == ["kept-0"]

        missing = await run_cli("topics", "delete", "t", *at)
        assert missing.returncode == 1
        assert missing.stdout == b""
        assert missing.stderr.decode().splitlines() == [
            "coordinator: delete topic t: no such topic (UNKNOWN_TOPIC_OR_PARTITION)"
        ]

    async with run_broker(data, *FAST_GROUP) as broker:
        at = ("--bootstrap", bootstrap(broker))
        assert _committed_topics(await describe_group(broker, "g")) == {"kept"}
        # Created again, the topic is empty and the group has no offset for it: it reads the new
        # records from the first, where an old offset (5 on each partition) would skip them.
        done = await run_cli("topics", "create", "t", "--partitions", "2", *at)
        assert done.returncode == 0, done.stderr
        described = await cli_json(broker, "topics", "describe", "t")
        assert [(p["partition"], p["end"]) for p in described] == [(0, 0), (1, 0)]
        # another topic under the name: another id
        (new_id,) = {uuid.UUID(p["topic_id"]) for p in described}
        assert new_id != old_id
        new = [b"new-%d" % i for i in range(4)]
        done = await run_cli("produce", "t", *at, stdin=b"\n".join(new) + b"\n")
        assert done.returncode == 0, done.stderr
        done = await run_cli(
            "consume", "t", "--group", "g", "--from-beginning", "--max-messages", "4",
            *SHORT_SESSION, *at,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        assert sorted(done.stdout.splitlines()) == new
