"""A consumer refused by its coordinator ends, rather than registering again for ever: it stops
its fetchers, closes its connection cleanly, and its streams raise the refusal."""

from __future__ import annotations

import pytest
import trio
import trio.testing

from consumer import ConsumerSettings, GroupAuthorizationFailed, open_consumer
from protocol import ErrorCode
from protocol.types import TopicPartition
from tests.consumer.inmemory import open_scripted_coordinator

T0 = TopicPartition(topic="t", partition=0)


async def test_a_group_refused_on_registering_again_stops_the_fetchers_and_ends_the_streams(
    autojump_clock: trio.testing.MockClock,
) -> None:
    settings = ConsumerSettings(
        auto_offset_reset="earliest", session_timeout=6.0, failover_jitter=0.0
    )
    async with open_scripted_coordinator() as coordinator:
        async with open_consumer(
            "broker:9092", "g", topics={"t": 1}, settings=settings, connect=coordinator.connect
        ) as consumer:
            member = await coordinator.member()
            await member.start(1, member.streams(("t", 0, 0)))
            await trio.sleep_until(1.0)
            assert consumer.assignment.value == {T0}
            # the group's rule is removed, and the connection lost: the consumer registers again
            coordinator.register_answer = ErrorCode.GROUP_AUTHORIZATION_FAILED
            await member.channel.aclose()
            (stream,) = consumer.streams
            with pytest.raises(GroupAuthorizationFailed, match="group 'g': not allowed to read"):
                async for _ in stream:
                    pass
            refused_at = trio.current_time()
            assert consumer.assignment.value == frozenset()
        assert len(coordinator.registrations) == 2  # refused once, not asked again
        assert refused_at == 1.0
        assert max(at for at, _, _ in coordinator.log.fetches) <= refused_at
