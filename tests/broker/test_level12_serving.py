"""Level 12 (SPEC.md §11.13) answered by a broker alone on the embedded store: each partition
has one replica, its leader at epoch 0. Every new version is answered as that makes it (acks=all
is acks=1, epoch 0 is the leader's, a factor above 1 is refused, no partition is led here for a
follower), with the leader hints, and the older versions are answered as before."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
import trio

from broker.dispatch import replica_fetch_error
from coordinator.limits import RequestLimits
from protocol import (
    ClusterMetadataRequest,
    ClusterMetadataResponse,
    CreateTopicRequest,
    ErrorCode,
    FetchRequest,
    FetchResponse,
    ListOffsetsRequest,
    ListOffsetsResponse,
    ProduceRequest,
    ProduceResponse,
    ReplicaFetchData,
    ReplicaFetchPartition,
    ReplicaFetchRequest,
    ReplicaFetchResponse,
    RequestMessage,
    ResponseMessage,
)
from protocol.batches import build_batch
from simulation.log import MemoryLog
from store import TopicPlacement
from tests.coordinator.test_boundary import DEADLINE, Broker, open_broker


def _produce(acks: int = 1, timeout_ms: int = 30_000) -> ProduceRequest:
    return ProduceRequest(
        topic="t",
        partition=0,
        records=(),
        batches=build_batch([b"v"]),
        acks=acks,
        timeout_ms=timeout_ms,
    )


async def _ask(broker: Broker, message: RequestMessage, version: int | None = None) -> object:
    async with broker.client() as channel:
        with trio.fail_after(DEADLINE):
            return await channel.request(message, api_version=version)


async def _with_topic(broker: Broker, partitions: int = 1) -> None:
    created = await broker.request(CreateTopicRequest(topic="t", partitions=partitions))
    assert created.error_code is ErrorCode.NONE


async def _high_watermark(broker: Broker) -> int:
    listed = await broker.request(ListOffsetsRequest(topic="t", partition=0))
    assert isinstance(listed, ListOffsetsResponse)
    return listed.high_watermark


async def test_produce_3_takes_acks_1_and_all_and_names_this_broker_the_leader(
    tmp_path: Path,
) -> None:
    async with open_broker(tmp_path) as broker:
        await _with_topic(broker)
        answers = [await broker.request(_produce(acks)) for acks in (1, -1)]
        high_watermark = await _high_watermark(broker)
    assert answers == [
        ProduceResponse(error_code=ErrorCode.NONE, base_offset=0, leader_id=1, leader_epoch=0),
        ProduceResponse(error_code=ErrorCode.NONE, base_offset=1, leader_id=1, leader_epoch=0),
    ]
    assert high_watermark == 2


@pytest.mark.parametrize(
    ("acks", "timeout_ms", "error"),
    [
        (0, 30_000, ErrorCode.INVALID_REQUIRED_ACKS),
        (2, 30_000, ErrorCode.INVALID_REQUIRED_ACKS),
        (-2, 30_000, ErrorCode.INVALID_REQUIRED_ACKS),
        (1, -1, ErrorCode.INVALID_REQUEST),
        (-1, 300_001, ErrorCode.INVALID_REQUEST),
    ],
)
async def test_produce_3_refuses_other_acks_and_timeouts_out_of_bounds_writing_nothing(
    tmp_path: Path, acks: int, timeout_ms: int, error: ErrorCode
) -> None:
    async with open_broker(tmp_path) as broker:
        await _with_topic(broker)
        answer = await broker.request(_produce(acks, timeout_ms))
        high_watermark = await _high_watermark(broker)
    assert answer == ProduceResponse(error_code=error, base_offset=-1)
    assert high_watermark == 0


async def test_produce_3_at_the_timeout_bounds_is_written(tmp_path: Path) -> None:
    async with open_broker(tmp_path) as broker:
        await _with_topic(broker)
        answers = [await broker.request(_produce(-1, t)) for t in (0, 300_000)]
    assert [a.error_code for a in answers] == [ErrorCode.NONE] * 2


async def test_produce_2_is_answered_without_the_hint(tmp_path: Path) -> None:
    async with open_broker(tmp_path) as broker:
        await _with_topic(broker)
        answer = await _ask(broker, _produce(), version=2)
    # What a version-2 answer carries, read back with the newer fields at their defaults.
    assert answer == ProduceResponse(error_code=ErrorCode.NONE, base_offset=0)


@pytest.mark.parametrize(
    ("epoch", "error"),
    [
        (-1, ErrorCode.NONE),  # not checked
        (0, ErrorCode.NONE),  # the sole replica's epoch
        (1, ErrorCode.UNKNOWN_LEADER_EPOCH),
        (-2, ErrorCode.FENCED_LEADER_EPOCH),
    ],
)
async def test_fetch_3_and_list_offsets_2_check_the_leader_epoch(
    tmp_path: Path, epoch: int, error: ErrorCode
) -> None:
    async with open_broker(tmp_path) as broker:
        await _with_topic(broker)
        await broker.request(_produce())
        fetched = await broker.request(
            FetchRequest(
                topic="t", partition=0, offset=0, max_bytes=1 << 16, current_leader_epoch=epoch
            )
        )
        listed = await broker.request(
            ListOffsetsRequest(topic="t", partition=0, current_leader_epoch=epoch)
        )
    assert isinstance(fetched, FetchResponse)
    assert isinstance(listed, ListOffsetsResponse)
    assert (fetched.error_code, fetched.leader_id, fetched.leader_epoch) == (error, 1, 0)
    assert (listed.error_code, listed.leader_id, listed.leader_epoch) == (error, 1, 0)
    served = error is ErrorCode.NONE
    assert (fetched.high_watermark, bool(fetched.batches)) == ((1, True) if served else (-1, False))
    assert listed.high_watermark == (1 if served else -1)


async def test_a_partition_not_here_gets_no_hint(tmp_path: Path) -> None:
    async with open_broker(tmp_path) as broker:
        await _with_topic(broker)
        answers = [
            await broker.request(message)
            for message in (
                ProduceRequest(topic="t", partition=5, records=()),
                FetchRequest(topic="t", partition=5, offset=0, max_bytes=1),
                ListOffsetsRequest(topic="t", partition=5),
            )
        ]
    assert [(a.error_code, a.leader_id, a.leader_epoch) for a in answers] == [  # type: ignore[union-attr]
        (ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, -1, -1)
    ] * 3


@pytest.mark.parametrize("version", [2, 1, 0])
async def test_an_older_fetch_and_list_offsets_see_no_new_code(
    tmp_path: Path, version: int
) -> None:
    async with open_broker(tmp_path) as broker:
        await _with_topic(broker)
        await broker.request(_produce())
        fetched = await _ask(
            broker, FetchRequest(topic="t", partition=0, offset=0, max_bytes=1 << 16), version
        )
        listed = await _ask(broker, ListOffsetsRequest(topic="t", partition=0), min(version, 1))
    assert isinstance(fetched, FetchResponse)
    assert isinstance(listed, ListOffsetsResponse)
    assert (fetched.error_code, fetched.high_watermark, fetched.leader_id) == (
        ErrorCode.NONE,
        1,
        -1,
    )
    assert (listed.error_code, listed.high_watermark, listed.leader_id) == (ErrorCode.NONE, 1, -1)


async def test_cluster_metadata_5_names_each_partitions_sole_replica_as_its_leader(
    tmp_path: Path,
) -> None:
    """A topic of one replica per partition has no ``replicas`` entry (SPEC.md §7): its
    partitions' ``broker_id`` says it all, and v5 costs it no more than v4."""
    async with open_broker(tmp_path) as broker:
        await _with_topic(broker, partitions=2)
        answer = await broker.request(ClusterMetadataRequest(group_id=None, topics=("t", "u")))
        old = await _ask(broker, ClusterMetadataRequest(group_id=None, topics=("t",)), 4)
    assert isinstance(answer, ClusterMetadataResponse)
    assert isinstance(old, ClusterMetadataResponse)
    assert answer.replicas == ()
    assert [(p.partition, p.broker_id) for p in answer.topics[0].partitions] == [(0, 1), (1, 1)]
    assert answer.topics[1].error_code is ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    assert old.replicas == ()
    assert old.topics == answer.topics[:1]


@pytest.mark.parametrize(
    ("factor", "error"),
    [
        (1, ErrorCode.NONE),
        (-1, ErrorCode.NONE),  # the broker's default: 1 on the embedded store
        (2, ErrorCode.INVALID_REPLICATION_FACTOR),
        (3, ErrorCode.INVALID_REPLICATION_FACTOR),
        (0, ErrorCode.INVALID_REPLICATION_FACTOR),
        (-2, ErrorCode.INVALID_REPLICATION_FACTOR),
    ],
)
async def test_create_topic_3_takes_a_factor_of_1_and_refuses_replication(
    tmp_path: Path, factor: int, error: ErrorCode
) -> None:
    async with open_broker(tmp_path) as broker:
        created = await broker.request(
            CreateTopicRequest(topic="t", partitions=2, replication_factor=factor)
        )
        topics = await broker.log.store.topics()
    assert created.error_code is error
    assert ("t" in topics) is (error is ErrorCode.NONE)
    if "t" in topics:
        assert topics["t"].brokers == (1, 1)


def _replica_fetch(*partitions: int, max_wait_ms: int = 500) -> ReplicaFetchRequest:
    return ReplicaFetchRequest(
        replica_id=2,
        log_dir=uuid.UUID(int=7),
        max_wait_ms=max_wait_ms,
        max_bytes=1 << 20,
        partitions=tuple(
            ReplicaFetchPartition(
                topic_id=uuid.UUID(int=1),
                partition=p,
                leader_epoch=0,
                fetch_offset=0,
                last_fetched_epoch=-1,
            )
            for p in partitions
        ),
    )


async def test_replica_fetch_finds_no_partition_led_here_for_a_follower(tmp_path: Path) -> None:
    async with open_broker(tmp_path) as broker:
        await _with_topic(broker)
        answer = await broker.request(_replica_fetch(0, 3))
        empty = await broker.request(_replica_fetch())
    not_led = [
        ReplicaFetchData(
            topic_id=uuid.UUID(int=1),
            partition=p,
            error_code=ErrorCode.NOT_LEADER_OR_FOLLOWER,
            high_watermark=-1,
            log_start_offset=-1,
            diverging_epoch=-1,
            diverging_end_offset=-1,
            epoch_starts=(),
            batches=b"",
        )
        for p in (0, 3)
    ]
    assert answer == ReplicaFetchResponse(error_code=ErrorCode.NONE, partitions=tuple(not_led))
    assert empty == ReplicaFetchResponse(error_code=ErrorCode.NONE, partitions=())


async def test_replica_fetch_is_bounded(tmp_path: Path) -> None:
    limits = RequestLimits(max_partitions_per_request=3)
    assert replica_fetch_error(_replica_fetch(0, 1, 2), limits) is ErrorCode.NONE
    assert replica_fetch_error(_replica_fetch(0, 1, 2, 3), limits) is ErrorCode.INVALID_REQUEST
    assert replica_fetch_error(_replica_fetch(max_wait_ms=0), limits) is ErrorCode.NONE
    for wait in (-1, 501):
        refused = replica_fetch_error(_replica_fetch(max_wait_ms=wait), limits)
        assert refused is ErrorCode.INVALID_REQUEST
    async with open_broker(tmp_path) as broker:
        answer: ResponseMessage = await broker.request(_replica_fetch(0, max_wait_ms=501))
    assert answer == ReplicaFetchResponse(error_code=ErrorCode.INVALID_REQUEST, partitions=())


async def test_a_log_that_knows_no_broker_id_hints_no_leader() -> None:
    """The simulated broker's log (one broker, no id): a leader hint of -1 and -1, unknown."""
    log = MemoryLog()
    log.follow({"t": TopicPlacement(topic="t", brokers=(1,), topic_id=uuid.uuid4())})
    produced = await log.produce(_produce(acks=-1))
    fetched = await log.fetch(FetchRequest(topic="t", partition=0, offset=0, max_bytes=1 << 16))
    assert (produced.error_code, produced.leader_id, produced.leader_epoch) == (
        ErrorCode.NONE,
        -1,
        -1,
    )
    assert (fetched.error_code, fetched.leader_id, fetched.leader_epoch) == (ErrorCode.NONE, -1, -1)
