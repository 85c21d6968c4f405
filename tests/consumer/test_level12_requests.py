"""The library's clients speak level 12 (SPEC.md §11.13) with the values that keep what they did
before it: the producer asks acks=all (which a topic of one replica treats as acks=1), the
consumer and the admin name no leader epoch until they learned one, and a topic the admin creates
has the broker's default replication factor (1 here)."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio
import trio.testing

from consumer import ConsumerSettings, ProducerConfig, open_consumer, open_producer
from consumer.admin import AdminError, open_admin
from coordinator.config import CoordinatorConfig
from protocol import (
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


def _of(sent: list[Request], api_key: ApiKey) -> list[tuple[int, RequestMessage]]:
    return [(r.api_version, r.message) for r in sent if r.message.API_KEY is api_key]


def recording(monkeypatch: pytest.MonkeyPatch) -> list[Request]:
    """Every request a connection of this process makes from now on, with its version."""
    sent: list[Request] = []
    new_request = Connection.new_request

    def recorded(
        self: Connection, message: RequestMessage, api_version: int | None = None
    ) -> Request:
        request = new_request(self, message, api_version)
        if self.our_role is Role.CONSUMER:
            sent.append(request)
        return request

    monkeypatch.setattr(Connection, "new_request", recorded)
    return sent


async def test_the_producer_consumer_and_admin_send_level_12_keeping_their_meaning(
    tmp_path: Path, autojump_clock: trio.testing.MockClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    sent = recording(monkeypatch)
    async with open_simulated_cluster(tmp_path, CONFIG) as cluster:
        connect = cluster.connect_to

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
    assert created[1].replication_factor == -1  # the broker's default: 1 on this one
    produced = _of(sent, ApiKey.PRODUCE)
    assert [v for v, _ in produced] == [3]
    assert all(isinstance(m, ProduceRequest) and m.acks == -1 for _, m in produced)
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


def test_a_refused_replication_factor_says_what_a_factor_may_be() -> None:
    """CreateTopic's answer is a code alone: the admin's error says what it means."""
    refused = AdminError("create topic t", ErrorCode.INVALID_REPLICATION_FACTOR)
    assert str(refused) == (
        "create topic t: a topic's replication factor is 1 to the number of live brokers"
        " (without one, the brokers' --default-replication-factor: 3 on a cluster, 1 on the"
        " embedded store) (INVALID_REPLICATION_FACTOR)"
    )
