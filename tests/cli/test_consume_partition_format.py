"""kcat's and the console tools' ways in and out: ``produce --partition`` and ``--header``;
``consume --partition --offset`` reading without a group; ``--format`` printing offset,
timestamp, key and headers; several topics, or a ``--pattern``, in one group."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from launch.processes import run_broker
from tests.cli.cli_process import bootstrap, cli_json, run_cli

pytestmark = pytest.mark.realtime

FAST_GROUP = ("--initial-rebalance-delay", "0")


async def test_produce_to_a_partition_with_headers_and_read_it_from_an_offset(
    tmp_path: Path,
) -> None:
    async with run_broker(tmp_path / "data", *FAST_GROUP) as broker:
        at = ("--bootstrap", bootstrap(broker))
        done = await run_cli("topics", "create", "t", "--partitions", "3", *at)
        assert done.returncode == 0, done.stderr
        before_ms = int(time.time() * 1000)
        lines = b"".join(b"k%d:v%d\n" % (i, i) for i in range(5))
        produce = ("produce", "t", "--key-separator", ":", *at)
        done = await run_cli(*produce, "--partition", "2", "-H", "src=cli", "--header", "n=1",
                             stdin=lines)  # fmt: skip
        assert done.returncode == 0, done.stderr
        after_ms = int(time.time() * 1000)
        described = await cli_json(broker, "topics", "describe", "t")
        assert [p["end"] for p in described] == [0, 0, 5]  # keys would have spread them

        done = await run_cli(*produce, "--partition", "3", stdin=b"x:y\n")
        assert done.returncode == 2
        assert done.stderr.decode().splitlines() == [
            "coordinator: topic t has no partition 3 (it has 3)"
        ]

        read = ("consume", "t", "--partition", "2", *at)
        done = await run_cli(*read, "--offset", "1", "--max-messages", "3",
                             "--format", r"%t|%p|%o|%k|%s|%h|%K|%S\n")  # fmt: skip
        assert done.returncode == 0, done.stderr
        assert done.stdout.decode().splitlines() == [
            f"t|2|{i}|k{i}|v{i}|src=cli,n=1|2|2" for i in (1, 2, 3)
        ]
        done = await run_cli(*read, "--offset", "beginning", "--max-messages", "1",
                             "--format", r"%o %T\n")  # fmt: skip
        assert done.returncode == 0, done.stderr
        offset, stamp = done.stdout.split()
        assert offset == b"0" and before_ms <= int(stamp) <= after_ms
        done = await run_cli(*read, "--offset", "-2", "--max-messages", "2", "--print-key")
        assert done.returncode == 0, done.stderr
        assert done.stdout.splitlines() == [b"k3\tv3", b"k4\tv4"]
        # --offset alone: every partition of the topic; the only records are partition 2's
        done = await run_cli("consume", "t", "--offset", "-2", "--max-messages", "2", *at)
        assert done.returncode == 0, done.stderr
        assert done.stdout.splitlines() == [b"v3", b"v4"]
        done = await run_cli("consume", "t", "--offset", "3", *at)
        assert done.returncode == 2
        assert done.stderr.decode().splitlines() == [
            "coordinator: --offset N needs --partition (every partition: beginning, end or -N)"
        ]
        done = await run_cli(*read, "--offset", "6", "--max-messages", "1")
        assert done.returncode == 2
        assert done.stderr.decode().splitlines() == [
            "coordinator: offset 6 is outside t-2's log [0, 5]"
        ]
        # none of these reads was a group's
        assert await cli_json(broker, "groups", "list") == []
        done = await run_cli(*read, "--group", "g")
        assert done.returncode == 2
        assert done.stderr.decode().splitlines() == [
            "coordinator: --partition and --offset read without a group: not with --group"
        ]


async def test_several_topics_or_a_pattern_in_one_group(tmp_path: Path) -> None:
    async with run_broker(tmp_path / "data", *FAST_GROUP) as broker:
        at = ("--bootstrap", bootstrap(broker))
        for topic in ("logs.a", "logs.b", "other"):
            done = await run_cli("topics", "create", topic, "--partitions", "1", *at)
            assert done.returncode == 0, done.stderr
            lines = b"".join(b"%s-%d\n" % (topic.encode(), i) for i in range(3))
            done = await run_cli("produce", topic, "-H", f"from={topic}", *at, stdin=lines)
            assert done.returncode == 0, done.stderr

        fmt = ("--format", r"%t %o %s %h\n", "--from-beginning", "--max-messages", "6")
        done = await run_cli("consume", "logs.a", "other", "--group", "two", *fmt, *at)
        assert done.returncode == 0, done.stderr
        assert sorted(done.stdout.decode().splitlines()) == [
            f"{t} {i} {t}-{i} from={t}" for t in ("logs.a", "other") for i in range(3)
        ]
        done = await run_cli("consume", "--pattern", r"logs\..*", "--group", "logs", *fmt, *at)
        assert done.returncode == 0, done.stderr
        assert sorted(done.stdout.decode().splitlines()) == [
            f"{t} {i} {t}-{i} from={t}" for t in ("logs.a", "logs.b") for i in range(3)
        ]
        # each group committed what it printed
        for group, topics in (("two", {"logs.a", "other"}), ("logs", {"logs.a", "logs.b"})):
            report = await cli_json(broker, "groups", "describe", group)
            assert {p["topic"]: p["committed"] for p in report["partitions"]} == dict.fromkeys(
                topics, 3
            )
