"""The coordinator's check of a committed offset for a replicated partition led by another broker
(docs/design.md#replication): that leader's high watermark, asked with ListOffsets, not this
broker's replica, which may lag (refusing good commits) or hold records not yet committed
(admitting bad ones).

One connection per leader broker, kept while it answers, and the last high watermark each
leader told, per leader epoch: an offset at or below it needs no question (a high watermark only
rises under one leader epoch). Every question is bounded (``ASK_BOUND``); a leader that cannot
answer in time, or a partition without a leader, makes the commit retriable
(``coordinator.validation.LeaderUnavailable``).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping

import attrs
import trio

from broker.controller import ControlInputs
from consumer.runtime import first_cause
from coordinator.validation import LeaderUnavailable
from protocol import ErrorCode, ListOffsetsRequest, ListOffsetsResponse, RemoteProtocolError
from protocol.types import BrokerInfo, TopicPartition
from statemachine.partition_state import NO_LEADER, PartitionKey
from store import TopicPlacement
from transport.channel import Channel
from transport.connect import open_channel
from transport.refusals import ChannelClosed, Refused

__all__ = ["ASK_BOUND", "LeaderHighWatermarks"]

log = logging.getLogger(__name__)

#: How long a commit waits for the leaders' high watermarks before it is answered retriable.
ASK_BOUND = 2.0
#: The ListOffsets version that carries the leader epoch (a fenced leader refuses it).
_LIST_OFFSETS_VERSION = 2

Connect = Callable[[str, int], Awaitable[trio.abc.Stream]]


@attrs.define(eq=False)
class LeaderHighWatermarks:
    """``coordinator.validation.HighWatermarks`` of a broker of a cluster, from its view of the
    topics, the partition states and the live brokers."""

    me: int
    control: ControlInputs
    topics: Callable[[], Mapping[str, TopicPlacement]]
    brokers: Callable[[], tuple[BrokerInfo, ...]]
    #: Owns the connections to the leaders.
    nursery: trio.Nursery
    #: How to reach another broker (TLS and SASL as the cluster's listeners ask).
    connect: Connect = trio.open_tcp_stream
    _channels: dict[int, tuple[tuple[str, int], Channel, trio.CancelScope]] = attrs.Factory(dict)
    #: Partition (of one incarnation of its topic: one created again under the name starts at
    #: leader epoch 0 again) -> (leader epoch, the high watermark its leader last told).
    _known: dict[PartitionKey, tuple[int, int]] = attrs.Factory(dict)

    async def __call__(self, offsets: Mapping[TopicPartition, int]) -> Mapping[TopicPartition, int]:
        topics = self.topics()
        found: dict[TopicPartition, int] = {}
        asks: dict[int, list[tuple[TopicPartition, PartitionKey, int]]] = {}
        for tp, offset in offsets.items():
            placement = topics.get(tp.topic)
            if placement is None or placement.replication_factor == 1:
                continue  # factor 1 (or unknown: refused elsewhere), checked as always
            key = PartitionKey(topic_id=placement.topic_id, partition=tp.partition)
            state = self.control.states.get(key)
            if state is None or state.leader == NO_LEADER:
                raise LeaderUnavailable(f"{tp.topic}-{tp.partition} has no leader now")
            if state.leader == self.me:
                continue  # led here: the log end this broker tells is the leader's
            known = self._known.get(key)
            if known is not None and known[0] == state.leader_epoch and known[1] >= offset:
                found[tp] = known[1]
            else:
                asks.setdefault(state.leader, []).append((tp, key, state.leader_epoch))
        if not asks:
            return found
        failed: list[str] = []
        with trio.move_on_after(ASK_BOUND) as bound:
            async with trio.open_nursery() as nursery:
                for leader, wanted in asks.items():
                    nursery.start_soon(self._ask, leader, wanted, found, failed)
        if bound.cancelled_caught:
            failed.append(f"no answer in {ASK_BOUND:g} s")
        if failed:
            raise LeaderUnavailable("; ".join(failed))
        return found

    async def _ask(
        self,
        leader: int,
        wanted: list[tuple[TopicPartition, PartitionKey, int]],
        found: dict[TopicPartition, int],
        failed: list[str],
    ) -> None:
        try:
            channel = await self._channel(leader)
            for tp, key, epoch in wanted:
                request = ListOffsetsRequest(
                    topic=tp.topic, partition=tp.partition, current_leader_epoch=epoch
                )
                response = await channel.request(request, api_version=_LIST_OFFSETS_VERSION)
                if not isinstance(response, ListOffsetsResponse):
                    raise ChannelClosed(f"broker {leader} answered {type(response).__name__}")
                if response.error_code is not ErrorCode.NONE:
                    failed.append(f"broker {leader} on {tp}: {response.error_code.name}")
                    continue
                self._known[key] = (epoch, response.high_watermark)
                found[tp] = response.high_watermark
        except (OSError, trio.BrokenResourceError, ChannelClosed, Refused) as exc:
            failed.append(f"broker {leader}: {exc}")
            self._forget(leader)

    async def _channel(self, leader: int) -> Channel:
        """The connection to ``leader`` at the address it has now."""
        info = next((b for b in self.brokers() if b.broker_id == leader), None)
        if info is None:
            raise ChannelClosed(f"broker {leader} is not live")
        address = (info.host, info.port)
        held = self._channels.get(leader)
        if held is not None and held[0] == address and not held[1].closed:
            return held[1]
        self._forget(leader)
        channel: Channel = await self.nursery.start(self._keep, leader, address)
        return channel

    async def _keep(
        self, leader: int, address: tuple[str, int], *, task_status: trio.TaskStatus[Channel]
    ) -> None:
        """Hold a connection to ``leader`` until it is forgotten, or fails: a peer that breaks
        the protocol or drops the connection ends this connection and nothing else (its
        questions in flight fail as a leader's that cannot tell). The channel's nursery wraps
        what ended it."""
        stream = await self.connect(*address)
        try:
            with trio.CancelScope() as scope:
                async with open_channel(stream, client_id=f"broker-{self.me}") as channel:
                    self._channels[leader] = (address, channel, scope)
                    task_status.started(channel)
                    try:
                        await trio.sleep_forever()
                    finally:
                        if self._channels.get(leader, (None, None))[1] is channel:
                            del self._channels[leader]
        except* (OSError, trio.BrokenResourceError, RemoteProtocolError, ChannelClosed) as failed:
            log.warning("the connection to broker %d failed: %s", leader, first_cause(failed))

    def _forget(self, leader: int) -> None:
        held = self._channels.pop(leader, None)
        if held is not None:
            held[2].cancel()
