"""The message classes are a contract other packages code against, and SPEC.md is the contract for
clients in other languages: both must match the wire layout the codec actually uses."""

from __future__ import annotations

import pathlib
import re
from typing import Any

import attrs
import pytest

import protocol
from protocol import NEWEST_VERSION, REQUEST_TYPES, RESPONSE_TYPES, ApiKey
from protocol.codec import Codec
from protocol.errors import RETRIABLE, STALE_METADATA
from protocol.schema import struct_codec

SPEC = pathlib.Path(__file__).resolve().parents[2] / "protocol" / "SPEC.md"

# name:type, "?" marks a nullable field; exactly the field lists of the design brief.
CONTRACT = {
    "TopicPartition": "topic:string partition:int32",
    "PartitionOffset": "topic:string partition:int32 offset:int64",
    "BrokerInfo": "broker_id:int32 host:string port:int32",
    "TopicStreams": "topic:string streams:int32",
    "Subscription": "topics:array[TopicStreams] pattern:string? pattern_is_blacklist:bool"
    " pattern_streams:int32",
    "AssignedPartition": "topic:string partition:int32 offset:int64 broker_id:int32",
    "AssignedStream": "stream_id:string partitions:array[AssignedPartition]",
    "PartitionMetadata": "partition:int32 broker_id:int32",
    "TopicMetadata": "topic:string error_code:int16 partitions:array[PartitionMetadata]",
    "TopicIdentity": "topic:string topic_id:uuid",
    "ConfigEntry": "name:string value:string",
    "TopicConfigs": "topic:string configs:array[ConfigEntry]",
    "GroupSummary": "group_id:string state:string",
    "MemberDescription": "member_id:string client_id:string session_timeout_ms:int32"
    " subscription:Subscription partitions:array[TopicPartition]",
    "ProduceRequest": "topic:string partition:int32 records:array[Record] batches:bytes"
    " topic_id:uuid acks:int16 timeout_ms:int32",
    "ProduceResponse": "error_code:int16 base_offset:int64 leader_id:int32 leader_epoch:int64",
    "FetchRequest": "topic:string partition:int32 offset:int64 max_bytes:int32 topic_id:uuid"
    " current_leader_epoch:int64",
    "FetchResponse": "error_code:int16 high_watermark:int64 log_start_offset:int64"
    " records:array[Record] batches:bytes leader_id:int32 leader_epoch:int64",
    "ListOffsetsRequest": "topic:string partition:int32 timestamp_ms:int64"
    " current_leader_epoch:int64",
    "ListOffsetsResponse": "error_code:int16 log_start_offset:int64 high_watermark:int64"
    " offset:int64 timestamp_ms:int64 leader_id:int32 leader_epoch:int64",
    "ClusterMetadataRequest": "group_id:string? topics:array[string]? leased:bool",
    "ClusterMetadataResponse": "error_code:int16 coordinator_id:int32 coordinator_epoch:int64"
    " brokers:array[BrokerInfo] topics:array[TopicMetadata] slot_holders:array[int32]"
    " topic_ids:array[TopicIdentity] topic_configs:array[TopicConfigs] throttle_time_ms:int32"
    " replicas:array[TopicReplicas]",
    "TopicReplicas": "topic:string partitions:array[PartitionReplicas]",
    "PartitionReplicas": "partition:int32 leader_epoch:int64 replicas:array[int32]"
    " isr:array[int32]",
    "RegisterConsumerRequest": "group_id:string consumer_id:string subscription:Subscription"
    " auto_commit:bool auto_offset_reset:string session_timeout_ms:int32 generation:int32"
    " owned_partitions:array[TopicPartition] instance_id:string?"
    " served_versions:array[ApiVersionRange]",
    "ApiVersionRange": "api_key:int16 min_version:int16 max_version:int16",
    "RegisterConsumerResponse": "error_code:int16 coordinator_epoch:int64 generation:int32"
    " throttle_time_ms:int32",
    "PingRequest": "coordinator_epoch:int64 generation:int32 consumer_id:string num_retries:int32"
    " acknowledged_frames:int64",
    "PingResponse": "error_code:int16 consumer_id:string offsets:array[PartitionOffset]",
    "StopFetcherRequest": "coordinator_epoch:int64 generation:int32 consumer_id:string"
    " acknowledged_frames:int64 partitions:array[TopicPartition]? reason:int16"
    " throttle_time_ms:int32",
    "StopFetcherResponse": "error_code:int16 consumer_id:string offsets:array[PartitionOffset]",
    "StartFetcherRequest": "coordinator_epoch:int64 generation:int32 consumer_id:string"
    " streams:array[AssignedStream] brokers:array[BrokerInfo] acknowledged_frames:int64"
    " incremental:bool topic_ids:array[TopicIdentity]",
    "StartFetcherResponse": "error_code:int16 consumer_id:string",
    "OffsetCommitRequest": "group_id:string consumer_id:string? generation:int32"
    " offsets:array[PartitionOffset]",
    "OffsetCommitResponse": "error_code:int16",
    "OffsetFetchRequest": "group_id:string partitions:array[TopicPartition]?",
    "OffsetFetchResponse": "error_code:int16 offsets:array[PartitionOffset]",
    "CreateTopicRequest": "topic:string partitions:int32 broker_ids:array[int32]?"
    " configs:array[ConfigEntry] replication_factor:int16",
    "CreateTopicResponse": "error_code:int16",
    "CreatePartitionsRequest": "topic:string total_partitions:int32 broker_ids:array[int32]?",
    "CreatePartitionsResponse": "error_code:int16",
    "ListGroupsRequest": "",
    "ListGroupsResponse": "error_code:int16 groups:array[GroupSummary]",
    "DescribeGroupRequest": "group_id:string",
    "DescribeGroupResponse": "error_code:int16 group_id:string state:string generation:int32"
    " members:array[MemberDescription] offsets:array[PartitionOffset]"
    " reported_offsets:array[PartitionOffset] member_hosts:array[MemberHost]"
    " awaiting:array[string]",
    "MemberHost": "member_id:string host:string",
    "LeaveGroupRequest": "group_id:string consumer_id:string generation:int32",
    "LeaveGroupResponse": "error_code:int16",
    "DeleteGroupRequest": "group_id:string",
    "DeleteGroupResponse": "error_code:int16",
    "DeleteTopicRequest": "topic:string",
    "DeleteTopicResponse": "error_code:int16",
    "SaslHandshakeRequest": "mechanism:string",
    "SaslHandshakeResponse": "error_code:int16 mechanisms:array[string]",
    "SaslAuthenticateRequest": "auth_bytes:bytes",
    "SaslAuthenticateResponse": "error_code:int16 error_message:string auth_bytes:bytes",
    "AclBinding": "principal:string resource_type:string name:string operation:string",
    "DescribeAclsRequest": "principal:string? resource_type:string? name:string? operation:string?",
    "DescribeAclsResponse": "error_code:int16 acls:array[AclBinding]",
    "CreateAclsRequest": "acls:array[AclBinding]",
    "CreateAclsResponse": "error_code:int16",
    "DeleteAclsRequest": "acls:array[AclBinding]",
    "DeleteAclsResponse": "error_code:int16 deleted:array[AclBinding]",
    "ScramCredentialInfo": "mechanism:string iterations:int32",
    "UserScramCredentials": "user:string credentials:array[ScramCredentialInfo]",
    "DescribeUserScramCredentialsRequest": "users:array[string]?",
    "DescribeUserScramCredentialsResponse": "error_code:int16 users:array[UserScramCredentials]",
    "ScramUpsertion": "user:string mechanism:string iterations:int32 salt:bytes"
    " stored_key:bytes server_key:bytes",
    "AlterUserScramCredentialsRequest": "deletions:array[string] upsertions:array[ScramUpsertion]",
    "UserAlteration": "user:string error_code:int16",
    "AlterUserScramCredentialsResponse": "error_code:int16 results:array[UserAlteration]",
    "ReplicaFetchRequest": "replica_id:int32 log_dir:uuid max_wait_ms:int32 max_bytes:int32"
    " partitions:array[ReplicaFetchPartition]",
    "ReplicaFetchPartition": "topic_id:uuid partition:int32 leader_epoch:int64"
    " fetch_offset:int64 last_fetched_epoch:int64",
    "ReplicaFetchResponse": "error_code:int16 partitions:array[ReplicaFetchData]",
    "ReplicaFetchData": "topic_id:uuid partition:int32 error_code:int16 high_watermark:int64"
    " log_start_offset:int64 diverging_epoch:int64 diverging_end_offset:int64"
    " epoch_starts:array[EpochStart] batches:bytes",
    "EpochStart": "epoch:int64 start_offset:int64",
}
# The layouts of older versions, where they differ from the newest (the class's whole field list).
OLDER_VERSIONS = {
    ("ListOffsetsRequest", 0): "topic:string partition:int32",
    ("ListOffsetsResponse", 0): "error_code:int16 log_start_offset:int64 high_watermark:int64",
    ("ListOffsetsRequest", 1): "topic:string partition:int32 timestamp_ms:int64",
    ("ListOffsetsResponse", 1): "error_code:int16 log_start_offset:int64 high_watermark:int64"
    " offset:int64 timestamp_ms:int64",
    ("ProduceRequest", 2): "topic:string partition:int32 records:array[Record] batches:bytes"
    " topic_id:uuid",
    ("ProduceResponse", 0): "error_code:int16 base_offset:int64",
    ("ProduceResponse", 1): "error_code:int16 base_offset:int64",
    ("ProduceResponse", 2): "error_code:int16 base_offset:int64",
    ("FetchRequest", 2): "topic:string partition:int32 offset:int64 max_bytes:int32 topic_id:uuid",
    ("FetchResponse", 1): "error_code:int16 high_watermark:int64 log_start_offset:int64"
    " records:array[Record] batches:bytes",
    ("FetchResponse", 2): "error_code:int16 high_watermark:int64 log_start_offset:int64"
    " records:array[Record] batches:bytes",
    ("ClusterMetadataResponse", 4): "error_code:int16 coordinator_id:int32"
    " coordinator_epoch:int64 brokers:array[BrokerInfo] topics:array[TopicMetadata]"
    " slot_holders:array[int32] topic_ids:array[TopicIdentity] topic_configs:array[TopicConfigs]"
    " throttle_time_ms:int32",
    ("CreateTopicRequest", 2): "topic:string partitions:int32 broker_ids:array[int32]?"
    " configs:array[ConfigEntry]",
    ("ClusterMetadataResponse", 0): "error_code:int16 coordinator_id:int32"
    " coordinator_epoch:int64 brokers:array[BrokerInfo] topics:array[TopicMetadata]",
    ("ClusterMetadataResponse", 1): "error_code:int16 coordinator_id:int32"
    " coordinator_epoch:int64 brokers:array[BrokerInfo] topics:array[TopicMetadata]"
    " slot_holders:array[int32]",
    ("ClusterMetadataRequest", 0): "group_id:string? topics:array[string]?",
    ("ClusterMetadataRequest", 1): "group_id:string? topics:array[string]?",
    ("ClusterMetadataRequest", 2): "group_id:string? topics:array[string]?",
    ("ClusterMetadataRequest", 3): "group_id:string? topics:array[string]?",
    ("ClusterMetadataResponse", 2): "error_code:int16 coordinator_id:int32"
    " coordinator_epoch:int64 brokers:array[BrokerInfo] topics:array[TopicMetadata]"
    " slot_holders:array[int32] topic_ids:array[TopicIdentity]",
    ("ClusterMetadataResponse", 3): "error_code:int16 coordinator_id:int32"
    " coordinator_epoch:int64 brokers:array[BrokerInfo] topics:array[TopicMetadata]"
    " slot_holders:array[int32] topic_ids:array[TopicIdentity] topic_configs:array[TopicConfigs]",
    ("RegisterConsumerResponse", 0): "error_code:int16 coordinator_epoch:int64 generation:int32",
    ("RegisterConsumerResponse", 1): "error_code:int16 coordinator_epoch:int64 generation:int32",
    ("RegisterConsumerResponse", 2): "error_code:int16 coordinator_epoch:int64 generation:int32",
    ("ProduceRequest", 0): "topic:string partition:int32 records:array[Record]",
    ("ProduceRequest", 1): "topic:string partition:int32 records:array[Record] batches:bytes",
    ("FetchRequest", 0): "topic:string partition:int32 offset:int64 max_bytes:int32",
    ("FetchRequest", 1): "topic:string partition:int32 offset:int64 max_bytes:int32",
    ("StartFetcherRequest", 2): "coordinator_epoch:int64 generation:int32 consumer_id:string"
    " streams:array[AssignedStream] brokers:array[BrokerInfo] acknowledged_frames:int64"
    " incremental:bool",
    ("FetchResponse", 0): "error_code:int16 high_watermark:int64 log_start_offset:int64"
    " records:array[Record]",
    ("PingRequest", 0): "coordinator_epoch:int64 generation:int32 consumer_id:string"
    " num_retries:int32",
    ("RegisterConsumerRequest", 0): "group_id:string consumer_id:string subscription:Subscription"
    " auto_commit:bool auto_offset_reset:string session_timeout_ms:int32 generation:int32"
    " owned_partitions:array[TopicPartition]",
    ("RegisterConsumerRequest", 1): "group_id:string consumer_id:string subscription:Subscription"
    " auto_commit:bool auto_offset_reset:string session_timeout_ms:int32 generation:int32"
    " owned_partitions:array[TopicPartition] instance_id:string?",
    ("CreateTopicRequest", 0): "topic:string partitions:int32",
    ("CreateTopicRequest", 1): "topic:string partitions:int32 broker_ids:array[int32]?",
    ("CreatePartitionsRequest", 0): "topic:string total_partitions:int32",
    ("StopFetcherRequest", 0): "coordinator_epoch:int64 generation:int32 consumer_id:string",
    ("StopFetcherRequest", 1): "coordinator_epoch:int64 generation:int32 consumer_id:string"
    " acknowledged_frames:int64",
    ("StopFetcherRequest", 2): "coordinator_epoch:int64 generation:int32 consumer_id:string"
    " acknowledged_frames:int64 partitions:array[TopicPartition]? reason:int16",
    ("StartFetcherRequest", 0): "coordinator_epoch:int64 generation:int32 consumer_id:string"
    " streams:array[AssignedStream] brokers:array[BrokerInfo]",
    ("StartFetcherRequest", 1): "coordinator_epoch:int64 generation:int32 consumer_id:string"
    " streams:array[AssignedStream] brokers:array[BrokerInfo] acknowledged_frames:int64",
    ("DescribeGroupResponse", 0): "error_code:int16 group_id:string state:string generation:int32"
    " members:array[MemberDescription] offsets:array[PartitionOffset]",
    ("DescribeGroupResponse", 1): "error_code:int16 group_id:string state:string generation:int32"
    " members:array[MemberDescription] offsets:array[PartitionOffset]"
    " reported_offsets:array[PartitionOffset]",
    ("DescribeGroupResponse", 2): "error_code:int16 group_id:string state:string generation:int32"
    " members:array[MemberDescription] offsets:array[PartitionOffset]"
    " reported_offsets:array[PartitionOffset] member_hosts:array[MemberHost]",
}

Layout = list[tuple[str, str]]


def _contract(name: str, version: int | None = None) -> Layout:
    fields = []
    text = CONTRACT[name] if version is None else OLDER_VERSIONS[name, version]
    for item in text.split():
        field, wire = item.split(":")
        fields.append((field, wire.removesuffix("?") + (", nullable" if wire[-1] == "?" else "")))
    return fields


def _spec_type(codec: Codec[Any]) -> str:
    """A codec's type in SPEC.md's notation."""
    nullable = codec.name.startswith("nullable ")
    base = codec.name.removeprefix("nullable ")
    names = {"error code": "int16", "record": "Record"}
    if base.startswith("array of "):
        item = base.removeprefix("array of ")
        base = f"array[{names.get(item, item)}]"
    return names.get(base, base) + (", nullable" if nullable else "")


def _layout(cls: type, version: int | None = None) -> Layout:
    return [(name, _spec_type(codec)) for name, codec in struct_codec(cls, version).fields]


def _versions() -> list[tuple[str, int]]:
    return [
        (cls.__name__, version)
        for key, newest in NEWEST_VERSION.items()
        for cls in (REQUEST_TYPES[key], RESPONSE_TYPES[key])
        for version in range(newest + 1)
    ]


@pytest.mark.parametrize(("name", "version"), _versions())
def test_each_version_has_its_contracted_layout(name: str, version: int) -> None:
    cls = getattr(protocol, name)
    # A version not listed in OLDER_VERSIONS has the newest layout: later ones did not change it.
    older = (name, version) in OLDER_VERSIONS
    assert _layout(cls, version) == _contract(name, version if older else None)


@pytest.mark.parametrize("name", sorted(CONTRACT))
def test_classes_have_the_contracted_fields_and_wire_types(name: str) -> None:
    cls = getattr(protocol, name)
    assert [a.name for a in attrs.fields(cls)] == [f for f, _ in _contract(name)]
    assert _layout(cls) == _contract(name)


@pytest.mark.parametrize("name", sorted(CONTRACT))
def test_classes_are_frozen_and_keyword_only(name: str) -> None:
    cls = getattr(protocol, name)
    assert attrs.has(cls)
    assert all(a.kw_only for a in attrs.fields(cls))
    assert cls.__setattr__ is not object.__setattr__  # frozen


def test_api_keys_and_tables() -> None:
    assert [(k.name, k.value) for k in ApiKey] == [
        *(
            (name, i)
            for i, name in enumerate(
                [
                    "PRODUCE",
                    "FETCH",
                    "LIST_OFFSETS",
                    "CLUSTER_METADATA",
                    "REGISTER_CONSUMER",
                    "PING",
                    "STOP_FETCHER",
                    "START_FETCHER",
                    "OFFSET_COMMIT",
                    "OFFSET_FETCH",
                    "CREATE_TOPIC",
                    "CREATE_PARTITIONS",
                    "LIST_GROUPS",
                    "DESCRIBE_GROUP",
                    "LEAVE_GROUP",
                    "DELETE_GROUP",
                ]
            )
        ),
        ("SASL_HANDSHAKE", 17),  # Kafka's numbers, as Kafka's layouts
        ("DELETE_TOPIC", 20),
        ("DESCRIBE_ACLS", 29),
        ("CREATE_ACLS", 30),
        ("DELETE_ACLS", 31),
        ("SASL_AUTHENTICATE", 36),
        ("DESCRIBE_USER_SCRAM_CREDENTIALS", 50),
        ("ALTER_USER_SCRAM_CREDENTIALS", 51),
        ("REPLICA_FETCH", 1000),  # ours: Kafka's replicas fetch with FETCH
    ]
    for key in ApiKey:
        assert REQUEST_TYPES[key].API_KEY is key is RESPONSE_TYPES[key].API_KEY
        assert REQUEST_TYPES[key].__name__.endswith("Request")
        assert RESPONSE_TYPES[key].__name__ == REQUEST_TYPES[key].__name__[:-7] + "Response"


def test_error_codes() -> None:
    codes = {code.name: code.value for code in protocol.ErrorCode}
    assert codes == {
        "NONE": 0,
        "UNKNOWN_SERVER_ERROR": -1,
        "OFFSET_OUT_OF_RANGE": 1,
        "CORRUPT_MESSAGE": 2,
        "UNKNOWN_TOPIC_OR_PARTITION": 3,
        "LEADER_NOT_AVAILABLE": 5,
        "NOT_LEADER_OR_FOLLOWER": 6,
        "REQUEST_TIMED_OUT": 7,
        "MESSAGE_TOO_LARGE": 10,
        "COORDINATOR_LOAD_IN_PROGRESS": 14,
        "COORDINATOR_NOT_AVAILABLE": 15,
        "NOT_COORDINATOR": 16,
        "INVALID_TOPIC_EXCEPTION": 17,
        "NOT_ENOUGH_REPLICAS": 19,
        "NOT_ENOUGH_REPLICAS_AFTER_APPEND": 20,
        "INVALID_REQUIRED_ACKS": 21,
        "ILLEGAL_GENERATION": 22,
        "INVALID_GROUP_ID": 24,
        "UNKNOWN_MEMBER_ID": 25,
        "INVALID_SESSION_TIMEOUT": 26,
        "REBALANCE_IN_PROGRESS": 27,
        "TOPIC_AUTHORIZATION_FAILED": 29,
        "GROUP_AUTHORIZATION_FAILED": 30,
        "CLUSTER_AUTHORIZATION_FAILED": 31,
        "UNSUPPORTED_SASL_MECHANISM": 33,
        "ILLEGAL_SASL_STATE": 34,
        "UNSUPPORTED_VERSION": 35,
        "TOPIC_ALREADY_EXISTS": 36,
        "INVALID_PARTITIONS": 37,
        "INVALID_REPLICATION_FACTOR": 38,
        "INVALID_REPLICA_ASSIGNMENT": 39,
        "INVALID_CONFIG": 40,
        "INVALID_REQUEST": 42,
        "POLICY_VIOLATION": 44,
        "SASL_AUTHENTICATION_FAILED": 58,
        "NON_EMPTY_GROUP": 68,
        "GROUP_ID_NOT_FOUND": 69,
        "GROUP_MAX_SIZE_REACHED": 81,
        "FENCED_INSTANCE_ID": 82,
        "RESOURCE_NOT_FOUND": 91,
        "UNACCEPTABLE_CREDENTIAL": 93,
        "FENCED_LEADER_EPOCH": 74,
        "UNKNOWN_LEADER_EPOCH": 75,
        "UNKNOWN_TOPIC_ID": 100,
        "INVALID_REGULAR_EXPRESSION": 128,
        "FRAME_TOO_LARGE": 1001,
        "MALFORMED_FRAME": 1002,
        "UNKNOWN_API_KEY": 1003,
        "DUPLICATE_MEMBER_ID": 1004,
        "STALE_COORDINATOR_EPOCH": 1005,
        "UNEXPECTED_RESPONSE": 1006,
        "INVALID_OFFSET_RESET": 1007,
        "RESPONSE_TOO_LARGE": 1008,
        "BROKER_BUSY": 1009,
    }


def test_the_retriable_codes_are_kafkas() -> None:
    """Kafka's RetriableExceptions among our codes (and our BROKER_BUSY); those that mean a
    stale view of the partitions are its InvalidMetadataExceptions."""
    assert {code.name for code in RETRIABLE} == {
        "CORRUPT_MESSAGE",
        "UNKNOWN_TOPIC_OR_PARTITION",
        "LEADER_NOT_AVAILABLE",
        "NOT_LEADER_OR_FOLLOWER",
        "REQUEST_TIMED_OUT",
        "COORDINATOR_LOAD_IN_PROGRESS",
        "COORDINATOR_NOT_AVAILABLE",
        "NOT_COORDINATOR",
        "NOT_ENOUGH_REPLICAS",
        "NOT_ENOUGH_REPLICAS_AFTER_APPEND",
        "FENCED_LEADER_EPOCH",
        "UNKNOWN_LEADER_EPOCH",
        "UNKNOWN_TOPIC_ID",
        "BROKER_BUSY",
    }
    assert {code.name for code in STALE_METADATA} == {
        "UNKNOWN_TOPIC_OR_PARTITION",
        "LEADER_NOT_AVAILABLE",
        "NOT_LEADER_OR_FOLLOWER",
        "FENCED_LEADER_EPOCH",
        "UNKNOWN_TOPIC_ID",
    }
    assert STALE_METADATA <= RETRIABLE


def test_protocol_error_cannot_be_raised_directly() -> None:
    with pytest.raises(TypeError):
        protocol.ProtocolError("x", protocol.ErrorCode.NONE)


# --- SPEC.md ------------------------------------------------------------------------------------


def _spec_layouts() -> dict[str, Layout]:
    """Every structure and message layout SPEC.md writes down, in its own notation."""
    text = SPEC.read_text()
    layouts: dict[str, Layout] = {}
    # Message tables: a header row naming the class, then one row per field.
    for match in re.finditer(
        r"^\| (\w+(?: v\d+)?) \| Type \|.*\n\|[-|]+\|\n((?:\|.*\n)*)", text, re.M
    ):
        rows = re.findall(r"^\| `(\w+)` \| ([^|]+?) \|", match.group(2), re.M)
        layouts[match.group(1)] = [(field, wire) for field, wire in rows]
    # One-line messages: "XResponse and YResponse: `error_code`: int16." / "X has an empty body."
    for names, field, wire in re.findall(r"^(\w+(?: and \w+)?): `(\w+)`: (\w+)\.$", text, re.M):
        for name in names.split(" and "):
            layouts[name] = [(field, wire)]
    for name in re.findall(r"^(\w+) has an empty body\.$", text, re.M):
        layouts[name] = []
    # Shared structures: "| Name | `field`: type (meaning), ... |".
    section = text.split("## 7. Shared structures", 1)[1].split("\n## ", 1)[0]
    for name, fields in re.findall(r"^\| (\w+) \| (`.*) \|$", section, re.M):
        layouts[name] = [
            (field, wire + (", nullable" if nullable else ""))
            for field, wire, nullable in re.findall(
                r"`(\w+)`: (array\[\w+\]|\w+)(,? nullable)?", fields
            )
        ]
    return layouts


def test_spec_documents_every_layout_exactly() -> None:
    spec = _spec_layouts()
    for name in CONTRACT:
        assert spec.get(name) == _layout(getattr(protocol, name)), name
    for name, version in OLDER_VERSIONS:
        assert spec.get(f"{name} v{version}") == _layout(getattr(protocol, name), version), name


def test_spec_version_table_matches_the_code() -> None:
    """SPEC.md §3's table: one row per api, its versions as "0" or "0-N"."""
    rows = re.findall(r"^\| (\d+) (\w+) \| (\d+(?:-\d+)?) \|", SPEC.read_text(), re.M)
    assert {ApiKey[name]: versions for _, name, versions in rows} == {
        key: "0" if newest == 0 else f"0-{newest}" for key, newest in NEWEST_VERSION.items()
    }
    assert all(int(number) == ApiKey[name] for number, name, _ in rows)


def test_spec_lists_every_error_code() -> None:
    rows = dict(re.findall(r"^\| (-?\d+) \| (\w+) \|", SPEC.read_text(), re.M))
    assert {int(code): name for code, name in rows.items()} == {
        code.value: code.name for code in protocol.ErrorCode
    }
