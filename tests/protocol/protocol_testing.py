"""Helpers shared by the protocol tests: connection pairs and hand-built frames."""

from __future__ import annotations

import struct
import uuid

from protocol import (
    COORDINATOR_REQUESTS,
    NEED_DATA,
    AclBinding,
    AlterUserScramCredentialsRequest,
    ApiKey,
    ClusterMetadataRequest,
    Connection,
    ConnectionClosed,
    CreateAclsRequest,
    CreatePartitionsRequest,
    CreateTopicRequest,
    DeleteAclsRequest,
    DeleteGroupRequest,
    DeleteTopicRequest,
    DescribeAclsRequest,
    DescribeGroupRequest,
    DescribeUserScramCredentialsRequest,
    Event,
    FetchRequest,
    LeaveGroupRequest,
    ListGroupsRequest,
    ListOffsetsRequest,
    OffsetCommitRequest,
    OffsetFetchRequest,
    PeerError,
    PingRequest,
    ProduceRequest,
    RegisterConsumerRequest,
    ReplicaFetchPartition,
    ReplicaFetchRequest,
    RequestMessage,
    Role,
    SaslAuthenticateRequest,
    SaslHandshakeRequest,
    ScramUpsertion,
    StartFetcherRequest,
    StopFetcherRequest,
    Subscription,
    TopicStreams,
)


def sender_role(message: RequestMessage) -> Role:
    """The role that may send ``message`` as a request."""
    return Role.BROKER if message.API_KEY in COORDINATOR_REQUESTS else Role.CONSUMER


def other(role: Role) -> Role:
    return Role.BROKER if role is Role.CONSUMER else Role.CONSUMER


def drain(conn: Connection) -> list[Event]:
    """Every event the buffered bytes make, up to NEED_DATA, ConnectionClosed or PeerError."""
    events: list[Event] = []
    while True:
        event = conn.next_event()
        if event is NEED_DATA:
            return events
        events.append(event)
        if isinstance(event, ConnectionClosed | PeerError):
            return events


def string(text: str | None) -> bytes:
    if text is None:
        return struct.pack(">h", -1)
    data = text.encode()
    return struct.pack(">h", len(data)) + data


def raw_frame(
    *,
    kind: int = 0,
    api_key: int = 5,
    version: int = 0,
    correlation_id: int = 0,
    client_id: bytes = b"\x00\x00",
    body: bytes = b"",
) -> bytes:
    """A frame built by hand, for the bytes a correct encoder would never write."""
    rest = struct.pack(">bhhi", kind, api_key, version, correlation_id)
    if kind == 0:
        rest += client_id
    rest += body
    return struct.pack(">i", len(rest)) + rest


def ping_body(
    epoch: int = 1, generation: int = 1, consumer_id: str = "c", retries: int = 0
) -> bytes:
    return struct.pack(">qi", epoch, generation) + string(consumer_id) + struct.pack(">i", retries)


_SUB = Subscription(topics=(TopicStreams(topic="t", streams=1),))
#: Alice may read topic t.
READ_T = AclBinding(principal="User:alice", resource_type="topic", name="t", operation="read")

SAMPLE_REQUESTS: dict[ApiKey, RequestMessage] = {
    ApiKey.PRODUCE: ProduceRequest(topic="t", partition=0, records=()),
    ApiKey.FETCH: FetchRequest(topic="t", partition=0, offset=0, max_bytes=1024),
    ApiKey.LIST_OFFSETS: ListOffsetsRequest(topic="t", partition=0),
    ApiKey.CLUSTER_METADATA: ClusterMetadataRequest(group_id="g", topics=None),
    ApiKey.REGISTER_CONSUMER: RegisterConsumerRequest(
        group_id="g",
        consumer_id="c",
        subscription=_SUB,
        auto_commit=True,
        auto_offset_reset="smallest",
        session_timeout_ms=6000,
        generation=-1,
        owned_partitions=(),
    ),
    ApiKey.PING: PingRequest(coordinator_epoch=1, generation=1, consumer_id="c", num_retries=0),
    ApiKey.STOP_FETCHER: StopFetcherRequest(coordinator_epoch=1, generation=2, consumer_id="c"),
    ApiKey.START_FETCHER: StartFetcherRequest(
        coordinator_epoch=1, generation=2, consumer_id="c", streams=(), brokers=()
    ),
    ApiKey.OFFSET_COMMIT: OffsetCommitRequest(
        group_id="g", consumer_id=None, generation=-1, offsets=()
    ),
    ApiKey.OFFSET_FETCH: OffsetFetchRequest(group_id="g", partitions=None),
    ApiKey.CREATE_TOPIC: CreateTopicRequest(topic="t", partitions=1),
    ApiKey.CREATE_PARTITIONS: CreatePartitionsRequest(topic="t", total_partitions=2),
    ApiKey.LIST_GROUPS: ListGroupsRequest(),
    ApiKey.DESCRIBE_GROUP: DescribeGroupRequest(group_id="g"),
    ApiKey.LEAVE_GROUP: LeaveGroupRequest(group_id="g", consumer_id="c", generation=1),
    ApiKey.DELETE_GROUP: DeleteGroupRequest(group_id="g"),
    ApiKey.DELETE_TOPIC: DeleteTopicRequest(topic="t"),
    ApiKey.SASL_HANDSHAKE: SaslHandshakeRequest(mechanism="SCRAM-SHA-256"),
    ApiKey.SASL_AUTHENTICATE: SaslAuthenticateRequest(auth_bytes=b"n,,n=alice,r=nonce"),
    ApiKey.DESCRIBE_ACLS: DescribeAclsRequest(
        principal=None, resource_type=None, name=None, operation=None
    ),
    ApiKey.CREATE_ACLS: CreateAclsRequest(acls=(READ_T,)),
    ApiKey.DELETE_ACLS: DeleteAclsRequest(acls=(READ_T,)),
    ApiKey.DESCRIBE_USER_SCRAM_CREDENTIALS: DescribeUserScramCredentialsRequest(users=None),
    ApiKey.ALTER_USER_SCRAM_CREDENTIALS: AlterUserScramCredentialsRequest(
        deletions=("bob",),
        upsertions=(
            ScramUpsertion(
                user="alice",
                mechanism="SCRAM-SHA-256",
                iterations=4096,
                salt=b"s" * 16,
                stored_key=b"k" * 32,
                server_key=b"v" * 32,
            ),
        ),
    ),
    ApiKey.REPLICA_FETCH: ReplicaFetchRequest(
        replica_id=2,
        log_dir=uuid.UUID(int=7),
        max_wait_ms=500,
        max_bytes=1 << 20,
        partitions=(
            ReplicaFetchPartition(
                topic_id=uuid.UUID(int=1),
                partition=0,
                leader_epoch=0,
                fetch_offset=0,
                last_fetched_epoch=-1,
            ),
        ),
    ),
}
"""One small, fixed request per api key, for tests where the content does not matter."""
