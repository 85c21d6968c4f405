"""Every request and response body, as attrs classes whose fields are the wire layout.

Field order here is byte order on the wire (see :mod:`protocol.schema`), so reordering a field is a
protocol change; ``protocol/SPEC.md`` documents the same layout for implementers in other languages.
Ints carry their width in the annotation (``Int32``/``Int64``): counts, partitions, generations,
timeouts and broker ids are int32; offsets, epochs, timestamps and watermarks are int64.

Each api has versions 0 to :data:`NEWEST_VERSION`; a field that a later version added is marked
``since(N)`` and has a default (see :mod:`protocol.schema`), so one class serves every version.
"""

from __future__ import annotations

import typing
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any, ClassVar, TypeAlias

import attrs

from .api_keys import COORDINATOR_REQUESTS as COORDINATOR_REQUESTS
from .api_keys import ApiKey as ApiKey
from .codec import Codec, Int16, Int32, Int64
from .errors import ErrorCode
from .records import Record
from .replica_messages import ReplicaFetchRequest, ReplicaFetchResponse, TopicReplicas
from .schema import SINCE, since, struct_codec
from .types import NO_TOPIC_ID, BrokerInfo, PartitionOffset, Subscription, TopicId, TopicPartition

# --- nested types -------------------------------------------------------------------------------


@attrs.frozen(kw_only=True)
class AssignedPartition:
    topic: str
    partition: Int32
    offset: Int64
    """Where to start reading; -1: no committed offset, apply the consumer's auto_offset_reset."""
    broker_id: Int32


@attrs.frozen(kw_only=True)
class AssignedStream:
    stream_id: str
    partitions: tuple[AssignedPartition, ...]


@attrs.frozen(kw_only=True)
class PartitionMetadata:
    partition: Int32
    broker_id: Int32


@attrs.frozen(kw_only=True)
class TopicMetadata:
    topic: str
    error_code: ErrorCode
    partitions: tuple[PartitionMetadata, ...]


@attrs.frozen(kw_only=True)
class ConfigEntry:
    name: str
    """A topic setting's Kafka name (protocol/topic_configs.py); ``value`` is an integer."""
    value: str


@attrs.frozen(kw_only=True)
class TopicConfigs:
    topic: str
    configs: tuple[ConfigEntry, ...]


@attrs.frozen(kw_only=True)
class TopicIdentity:
    """A topic's name and the id of the incarnation the sender means (docs/design.md#topic-ids)."""

    topic: str
    topic_id: TopicId


@attrs.frozen(kw_only=True)
class GroupSummary:
    group_id: str
    state: str


@attrs.frozen(kw_only=True)
class MemberDescription:
    member_id: str
    client_id: str
    session_timeout_ms: Int32
    subscription: Subscription
    partitions: tuple[TopicPartition, ...]


@attrs.frozen(kw_only=True)
class ApiVersionRange:
    """The versions of one api a peer serves, as in Kafka's ApiVersions (api key 18): a consumer
    lists the coordinator requests it can read in RegisterConsumer, so the coordinator sends it
    only those (SPEC.md §3, "Versions both ways")."""

    api_key: Int16
    min_version: Int16
    max_version: Int16


@attrs.frozen(kw_only=True)
class MemberHost:
    """Where a member's connection comes from: the address the broker accepted it from (""
    where it does not know one)."""

    member_id: str
    host: str


# --- 0 PRODUCE ----------------------------------------------------------------------------------


@attrs.frozen(kw_only=True)
class ProduceRequest:
    API_KEY: ClassVar[ApiKey] = ApiKey.PRODUCE
    topic: str
    partition: Int32
    records: tuple[Record, ...]
    """Version 0's records, sent with offset -1; the broker assigns offsets. Empty in version 1
    on, whose producers send ``batches``."""
    batches: bytes = attrs.field(default=b"", metadata=since(1))
    """Record batches back to back (SPEC.md §6), base offsets 0: the broker checks each one's
    CRC, stamps its offsets and stores it as it came."""
    topic_id: TopicId = attrs.field(default=NO_TOPIC_ID, metadata=since(2))
    """The incarnation of ``topic`` the producer learned (SPEC.md §11.12): another one is
    refused with UNKNOWN_TOPIC_ID and nothing is written; NO_TOPIC_ID: whichever is in force."""
    acks: Int16 = attrs.field(default=1, metadata=since(3))
    """1: acknowledged once the leader wrote it; -1 (all): once every in-sync replica has it,
    refused NOT_ENOUGH_REPLICAS if fewer are in sync than the topic's minimum. Else
    INVALID_REQUIRED_ACKS; versions before 3 mean 1."""
    timeout_ms: Int32 = attrs.field(default=30_000, metadata=since(3))
    """How long an acks=all write may wait for the in-sync replicas (REQUEST_TIMED_OUT after)."""


@attrs.frozen(kw_only=True)
class ProduceResponse:
    API_KEY: ClassVar[ApiKey] = ApiKey.PRODUCE
    error_code: ErrorCode
    base_offset: Int64
    leader_id: Int32 = attrs.field(default=-1, metadata=since(3))
    """The partition's leader as this broker knows it (KIP-951's hint), -1: unknown."""
    leader_epoch: Int64 = attrs.field(default=-1, metadata=since(3))
    """That leader's epoch, -1: unknown."""


# --- 1 FETCH ------------------------------------------------------------------------------------


@attrs.frozen(kw_only=True)
class FetchRequest:
    API_KEY: ClassVar[ApiKey] = ApiKey.FETCH
    topic: str
    partition: Int32
    offset: Int64
    max_bytes: Int32
    topic_id: TopicId = attrs.field(default=NO_TOPIC_ID, metadata=since(2))
    """The incarnation of ``topic`` the consumer was started on: another one, or none, is
    refused with UNKNOWN_TOPIC_ID instead of served. The zero id (and version 0 and 1): any
    incarnation of the name."""
    current_leader_epoch: Int64 = attrs.field(default=-1, metadata=since(3))
    """The leader epoch the consumer learned (KIP-320): an older one is refused
    FENCED_LEADER_EPOCH, a newer one UNKNOWN_LEADER_EPOCH; -1 (and before 3): not checked."""


@attrs.frozen(kw_only=True)
class FetchResponse:
    API_KEY: ClassVar[ApiKey] = ApiKey.FETCH
    error_code: ErrorCode
    high_watermark: Int64
    log_start_offset: Int64
    records: tuple[Record, ...]
    """Version 0: the records from the requested offset. Empty in version 1 on."""
    batches: bytes = attrs.field(default=b"", metadata=since(1))
    """Whole stored batches, the first one holding the requested offset (so it may begin
    before it: a consumer skips those records), as the log holds them."""
    leader_id: Int32 = attrs.field(default=-1, metadata=since(3))
    """As in :class:`ProduceResponse`."""
    leader_epoch: Int64 = attrs.field(default=-1, metadata=since(3))


# --- 2 LIST_OFFSETS -----------------------------------------------------------------------------


@attrs.frozen(kw_only=True)
class ListOffsetsRequest:
    API_KEY: ClassVar[ApiKey] = ApiKey.LIST_OFFSETS
    topic: str
    partition: Int32
    timestamp_ms: Int64 = attrs.field(default=-1, metadata=since(1))
    """-1: no lookup by time. Otherwise the earliest offset whose record's timestamp is at
    least this (Kafka's offsetsForTimes), answered in the response's ``offset``."""
    current_leader_epoch: Int64 = attrs.field(default=-1, metadata=since(2))
    """As in :class:`FetchRequest`."""


@attrs.frozen(kw_only=True)
class ListOffsetsResponse:
    API_KEY: ClassVar[ApiKey] = ApiKey.LIST_OFFSETS
    error_code: ErrorCode
    log_start_offset: Int64
    high_watermark: Int64
    offset: Int64 = attrs.field(default=-1, metadata=since(1))
    """The offset the request's ``timestamp_ms`` found: -1 if it asked none, or if no record
    below the high watermark has a timestamp that late."""
    timestamp_ms: Int64 = attrs.field(default=-1, metadata=since(1))
    """That record's timestamp (-1 with ``offset`` -1)."""
    leader_id: Int32 = attrs.field(default=-1, metadata=since(2))
    """As in :class:`ProduceResponse`."""
    leader_epoch: Int64 = attrs.field(default=-1, metadata=since(2))


# --- 3 CLUSTER_METADATA -------------------------------------------------------------------------


@attrs.frozen(kw_only=True)
class ClusterMetadataRequest:
    API_KEY: ClassVar[ApiKey] = ApiKey.CLUSTER_METADATA
    group_id: str | None
    """Set: also find this group's coordinator."""
    topics: tuple[str, ...] | None
    """None: all topics."""
    leased: bool = attrs.field(default=False, metadata=since(4))
    """The asker is a consumer fetching under its lease, looking for its coordinator to register
    again with what it fetches: a busy broker answers it all the same (SPEC.md §11.7)."""


@attrs.frozen(kw_only=True)
class ClusterMetadataResponse:
    API_KEY: ClassVar[ApiKey] = ApiKey.CLUSTER_METADATA
    error_code: ErrorCode
    coordinator_id: Int32
    """-1: unknown (or no group_id was asked about)."""
    coordinator_epoch: Int64
    brokers: tuple[BrokerInfo, ...]
    topics: tuple[TopicMetadata, ...]
    slot_holders: tuple[Int32, ...] = attrs.field(default=(), metadata=since(1))
    """By slot number, the broker coordinating that slot's groups (-1: none now); its length is
    the cluster's coordinator slot count (docs/design.md#coordinator-slots)."""
    topic_ids: tuple[TopicIdentity, ...] = attrs.field(default=(), metadata=since(2))
    """The id of each topic in ``topics`` that exists."""
    topic_configs: tuple[TopicConfigs, ...] = attrs.field(default=(), metadata=since(3))
    """The settings each topic in ``topics`` was created with (those that have any)."""
    throttle_time_ms: Int32 = attrs.field(default=0, metadata=since(4))
    """With BROKER_BUSY: how long to wait before asking this broker again (SPEC.md §11.7)."""
    replicas: tuple[TopicReplicas, ...] = attrs.field(default=(), metadata=since(5))
    """Each partition's leader epoch, replicas and in-sync replicas, for the topics of
    ``topics`` that exist; ``topics`` names each partition's leader (in every version)."""


# --- 4 REGISTER_CONSUMER ------------------------------------------------------------------------


@attrs.frozen(kw_only=True)
class RegisterConsumerRequest:
    API_KEY: ClassVar[ApiKey] = ApiKey.REGISTER_CONSUMER
    group_id: str
    consumer_id: str
    subscription: Subscription
    auto_commit: bool
    auto_offset_reset: str
    session_timeout_ms: Int32
    generation: Int32
    """The last generation this consumer took part in; -1: none."""
    owned_partitions: tuple[TopicPartition, ...]
    """What it still holds, so that a newly elected coordinator can adopt it."""
    instance_id: str | None = attrs.field(default=None, metadata=since(1))
    """Static membership: the name of this member that outlives its processes (SPEC.md §11.11).
    None: a dynamic member, which is only ever one process."""
    served_versions: tuple[ApiVersionRange, ...] = attrs.field(
        factory=lambda: coordinator_versions_served(), metadata=since(2)
    )
    """The versions of the coordinator requests this consumer can read (SPEC.md §3); an api it
    does not list: version 0 only. The default is what this package reads, every version. A
    coordinator reads it only from a version-2 request: an older request lists nothing, whatever
    its decoded default (:func:`protocol.versions.negotiate`)."""


@attrs.frozen(kw_only=True)
class RegisterConsumerResponse:
    API_KEY: ClassVar[ApiKey] = ApiKey.REGISTER_CONSUMER
    error_code: ErrorCode
    coordinator_epoch: Int64
    generation: Int32
    throttle_time_ms: Int32 = attrs.field(default=0, metadata=since(3))
    """With BROKER_BUSY: how long to wait before registering again (SPEC.md §11.7)."""


# --- 5 PING (coordinator -> consumer) -----------------------------------------------------------


@attrs.frozen(kw_only=True)
class PingRequest:
    API_KEY: ClassVar[ApiKey] = ApiKey.PING
    coordinator_epoch: Int64
    generation: Int32
    consumer_id: str
    num_retries: Int32
    acknowledged_frames: Int64 = attrs.field(default=-1, metadata=since(1))
    """How many frames the coordinator had received from this consumer on this connection when it
    built the request; the consumer's lease runs from its own queue time of that frame
    (SPEC.md §1, docs/design.md#ownership-lease). -1: not given (version 0), renews nothing.
    int64: a long-lived connection may carry more than 2**31 frames."""


@attrs.frozen(kw_only=True)
class PingResponse:
    API_KEY: ClassVar[ApiKey] = ApiKey.PING
    error_code: ErrorCode
    consumer_id: str
    offsets: tuple[PartitionOffset, ...]


# --- 6 STOP_FETCHER (coordinator -> consumer) ---------------------------------------------------


@attrs.frozen(kw_only=True)
class StopFetcherRequest:
    API_KEY: ClassVar[ApiKey] = ApiKey.STOP_FETCHER
    coordinator_epoch: Int64
    generation: Int32
    consumer_id: str
    acknowledged_frames: Int64 = attrs.field(default=-1, metadata=since(1))
    """As in :class:`PingRequest`."""
    partitions: tuple[TopicPartition, ...] | None = attrs.field(default=None, metadata=since(2))
    """The partitions to stop (an incremental rebalance revokes only what moves, SPEC.md §11.5);
    None: every partition, as in versions 0 and 1."""
    reason: ErrorCode = attrs.field(default=ErrorCode.NONE, metadata=since(2))
    """NONE: a rebalance. FENCED_INSTANCE_ID: a newer process registered under this member's
    instance id; stop everything, answer, close, and do not register again (SPEC.md §11.11).
    BROKER_BUSY (v3 on): the broker let this member's group go; stop everything, answer, close,
    and register again after ``throttle_time_ms`` (SPEC.md §11.7)."""
    throttle_time_ms: Int32 = attrs.field(default=0, metadata=since(3))
    """With reason BROKER_BUSY: how long to wait before registering again."""


@attrs.frozen(kw_only=True)
class StopFetcherResponse:
    API_KEY: ClassVar[ApiKey] = ApiKey.STOP_FETCHER
    error_code: ErrorCode
    consumer_id: str
    offsets: tuple[PartitionOffset, ...]


# --- 7 START_FETCHER (coordinator -> consumer) --------------------------------------------------


@attrs.frozen(kw_only=True)
class StartFetcherRequest:
    API_KEY: ClassVar[ApiKey] = ApiKey.START_FETCHER
    coordinator_epoch: Int64
    generation: Int32
    consumer_id: str
    streams: tuple[AssignedStream, ...]
    brokers: tuple[BrokerInfo, ...]
    acknowledged_frames: Int64 = attrs.field(default=-1, metadata=since(1))
    """As in :class:`PingRequest`."""
    incremental: bool = attrs.field(default=False, metadata=since(2))
    """True: ``streams`` is still the whole assignment, but a partition the consumer already
    fetches goes on without a stop (SPEC.md §11.6). False, and in versions 0 and 1: the
    assignment is replaced, every fetcher stopped and started again."""
    topic_ids: tuple[TopicIdentity, ...] = attrs.field(default=(), metadata=since(3))
    """The incarnation of each topic in ``streams``: the consumer fetches with these ids, so a
    broker refuses it the log of a topic deleted and created again since (SPEC.md §11.12)."""


@attrs.frozen(kw_only=True)
class StartFetcherResponse:
    API_KEY: ClassVar[ApiKey] = ApiKey.START_FETCHER
    error_code: ErrorCode
    consumer_id: str


# --- 8 OFFSET_COMMIT ----------------------------------------------------------------------------


@attrs.frozen(kw_only=True)
class OffsetCommitRequest:
    API_KEY: ClassVar[ApiKey] = ApiKey.OFFSET_COMMIT
    group_id: str
    consumer_id: str | None
    """None: a standalone committer (not a member), which sends generation -1."""
    generation: Int32
    offsets: tuple[PartitionOffset, ...]


@attrs.frozen(kw_only=True)
class OffsetCommitResponse:
    API_KEY: ClassVar[ApiKey] = ApiKey.OFFSET_COMMIT
    error_code: ErrorCode


# --- 9 OFFSET_FETCH -----------------------------------------------------------------------------


@attrs.frozen(kw_only=True)
class OffsetFetchRequest:
    API_KEY: ClassVar[ApiKey] = ApiKey.OFFSET_FETCH
    group_id: str
    partitions: tuple[TopicPartition, ...] | None
    """None: every partition the group has an offset for."""


@attrs.frozen(kw_only=True)
class OffsetFetchResponse:
    API_KEY: ClassVar[ApiKey] = ApiKey.OFFSET_FETCH
    error_code: ErrorCode
    offsets: tuple[PartitionOffset, ...]


# --- 10 CREATE_TOPIC, 11 CREATE_PARTITIONS ------------------------------------------------------


@attrs.frozen(kw_only=True)
class CreateTopicRequest:
    API_KEY: ClassVar[ApiKey] = ApiKey.CREATE_TOPIC
    topic: str
    partitions: Int32
    broker_ids: tuple[Int32, ...] | None = attrs.field(default=None, metadata=since(1))
    """The brokers to place the partitions on, round robin; None: every live broker."""
    configs: tuple[ConfigEntry, ...] = attrs.field(default=(), metadata=since(2))
    """The topic's own settings (protocol/topic_configs.py); those not named are the broker's."""
    replication_factor: Int16 = attrs.field(default=1, metadata=since(3))
    """Replicas per partition; -1: the broker's default. Versions before 3 mean 1."""


@attrs.frozen(kw_only=True)
class CreateTopicResponse:
    API_KEY: ClassVar[ApiKey] = ApiKey.CREATE_TOPIC
    error_code: ErrorCode


@attrs.frozen(kw_only=True)
class CreatePartitionsRequest:
    API_KEY: ClassVar[ApiKey] = ApiKey.CREATE_PARTITIONS
    topic: str
    total_partitions: Int32
    broker_ids: tuple[Int32, ...] | None = attrs.field(default=None, metadata=since(1))
    """As in :class:`CreateTopicRequest`, for the partitions added."""


@attrs.frozen(kw_only=True)
class CreatePartitionsResponse:
    API_KEY: ClassVar[ApiKey] = ApiKey.CREATE_PARTITIONS
    error_code: ErrorCode


# --- 12 LIST_GROUPS, 13 DESCRIBE_GROUP ----------------------------------------------------------


@attrs.frozen(kw_only=True)
class ListGroupsRequest:
    API_KEY: ClassVar[ApiKey] = ApiKey.LIST_GROUPS


@attrs.frozen(kw_only=True)
class ListGroupsResponse:
    API_KEY: ClassVar[ApiKey] = ApiKey.LIST_GROUPS
    error_code: ErrorCode
    groups: tuple[GroupSummary, ...]


@attrs.frozen(kw_only=True)
class DescribeGroupRequest:
    API_KEY: ClassVar[ApiKey] = ApiKey.DESCRIBE_GROUP
    group_id: str


@attrs.frozen(kw_only=True)
class DescribeGroupResponse:
    API_KEY: ClassVar[ApiKey] = ApiKey.DESCRIBE_GROUP
    error_code: ErrorCode
    group_id: str
    state: str
    generation: Int32
    members: tuple[MemberDescription, ...]
    offsets: tuple[PartitionOffset, ...]
    """Committed offsets: durable in the store, so no restart or failover can take them back."""
    reported_offsets: tuple[PartitionOffset, ...] = attrs.field(default=(), metadata=since(1))
    """Offsets accepted (from Pings, StopFetcher answers, OffsetCommits) but not yet durable, for
    the partitions where they differ from ``offsets``; a crash before the committer writes them
    loses them. Version 1 on; a version-0 answer has ``offsets`` alone."""
    member_hosts: tuple[MemberHost, ...] = attrs.field(default=(), metadata=since(2))
    """Each live member's address, in the order of ``members``. Version 2 on."""
    awaiting: tuple[str, ...] = attrs.field(default=(), metadata=since(3))
    """The members of ``members`` that a new coordinator is still waiting for: its store record
    names them, with what they hold, but they have not registered with it since it took office
    (docs/design.md#adoption-after-a-failover). Version 3 on."""


# --- 14 LEAVE_GROUP, 15 DELETE_GROUP ------------------------------------------------------------


@attrs.frozen(kw_only=True)
class LeaveGroupRequest:
    API_KEY: ClassVar[ApiKey] = ApiKey.LEAVE_GROUP
    group_id: str
    consumer_id: str
    generation: Int32


@attrs.frozen(kw_only=True)
class LeaveGroupResponse:
    API_KEY: ClassVar[ApiKey] = ApiKey.LEAVE_GROUP
    error_code: ErrorCode


@attrs.frozen(kw_only=True)
class DeleteGroupRequest:
    API_KEY: ClassVar[ApiKey] = ApiKey.DELETE_GROUP
    group_id: str


@attrs.frozen(kw_only=True)
class DeleteGroupResponse:
    API_KEY: ClassVar[ApiKey] = ApiKey.DELETE_GROUP
    error_code: ErrorCode


# --- 17 SASL_HANDSHAKE, 36 SASL_AUTHENTICATE ---------------------------------------------------
# Kafka's numbers and layouts: the authentication that opens a connection to a SASL listener
# (protocol/SPEC.md §12), before any other request.


@attrs.frozen(kw_only=True)
class SaslHandshakeRequest:
    API_KEY: ClassVar[ApiKey] = ApiKey.SASL_HANDSHAKE
    mechanism: str
    """``SCRAM-SHA-256`` or ``SCRAM-SHA-512``."""


@attrs.frozen(kw_only=True)
class SaslHandshakeResponse:
    API_KEY: ClassVar[ApiKey] = ApiKey.SASL_HANDSHAKE
    error_code: ErrorCode
    mechanisms: tuple[str, ...]
    """The mechanisms the listener offers."""


@attrs.frozen(kw_only=True)
class SaslAuthenticateRequest:
    API_KEY: ClassVar[ApiKey] = ApiKey.SASL_AUTHENTICATE
    auth_bytes: bytes
    """The mechanism's next client message (RFC 5802: client-first, then client-final)."""


@attrs.frozen(kw_only=True)
class SaslAuthenticateResponse:
    API_KEY: ClassVar[ApiKey] = ApiKey.SASL_AUTHENTICATE
    error_code: ErrorCode
    error_message: str
    auth_bytes: bytes
    """The mechanism's next server message (server-first, then server-final)."""


# --- 20 DELETE_TOPIC ---------------------------------------------------------------------------
# Kafka's DeleteTopics number, for one topic.


@attrs.frozen(kw_only=True)
class DeleteTopicRequest:
    API_KEY: ClassVar[ApiKey] = ApiKey.DELETE_TOPIC
    topic: str


@attrs.frozen(kw_only=True)
class DeleteTopicResponse:
    API_KEY: ClassVar[ApiKey] = ApiKey.DELETE_TOPIC
    error_code: ErrorCode


# --- 29 DESCRIBE_ACLS, 30 CREATE_ACLS, 31 DELETE_ACLS ------------------------------------------
# Kafka's numbers; the rules of statemachine/acl.py (allow rules only), each as its four words.


@attrs.frozen(kw_only=True)
class AclBinding:
    """One allow rule: ``principal`` (``User:NAME`` or ``*``) may do ``operation`` (``read``,
    ``write``, ``create``, ``alter``, ``describe``, ``delete`` or ``all``) on the resource of
    type ``resource_type`` (``topic``, ``group`` or ``cluster``) named ``name`` (``*``: every
    one of its type; the cluster is named ``cluster``)."""

    principal: str
    resource_type: str
    name: str
    operation: str


@attrs.frozen(kw_only=True)
class DescribeAclsRequest:
    API_KEY: ClassVar[ApiKey] = ApiKey.DESCRIBE_ACLS
    principal: str | None
    """Only the rules of this principal (exactly: ``*`` matches the rules for everyone); None:
    any. The same for the fields below."""
    resource_type: str | None
    name: str | None
    operation: str | None


@attrs.frozen(kw_only=True)
class DescribeAclsResponse:
    API_KEY: ClassVar[ApiKey] = ApiKey.DESCRIBE_ACLS
    error_code: ErrorCode
    acls: tuple[AclBinding, ...]


@attrs.frozen(kw_only=True)
class CreateAclsRequest:
    API_KEY: ClassVar[ApiKey] = ApiKey.CREATE_ACLS
    acls: tuple[AclBinding, ...]
    """Added in one write, all or none; a rule already in force is no error."""


@attrs.frozen(kw_only=True)
class CreateAclsResponse:
    API_KEY: ClassVar[ApiKey] = ApiKey.CREATE_ACLS
    error_code: ErrorCode


@attrs.frozen(kw_only=True)
class DeleteAclsRequest:
    API_KEY: ClassVar[ApiKey] = ApiKey.DELETE_ACLS
    acls: tuple[AclBinding, ...]
    """The rules to remove, exactly (no patterns), in one write."""


@attrs.frozen(kw_only=True)
class DeleteAclsResponse:
    API_KEY: ClassVar[ApiKey] = ApiKey.DELETE_ACLS
    error_code: ErrorCode
    deleted: tuple[AclBinding, ...]
    """Those of the request's rules that were in force, and are no longer."""


# --- 50 DESCRIBE_USER_SCRAM_CREDENTIALS, 51 ALTER_USER_SCRAM_CREDENTIALS -----------------------
# Kafka's numbers. A credential travels as the broker keeps it (RFC 5802 §3), salted and hashed by
# the client: never a password, nor a salted password, from which one could log in.


@attrs.frozen(kw_only=True)
class ScramCredentialInfo:
    mechanism: str
    iterations: Int32


@attrs.frozen(kw_only=True)
class UserScramCredentials:
    """A user's mechanisms and their iteration counts: never its salts or keys."""

    user: str
    credentials: tuple[ScramCredentialInfo, ...]


@attrs.frozen(kw_only=True)
class DescribeUserScramCredentialsRequest:
    API_KEY: ClassVar[ApiKey] = ApiKey.DESCRIBE_USER_SCRAM_CREDENTIALS
    users: tuple[str, ...] | None
    """None: every user. A user named that has no credential is left out of the answer."""


@attrs.frozen(kw_only=True)
class DescribeUserScramCredentialsResponse:
    API_KEY: ClassVar[ApiKey] = ApiKey.DESCRIBE_USER_SCRAM_CREDENTIALS
    error_code: ErrorCode
    users: tuple[UserScramCredentials, ...]


@attrs.frozen(kw_only=True)
class ScramUpsertion:
    """Add or replace ``user``'s credential for ``mechanism``: what the broker stores, derived
    by the client from the password (RFC 5802 §3: StoredKey = H(ClientKey), ServerKey =
    HMAC(SaltedPassword, "Server Key"))."""

    user: str
    mechanism: str
    iterations: Int32
    salt: bytes
    stored_key: bytes
    server_key: bytes


@attrs.frozen(kw_only=True)
class AlterUserScramCredentialsRequest:
    API_KEY: ClassVar[ApiKey] = ApiKey.ALTER_USER_SCRAM_CREDENTIALS
    deletions: tuple[str, ...]
    """Users to delete, every credential of each (Kafka deletes one mechanism at a time)."""
    upsertions: tuple[ScramUpsertion, ...]


@attrs.frozen(kw_only=True)
class UserAlteration:
    user: str
    error_code: ErrorCode


@attrs.frozen(kw_only=True)
class AlterUserScramCredentialsResponse:
    API_KEY: ClassVar[ApiKey] = ApiKey.ALTER_USER_SCRAM_CREDENTIALS
    error_code: ErrorCode
    results: tuple[UserAlteration, ...]
    """One per user the request named, in its order: NONE, or why that user was not changed."""


# --- tables -------------------------------------------------------------------------------------

RequestMessage: TypeAlias = (
    ProduceRequest
    | FetchRequest
    | ListOffsetsRequest
    | ClusterMetadataRequest
    | RegisterConsumerRequest
    | PingRequest
    | StopFetcherRequest
    | StartFetcherRequest
    | OffsetCommitRequest
    | OffsetFetchRequest
    | CreateTopicRequest
    | CreatePartitionsRequest
    | ListGroupsRequest
    | DescribeGroupRequest
    | LeaveGroupRequest
    | DeleteGroupRequest
    | DeleteTopicRequest
    | SaslHandshakeRequest
    | SaslAuthenticateRequest
    | DescribeAclsRequest
    | CreateAclsRequest
    | DeleteAclsRequest
    | DescribeUserScramCredentialsRequest
    | AlterUserScramCredentialsRequest
    | ReplicaFetchRequest
)
ResponseMessage: TypeAlias = (
    ProduceResponse
    | FetchResponse
    | ListOffsetsResponse
    | ClusterMetadataResponse
    | RegisterConsumerResponse
    | PingResponse
    | StopFetcherResponse
    | StartFetcherResponse
    | OffsetCommitResponse
    | OffsetFetchResponse
    | CreateTopicResponse
    | CreatePartitionsResponse
    | ListGroupsResponse
    | DescribeGroupResponse
    | LeaveGroupResponse
    | DeleteGroupResponse
    | DeleteTopicResponse
    | SaslHandshakeResponse
    | SaslAuthenticateResponse
    | DescribeAclsResponse
    | CreateAclsResponse
    | DeleteAclsResponse
    | DescribeUserScramCredentialsResponse
    | AlterUserScramCredentialsResponse
    | ReplicaFetchResponse
)

_REQUESTS: tuple[type[RequestMessage], ...] = typing.get_args(RequestMessage)
_RESPONSES: tuple[type[ResponseMessage], ...] = typing.get_args(ResponseMessage)

REQUEST_TYPES: Mapping[ApiKey, type[RequestMessage]] = MappingProxyType(
    {cls.API_KEY: cls for cls in _REQUESTS}
)
RESPONSE_TYPES: Mapping[ApiKey, type[ResponseMessage]] = MappingProxyType(
    {cls.API_KEY: cls for cls in _RESPONSES}
)

NEWEST_VERSION: Mapping[ApiKey, int] = MappingProxyType(
    {key: 0 for key in ApiKey}
    | {
        ApiKey.PRODUCE: 3,
        ApiKey.CLUSTER_METADATA: 5,
        ApiKey.FETCH: 3,
        ApiKey.LIST_OFFSETS: 2,
        ApiKey.REGISTER_CONSUMER: 3,
        ApiKey.CREATE_TOPIC: 3,
        ApiKey.CREATE_PARTITIONS: 1,
        ApiKey.PING: 1,
        ApiKey.STOP_FETCHER: 3,
        ApiKey.START_FETCHER: 3,
        ApiKey.DESCRIBE_GROUP: 3,
    }
)
"""Every api is served in versions 0 .. its newest; clients here send the newest. SPEC.md §3 has
the version table (what each version changed)."""


def coordinator_versions_served() -> tuple[ApiVersionRange, ...]:
    """What a consumer built on this package reads of the coordinator's requests: every
    version of each (its Connection decodes them all)."""
    return tuple(
        ApiVersionRange(api_key=key, min_version=0, max_version=NEWEST_VERSION[key])
        for key in sorted(COORDINATOR_REQUESTS)
    )


REQUEST_CODECS: Mapping[tuple[ApiKey, int], Codec[Any]] = MappingProxyType(
    {
        (key, version): struct_codec(cls, version)
        for key, cls in REQUEST_TYPES.items()
        for version in range(NEWEST_VERSION[key] + 1)
    }
)
"""The body codec of each request by api key and version; the frame header is
:mod:`protocol.framing`'s job."""
RESPONSE_CODECS: Mapping[tuple[ApiKey, int], Codec[Any]] = MappingProxyType(
    {
        (key, version): struct_codec(cls, version)
        for key, cls in RESPONSE_TYPES.items()
        for version in range(NEWEST_VERSION[key] + 1)
    }
)

assert len(REQUEST_TYPES) == len(RESPONSE_TYPES) == len(ApiKey), "every api key has both halves"


_FACTORY: type = type(attrs.Factory(list))


def error_response(request: RequestMessage, error_code: ErrorCode) -> ResponseMessage:
    """The response that answers ``request`` with nothing but ``error_code``.

    Every other field takes its "nothing" value (-1 for numbers, empty strings and lists, None
    where allowed), so one function lets a broker refuse any request — not the coordinator,
    still loading — without a hand-written refusal per message type.
    """
    response_type = RESPONSE_TYPES[request.API_KEY]
    hints = typing.get_type_hints(response_type)
    fields: dict[str, Any] = {}
    for field in attrs.fields(response_type):
        hint = hints[field.name]
        if SINCE in field.metadata and not isinstance(field.default, _FACTORY):
            # A field a later version added: its default is what older versions carry.
            fields[field.name] = field.default
        elif hint is ErrorCode:
            fields[field.name] = error_code
        elif type(None) in typing.get_args(hint):
            fields[field.name] = None
        elif hint is str:
            fields[field.name] = ""
        elif hint is bytes:
            fields[field.name] = b""
        elif hint is bool:
            fields[field.name] = False
        elif typing.get_origin(hint) is tuple:
            fields[field.name] = ()
        else:  # Int32 / Int64
            fields[field.name] = -1
    response: ResponseMessage = response_type(**fields)
    return response
