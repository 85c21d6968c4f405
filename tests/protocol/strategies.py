"""Hypothesis strategies for every wire message and the types inside them.

Values span the full range of each field's wire type (ints to their width, any UTF-8 text, null
wherever a field is nullable), not just the values the coordinator would use: the codec must carry
whatever the types allow, and other packages' tests can narrow these down with ``.filter``/``.map``.
"""

from __future__ import annotations

from typing import Any, TypeVar

from hypothesis import strategies as st

from protocol import (
    COORDINATOR_REQUESTS,
    REQUEST_TYPES,
    RESPONSE_TYPES,
    AclBinding,
    AlterUserScramCredentialsRequest,
    AlterUserScramCredentialsResponse,
    ApiKey,
    ApiVersionRange,
    AssignedPartition,
    AssignedStream,
    BrokerInfo,
    ClusterMetadataRequest,
    ClusterMetadataResponse,
    CreateAclsRequest,
    CreateAclsResponse,
    CreatePartitionsRequest,
    CreatePartitionsResponse,
    CreateTopicRequest,
    CreateTopicResponse,
    DeleteAclsRequest,
    DeleteAclsResponse,
    DeleteGroupRequest,
    DeleteGroupResponse,
    DeleteTopicRequest,
    DeleteTopicResponse,
    DescribeAclsRequest,
    DescribeAclsResponse,
    DescribeGroupRequest,
    DescribeGroupResponse,
    DescribeUserScramCredentialsRequest,
    DescribeUserScramCredentialsResponse,
    EpochStart,
    ErrorCode,
    FetchRequest,
    FetchResponse,
    GroupSummary,
    LeaveGroupRequest,
    LeaveGroupResponse,
    ListGroupsRequest,
    ListGroupsResponse,
    ListOffsetsRequest,
    ListOffsetsResponse,
    MemberDescription,
    OffsetCommitRequest,
    OffsetCommitResponse,
    OffsetFetchRequest,
    OffsetFetchResponse,
    PartitionMetadata,
    PartitionOffset,
    PingRequest,
    PingResponse,
    ProduceRequest,
    ProduceResponse,
    Record,
    RegisterConsumerRequest,
    RegisterConsumerResponse,
    ReplicaFetchData,
    ReplicaFetchPartition,
    ReplicaFetchRequest,
    ReplicaFetchResponse,
    RequestMessage,
    ResponseMessage,
    SaslAuthenticateRequest,
    SaslAuthenticateResponse,
    SaslHandshakeRequest,
    SaslHandshakeResponse,
    ScramCredentialInfo,
    ScramUpsertion,
    StartFetcherRequest,
    StartFetcherResponse,
    StopFetcherRequest,
    StopFetcherResponse,
    Subscription,
    TopicMetadata,
    TopicPartition,
    TopicStreams,
    UserAlteration,
    UserScramCredentials,
)

T = TypeVar("T")

int8 = st.integers(-(2**7), 2**7 - 1)
int16 = st.integers(-(2**15), 2**15 - 1)
int32 = st.integers(-(2**31), 2**31 - 1)
int64 = st.integers(-(2**63), 2**63 - 1)
texts = st.text(max_size=12)
"""Any text UTF-8 can carry (hypothesis leaves out lone surrogates by default)."""
nullable_texts = st.none() | texts
blobs = st.none() | st.binary(max_size=40)
error_codes = st.sampled_from(ErrorCode)


def tuples_of(
    elements: st.SearchStrategy[T], max_size: int = 3
) -> st.SearchStrategy[tuple[T, ...]]:
    return st.lists(elements, max_size=max_size).map(tuple)


topic_partitions = st.builds(TopicPartition, topic=texts, partition=int32)
partition_offsets = st.builds(PartitionOffset, topic=texts, partition=int32, offset=int64)
broker_infos = st.builds(BrokerInfo, broker_id=int32, host=texts, port=int32)
topic_streams = st.builds(TopicStreams, topic=texts, streams=int32)
subscriptions = st.builds(
    Subscription,
    topics=tuples_of(topic_streams),
    pattern=nullable_texts,
    pattern_is_blacklist=st.booleans(),
    pattern_streams=int32,
)
records = st.builds(Record, offset=int64, timestamp_ms=int64, key=blobs, value=blobs)
assigned_partitions = st.builds(
    AssignedPartition, topic=texts, partition=int32, offset=int64, broker_id=int32
)
assigned_streams = st.builds(
    AssignedStream, stream_id=texts, partitions=tuples_of(assigned_partitions)
)
partition_metadata = st.builds(PartitionMetadata, partition=int32, broker_id=int32)
topic_metadata = st.builds(
    TopicMetadata, topic=texts, error_code=error_codes, partitions=tuples_of(partition_metadata)
)
group_summaries = st.builds(GroupSummary, group_id=texts, state=texts)
acl_bindings = st.builds(
    AclBinding, principal=texts, resource_type=texts, name=texts, operation=texts
)
member_descriptions = st.builds(
    MemberDescription,
    member_id=texts,
    client_id=texts,
    session_timeout_ms=int32,
    subscription=subscriptions,
    partitions=tuples_of(topic_partitions),
)

replica_fetch_partitions = st.builds(
    ReplicaFetchPartition,
    topic_id=st.uuids(),
    partition=int32,
    leader_epoch=int64,
    fetch_offset=int64,
    last_fetched_epoch=int64,
)
replica_fetch_data = st.builds(
    ReplicaFetchData,
    topic_id=st.uuids(),
    partition=int32,
    error_code=error_codes,
    high_watermark=int64,
    log_start_offset=int64,
    diverging_epoch=int64,
    diverging_end_offset=int64,
    epoch_starts=tuples_of(st.builds(EpochStart, epoch=int64, start_offset=int64)),
    batches=st.binary(max_size=40),
)

REQUEST_STRATEGIES: dict[ApiKey, st.SearchStrategy[Any]] = {
    ApiKey.PRODUCE: st.builds(
        ProduceRequest, topic=texts, partition=int32, records=tuples_of(records)
    ),
    ApiKey.FETCH: st.builds(
        FetchRequest, topic=texts, partition=int32, offset=int64, max_bytes=int32
    ),
    ApiKey.LIST_OFFSETS: st.builds(ListOffsetsRequest, topic=texts, partition=int32),
    ApiKey.CLUSTER_METADATA: st.builds(
        ClusterMetadataRequest, group_id=nullable_texts, topics=st.none() | tuples_of(texts)
    ),
    ApiKey.REGISTER_CONSUMER: st.builds(
        RegisterConsumerRequest,
        group_id=texts,
        consumer_id=texts,
        subscription=subscriptions,
        auto_commit=st.booleans(),
        auto_offset_reset=texts,
        session_timeout_ms=int32,
        generation=int32,
        owned_partitions=tuples_of(topic_partitions),
        instance_id=nullable_texts,
        served_versions=tuples_of(
            st.builds(ApiVersionRange, api_key=int16, min_version=int16, max_version=int16)
        ),
    ),
    ApiKey.PING: st.builds(
        PingRequest,
        coordinator_epoch=int64,
        generation=int32,
        consumer_id=texts,
        num_retries=int32,
        acknowledged_frames=int64,
    ),
    ApiKey.STOP_FETCHER: st.builds(
        StopFetcherRequest,
        coordinator_epoch=int64,
        generation=int32,
        consumer_id=texts,
        acknowledged_frames=int64,
        partitions=st.none() | tuples_of(topic_partitions),
        reason=error_codes,
    ),
    ApiKey.START_FETCHER: st.builds(
        StartFetcherRequest,
        coordinator_epoch=int64,
        generation=int32,
        consumer_id=texts,
        streams=tuples_of(assigned_streams),
        brokers=tuples_of(broker_infos),
        acknowledged_frames=int64,
        incremental=st.booleans(),
    ),
    ApiKey.OFFSET_COMMIT: st.builds(
        OffsetCommitRequest,
        group_id=texts,
        consumer_id=nullable_texts,
        generation=int32,
        offsets=tuples_of(partition_offsets),
    ),
    ApiKey.OFFSET_FETCH: st.builds(
        OffsetFetchRequest, group_id=texts, partitions=st.none() | tuples_of(topic_partitions)
    ),
    ApiKey.CREATE_TOPIC: st.builds(
        CreateTopicRequest,
        topic=texts,
        partitions=int32,
        broker_ids=st.none() | tuples_of(int32),
    ),
    ApiKey.CREATE_PARTITIONS: st.builds(
        CreatePartitionsRequest,
        topic=texts,
        total_partitions=int32,
        broker_ids=st.none() | tuples_of(int32),
    ),
    ApiKey.LIST_GROUPS: st.builds(ListGroupsRequest),
    ApiKey.DESCRIBE_GROUP: st.builds(DescribeGroupRequest, group_id=texts),
    ApiKey.LEAVE_GROUP: st.builds(
        LeaveGroupRequest, group_id=texts, consumer_id=texts, generation=int32
    ),
    ApiKey.DELETE_GROUP: st.builds(DeleteGroupRequest, group_id=texts),
    ApiKey.DELETE_TOPIC: st.builds(DeleteTopicRequest, topic=texts),
    ApiKey.SASL_HANDSHAKE: st.builds(SaslHandshakeRequest, mechanism=texts),
    ApiKey.SASL_AUTHENTICATE: st.builds(SaslAuthenticateRequest, auth_bytes=st.binary()),
    ApiKey.DESCRIBE_ACLS: st.builds(
        DescribeAclsRequest,
        principal=nullable_texts,
        resource_type=nullable_texts,
        name=nullable_texts,
        operation=nullable_texts,
    ),
    ApiKey.CREATE_ACLS: st.builds(CreateAclsRequest, acls=tuples_of(acl_bindings)),
    ApiKey.DELETE_ACLS: st.builds(DeleteAclsRequest, acls=tuples_of(acl_bindings)),
    ApiKey.DESCRIBE_USER_SCRAM_CREDENTIALS: st.builds(
        DescribeUserScramCredentialsRequest, users=st.none() | tuples_of(texts)
    ),
    ApiKey.ALTER_USER_SCRAM_CREDENTIALS: st.builds(
        AlterUserScramCredentialsRequest,
        deletions=tuples_of(texts),
        upsertions=tuples_of(
            st.builds(
                ScramUpsertion,
                user=texts,
                mechanism=texts,
                iterations=int32,
                salt=st.binary(),
                stored_key=st.binary(),
                server_key=st.binary(),
            )
        ),
    ),
    ApiKey.REPLICA_FETCH: st.builds(
        ReplicaFetchRequest,
        replica_id=int32,
        log_dir=st.uuids(),
        max_wait_ms=int32,
        max_bytes=int32,
        partitions=tuples_of(replica_fetch_partitions),
    ),
}

RESPONSE_STRATEGIES: dict[ApiKey, st.SearchStrategy[Any]] = {
    ApiKey.PRODUCE: st.builds(ProduceResponse, error_code=error_codes, base_offset=int64),
    ApiKey.FETCH: st.builds(
        FetchResponse,
        error_code=error_codes,
        high_watermark=int64,
        log_start_offset=int64,
        records=tuples_of(records),
    ),
    ApiKey.LIST_OFFSETS: st.builds(
        ListOffsetsResponse, error_code=error_codes, log_start_offset=int64, high_watermark=int64
    ),
    ApiKey.CLUSTER_METADATA: st.builds(
        ClusterMetadataResponse,
        error_code=error_codes,
        coordinator_id=int32,
        coordinator_epoch=int64,
        brokers=tuples_of(broker_infos),
        topics=tuples_of(topic_metadata),
    ),
    ApiKey.REGISTER_CONSUMER: st.builds(
        RegisterConsumerResponse, error_code=error_codes, coordinator_epoch=int64, generation=int32
    ),
    ApiKey.PING: st.builds(
        PingResponse,
        error_code=error_codes,
        consumer_id=texts,
        offsets=tuples_of(partition_offsets),
    ),
    ApiKey.STOP_FETCHER: st.builds(
        StopFetcherResponse,
        error_code=error_codes,
        consumer_id=texts,
        offsets=tuples_of(partition_offsets),
    ),
    ApiKey.START_FETCHER: st.builds(
        StartFetcherResponse, error_code=error_codes, consumer_id=texts
    ),
    ApiKey.OFFSET_COMMIT: st.builds(OffsetCommitResponse, error_code=error_codes),
    ApiKey.OFFSET_FETCH: st.builds(
        OffsetFetchResponse, error_code=error_codes, offsets=tuples_of(partition_offsets)
    ),
    ApiKey.CREATE_TOPIC: st.builds(CreateTopicResponse, error_code=error_codes),
    ApiKey.CREATE_PARTITIONS: st.builds(CreatePartitionsResponse, error_code=error_codes),
    ApiKey.LIST_GROUPS: st.builds(
        ListGroupsResponse, error_code=error_codes, groups=tuples_of(group_summaries)
    ),
    ApiKey.DESCRIBE_GROUP: st.builds(
        DescribeGroupResponse,
        error_code=error_codes,
        group_id=texts,
        state=texts,
        generation=int32,
        members=tuples_of(member_descriptions),
        offsets=tuples_of(partition_offsets),
        reported_offsets=tuples_of(partition_offsets),
    ),
    ApiKey.LEAVE_GROUP: st.builds(LeaveGroupResponse, error_code=error_codes),
    ApiKey.DELETE_GROUP: st.builds(DeleteGroupResponse, error_code=error_codes),
    ApiKey.DELETE_TOPIC: st.builds(DeleteTopicResponse, error_code=error_codes),
    ApiKey.SASL_HANDSHAKE: st.builds(
        SaslHandshakeResponse, error_code=error_codes, mechanisms=tuples_of(texts)
    ),
    ApiKey.SASL_AUTHENTICATE: st.builds(
        SaslAuthenticateResponse,
        error_code=error_codes,
        error_message=texts,
        auth_bytes=st.binary(),
    ),
    ApiKey.DESCRIBE_ACLS: st.builds(
        DescribeAclsResponse, error_code=error_codes, acls=tuples_of(acl_bindings)
    ),
    ApiKey.CREATE_ACLS: st.builds(CreateAclsResponse, error_code=error_codes),
    ApiKey.DELETE_ACLS: st.builds(
        DeleteAclsResponse, error_code=error_codes, deleted=tuples_of(acl_bindings)
    ),
    ApiKey.DESCRIBE_USER_SCRAM_CREDENTIALS: st.builds(
        DescribeUserScramCredentialsResponse,
        error_code=error_codes,
        users=tuples_of(
            st.builds(
                UserScramCredentials,
                user=texts,
                credentials=tuples_of(
                    st.builds(ScramCredentialInfo, mechanism=texts, iterations=int32)
                ),
            )
        ),
    ),
    ApiKey.ALTER_USER_SCRAM_CREDENTIALS: st.builds(
        AlterUserScramCredentialsResponse,
        error_code=error_codes,
        results=tuples_of(st.builds(UserAlteration, user=texts, error_code=error_codes)),
    ),
    ApiKey.REPLICA_FETCH: st.builds(
        ReplicaFetchResponse, error_code=error_codes, partitions=tuples_of(replica_fetch_data)
    ),
}

assert (
    set(REQUEST_STRATEGIES) == set(REQUEST_TYPES) == set(RESPONSE_STRATEGIES) == set(RESPONSE_TYPES)
), "a strategy for every message"

request_messages: st.SearchStrategy[RequestMessage] = st.one_of(*REQUEST_STRATEGIES.values())
response_messages: st.SearchStrategy[ResponseMessage] = st.one_of(*RESPONSE_STRATEGIES.values())


def exchanges(
    api_keys: st.SearchStrategy[ApiKey] | None = None,
) -> st.SearchStrategy[tuple[RequestMessage, ResponseMessage]]:
    """A request and a response of the same api key (any key unless ``api_keys`` narrows it)."""
    keys = st.sampled_from(ApiKey) if api_keys is None else api_keys
    return keys.flatmap(lambda key: st.tuples(REQUEST_STRATEGIES[key], RESPONSE_STRATEGIES[key]))


consumer_requests: st.SearchStrategy[RequestMessage] = st.one_of(
    *(REQUEST_STRATEGIES[key] for key in ApiKey if key not in COORDINATOR_REQUESTS)
)
"""Requests the CONSUMER role may send."""
broker_requests: st.SearchStrategy[RequestMessage] = st.one_of(
    *(REQUEST_STRATEGIES[key] for key in sorted(COORDINATOR_REQUESTS))
)
"""Requests the BROKER role may send (Ping, StopFetcher, StartFetcher)."""
