"""The coordinator's question to a replicated partition's leader (broker/leader_offsets.py): its
high watermark by ListOffsets under the leader epoch the broker knows, asked once per leader epoch
while offsets stay below the answer, bounded in time; factor-1 partitions and partitions led here
are left to the local check. Leaders are channels in memory, virtual time."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import attrs
import pytest
import trio
import trio.testing

from broker.controller import ControlInputs
from broker.leader_offsets import ASK_BOUND, LeaderHighWatermarks
from coordinator.validation import LeaderUnavailable
from protocol import ErrorCode, ListOffsetsRequest, ListOffsetsResponse, Request, Role
from protocol.types import BrokerInfo, TopicPartition
from statemachine.partition_state import NO_LEADER, IsrEntry, PartitionKey, PartitionState
from store import TopicPlacement
from transport.channel import Channel

ME = 1
TOPIC = TopicPlacement.of(topic="r", assignment=((2, 1), (1, 2)), topic_id=uuid.uuid4())
SINGLE = TopicPlacement(topic="s", brokers=(2,), topic_id=uuid.uuid4())
LED_THERE, LED_HERE = TopicPartition(topic="r", partition=0), TopicPartition(topic="r", partition=1)
ONE = TopicPartition(topic="s", partition=0)
BROKERS = (BrokerInfo(broker_id=1, host="h1", port=1), BrokerInfo(broker_id=2, host="h2", port=2))


def led_by(leader: int, epoch: int) -> PartitionState:
    isr = tuple(IsrEntry(broker_id=b, log_dir=uuid.UUID(int=b)) for b in (1, 2))
    return PartitionState(leader=leader, leader_epoch=epoch, isr=isr, version=epoch)


@attrs.define
class Leader:
    """Broker 2: answers ListOffsets with ``high_watermark`` (or never, when ``silent``)."""

    high_watermark: int = 10
    silent: bool = False
    #: Answers with bytes that are no frame (a misbehaving peer).
    garbage: bool = False
    asked: list[ListOffsetsRequest] = attrs.Factory(list)
    connections: int = 0


@asynccontextmanager
async def lookup(leader: Leader) -> AsyncIterator[tuple[LeaderHighWatermarks, ControlInputs]]:
    control = ControlInputs(slots=1)
    control.learn(
        {
            PartitionKey(topic_id=TOPIC.topic_id, partition=0): led_by(2, 3),
            PartitionKey(topic_id=TOPIC.topic_id, partition=1): led_by(1, 0),
        }
    )
    async with trio.open_nursery() as nursery:

        async def connect(host: str, port: int) -> trio.abc.Stream:
            assert (host, port) == ("h2", 2)
            leader.connections += 1
            ours, theirs = trio.testing.memory_stream_pair()
            channel = Channel.open(theirs, Role.BROKER, max_frame_size=1 << 20)

            async def answer(request: Request) -> None:
                message = request.message
                assert isinstance(message, ListOffsetsRequest)
                leader.asked.append(message)
                if leader.silent:
                    return
                if leader.garbage:
                    await theirs.send_all(b"\xff\xff\xff\xff not a frame")
                    return
                response = ListOffsetsResponse(
                    error_code=ErrorCode.NONE,
                    log_start_offset=0,
                    high_watermark=leader.high_watermark,
                    leader_id=2,
                    leader_epoch=message.current_leader_epoch,
                )
                await channel.respond(request, response)

            nursery.start_soon(channel.run, answer)
            return ours

        yield (
            LeaderHighWatermarks(
                me=ME,
                control=control,
                topics=lambda: {"r": TOPIC, "s": SINGLE},
                brokers=lambda: BROKERS,
                nursery=nursery,
                connect=connect,
            ),
            control,
        )
        nursery.cancel_scope.cancel()


async def test_the_leader_tells_and_is_asked_again_only_when_needed(
    autojump_clock: trio.testing.MockClock,
) -> None:
    leader = Leader()
    async with lookup(leader) as (high_watermarks, control):
        offsets = {LED_THERE: 7, LED_HERE: 100, ONE: 100}
        assert await high_watermarks(offsets) == {LED_THERE: 10}
        assert [(m.topic, m.partition, m.current_leader_epoch) for m in leader.asked] == [
            ("r", 0, 3)
        ]
        # Below what the leader told under this epoch: no question.
        assert await high_watermarks({LED_THERE: 10}) == {LED_THERE: 10}
        assert len(leader.asked) == 1
        # Above it: asked again, on the same connection.
        leader.high_watermark = 12
        assert await high_watermarks({LED_THERE: 11}) == {LED_THERE: 12}
        # A new leader epoch: asked again whatever the offset.
        control.learn({PartitionKey(topic_id=TOPIC.topic_id, partition=0): led_by(2, 4)})
        await high_watermarks({LED_THERE: 0})
        assert [m.current_leader_epoch for m in leader.asked] == [3, 3, 4]
        assert leader.connections == 1


async def test_a_leader_that_cannot_tell_makes_the_commit_retriable(
    autojump_clock: trio.testing.MockClock,
) -> None:
    leader = Leader(silent=True)
    async with lookup(leader) as (high_watermarks, control):
        start = trio.current_time()
        with pytest.raises(LeaderUnavailable, match="no answer"):
            await high_watermarks({LED_THERE: 1})
        assert trio.current_time() - start == pytest.approx(ASK_BOUND)
        control.learn({PartitionKey(topic_id=TOPIC.topic_id, partition=0): led_by(NO_LEADER, 5)})
        with pytest.raises(LeaderUnavailable, match="no leader"):
            await high_watermarks({LED_THERE: 1})


async def test_a_peer_that_breaks_the_protocol_ends_its_connection_only(
    autojump_clock: trio.testing.MockClock,
) -> None:
    leader = Leader(garbage=True)
    async with lookup(leader) as (high_watermarks, _):
        with pytest.raises(LeaderUnavailable, match="broker 2"):
            await high_watermarks({LED_THERE: 1})
        # the broker goes on (the lookup's nursery, the elector's in a broker, is not ended),
        # and the next question opens a new connection
        leader.garbage = False
        assert await high_watermarks({LED_THERE: 1}) == {LED_THERE: 10}
        assert leader.connections == 2
