"""Crashes through the CLI, with real processes: a consumer killed with SIGKILL mid-stream, then the
broker, then garbage on the broker's port.

What a user would check: every record printed at least once, duplicates only among what the dead
consumer had printed, nothing acknowledged lost and no committed offset moved by a broker crash, and
a stable group untouched by a broken client.
"""

from __future__ import annotations

import collections
import re
import signal
import struct
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import trio

from consumer.admin import AdminError, open_admin
from launch.processes import BrokerProcess, run_broker
from tests.cli.cli_process import (
    bootstrap,
    cli_json,
    describe_group,
    open_cli,
    open_cli_piped,
    run_cli,
    stop,
)

pytestmark = pytest.mark.realtime

RECORDS = 100_000
PARTITIONS = 12
TOPIC = "numbers"
GROUP = "printers"
#: Lines the victim prints before it is killed: enough to have reported some offsets, far fewer
#: than its third of the topic.
VICTIM_LINES = 500
POLL = 0.05
#: Bounds on the waits below; generous, since CI has two busy cores.
PRODUCE_DEADLINE = 120.0
REBALANCE_DEADLINE = 30.0
CONSUME_DEADLINE = 120.0
BROKER_ARGS = ("--initial-rebalance-delay", "1.0")


def printed(path: Path) -> list[str]:
    """The whole lines in ``path`` (a killed process may leave half of one)."""
    text = path.read_bytes().decode()
    return text.split("\n")[:-1]


@contextmanager
def measured(what: str) -> Iterator[None]:
    started = time.monotonic()  # real-clock: the report is about wall time
    yield
    print(f"MEASURED {what}: {time.monotonic() - started:.2f} s")


async def until_stable(broker: BrokerProcess, members: int) -> None:
    """Until the group is Stable with ``members`` members.

    The polling asks the broker directly: a CLI process per poll would add its start-up time (on a
    busy machine, seconds) to the kill -> Stable measurement."""
    with trio.fail_after(REBALANCE_DEADLINE):
        while True:
            try:
                async with open_admin([broker.address]) as admin:
                    report = await admin.describe_group(GROUP)
                if report.state == "Stable" and len(report.members) == members:
                    return
            except* AdminError:
                pass  # no such group until its first member registers
            await trio.sleep(POLL)


async def produce(broker: BrokerProcess) -> None:
    lines = "".join(f"{i}\n" for i in range(RECORDS)).encode()
    with measured(f"produce {RECORDS} records with the CLI"):
        done = await run_cli(
            "produce",
            TOPIC,
            "--bootstrap",
            bootstrap(broker),
            stdin=lines,
            timeout=PRODUCE_DEADLINE,
        )
    assert done.returncode == 0, done.stderr
    assert f"produced {RECORDS} records".encode() in done.stderr


async def ends(broker: BrokerProcess) -> dict[int, int]:
    rows = await cli_json(broker, "topics", "describe", TOPIC)
    assert isinstance(rows, list)
    return {row["partition"]: row["end"] for row in rows}


def committed(report: dict[str, Any]) -> dict[int, int]:
    rows = report["partitions"]
    assert isinstance(rows, list)
    return {row["partition"]: row["committed"] for row in rows}


async def send_garbage(broker: BrokerProcess, frame: bytes) -> str:
    """Send ``frame`` on a fresh connection; the broker must close it. Returns our address."""
    stream = await trio.open_tcp_stream(*broker.address)
    host, port = stream.socket.getsockname()[:2]
    async with stream:
        await stream.send_all(frame)
        with trio.fail_after(10):
            try:
                while await stream.receive_some(65536):
                    pass  # an error frame telling us why, then the close
            except trio.BrokenResourceError:
                pass  # closed with unread data: a reset
    return f"{host}:{port}"


async def test_consumer_crash_broker_crash_and_garbage(tmp_path: Path) -> None:
    data_dir = tmp_path / "broker"
    async with run_broker(data_dir, *BROKER_ARGS) as broker:
        done = await run_cli(
            "topics",
            "create",
            TOPIC,
            "--partitions",
            str(PARTITIONS),
            "--bootstrap",
            bootstrap(broker),
        )
        assert done.returncode == 0, done.stderr
        await produce(broker)
        produced = await ends(broker)
        assert sum(produced.values()) == RECORDS

        outputs = [tmp_path / f"consumer{i}.out" for i in range(3)]
        args = (
            "consume",
            TOPIC,
            "--group",
            GROUP,
            "--from-beginning",
            # the victim's partitions move after its lease: T, not the 45 s default
            "--session-timeout",
            "6",
            "--bootstrap",
            bootstrap(broker),
        )
        # The victim prints into a pipe this test reads: once the test stops reading, the victim
        # blocks when the pipe is full, so it is killed mid-stream however fast it consumes.
        victim = await open_cli_piped(*args, stderr=outputs[0].with_suffix(".err"))
        survivors = [
            await open_cli(*args, stdout=out, stderr=out.with_suffix(".err")) for out in outputs[1:]
        ]
        consumers = [victim, *survivors]
        try:
            started = time.monotonic()  # real-clock: reported consume time
            assert victim.stdout is not None
            with outputs[0].open("wb") as victim_out:
                with trio.fail_after(REBALANCE_DEADLINE + CONSUME_DEADLINE):
                    while len(printed(outputs[0])) < VICTIM_LINES:
                        victim_out.write(await victim.stdout.receive_some())
                        victim_out.flush()
                victim.send_signal(signal.SIGKILL)
                killed_at = time.monotonic()  # real-clock: kill -> Stable, as a user sees it
                await victim.wait()
                # What it wrote before it died was printed: read the pipe to its end.
                with trio.fail_after(CONSUME_DEADLINE):
                    while chunk := await victim.stdout.receive_some():
                        victim_out.write(chunk)
            victim_lines = printed(outputs[0])
            assert len(victim_lines) < RECORDS // 3 - PARTITIONS, "killed after its share"

            await until_stable(broker, members=2)
            print(
                f"MEASURED kill -9 -> Stable with 2 members: {time.monotonic() - killed_at:.2f} s"
            )

            everything = {str(i) for i in range(RECORDS)}
            with trio.fail_after(CONSUME_DEADLINE):
                while {line for out in outputs for line in printed(out)} != everything:
                    await trio.sleep(POLL)
            print(f"MEASURED consume {RECORDS} records: {time.monotonic() - started:.2f} s")

            await until_stable(broker, members=2)
            stable = await describe_group(broker, GROUP)
            assert stable["state"] == "Stable" and len(stable["members"]) == 2, stable
            owned = sorted(
                (tp["topic"], tp["partition"])
                for member in stable["members"]
                for tp in member["partitions"]
            )
            assert owned == [(TOPIC, p) for p in range(PARTITIONS)]
            await check_garbage_is_refused(broker, stable)

            for survivor in survivors:
                assert await stop(survivor) == 0
        finally:
            for consumer in consumers:
                await stop(consumer)

        survivor_lines = [printed(out) for out in outputs[1:]]
        check_duplicates(victim_lines, survivor_lines)

        before = await describe_group(broker, GROUP)
        assert all(row["lag"] == 0 for row in before["partitions"]), before
        assert committed(before) == produced
        await broker.kill()

    async with run_broker(data_dir, *BROKER_ARGS) as broker:
        assert await ends(broker) == produced
        after = await describe_group(broker, GROUP)
        assert committed(after) == committed(before)
        await check_rereading_finds_everything(broker, tmp_path)


def check_duplicates(victim: list[str], survivors: list[list[str]]) -> None:
    """Records printed twice are records the dead consumer had printed and not yet reported."""
    by_survivors = collections.Counter(line for lines in survivors for line in lines)
    assert by_survivors.most_common(1)[0][1] == 1, "a live consumer's handoff re-printed a record"
    assert len(set(victim)) == len(victim)
    duplicates = [line for line in victim if line in by_survivors]
    print(f"MEASURED duplicates: {len(duplicates)} of the victim's {len(victim)} lines")


async def check_garbage_is_refused(broker: BrokerProcess, stable: dict[str, Any]) -> None:
    """Garbage, a frame over the size limit and a negative size each close their own connection;
    the broker logs why, and the group does not notice."""
    frames = {  # what is sent -> the reason the broker must log
        struct.pack(">i", 12) + b"\xde\xad\xbe\xef" * 3: "MALFORMED_FRAME",
        struct.pack(">i", 2**31 - 1) + b"\x00" * 64: "FRAME_TOO_LARGE",
        struct.pack(">i", -5) + b"\x00" * 8: "MALFORMED_FRAME",
    }
    for frame, reason in frames.items():
        peer = await send_garbage(broker, frame)
        logged = re.compile(rf"closing {re.escape(peer)}: .*\({reason}\)")
        with trio.move_on_after(10):
            while logged.search(broker.log_text()) is None:
                await trio.sleep(POLL)
        assert logged.search(broker.log_text()), f"the broker did not log {reason} for {frame!r}"
    report = await describe_group(broker, GROUP)
    assert report["state"] == "Stable"
    assert report["generation"] == stable["generation"]
    assert report["members"] == stable["members"]


async def check_rereading_finds_everything(broker: BrokerProcess, tmp_path: Path) -> None:
    out = tmp_path / "reread.out"
    reader = await open_cli(
        "consume",
        TOPIC,
        "--group",
        "rereader",
        "--from-beginning",
        "--max-messages",
        str(RECORDS),
        "--bootstrap",
        bootstrap(broker),
        stdout=out,
        stderr=out.with_suffix(".err"),
    )
    try:
        with trio.fail_after(CONSUME_DEADLINE):
            await reader.wait()
    finally:
        await stop(reader)
    assert reader.returncode == 0, out.with_suffix(".err").read_text()
    lines = printed(out)
    assert len(lines) == RECORDS
    assert set(lines) == {str(i) for i in range(RECORDS)}
