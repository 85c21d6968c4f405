"""The Spark source and sink follow a partition's leader: a planned ``OffsetRange``'s broker is a
first guess, and a broker that answers a leader code (or cannot be reached) sends the request,
once, to the leader the bootstrap brokers' metadata names now."""

from __future__ import annotations

import attrs
import pytest

from pipeline.source import OffsetRange, read_range
from pipeline.wire import Address, Cluster, PipelineError, Placement
from protocol import (
    ClusterMetadataRequest,
    ClusterMetadataResponse,
    ErrorCode,
    FetchRequest,
    FetchResponse,
    ListOffsetsRequest,
    ListOffsetsResponse,
    PartitionMetadata,
    ProduceRequest,
    ProduceResponse,
    RequestMessage,
    ResponseMessage,
    TopicMetadata,
)
from protocol.batches import build_batch
from protocol.types import BrokerInfo, TopicPartition

OLD = ("old", 1)
NEW = ("new", 2)
BOOTSTRAP = ("boot", 3)
PLANNED = Placement(topic="t", partition=0, host="old", port=1)
PLANNED_TP = TopicPartition(topic="t", partition=0)


@attrs.define
class FakeBrokers:
    """Broker 2 (``new``) leads t-0; broker 1 (``old``) answers ``old_answer`` or is down; the
    bootstrap broker answers metadata."""

    old_answer: ErrorCode | None = ErrorCode.NOT_LEADER_OR_FOLLOWER
    sent: list[tuple[Address, str]] = attrs.field(factory=list)

    def call(self, address: Address, message: RequestMessage) -> ResponseMessage:
        self.sent.append((address, type(message).__name__))
        if isinstance(message, ClusterMetadataRequest):
            assert address == BOOTSTRAP
            return ClusterMetadataResponse(
                error_code=ErrorCode.NONE,
                coordinator_id=-1,
                coordinator_epoch=-1,
                brokers=(
                    BrokerInfo(broker_id=1, host="old", port=1),
                    BrokerInfo(broker_id=2, host="new", port=2),
                ),
                topics=(
                    TopicMetadata(
                        topic="t",
                        error_code=ErrorCode.NONE,
                        partitions=(PartitionMetadata(partition=0, broker_id=2),),
                    ),
                ),
            )
        if address == OLD and self.old_answer is None:
            raise PipelineError("cannot reach broker old:1: refused")
        code = self.old_answer if address == OLD else ErrorCode.NONE
        assert code is not None
        match message:
            case FetchRequest():
                batches = b"" if code else build_batch([b"a", b"b"])
                return FetchResponse(
                    error_code=code,
                    high_watermark=2,
                    log_start_offset=0,
                    records=(),
                    batches=batches,
                )
            case ListOffsetsRequest():
                return ListOffsetsResponse(error_code=code, log_start_offset=0, high_watermark=2)
            case ProduceRequest():
                return ProduceResponse(error_code=code, base_offset=2)
        raise AssertionError(message)


@pytest.mark.parametrize("old_answer", [ErrorCode.NOT_LEADER_OR_FOLLOWER, None])
def test_a_planned_range_is_read_from_the_partitions_leader_now(
    monkeypatch: pytest.MonkeyPatch, old_answer: ErrorCode | None
) -> None:
    brokers = FakeBrokers(old_answer=old_answer)
    monkeypatch.setattr(Cluster, "call", brokers.call)
    task = OffsetRange(placement=PLANNED, start=0, end=2, bootstrap="boot:3")
    (batch,) = list(read_range(task))
    assert batch.column("value").to_pylist() == [b"a", b"b"]
    assert batch.column("offset").to_pylist() == [0, 1]
    assert brokers.sent == [
        (OLD, "FetchRequest"),
        (BOOTSTRAP, "ClusterMetadataRequest"),
        (NEW, "FetchRequest"),
    ]


def test_bounds_and_produce_follow_the_leader_and_other_refusals_do_not(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    brokers = FakeBrokers()
    monkeypatch.setattr(Cluster, "call", brokers.call)
    with Cluster("boot:3") as cluster:
        assert cluster.log_bounds([PLANNED]) == {PLANNED_TP: (0, 2)}
        assert cluster.produce(PLANNED, build_batch([b"c"])) == 2  # the move is remembered
    assert brokers.sent == [
        (OLD, "ListOffsetsRequest"),
        (BOOTSTRAP, "ClusterMetadataRequest"),
        (NEW, "ListOffsetsRequest"),
        (NEW, "ProduceRequest"),
    ]
    refusing = FakeBrokers(old_answer=ErrorCode.TOPIC_AUTHORIZATION_FAILED)
    monkeypatch.setattr(Cluster, "call", refusing.call)
    with Cluster("boot:3") as cluster, pytest.raises(PipelineError, match="AUTHORIZATION"):
        cluster.produce(PLANNED, build_batch([b"c"]))
    assert refusing.sent == [(OLD, "ProduceRequest")]
