"""What a newcomer runs into first, each a clear error or a logged warning in bounded time:
a string bootstrap for the producer, a forgotten ``await``, a wrong port, a missing topic, and
asyncio instead of trio."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest
import trio
import trio.testing

from consumer import (
    ConsumerSettings,
    CoordinatorUnavailable,
    NotAwaited,
    WrongEventLoop,
    open_consumer,
    open_producer,
)
from coordinator.config import CoordinatorConfig
from protocol import ErrorCode
from simulation import open_simulated_cluster
from statemachine.consumer import ConsumerState
from tests.consumer.inmemory import open_in_memory_cluster

#: Where these tests start: they read what was produced before they joined.
EARLIEST = ConsumerSettings(auto_offset_reset="earliest")

CONFIG = CoordinatorConfig(initial_rebalance_delay=1.0)


async def test_open_producer_takes_the_bootstrap_string_open_consumer_takes(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with (
        open_in_memory_cluster(tmp_path, CONFIG, {"t": 2}) as net,
        open_producer("b:1,b:2", connect=net.connect) as producer,
    ):
        assert producer.bootstrap == [("b", 1), ("b", 2)]
        assert await producer.partitions_for("t") == 2


async def test_a_send_that_was_never_awaited_fails_the_producer_block(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with open_in_memory_cluster(tmp_path, CONFIG, {"t": 2}) as net:
        with pytest.raises(NotAwaited, match=r"1 producer call\(s\) were never awaited"):
            async with open_producer("b:1", connect=net.connect) as producer:
                producer.send("t", b"lost")  # type: ignore[unused-coroutine]


async def test_a_send_started_as_a_task_is_not_forgotten(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with open_simulated_cluster(tmp_path, CONFIG) as cluster:
        await cluster.create_topic("t", partitions=1)
        async with (
            open_producer("b:1", connect=cluster.connect_to) as producer,
            trio.open_nursery() as nursery,
        ):
            nursery.start_soon(producer.send_and_wait, "t", b"as a task")
        assert [r.value for r in cluster.log.records("t", 0)] == [b"as a task"]


async def test_a_wrong_port_is_logged_reported_and_given_up_on(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    async def refuse(host: str, port: int) -> trio.abc.Stream:
        await trio.lowlevel.checkpoint()
        raise ConnectionRefusedError(f"[Errno 111] Connect call failed ({host!r}, {port})")

    settings = ConsumerSettings(auto_offset_reset="earliest", discovery_timeout=10.0)
    caplog.set_level(logging.WARNING, logger="consumer")
    with pytest.raises(CoordinatorUnavailable, match=r"127\.0\.0\.1:9999") as raised:
        async with open_consumer(
            "127.0.0.1:9999", "g", topics={"t": 1}, settings=settings, connect=refuse
        ) as consumer:
            await trio.sleep(0)
            assert consumer.last_error is None
            await trio.sleep(0.05)
            # the first pass failed at once: a warning says why, and last_error says so
            assert consumer.last_error is ErrorCode.COORDINATOR_NOT_AVAILABLE
            assert consumer.state is ConsumerState.DISCOVERING
            assert "cannot reach 127.0.0.1:9999" in caplog.text
            async for _ in consumer.streams[0]:
                pass
    assert "found in 10 s" in str(raised.value)
    assert trio.current_time() == pytest.approx(GIVE_UP_AT)


# Discovery passes at 0, then after backoffs 0.1, 0.2, 0.4, 0.8, 1.6, 3.2, 5, ...: the first
# pass at or after 10 s is the last.
GIVE_UP_AT = 0.1 + 0.2 + 0.4 + 0.8 + 1.6 + 3.2 + 5.0


async def test_a_subscription_to_a_missing_topic_warns(
    tmp_path: Path, autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="consumer")
    async with (
        open_in_memory_cluster(tmp_path, CONFIG, {"t": 2}) as net,
        open_consumer(
            "b:1", "g", settings=EARLIEST, topics={"t": 1, "typo": 1}, connect=net.connect
        ) as consumer,
    ):
        await consumer.assignment.wait_value(lambda a: len(a) == 2)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert [w for w in warnings if "'typo' does not exist" in w] == [
        "group g: subscribed topic 'typo' does not exist (UNKNOWN_TOPIC_OR_PARTITION): "
        "nothing of it is fetched until it is created"
    ]
    assert not [w for w in warnings if "'t'" in w]


def test_asyncio_instead_of_trio_is_a_clear_error() -> None:
    async def consume() -> None:
        async with open_consumer("127.0.0.1:9092", "g", settings=EARLIEST, topics={"t": 1}):
            pass

    async def produce() -> None:
        async with open_producer("127.0.0.1:9092"):
            pass

    with pytest.raises(WrongEventLoop, match=r"open_consumer runs under trio .*not asyncio"):
        asyncio.run(consume())
    with pytest.raises(WrongEventLoop, match=r"open_producer runs under trio .*not asyncio"):
        asyncio.run(produce())


async def test_an_error_in_the_block_comes_out_as_itself_after_a_graceful_close(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    """Not wrapped in an exception group by the library's nursery: ``except ValueError`` (or
    KeyboardInterrupt) catches what the application raised."""
    async with open_in_memory_cluster(tmp_path, CONFIG, {"t": 2}) as net:
        with pytest.raises(ValueError, match="the application's own error"):
            async with open_consumer(
                "b:1", "g", settings=EARLIEST, topics="t", connect=net.connect
            ) as consumer:
                await consumer.assignment.wait_value(lambda a: len(a) == 2)
                raise ValueError("the application's own error")
        assert consumer.state is ConsumerState.CLOSED  # it still closed gracefully
        with pytest.raises(KeyboardInterrupt):
            async with open_producer("b:1", connect=net.connect):
                raise KeyboardInterrupt
