"""``groups reset-offsets --to-datetime``, as kafka-consumer-groups': each partition's committed
offset goes to the earliest record at least that late (ListOffsets 1), or to the log end where
none is; the date and time in ISO 8601, with a timezone offset or in local time."""

from __future__ import annotations

import datetime
import math
import time
from pathlib import Path

import pytest
import trio

from launch.processes import run_broker
from tests.cli.cli_process import bootstrap, cli_json, describe_group, run_cli

pytestmark = pytest.mark.realtime


def committed(rows: list[dict[str, object]]) -> list[tuple[object, ...]]:
    """Each partition's committed offset after a reset, from its --json rows."""
    return [(row["topic"], row["partition"], row["committed"]) for row in rows]


def iso(ms: int, tz: datetime.timezone | None) -> str:
    """``ms`` as kafka-consumer-groups takes it: 2026-11-28T10:00:00.000 (naive: local time)."""
    when = datetime.datetime.fromtimestamp(ms / 1000, tz=tz)
    return when.isoformat(timespec="milliseconds")


async def test_reset_to_a_datetime_moves_each_partition_to_the_first_record_that_late(
    tmp_path: Path,
) -> None:
    async with run_broker(tmp_path / "data", "--initial-rebalance-delay", "0") as broker:
        at = ("--bootstrap", bootstrap(broker))
        done = await run_cli("topics", "create", "t", "--partitions", "1", *at)
        assert done.returncode == 0, done.stderr
        early = b"".join(b"early-%d\n" % i for i in range(5))
        assert (await run_cli("produce", "t", *at, stdin=early)).returncode == 0
        await trio.sleep(0.05)
        between = math.ceil(time.time() * 1000)
        await trio.sleep(0.05)
        late = b"".join(b"late-%d\n" % i for i in range(3))
        assert (await run_cli("produce", "t", *at, stdin=late)).returncode == 0

        reset = ("groups", "reset-offsets", "g", "--topic", "t", "--to-datetime")
        moved = await cli_json(broker, *reset, iso(between, datetime.UTC))
        assert committed(moved) == [("t", 0, 5)]
        (partition,) = (await describe_group(broker, "g"))["partitions"]
        assert (partition["committed"], partition["end"], partition["lag"]) == (5, 8, 3)

        # in local time, and from before the first record: the log start
        moved = await cli_json(broker, *reset, iso(between - 60_000, None))
        assert committed(moved) == [("t", 0, 0)]
        # after the last record: the log end
        future = datetime.datetime.now(datetime.UTC) + datetime.timedelta(hours=1)
        moved = await cli_json(broker, *reset, future.strftime("%Y-%m-%dT%H:%M:%S.000Z"))
        assert committed(moved) == [("t", 0, 8)]

        done = await run_cli(*reset, iso(between, datetime.UTC), *at)
        assert done.returncode == 0, done.stderr
        done = await run_cli("consume", "t", "--group", "g", "--max-messages", "3", *at)
        assert done.returncode == 0, done.stderr
        assert done.stdout.splitlines() == [b"late-0", b"late-1", b"late-2"]

        wrong = await run_cli(*reset, "yesterday", *at)
        assert wrong.returncode == 2
        assert "not an ISO 8601 date and time" in wrong.stderr.decode()
