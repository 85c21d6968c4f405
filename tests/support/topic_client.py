"""A client of a test cluster that writes and reads a topic's partitions one request at a time, each
sent to the broker the cluster names for the partition: what a test needs to say exactly which
records were acknowledged and which a broker serves, with no batching, retrying or caching of
placement in between (the library's producer does all three)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import TypeVar

import attrs
import trio

from protocol import (
    ClusterMetadataRequest,
    ClusterMetadataResponse,
    CreateTopicRequest,
    CreateTopicResponse,
    DeleteTopicRequest,
    DeleteTopicResponse,
    ErrorCode,
    FetchRequest,
    FetchResponse,
    ProduceRequest,
    ProduceResponse,
    RequestMessage,
    ResponseMessage,
)
from protocol.batches import build_batch, records_from_batches
from protocol.records import Record
from protocol.types import NO_TOPIC_ID, TopicId
from transport.channel import Channel
from transport.connect import Address, connect_any, open_channel

_T = TypeVar("_T")

#: Bounds every request: CI has two busy cores, ZooKeeper's JVM among them.
REQUEST_DEADLINE = 30.0


class Unserved(Exception):
    """A broker refused to serve a partition's records (``error_code``)."""

    def __init__(self, what: str, error_code: ErrorCode) -> None:
        super().__init__(f"{what}: {error_code.name}")
        self.error_code = error_code


@attrs.define(eq=False)
class TopicClient:
    """Connected to one broker (``address``), and to the others as their partitions need: each
    connection is held by a task of the client's own nursery, so one may be opened from within
    any cancel scope."""

    address: Address
    _nursery: trio.Nursery
    _channels: dict[Address, Channel] = attrs.field(factory=dict)

    async def call(self, request: RequestMessage, at: Address | None = None) -> ResponseMessage:
        channel = await self._channel(at or self.address)
        with trio.fail_after(REQUEST_DEADLINE):
            return await channel.request(request)

    async def create_topic(
        self, topic: str, partitions: int, at: Address | None = None
    ) -> ErrorCode:
        response = await self.call(CreateTopicRequest(topic=topic, partitions=partitions), at)
        assert isinstance(response, CreateTopicResponse)
        return response.error_code

    async def delete_topic(self, topic: str, at: Address | None = None) -> ErrorCode:
        response = await self.call(DeleteTopicRequest(topic=topic), at)
        assert isinstance(response, DeleteTopicResponse)
        return response.error_code

    async def placement(self, topic: str, at: Address | None = None) -> dict[int, Address] | None:
        """Where each partition of ``topic`` is served, as the broker ``at`` (default: the
        connected one) says; None: it has no such topic."""
        seen = await self.incarnation(topic, at)
        return None if seen is None else seen[0]

    async def incarnation(
        self, topic: str, at: Address | None = None
    ) -> tuple[dict[int, Address], TopicId] | None:
        """Where each partition of ``topic`` is served and the topic's id (NO_TOPIC_ID from a
        broker that tells none), as the broker ``at`` (default: the connected one) says; None:
        it has no such topic."""
        response = await self.call(ClusterMetadataRequest(group_id=None, topics=(topic,)), at)
        assert isinstance(response, ClusterMetadataResponse)
        brokers = {b.broker_id: (b.host, b.port) for b in response.brokers}
        ids = {found.topic: found.topic_id for found in response.topic_ids}
        for found in response.topics:
            if found.topic == topic and found.error_code is ErrorCode.NONE:
                placement = {p.partition: brokers[p.broker_id] for p in found.partitions}
                return placement, ids.get(topic, NO_TOPIC_ID)
        return None

    async def produce(
        self,
        topic: str,
        partition: int,
        values: Sequence[bytes],
        at: Address,
        topic_id: TopicId = NO_TOPIC_ID,
    ) -> ProduceResponse:
        """One batch of ``values`` to the partition, at the broker ``at``, for the incarnation
        ``topic_id`` names (as the library's producer sends it; NO_TOPIC_ID: by name)."""
        request = ProduceRequest(
            topic=topic,
            partition=partition,
            records=(),
            batches=build_batch(values),
            topic_id=topic_id,
        )
        response = await self.call(request, at)
        assert isinstance(response, ProduceResponse)
        return response

    async def read(
        self, topic: str, partition: int, at: Address, topic_id: TopicId = NO_TOPIC_ID
    ) -> list[Record]:
        """Every record the broker ``at`` serves for the partition's incarnation ``topic_id``
        (as the library's consumer fetches; NO_TOPIC_ID: by name), from offset 0 to its high
        watermark; :class:`Unserved` if it refuses."""
        records: list[Record] = []
        offset = 0
        while True:
            request = FetchRequest(
                topic=topic,
                partition=partition,
                offset=offset,
                max_bytes=1 << 20,
                topic_id=topic_id,
            )
            response = await self.call(request, at)
            assert isinstance(response, FetchResponse)
            if response.error_code is not ErrorCode.NONE:
                raise Unserved(f"fetch {topic}-{partition} at {offset}", response.error_code)
            fetched = records_from_batches(response.batches, offset)
            if not fetched:
                return records
            records.extend(fetched)
            offset = fetched[-1].offset + 1

    async def _channel(self, address: Address) -> Channel:
        channel = self._channels.get(address)
        if channel is None or channel.closed:
            channel = await self._nursery.start(self._hold, address)
            self._channels[address] = channel
        return channel

    async def _hold(self, address: Address, *, task_status: trio.TaskStatus[Channel]) -> None:
        stream, _ = await connect_any([address])
        async with open_channel(stream, client_id="topic-client") as channel:
            task_status.started(channel)
            await trio.sleep_forever()


@contextlib.asynccontextmanager
async def open_topic_client(address: Address) -> AsyncIterator[TopicClient]:
    """A client whose own requests go to the broker at ``address``; its connections close at
    the block's end."""
    async with trio.open_nursery() as nursery:
        client = TopicClient(address=address, nursery=nursery)
        await client._channel(address)
        yield client
        nursery.cancel_scope.cancel()


async def at_once(*calls: Callable[[], Awaitable[_T]]) -> list[_T]:
    """Run ``calls`` side by side (their requests leave together); their results, in order."""
    results: dict[int, _T] = {}

    async def run(i: int) -> None:
        results[i] = await calls[i]()

    async with trio.open_nursery() as nursery:
        for i in range(len(calls)):
            nursery.start_soon(run, i)
    return [results[i] for i in range(len(calls))]
