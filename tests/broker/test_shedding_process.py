"""Shedding at the door in a real broker process (docs/design.md#shedding-load): its loop
stalls (SIGSTOP) while newcomers connect; once it runs again, the members already in keep their
place and the newcomers are told BROKER_BUSY, back off and get in."""

from __future__ import annotations

import signal
from contextlib import AsyncExitStack
from pathlib import Path

import pytest
import trio

from consumer import ConsumerSettings, open_consumer
from consumer.admin import open_admin
from launch.processes import run_broker
from protocol import ErrorCode
from protocol.types import TopicPartition
from tests.consumer.test_consumer_process import wait_for

pytestmark = pytest.mark.realtime

SETTINGS = ConsumerSettings(session_timeout=6.0)
ALL_12 = frozenset(TopicPartition(topic="t", partition=p) for p in range(12))


async def test_a_stalled_broker_keeps_its_members_and_makes_newcomers_back_off(
    tmp_path: Path,
) -> None:
    async with run_broker(
        tmp_path / "broker", "--initial-rebalance-delay", "0.2", "--shed-above-lag", "0.5"
    ) as broker:
        bootstrap = f"{broker.host}:{broker.port}"
        async with open_admin([broker.address]) as admin:
            await admin.create_topic("t", 12)
        async with AsyncExitStack() as stack:
            members = [
                await stack.enter_async_context(
                    open_consumer(bootstrap, "g", topics={"t": 1}, settings=SETTINGS)
                )
                for _ in range(3)
            ]
            await wait_for(
                lambda: all(len(m.assignment.value) == 4 for m in members), "3 members, 4 each"
            )
            # The broker's loop stalls for 1.5 s (less than a Ping deadline, 2T/3 = 4 s) while
            # six newcomers connect and ask for the coordinator: their requests wait in the
            # socket buffers, and the broker reads them with its loop 1.5 s behind.
            broker.process.send_signal(signal.SIGSTOP)
            try:
                newcomers = [
                    await stack.enter_async_context(
                        open_consumer(bootstrap, "g", topics={"t": 1}, settings=SETTINGS)
                    )
                    for _ in range(6)
                ]
                await trio.sleep(1.5)
            finally:
                broker.process.send_signal(signal.SIGCONT)
            told: set[str] = set()

            def everyone_in() -> bool:
                told.update(n.member_id for n in newcomers if n.last_error is ErrorCode.BROKER_BUSY)
                consumers = (*members, *newcomers)
                return all(c.assignment.value for c in consumers) and sum(
                    len(c.assignment.value) for c in consumers
                ) == len(ALL_12)

            took = await wait_for(everyone_in, "nine consumers share the 12 partitions")
            print(f"all in {took:.1f} s after the stall; told BROKER_BUSY: {len(told)} of 6")
            # Each was told to wait (BROKER_BUSY, with a hint of twice the lag, about 3 s): not
            # let in on the stalled loop, and not refused for good.
            assert len(told) == 6
            assert took >= 2.5
            # Nobody already in was declared dead.
            assert " is dead " not in broker.log_text()
