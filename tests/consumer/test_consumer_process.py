"""The consumer library against a real broker process over TCP, on the real clock.

Waits are bounded conditions (CI has two busy cores); the numbers the tests measure are printed
for the record and asserted only against generous bounds.
"""

from __future__ import annotations

import collections
from collections.abc import Callable
from pathlib import Path

import pytest
import trio

from consumer import ConsumerSettings, RecordStream, open_consumer
from consumer.admin import open_admin
from launch.processes import run_broker
from protocol import ErrorCode, ProduceRequest, ProduceResponse
from protocol.records import Record
from protocol.types import TopicPartition
from transport.connect import connect_any, open_channel

pytestmark = pytest.mark.realtime

WAIT = 30.0
POLL = 0.05
SETTINGS = ConsumerSettings(auto_offset_reset="earliest", session_timeout=6.0)
BROKER_ARGS = ("--initial-rebalance-delay", "0.2")
ALL_12 = frozenset(TopicPartition(topic="t", partition=p) for p in range(12))


async def wait_for(condition: Callable[[], bool], what: str) -> float:
    """Poll ``condition`` every 50 ms for at most WAIT seconds; returns the seconds it took."""
    start = trio.current_time()
    with trio.move_on_after(WAIT):
        while not condition():
            await trio.sleep(POLL)
        return trio.current_time() - start
    raise AssertionError(f"not within {WAIT} s: {what}")


async def test_a_group_splits_a_topic_grows_and_hands_over_at_once_on_close(
    tmp_path: Path,
) -> None:
    async with run_broker(tmp_path / "broker", *BROKER_ARGS) as broker:
        bootstrap = f"{broker.host}:{broker.port}"
        async with open_admin([broker.address]) as admin:
            await admin.create_topic("t", 12)
        async with (
            # a's first bootstrap broker is down: round robin goes on to the next
            open_consumer(f"127.0.0.1:1,{bootstrap}", "g", topics={"t": 1}, settings=SETTINGS) as a,
            open_consumer(bootstrap, "g", topics={"t": 1}, settings=SETTINGS) as b,
        ):
            await wait_for(
                lambda: (
                    a.assignment.value | b.assignment.value == ALL_12
                    and len(a.assignment.value) == 6
                ),
                "two consumers split 12 partitions 6/6",
            )
            async with open_consumer(bootstrap, "g", topics={"t": 1}, settings=SETTINGS) as c:
                took = await wait_for(
                    lambda: (
                        a.assignment.value | b.assignment.value | c.assignment.value == ALL_12
                        and all(len(m.assignment.value) == 4 for m in (a, b, c))
                    ),
                    "a third consumer takes its share, 4/4/4",
                )
                print(f"join -> 4/4/4: {took:.3f} s")
                # a and b only gave partitions up (a revocation): they keep their generation
                assert a.generation == b.generation < c.generation
                await wait_for(lambda: a.generation == b.generation, "the group is stable")
                async with open_admin([broker.address]) as admin:
                    report = await admin.describe_group("g")
                    assert report.state == "Stable"
                    assert sorted(len(m.partitions) for m in report.members) == [4, 4, 4]
                start = trio.current_time()
                await c.aclose()
                moved = await wait_for(
                    lambda: (
                        a.assignment.value | b.assignment.value == ALL_12
                        and len(a.assignment.value) == 6
                    ),
                    "the leaver's partitions move to the other two",
                )
                moved = trio.current_time() - start
                print(f"graceful close -> 6/6: {moved:.3f} s")
                # at once: far below the 2T/3 = 4 s before a silent member could be declared dead
                assert moved < SETTINGS.session_timeout / 3
            await b.aclose()
            await wait_for(lambda: a.assignment.value == ALL_12, "the last one takes all")


async def drain(stream: RecordStream, seen: list[tuple[TopicPartition, int, bytes]]) -> None:
    async for record in stream:
        assert record.value is not None
        seen.append((record.topic_partition, record.offset, record.value))


async def test_a_group_consumes_every_record_exactly_once_while_nobody_fails(
    tmp_path: Path,
) -> None:
    per_partition = 50
    async with run_broker(tmp_path / "broker", *BROKER_ARGS) as broker:
        bootstrap = f"{broker.host}:{broker.port}"
        async with open_admin([broker.address]) as admin:
            await admin.create_topic("t", 12)
        sent: set[bytes] = set()
        tcp, _ = await connect_any([broker.address])
        async with open_channel(tcp, client_id="test-producer") as channel:
            for partition in range(12):
                values = [f"t/{partition}/{i}".encode() for i in range(per_partition)]
                sent.update(values)
                records = tuple(
                    Record(offset=-1, timestamp_ms=0, key=None, value=v) for v in values
                )
                with trio.fail_after(WAIT):
                    response = await channel.request(
                        ProduceRequest(topic="t", partition=partition, records=records)
                    )
                assert isinstance(response, ProduceResponse)
                assert response.error_code is ErrorCode.NONE
        seen: list[tuple[TopicPartition, int, bytes]] = []
        start = trio.current_time()
        async with (
            open_consumer(bootstrap, "g", topics={"t": 2}, settings=SETTINGS) as a,
            open_consumer(bootstrap, "g", topics={"t": 2}, settings=SETTINGS) as b,
            open_consumer(bootstrap, "g", topics={"t": 2}, settings=SETTINGS) as c,
        ):
            async with trio.open_nursery() as app:
                for member in (a, b, c):
                    for record_stream in member.streams:
                        app.start_soon(drain, record_stream, seen)
                await wait_for(lambda: len(seen) >= len(sent), "every record consumed")
                took = trio.current_time() - start
                print(f"{len(seen)} records by 3 consumers x 2 streams in {took:.3f} s")
                owners = [m.assignment.value for m in (a, b, c)]
                assert sum(len(o) for o in owners) == 12
                assert frozenset().union(*owners) == ALL_12
                app.cancel_scope.cancel()
            # Leave one at a time, each once the group is fetching again: the coordinator drops
            # the StopFetcher offsets of a member that leaves right after answering (reported).
            await c.aclose()
            await wait_for(lambda: a.assignment.value | b.assignment.value == ALL_12, "6/6")
            await b.aclose()
            await wait_for(lambda: a.assignment.value == ALL_12, "a takes all 12")
        assert collections.Counter(v for _, _, v in seen).most_common(1)[0][1] == 1
        assert {v for _, _, v in seen} == sent
        positions = collections.Counter(tp for tp, _, _ in seen)
        # every stream had asked for its next record, so every record seen was finished, and
        # the graceful closes committed exactly that
        async with open_admin([broker.address]) as admin:
            report = await admin.describe_group("g")
        committed = {
            TopicPartition(topic=p.topic, partition=p.partition): p.committed
            for p in report.partitions
        }
        assert committed == {tp: positions[tp] for tp in ALL_12}
