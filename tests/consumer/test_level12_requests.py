"""The library's clients speak level 12 (SPEC.md §11.13) with the values that keep what they did
before it: the producer asks acks=1, the consumer and the admin name no leader epoch, and a topic
the admin creates has one replica. What each sends is read off the wire as the broker reads it."""

from __future__ import annotations

from pathlib import Path

import attrs
import trio
import trio.testing

from consumer import ConsumerSettings, ProducerConfig, open_consumer, open_producer
from consumer.admin import AdminError, open_admin
from coordinator.config import CoordinatorConfig
from protocol import (
    NEED_DATA,
    ApiKey,
    ClusterMetadataRequest,
    Connection,
    CreateTopicRequest,
    ErrorCode,
    FetchRequest,
    ListOffsetsRequest,
    ProduceRequest,
    Request,
    RequestMessage,
    Role,
)
from protocol.types import TopicPartition
from simulation import open_simulated_cluster

CONFIG = CoordinatorConfig(initial_rebalance_delay=1.0)


@attrs.define(eq=False)
class _Tap(trio.abc.Stream):
    """A client's connection whose outgoing bytes are also read as the broker reads them."""

    inner: trio.abc.Stream
    sent: list[Request]
    reader: Connection = attrs.field(factory=lambda: Connection(Role.BROKER))
    #: Bytes of a frame not yet whole.
    pending: bytearray = attrs.field(factory=bytearray)

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        self.pending += data
        while len(self.pending) >= 4:
            end = 4 + int.from_bytes(self.pending[:4], "big")
            if len(self.pending) < end:
                break
            frame, self.pending[:end] = bytes(self.pending[:end]), b""
            if frame[4] == 0:  # a request (SPEC.md §3); a member's responses are not read here
                self.reader.receive_data(frame)
                while (event := self.reader.next_event()) is not NEED_DATA:
                    if isinstance(event, Request):
                        self.sent.append(event)
        await self.inner.send_all(data)

    async def wait_send_all_might_not_block(self) -> None:
        await self.inner.wait_send_all_might_not_block()

    async def receive_some(self, max_bytes: int | None = None) -> bytes | bytearray:
        return await self.inner.receive_some(max_bytes)

    async def send_eof(self) -> None:
        await self.inner.send_eof()  # type: ignore[attr-defined]

    async def aclose(self) -> None:
        await self.inner.aclose()


def _of(sent: list[Request], api_key: ApiKey) -> list[tuple[int, RequestMessage]]:
    return [(r.api_version, r.message) for r in sent if r.message.API_KEY is api_key]


async def test_the_producer_consumer_and_admin_send_level_12_keeping_their_meaning(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    sent: list[Request] = []
    async with open_simulated_cluster(tmp_path, CONFIG) as cluster:

        async def connect(host: str, port: int) -> trio.abc.Stream:
            return _Tap(inner=await cluster.connect_to(host, port), sent=sent)

        async with open_admin("b:1", connect=connect) as admin:
            await admin.create_topic("t", 1)
            bounds = await admin.log_bounds(["t"])
        assert bounds == {TopicPartition(topic="t", partition=0): (0, 0)}
        config = ProducerConfig(linger=0.0)
        async with open_producer("b:1", connect=connect, config=config) as producer:
            await producer.partitions_for("t")
            assert await producer.enqueue_nowait("t", b"v").wait() == (0, 0)
        settings = ConsumerSettings(auto_offset_reset="earliest")
        async with open_consumer(
            "b:1", "g", topics={"t": 1}, settings=settings, connect=connect
        ) as consumer:
            (stream,) = consumer.streams
            with trio.fail_after(30):
                record = await anext(aiter(stream))
        assert record.value == b"v"

    (created,) = _of(sent, ApiKey.CREATE_TOPIC)
    assert created[0] == 3
    assert isinstance(created[1], CreateTopicRequest)
    assert created[1].replication_factor == 1
    produced = _of(sent, ApiKey.PRODUCE)
    assert [v for v, _ in produced] == [3]
    assert all(isinstance(m, ProduceRequest) and m.acks == 1 for _, m in produced)
    fetched = _of(sent, ApiKey.FETCH)
    assert fetched and {v for v, _ in fetched} == {3}
    assert all(isinstance(m, FetchRequest) and m.current_leader_epoch == -1 for _, m in fetched)
    listed = _of(sent, ApiKey.LIST_OFFSETS)
    assert listed and {v for v, _ in listed} == {2}
    assert all(
        isinstance(m, ListOffsetsRequest) and m.current_leader_epoch == -1 for _, m in listed
    )
    metadata = _of(sent, ApiKey.CLUSTER_METADATA)
    assert metadata and {v for v, _ in metadata} == {5}
    assert all(isinstance(m, ClusterMetadataRequest) for _, m in metadata)


def test_a_refused_replication_factor_says_replication_is_not_served_yet() -> None:
    """CreateTopic's answer is a code alone: the admin's error says what it means."""
    refused = AdminError("create topic t", ErrorCode.INVALID_REPLICATION_FACTOR)
    assert str(refused) == (
        "create topic t: brokers serve no replication yet: a topic's replication factor is 1"
        " (or -1, the broker's default) (INVALID_REPLICATION_FACTOR)"
    )
