"""What a user porting aiokafka code writes, and what it does here: ``send`` hands back a delivery
to await and ``send_and_wait`` waits, the old meaning of an awaited ``send`` is never changed
silently, the names import from ``consumer``, the offset reset defaults to latest as in Kafka,
and each usual mistake is a clear error naming its fix. In-memory cluster, autojump clock."""

from __future__ import annotations

import argparse
import re
import warnings
from pathlib import Path

import pytest
import trio
import trio.testing

import consumer
from cli.data import _offset_reset
from consumer import (
    CommitFailed,
    ConsumerSettings,
    NotAwaited,
    PartitionNotAssigned,
    SendDoesNotWait,
    TopicPartition,
    open_admin,
    open_consumer,
    open_producer,
)
from coordinator.config import CoordinatorConfig
from protocol import ErrorCode
from simulation import open_simulated_cluster
from tests.consumer.inmemory import open_in_memory_cluster

CONFIG = CoordinatorConfig(initial_rebalance_delay=1.0)
LINGER = 0.005  # ProducerConfig's default
T0 = TopicPartition(topic="t", partition=0)


async def test_send_returns_the_delivery_at_once_and_send_and_wait_waits_for_the_broker(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with open_simulated_cluster(tmp_path, CONFIG) as cluster:
        await cluster.create_topic("t", partitions=1)
        async with open_producer("b:1", connect=cluster.connect_to) as producer:
            await producer.partitions_for("t")
            start = trio.current_time()
            deliveries = [await producer.send("t", b"%d" % n) for n in range(100)]
            # aiokafka's send: queued, no time spent, nothing acknowledged yet
            assert trio.current_time() == start
            assert not any(d.done for d in deliveries)
            assert [await d for d in deliveries] == [(0, n) for n in range(100)]
            assert trio.current_time() == pytest.approx(start + LINGER)  # one batch

            start = trio.current_time()
            assert await producer.send_and_wait("t", b"100") == (0, 100)
            assert trio.current_time() == pytest.approx(start + LINGER)  # the acknowledgement
            assert [r.value for r in cluster.log.records("t", 0)][-1] == b"100"


async def test_code_that_used_the_old_send_result_gets_an_error_naming_send_and_wait(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with open_simulated_cluster(tmp_path, CONFIG) as cluster:
        await cluster.create_topic("t", partitions=1)
        async with open_producer("b:1", connect=cluster.connect_to) as producer:
            with pytest.raises(TypeError, match=r"send_and_wait"):
                _partition, _offset = await producer.send("t", b"x")
            delivery = await producer.send("t", b"y")
            with pytest.raises(TypeError, match=r"send_and_wait"):
                assert delivery == (0, 1)
            with pytest.raises(TypeError, match=r"send_and_wait"):
                delivery[1]
            assert await delivery.wait() == (0, 1)


async def test_a_sent_record_nobody_awaited_warns_that_send_no_longer_waits(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    """Code that relied on an awaited ``send`` meaning "stored" now races: told, naming the line
    and ``send_and_wait``, at the end of the block (and at ``flush``); the records are stored."""
    async with open_simulated_cluster(tmp_path, CONFIG) as cluster:
        await cluster.create_topic("t", partitions=1)
        with pytest.warns(SendDoesNotWait) as caught:
            async with open_producer("b:1", connect=cluster.connect_to) as producer:
                await producer.send("t", b"relied on")
                line = _line_of("relied on")
                await producer.send("t", b"this one too")
        (warning,) = caught
        assert re.search(r"2 record\(s\) were sent with `await producer.send", str(warning.message))
        assert f"test_aiokafka_habits.py:{line}" in str(warning.message)
        assert "send_and_wait" in str(warning.message)
        assert [r.value for r in cluster.log.records("t", 0)] == [b"relied on", b"this one too"]

        with pytest.warns(SendDoesNotWait, match="1 record"):
            async with open_producer("b:1", connect=cluster.connect_to) as producer:
                await producer.send("t", b"at flush")
                await producer.flush()

        # awaited deliveries, send_and_wait and enqueue (which never meant waiting): no warning
        with warnings.catch_warnings():
            warnings.simplefilter("error", SendDoesNotWait)
            async with open_producer("b:1", connect=cluster.connect_to) as producer:
                delivery = await producer.send("t", b"a")
                await producer.send_and_wait("t", b"b")
                await producer.enqueue("t", b"c")
                assert delivery.offset in (-1, 3)  # looked at: the code handles the delivery


def _line_of(marker: str) -> int:
    text = Path(__file__).read_text().splitlines()
    return next(n for n, line in enumerate(text, 1) if f'b"{marker}"' in line)


def test_the_names_an_aiokafka_user_imports_come_from_consumer() -> None:
    from protocol.types import TopicPartition as Original

    assert TopicPartition is Original
    assert open_admin.__module__ == "consumer.admin"
    assert {"TopicPartition", "open_admin", "SendDoesNotWait"} <= set(consumer.__all__)


async def test_the_offset_reset_defaults_to_latest_in_the_library_and_the_cli(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    cli_default = argparse.Namespace(from_beginning=False, auto_offset_reset=None)
    assert ConsumerSettings().auto_offset_reset == _offset_reset(cli_default) == "latest"
    # The in-memory cluster writes 10 records a second to each partition: a default consumer
    # that joins at 3 s starts at the end, not at offset 0.
    async with open_in_memory_cluster(tmp_path, CONFIG, {"t": 1}) as net:
        await trio.sleep(3.0)
        async with open_consumer("b:1", "g", topics="t", connect=net.connect) as c:
            first = await c.__anext__()
        assert first.offset >= 30


async def test_a_value_or_key_that_is_not_bytes_without_a_serializer_names_the_serializer(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with open_simulated_cluster(tmp_path, CONFIG) as cluster:
        await cluster.create_topic("t", partitions=2)
        async with open_producer("b:1", connect=cluster.connect_to) as producer:
            with pytest.raises(TypeError, match=r"value_serializer=str\.encode"):
                await producer.send("t", "text")
            with pytest.raises(TypeError, match=r"key_serializer=str\.encode"):
                await producer.send_and_wait("t", b"v", key="user-1")
            with pytest.raises(TypeError, match=r"not dict: pass a value_serializer"):
                await producer.enqueue("t", {"n": 1})
            # nothing was half-sent: the producer goes on, and its block ends
            assert await producer.send_and_wait("t", b"bytes", key=b"k") is not None
            assert await producer.send_and_wait("t", bytearray(b"buffer")) is not None
        stored = {r.value for p in (0, 1) for r in cluster.log.records("t", p)}
        assert stored == {b"buffer", b"bytes"}


@pytest.mark.parametrize(
    ("headers", "fix"),
    [
        ({"trace": b"1"}, r"not a dict: pass list\(headers\.items\(\)\)"),
        ([("trace",)], r"\(name: str, value: bytes \| None\) pairs.*got \('trace',\)"),
        ([("trace", b"1", b"2")], r"got \('trace', b'1', b'2'\)"),
        ("trace", r"not str"),
        ([(b"trace", b"1")], r"the name b'trace' is bytes"),
        ([("trace", "1")], r"the value of 'trace' is str: encode it"),
    ],
)
async def test_malformed_headers_are_a_type_error_showing_the_form(
    tmp_path: Path, autojump_clock: trio.testing.MockClock, headers: object, fix: str
) -> None:
    async with open_simulated_cluster(tmp_path, CONFIG) as cluster:
        await cluster.create_topic("t", partitions=1)
        async with open_producer("b:1", connect=cluster.connect_to) as producer:
            with pytest.raises(TypeError, match=fix):
                await producer.send_and_wait("t", b"v", headers=headers)  # type: ignore[arg-type]
            assert await producer.send_and_wait("t", b"w", headers=[("ok", None)]) == (0, 0)


async def test_a_commit_of_a_partition_not_assigned_names_it_and_is_a_value_error(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    settings = ConsumerSettings(auto_commit=False)
    async with (
        open_in_memory_cluster(tmp_path, CONFIG, {"t": 1, "other": 1}) as net,
        open_consumer("b:1", "g", topics="t", settings=settings, connect=net.connect) as c,
    ):
        await c.assignment.wait_value(lambda owned: owned == {T0})
        foreign = TopicPartition(topic="other", partition=0)
        with pytest.raises(ValueError, match=r"other-0 not assigned to this consumer") as raised:
            await c.commit({T0: 1, foreign: 5})
        assert isinstance(raised.value, PartitionNotAssigned)
        assert isinstance(raised.value, CommitFailed)  # what a rebalance race was caught as
        assert raised.value.partitions == (foreign,)
        assert raised.value.error_code is ErrorCode.ILLEGAL_GENERATION  # the coordinator's word
        assert "it owns t-0" in str(raised.value)
        await c.commit({T0: 1})  # its own partition commits
        assert await c.committed(T0) == 1


async def test_a_commit_never_awaited_fails_the_consumer_block(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with open_in_memory_cluster(tmp_path, CONFIG, {"t": 1}) as net:
        with pytest.raises(NotAwaited, match=r"1 consumer call\(s\) were never awaited") as raised:
            async with open_consumer("b:1", "g", topics="t", connect=net.connect) as c:
                await c.assignment.wait_value(lambda owned: owned == {T0})
                c.commit({T0: 3})  # type: ignore[unused-coroutine]
        assert "await consumer.commit(...)" in str(raised.value)


async def test_seek_to_beginning_and_end_may_be_awaited_as_in_aiokafka(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    settings = ConsumerSettings(auto_offset_reset="earliest", auto_commit=False)
    async with (
        open_in_memory_cluster(tmp_path, CONFIG, {"t": 1}) as net,
        open_consumer("b:1", "g", topics="t", settings=settings, connect=net.connect) as c,
    ):
        await trio.sleep(3.0)
        c.seek(T0, 20)
        assert (await c.__anext__()).offset == 20
        await c.seek_to_beginning()
        assert (await c.__anext__()).offset == 0
        await c.seek_to_end(T0)
        assert (await c.__anext__()).offset >= 30
        c.seek_to_beginning(T0)  # the form without await goes on working
        assert (await c.__anext__()).offset == 0


def test_docs_name_only_compressions_that_exist() -> None:
    """docs/producer.md's `compression` row lists what ``Compression`` has (no GZIP)."""
    from protocol.batches import Compression

    docs = (Path(__file__).parents[2] / "docs" / "producer.md").read_text()
    (row,) = [line for line in docs.splitlines() if line.startswith("| `config` |")]
    named = set(re.findall(r"`(?:Compression\.)?([A-Z0-9]+)`", row))
    assert named == {c.name for c in Compression}
