"""The Spark source and sink's wire (pipeline/wire.py) speaks level 12 (SPEC.md §11.13) with the
values that keep what it did before: acks=1, no leader epoch named."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipeline.local import local_broker
from pipeline.wire import Cluster
from protocol import (
    ApiKey,
    CreateTopicRequest,
    ErrorCode,
    FetchRequest,
    ListOffsetsRequest,
    ProduceRequest,
)
from protocol.batches import build_batch
from protocol.types import TopicPartition
from tests.consumer.test_level12_requests import recording

pytestmark = pytest.mark.realtime


def test_the_wire_sends_level_12_keeping_its_meaning(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sent = recording(monkeypatch)
    with local_broker(tmp_path / "broker") as address, Cluster(address) as cluster:
        created = cluster.call_any(CreateTopicRequest(topic="t", partitions=1))
        assert created.error_code is ErrorCode.NONE
        (placement,) = cluster.placements(["t"]).values()
        assert cluster.produce(placement, build_batch([b"v"])) == 0
        assert cluster.fetch(placement, 0, 1 << 16).error_code is ErrorCode.NONE
        assert cluster.log_bounds([placement]) == {TopicPartition(topic="t", partition=0): (0, 1)}

    versions = {(r.message.API_KEY, r.api_version) for r in sent}
    assert {
        (ApiKey.PRODUCE, 3),
        (ApiKey.FETCH, 3),
        (ApiKey.LIST_OFFSETS, 2),
        (ApiKey.CLUSTER_METADATA, 5),
    } <= versions
    for request in sent:
        match request.message:
            case ProduceRequest(acks=acks):
                assert acks == 1
            case (
                FetchRequest(current_leader_epoch=epoch)
                | ListOffsetsRequest(current_leader_epoch=epoch)
            ):
                assert epoch == -1
