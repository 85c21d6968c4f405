"""``topics create --config NAME=VALUE`` and ``--if-not-exists``, as kafka-topics has them: a
topic's own retention.ms, retention.bytes and segment.bytes, refused before anything is created
when wrong, kept with the topic across a restart, shown by ``topics describe``, and applied by the
broker's log to that topic's partitions alone."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

from broker.log.segment import SUFFIX
from launch.processes import run_broker
from tests.cli.cli_process import bootstrap, cli_json, run_cli

pytestmark = pytest.mark.realtime

#: The broker looks for segments past retention this often.
CHECK = ("--retention-check-ms", "100")
RETENTION_WITHIN = 20.0


def _segments(directory: Path) -> int:
    return len(list(directory.glob(f"*{SUFFIX}")))


async def test_a_topics_own_settings_are_kept_shown_and_applied(tmp_path: Path) -> None:
    data = tmp_path / "data"
    records = [b"record %04d %s\n" % (i, b"x" * 80) for i in range(200)]
    #: Each run of the producer sends its lines in one batch of about 4 KiB (3-6 KiB).
    batches = [b"".join(records[i : i + 40]) for i in range(0, len(records), 40)]
    async with run_broker(data, *CHECK) as broker:
        at = ("--bootstrap", bootstrap(broker))
        done = await run_cli(
            "topics", "create", "small", "--partitions", "1",
            "--config", "segment.bytes=2048", "--config", "retention.bytes=6000", *at,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        assert done.stdout.decode().strip() == "created topic small with 1 partitions"
        done = await run_cli("topics", "create", "plain", "--partitions", "1", *at)
        assert done.returncode == 0, done.stderr
        for topic in ("small", "plain"):
            for batch in batches:
                done = await run_cli("produce", topic, *at, stdin=batch)
                assert done.returncode == 0, done.stderr

        # Rolled past 2 KiB (each batch its own segment), and the oldest deleted while 6000
        # bytes remain: this topic's alone.
        with trio.fail_after(RETENTION_WITHIN):
            while True:
                described = await cli_json(broker, "topics", "describe", "small")
                if described[0]["start"] == 120:  # 3 of 5 segments gone, 2 x 4 KiB kept
                    break
                await trio.sleep(0.1)
        assert described[0]["end"] == 200
        assert described[0]["configs"] == {"retention.bytes": "6000", "segment.bytes": "2048"}
        (plain,) = await cli_json(broker, "topics", "describe", "plain")
        assert (plain["start"], plain["end"], plain["configs"]) == (0, 200, {})
        assert _segments(data / "log" / "plain-0") == 1
        assert _segments(data / "log" / "small-0") == 2

    async with run_broker(data, *CHECK) as broker:  # kept by the store: the journal
        done = await run_cli("topics", "describe", "--bootstrap", bootstrap(broker))
        assert done.returncode == 0, done.stderr
        table = done.stdout.decode().splitlines()
        assert table[-3:] == [
            "TOPIC  SETTING          VALUE",
            "small  retention.bytes  6000",
            "small  segment.bytes    2048",
        ]


async def test_if_not_exists_and_refused_settings(tmp_path: Path) -> None:
    async with run_broker(tmp_path / "data") as broker:
        at = ("--bootstrap", bootstrap(broker))
        create = ("topics", "create", "t", "--partitions", "2", *at)
        done = await run_cli(*create, "--config", "retention.ms=60000")
        assert done.returncode == 0, done.stderr

        done = await run_cli(*create)
        assert done.returncode == 1
        assert b"the topic already exists" in done.stderr
        done = await run_cli(*create, "--if-not-exists")
        assert done.returncode == 0, done.stderr
        assert done.stdout.decode().strip() == "topic t already exists: left as it is"
        done = await run_cli(*create, "--if-not-exists", "--json")
        assert done.returncode == 0, done.stderr
        assert done.stdout.strip() == b'{"topic": "t", "created": false}'

        for setting, said in (
            ("cleanup.policy=compact", "unknown topic setting 'cleanup.policy'"),
            ("retention.ms=1h", "retention.ms must be a whole number, not '1h'"),
            ("segment.bytes=10", "segment.bytes must be between 14 and 2147483647, not 10"),
            ("retention.bytes", "expected name=value, not 'retention.bytes'"),
        ):
            done = await run_cli(
                "topics", "create", "u", "--partitions", "1", "--config", setting, *at
            )
            assert done.returncode == 2, setting
            assert said in done.stderr.decode(), done.stderr
        done = await run_cli(
            "topics", "create", "u", "--partitions", "1",
            "--config", "retention.ms=1", "--config", "retention.ms=2", *at,
        )  # fmt: skip
        assert done.returncode == 2
        assert "topic setting retention.ms is given twice" in done.stderr.decode()
        listed = await cli_json(broker, "topics", "list")
        assert [entry["topic"] for entry in listed] == ["t"]  # nothing else was created
        (first, second) = await cli_json(broker, "topics", "describe", "t")
        assert first["configs"] == second["configs"] == {"retention.ms": "60000"}
