"""A broker killed with SIGKILL loses the offsets it accepted and had not written yet; what
``groups describe`` showed as committed before the crash must still be there after it: shown as
committed, a reported offset not yet written would go backwards after a kill -9
(docs/design.md#offsets)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import trio

from consumer import ConsumerSettings, RecordStream, open_consumer
from consumer.admin import open_admin
from launch.processes import BrokerProcess, run_broker
from protocol import ErrorCode, ProduceRequest, ProduceResponse
from protocol.records import Record
from tests.cli.cli_process import describe_group
from transport.connect import connect_any, open_channel

pytestmark = pytest.mark.realtime

WAIT = 30.0
POLL = 0.05
PER_BATCH = 10
#: Nothing is written at an interval during the test: only a commit or a rebalance writes.
BROKER_ARGS = ("--initial-rebalance-delay", "0.2", "--commit-interval", "3600")


async def wait_for(condition: Callable[[], Any], what: str) -> None:
    with trio.move_on_after(WAIT):
        while not await condition():
            await trio.sleep(POLL)
        return
    raise AssertionError(f"not within {WAIT} s: {what}")


async def produce(broker: BrokerProcess, partitions: int) -> None:
    tcp, _ = await connect_any([broker.address])
    async with open_channel(tcp, client_id="test-producer") as channel:
        for partition in range(partitions):
            records = tuple(
                Record(offset=-1, timestamp_ms=0, key=None, value=b"x") for _ in range(PER_BATCH)
            )
            with trio.fail_after(WAIT):
                response = await channel.request(
                    ProduceRequest(topic="t", partition=partition, records=records)
                )
            assert isinstance(response, ProduceResponse)
            assert response.error_code is ErrorCode.NONE


async def drain(stream: RecordStream, seen: list[object]) -> None:
    async for record in stream:
        seen.append(record.offset)


def column(report: dict[str, Any], name: str) -> dict[int, int]:
    return {row["partition"]: row[name] for row in report["partitions"]}


def latest(report: dict[str, Any]) -> dict[int, int]:
    """The newest offset shown for each partition, committed or only reported."""
    return {
        row["partition"]: row["committed"] if row.get("reported") is None else row["reported"]
        for row in report["partitions"]
    }


async def test_committed_offsets_shown_before_a_kill_9_are_there_after_it(tmp_path: Path) -> None:
    data_dir = tmp_path / "broker"
    async with run_broker(data_dir, *BROKER_ARGS) as broker:
        async with open_admin([broker.address]) as admin:
            await admin.create_topic("t", 2)
        await produce(broker, 2)
        bootstrap = f"{broker.host}:{broker.port}"
        settings = ConsumerSettings(
            auto_offset_reset="earliest", session_timeout=6.0, request_timeout=2.0
        )
        seen: list[object] = []
        async with (
            open_consumer(bootstrap, "g", topics={"t": 1}, settings=settings) as consumer,
            trio.open_nursery() as app,
        ):
            for stream in consumer.streams:
                app.start_soon(drain, stream, seen)

            async def consumed(n: int) -> bool:
                return len(seen) >= n

            await wait_for(lambda: consumed(2 * PER_BATCH), "the first batch consumed")
            await consumer.commit()  # answered once durable: 10 on each partition
            await produce(broker, 2)
            await wait_for(lambda: consumed(4 * PER_BATCH), "the second batch consumed")

            before: dict[str, Any] = {}

            async def reported_by_a_ping() -> bool:
                before.update(await describe_group(broker, "g"))
                return latest(before) == {0: 2 * PER_BATCH, 1: 2 * PER_BATCH}

            await wait_for(reported_by_a_ping, "a Ping reports the second batch")
            await broker.kill()
            app.cancel_scope.cancel()

    async with run_broker(data_dir, *BROKER_ARGS) as broker:
        after = await describe_group(broker, "g")
    shown, now = column(before, "committed"), column(after, "committed")
    assert all(now[p] >= shown[p] for p in shown), (shown, now)
    assert shown == now == {0: PER_BATCH, 1: PER_BATCH}
    assert column(before, "reported") == {0: 2 * PER_BATCH, 1: 2 * PER_BATCH}
    assert column(after, "reported") == {0: None, 1: None}
