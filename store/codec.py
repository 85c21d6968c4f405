"""JSON shapes of the store's records, shared by every store that writes them down.

Kept apart from any file or ZooKeeper layout so that the embedded journal and the ZooKeeper nodes
spell a record the same way, and a record survives a move between them. Decoders trust their input
to be well formed JSON of these shapes (it is checksummed or came from our own writes); a value of
the wrong shape raises ``KeyError``/``TypeError``/``ValueError``, which callers turn into
``StoreUnavailable``.
"""

from __future__ import annotations

import base64
import uuid
from collections.abc import Mapping
from typing import Any

from protocol.sasl import ScramCredential
from protocol.types import (
    NO_TOPIC_ID,
    ConsumerThread,
    Subscription,
    TopicId,
    TopicPartition,
    TopicStreams,
)
from statemachine.acl import Acl, Operation, ResourceType
from statemachine.partition_state import IsrEntry, PartitionState

from .interface import GroupRecord, MemberRecord, TopicPlacement

__all__ = [
    "decode_acl",
    "decode_credential",
    "decode_group",
    "decode_member",
    "decode_owners",
    "decode_partition_state",
    "decode_placement",
    "decode_topic_ids",
    "encode_acl",
    "encode_credential",
    "encode_group",
    "encode_member",
    "encode_owners",
    "encode_partition_state",
    "encode_placement",
    "encode_topic_ids",
]


def encode_placement(placement: TopicPlacement) -> dict[str, int] | dict[str, list[int]]:
    """Kafka 0.8's map from partition number (as a string: JSON keys are strings) to broker id
    at replication factor 1, the bytes it always was; to the replicas' ids (Kafka's shape, the
    preferred leader first) above."""
    if placement.replication_factor == 1:
        return {str(partition): broker for partition, broker in enumerate(placement.brokers)}
    return {str(partition): list(replicas) for partition, replicas in enumerate(placement.replicas)}


def decode_placement(
    topic: str, value: Mapping[str, Any], topic_id: TopicId = NO_TOPIC_ID
) -> TopicPlacement:
    """Either shape of ``encode_placement``. ``topic_id`` NO_TOPIC_ID: a placement written before
    topics had ids, which its store gives one before publishing it."""
    listed = [value[str(partition)] for partition in range(len(value))]
    if not any(isinstance(replicas, list) for replicas in listed):
        brokers = tuple(int(broker) for broker in listed)
        return TopicPlacement(topic=topic, brokers=brokers, topic_id=topic_id)
    if not all(isinstance(replicas, list) and replicas for replicas in listed):
        raise ValueError(f"partitions of topic {topic!r} are placed in two shapes")
    return TopicPlacement.of(topic=topic, assignment=tuple(map(tuple, listed)), topic_id=topic_id)


def encode_partition_state(state: PartitionState) -> dict[str, Any]:
    """A replicated partition's state, without its version (the node's, on ZooKeeper)."""
    return {
        "leader": state.leader,
        "leader_epoch": state.leader_epoch,
        "isr": [[entry.broker_id, str(entry.log_dir)] for entry in state.isr],
    }


def decode_partition_state(value: Mapping[str, Any], version: int) -> PartitionState:
    return PartitionState(
        leader=int(value["leader"]),
        leader_epoch=int(value["leader_epoch"]),
        isr=tuple(
            IsrEntry(broker_id=int(broker), log_dir=uuid.UUID(str(log_dir)))
            for broker, log_dir in value["isr"]
        ),
        version=version,
    )


def _encode_subscription(subscription: Subscription) -> dict[str, Any]:
    return {
        "topics": [[entry.topic, entry.streams] for entry in subscription.topics],
        "pattern": subscription.pattern,
        "pattern_is_blacklist": subscription.pattern_is_blacklist,
        "pattern_streams": subscription.pattern_streams,
    }


def _decode_subscription(value: Mapping[str, Any]) -> Subscription:
    pattern = value["pattern"]
    return Subscription(
        topics=tuple(TopicStreams(topic=str(t), streams=int(s)) for t, s in value["topics"]),
        pattern=None if pattern is None else str(pattern),
        pattern_is_blacklist=bool(value["pattern_is_blacklist"]),
        pattern_streams=int(value["pattern_streams"]),
    )


def encode_member(member: MemberRecord) -> dict[str, Any]:
    encoded: dict[str, Any] = {
        "member_id": member.member_id,
        "client_id": member.client_id,
        "subscription": _encode_subscription(member.subscription),
        "session_timeout_ms": member.session_timeout_ms,
        "auto_commit": member.auto_commit,
        "auto_offset_reset": member.auto_offset_reset,
        "generation": member.generation,
    }
    if member.instance_id is not None:  # absent for a dynamic member, as in older records
        encoded["instance_id"] = member.instance_id
    return encoded


def decode_member(value: Mapping[str, Any]) -> MemberRecord:
    return MemberRecord(
        member_id=str(value["member_id"]),
        client_id=str(value["client_id"]),
        subscription=_decode_subscription(value["subscription"]),
        session_timeout_ms=int(value["session_timeout_ms"]),
        auto_commit=bool(value["auto_commit"]),
        auto_offset_reset=str(value["auto_offset_reset"]),
        generation=int(value.get("generation", -1)),
        instance_id=None if value.get("instance_id") is None else str(value["instance_id"]),
    )


def encode_group(group: GroupRecord) -> dict[str, Any]:
    """The group's registry, its assignment as topic -> [[partition, member_id, index], ...]: a
    large group's owners cost a few bytes each, sorted so that equal records encode equally."""
    encoded: dict[str, Any] = {
        "group_id": group.group_id,
        "generation": group.generation,
        "members": [encode_member(member) for member in group.members],
        "assignment": encode_owners(group.assignment),
    }
    if group.complete:  # absent when false: a record without it reads as one never completed
        encoded["complete"] = True
    if group.topic_ids:  # absent in older records: read as made under the ids in force
        encoded["topic_ids"] = encode_topic_ids(group.topic_ids)
    return encoded


def encode_owners(
    assignment: Mapping[TopicPartition, ConsumerThread],
) -> dict[str, list[list[Any]]]:
    """topic -> [[partition, member_id, index], ...], sorted by plain tuples (attrs' generated
    ordering costs microseconds a comparison: a sixth of a 10,000-partition rebalance)."""
    rows = sorted(
        (tp.topic, tp.partition, thread.member_id, thread.index)
        for tp, thread in assignment.items()
    )
    owners: dict[str, list[list[Any]]] = {}
    for topic, partition, member_id, index in rows:
        owners.setdefault(topic, []).append([partition, member_id, index])
    return owners


def decode_owners(value: Mapping[str, Any]) -> dict[TopicPartition, ConsumerThread]:
    """The inverse of ``encode_owners``. A member's threads are one object each, not one per
    partition: 10,000 partitions of 10 members decode to 10 ``ConsumerThread`` objects."""
    threads: dict[tuple[str, int], ConsumerThread] = {}
    assignment: dict[TopicPartition, ConsumerThread] = {}
    for topic, rows in value.items():
        topic = str(topic)
        for partition, member_id, index in rows:
            key = (str(member_id), int(index))
            thread = threads.get(key)
            if thread is None:
                thread = threads[key] = ConsumerThread(member_id=key[0], index=key[1])
            assignment[TopicPartition(topic=topic, partition=int(partition))] = thread
    return assignment


def encode_topic_ids(topic_ids: Mapping[str, TopicId]) -> dict[str, str]:
    """A group record's topic ids (docs/design.md#topic-ids): topic -> the uuid as a string."""
    return {topic: str(topic_id) for topic, topic_id in sorted(topic_ids.items())}


def decode_topic_ids(value: Mapping[str, Any]) -> dict[str, TopicId]:
    return {str(topic): uuid.UUID(str(topic_id)) for topic, topic_id in value.items()}


def decode_group(value: Mapping[str, Any]) -> GroupRecord:
    return GroupRecord(
        group_id=str(value["group_id"]),
        generation=int(value["generation"]),
        members=tuple(decode_member(member) for member in value["members"]),
        assignment=decode_owners(value["assignment"]),
        complete=bool(value.get("complete", False)),
        topic_ids=decode_topic_ids(value.get("topic_ids", {})),
    )


def encode_credential(credential: ScramCredential) -> dict[str, Any]:
    """A user's salted, hashed SCRAM credential (never the password: RFC 5802 §3)."""
    return {
        "salt": base64.b64encode(credential.salt).decode(),
        "stored_key": base64.b64encode(credential.stored_key).decode(),
        "server_key": base64.b64encode(credential.server_key).decode(),
        "iterations": credential.iterations,
    }


def decode_credential(mechanism: str, value: Mapping[str, Any]) -> ScramCredential:
    return ScramCredential(
        mechanism=mechanism,
        salt=base64.b64decode(value["salt"]),
        stored_key=base64.b64decode(value["stored_key"]),
        server_key=base64.b64decode(value["server_key"]),
        iterations=int(value["iterations"]),
    )


def encode_acl(acl: Acl) -> dict[str, str]:
    return {
        "principal": acl.principal,
        "resource_type": acl.resource_type.value,
        "name": acl.name,
        "operation": acl.operation.value,
    }


def decode_acl(value: Mapping[str, Any]) -> Acl:
    return Acl(
        principal=str(value["principal"]),
        resource_type=ResourceType(value["resource_type"]),
        name=str(value["name"]),
        operation=Operation(value["operation"]),
    )
