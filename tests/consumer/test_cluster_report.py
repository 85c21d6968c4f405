"""The cluster view ``coordinator cluster`` prints, from one ClusterMetadata answer: a broker
that is down shows up through the partitions and slots that name it
(docs/design.md#coordinator-slots)."""

from __future__ import annotations

from consumer.admin import cluster_report
from protocol import ClusterMetadataResponse, ErrorCode, PartitionMetadata, TopicMetadata
from protocol.replica_messages import PartitionReplicas, TopicReplicas
from protocol.types import BrokerInfo


def test_every_broker_known_with_its_slots_and_partitions_and_whether_it_is_up() -> None:
    metadata = ClusterMetadataResponse(
        error_code=ErrorCode.NONE,
        coordinator_id=-1,
        coordinator_epoch=-1,
        brokers=(
            BrokerInfo(broker_id=1, host="h1", port=9092),
            BrokerInfo(broker_id=2, host="h2", port=9093),
        ),
        topics=(
            TopicMetadata(
                topic="t",
                error_code=ErrorCode.NONE,
                partitions=tuple(
                    PartitionMetadata(partition=p, broker_id=b) for p, b in enumerate((1, 3, 3))
                ),
            ),
        ),
        slot_holders=(2, 2, 3, -1),
    )
    report = cluster_report(metadata)
    assert report.as_json() == {
        "slots": 4,
        "brokers": [
            {
                "broker": 1,
                "host": "h1",
                "port": 9092,
                "up": True,
                "slots": [],
                "partitions": 1,
                "replicas": 1,
            },
            {
                "broker": 2,
                "host": "h2",
                "port": 9093,
                "up": True,
                "slots": [0, 1],
                "partitions": 0,
                "replicas": 0,
            },
            {
                "broker": 3,
                "host": None,
                "port": None,
                "up": False,
                "slots": [2],
                "partitions": 2,
                "replicas": 2,
            },
        ],
    }


def test_a_broker_counts_the_partitions_it_leads_and_those_it_holds_a_replica_of() -> None:
    held = ((1, (1, 2, 3)), (2, (2, 3, 1)), (-1, (3, 1, 2)), (1, (1, 2, 3)))
    metadata = ClusterMetadataResponse(
        error_code=ErrorCode.NONE,
        coordinator_id=-1,
        coordinator_epoch=-1,
        brokers=tuple(BrokerInfo(broker_id=b, host=f"h{b}", port=9092) for b in (1, 2, 3)),
        topics=(
            TopicMetadata(
                topic="t",
                error_code=ErrorCode.NONE,
                partitions=tuple(
                    PartitionMetadata(partition=p, broker_id=b) for p, (b, _) in enumerate(held)
                ),
            ),
        ),
        replicas=(
            TopicReplicas(
                topic="t",
                partitions=tuple(
                    PartitionReplicas(partition=p, leader_epoch=2, replicas=r, isr=r[:2])
                    for p, (_, r) in enumerate(held)
                ),
            ),
        ),
    )
    report = cluster_report(metadata)
    assert [(b.broker_id, b.partitions, b.replicas) for b in report.brokers] == [
        (1, 2, 4),
        (2, 1, 4),
        (3, 0, 4),
    ]
