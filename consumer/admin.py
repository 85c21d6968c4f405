"""The operator's view of a cluster: topics, groups, offsets and lag, over the wire protocol.

Everything here is a client of the brokers like any other (it is what the CLI's ``topics`` and
``groups`` verbs run), so what it shows is what a consumer would see.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from functools import partial

import attrs
import trio

from consumer.leaders import LEADER_CODES, Leader, leaders_of
from consumer.runtime import busy_wait, unwrap_single
from protocol import (
    AlterUserScramCredentialsRequest,
    AlterUserScramCredentialsResponse,
    ClusterMetadataRequest,
    ClusterMetadataResponse,
    ConfigEntry,
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
    ErrorCode,
    FetchRequest,
    FetchResponse,
    GroupSummary,
    ListGroupsRequest,
    ListGroupsResponse,
    ListOffsetsRequest,
    ListOffsetsResponse,
    OffsetCommitRequest,
    OffsetCommitResponse,
    PartitionOffset,
    RemoteProtocolError,
    RequestMessage,
    ResponseMessage,
    ScramUpsertion,
    TopicMetadata,
)
from protocol.batches import RecordBatch, batch_at, records_from_batches, walk_batches
from protocol.sasl import MECHANISMS, ScramCredential
from protocol.topic_configs import checked_configs
from protocol.types import BrokerInfo, TopicId, TopicPartition
from statemachine.acl import Acl, Operation, ResourceType, acl_of, binding_of
from transport.channel import Channel
from transport.connect import (
    Address,
    Connector,
    NoBrokerAvailable,
    connect_any,
    open_channel,
    parse_bootstrap,
)
from transport.refusals import refusal
from transport.scram import ITERATIONS, make_credential
from transport.security import ClientSecurity

CLIENT_ID = "coordinator-admin"

#: A coordinator answers COORDINATOR_LOAD_IN_PROGRESS while it reads its groups' records after
#: taking office (docs/design.md#loading), and a broker that just lost the office
#: NOT_COORDINATOR: a group request finds the coordinator and asks again this often...
LOAD_RETRY = 0.05
#: ...this many times (15 s: beyond the default ZooKeeper session of 8 s and a tick) before the
#: code is reported.
LOAD_RETRIES = 300


class AdminError(Exception):
    """The cluster refused the operation; ``error_code`` says why."""

    def __init__(self, what: str, error_code: ErrorCode) -> None:
        hint = _HINTS.get(error_code)
        super().__init__(
            f"{what}: {hint} ({error_code.name})" if hint else f"{what}: {error_code.name}"
        )
        self.error_code = error_code


#: What the codes an operator meets most often mean for them.
_HINTS = {
    ErrorCode.UNKNOWN_TOPIC_OR_PARTITION: "no such topic",
    ErrorCode.TOPIC_ALREADY_EXISTS: "the topic already exists",
    ErrorCode.INVALID_PARTITIONS: (
        "a topic's partitions can only be added to, up to the broker's --max-partitions-per-topic"
    ),
    ErrorCode.POLICY_VIOLATION: "the broker would hold more than its --max-partitions-per-broker",
    ErrorCode.INVALID_REPLICA_ASSIGNMENT: "name live brokers, each once",
    ErrorCode.INVALID_REPLICATION_FACTOR: (
        "a topic's replication factor is 1 to the number of live brokers (without one, the "
        "brokers' --default-replication-factor: 3 on a cluster, 1 on the embedded store)"
    ),
    ErrorCode.INVALID_CONFIG: (
        "a topic's settings are retention.ms, retention.bytes and segment.bytes, each once, "
        "as whole numbers within their bounds"
    ),
    ErrorCode.INVALID_TOPIC_EXCEPTION: "a topic name is 1-249 characters of [A-Za-z0-9._-]",
    ErrorCode.INVALID_GROUP_ID: (
        "a group id is at most the broker's --max-id-bytes, without control characters"
    ),
    ErrorCode.OFFSET_OUT_OF_RANGE: "an offset lies past its partition's log end",
    ErrorCode.GROUP_ID_NOT_FOUND: "no such group",
    ErrorCode.NON_EMPTY_GROUP: "the group has live members; stop its consumers first",
    ErrorCode.RESOURCE_NOT_FOUND: "no such user",
    ErrorCode.UNACCEPTABLE_CREDENTIAL: (
        "the broker takes SCRAM-SHA-256 and SCRAM-SHA-512 credentials of 4096-16384 iterations"
    ),
    ErrorCode.REBALANCE_IN_PROGRESS: (
        "a partition of the group is under a consumer's lease (one that died, or one a "
        "coordinator failover is waiting for, may still be fetching it); retry after the "
        "consumers' session timeout"
    ),
}


#: Codes that mean the coordinator is loading or moving: ask again shortly (SPEC.md §11.7).
_ASK_AGAIN = (ErrorCode.COORDINATOR_LOAD_IN_PROGRESS, ErrorCode.NOT_COORDINATOR)

#: Codes of a broker that is busy (it sheds admin requests while its loop is behind) or cannot
#: reach its store for a moment: asked again with backoff, and at least a BROKER_BUSY answer's
#: hint, with jitter (SPEC.md §11.7)...
_BACK_OFF = (ErrorCode.BROKER_BUSY, ErrorCode.COORDINATOR_NOT_AVAILABLE)
#: ... from this long, doubling to 5 s, for this long in all before the code is reported.
BACKOFF, MAX_BACKOFF, PATIENCE = 0.1, 5.0, 15.0


@attrs.frozen(kw_only=True)
class PartitionLag:
    topic: str
    partition: int
    owner: str | None
    committed: int  # -1: nothing committed; only durable offsets count as committed
    reported: int | None
    """An offset the coordinator accepted and has not written yet (None: nothing pending): a
    coordinator crash before its next commit loses it, so it is not shown as committed."""
    end: int  # -1: the partition's broker did not answer
    lag: int | None
    #: Age of the oldest record not yet consumed, in seconds (0.0 with no lag; None: unknown,
    #: nothing committed or its broker did not answer).
    lag_seconds: float | None = None

    def as_json(self) -> dict[str, object]:
        """No value is null, as ``reported``'s and ``lag``'s, not -1 (the table's "-")."""
        shown = attrs.asdict(self)
        for name in ("committed", "end"):
            if shown[name] < 0:
                shown[name] = None
        return shown


@attrs.frozen(kw_only=True)
class MemberReport:
    id: str
    partitions: tuple[TopicPartition, ...]
    client_id: str = ""
    #: The address its connection comes from ("": a broker older than DescribeGroup v2).
    host: str = ""
    #: A member of the group's record that a new coordinator still waits for after a failover:
    #: not registered with it yet, though it may be fetching what it holds under its lease.
    awaiting: bool = False

    def as_json(self) -> dict[str, object]:
        return {
            "id": self.id,
            "client_id": self.client_id,
            "host": self.host,
            "awaiting": self.awaiting,
            # objects, as in the top-level "partitions": a topic name may hold a dash
            "partitions": [
                {"topic": tp.topic, "partition": tp.partition} for tp in self.partitions
            ],
        }


@attrs.frozen(kw_only=True)
class GroupReport:
    """One group as ``groups describe --json`` prints it."""

    group: str
    state: str
    generation: int
    members: tuple[MemberReport, ...]
    partitions: tuple[PartitionLag, ...]

    def as_json(self) -> dict[str, object]:
        return {
            "group": self.group,
            "state": self.state,
            "generation": self.generation,
            "members": [m.as_json() for m in self.members],
            "partitions": [p.as_json() for p in self.partitions],
        }


@attrs.frozen(kw_only=True)
class BrokerReport:
    """One broker as ``coordinator cluster`` shows it. A broker is up while it is registered in
    the cluster's store; one that is down is known only because a partition or a slot names it,
    and has no address."""

    broker_id: int
    address: Address | None
    slots: tuple[int, ...]
    partitions: int
    """The partitions it leads."""
    replicas: int = 0
    """The partitions it holds a replica of, the ones it leads among them."""

    @property
    def up(self) -> bool:
        return self.address is not None

    def as_json(self) -> dict[str, object]:
        host, port = self.address or (None, None)
        return {
            "broker": self.broker_id,
            "host": host,
            "port": port,
            "up": self.up,
            "slots": list(self.slots),
            "partitions": self.partitions,
            "replicas": self.replicas,
        }


@attrs.frozen(kw_only=True)
class TopicListing:
    """Topics as one ClusterMetadata answer gives them: their partitions, and the id of each
    topic's incarnation in force (docs/design.md#topic-ids; none from a broker that answers
    before version 2)."""

    topics: tuple[TopicMetadata, ...]
    ids: Mapping[str, TopicId]
    #: The settings each topic was created with, by name (protocol/topic_configs.py); a topic
    #: not here has none of its own (or the broker answers before version 3).
    configs: Mapping[str, Mapping[str, str]] = attrs.field(factory=dict)
    #: Each partition's leader, leader epoch, replicas and in-sync replicas.
    leaders: Mapping[TopicPartition, Leader] = attrs.field(factory=dict)


@attrs.frozen(kw_only=True)
class ClusterReport:
    """The cluster as ``coordinator cluster`` shows it: every broker known, and the slot count."""

    slots: int
    brokers: tuple[BrokerReport, ...]

    def as_json(self) -> dict[str, object]:
        return {"slots": self.slots, "brokers": [b.as_json() for b in self.brokers]}


def cluster_report(metadata: ClusterMetadataResponse) -> ClusterReport:
    """Who is up, and which coordinator slots and how many partitions each broker holds, from
    one ClusterMetadata answer naming every topic."""
    live = {b.broker_id: (b.host, b.port) for b in metadata.brokers}
    partitions: dict[int, int] = {}
    replicas: dict[int, int] = {}
    for leader in leaders_of(metadata).values():
        if leader.broker_id >= 0:
            partitions[leader.broker_id] = partitions.get(leader.broker_id, 0) + 1
        for replica in leader.replicas:
            replicas[replica] = replicas.get(replica, 0) + 1
    slots: dict[int, list[int]] = {}
    for slot, holder in enumerate(metadata.slot_holders):
        if holder >= 0:
            slots.setdefault(holder, []).append(slot)
    known = sorted(set(live) | set(partitions) | set(replicas) | set(slots))
    return ClusterReport(
        slots=len(metadata.slot_holders),
        brokers=tuple(
            BrokerReport(
                broker_id=broker,
                address=live.get(broker),
                slots=tuple(slots.get(broker, ())),
                partitions=partitions.get(broker, 0),
                replicas=replicas.get(broker, 0),
            )
            for broker in known
        ),
    )


@attrs.frozen
class OffsetAndTimestamp:
    """What a lookup by time found (aiokafka's ``OffsetAndTimestamp``): the earliest offset
    whose record is at least as late as asked, and that record's timestamp (ms)."""

    offset: int
    timestamp: int


@attrs.frozen(kw_only=True)
class PartitionRead:
    """What :meth:`Admin.read` found: checked batches, and the partition's log bounds then."""

    batches: tuple[RecordBatch, ...]
    log_start: int
    high_watermark: int


@attrs.define(eq=False)
class Admin:
    #: The connection to the bootstrap broker that answered.
    channel: Channel
    address: Address
    #: Owns the connections to the other brokers, each held by a task of its own, so that one
    #: opened inside a caller's cancel scope (``trio.fail_after`` around a call) outlives it.
    _nursery: trio.Nursery
    _brokers: dict[int, Channel] = attrs.field(factory=dict)
    #: The broker channel each partition :meth:`read` reads was last found on.
    _readers: dict[TopicPartition, Channel] = attrs.field(factory=dict)
    #: How this admin connects to the other brokers of the cluster: as to the first.
    _connect: Connector = attrs.field(factory=lambda: ClientSecurity().connector())

    async def call(self, request: RequestMessage) -> ResponseMessage:
        return await _patiently(partial(self.channel.request, request))

    async def call_coordinator(self, request: RequestMessage, group_id: str) -> ResponseMessage:
        """A group request, sent to the coordinator of ``group_id``, found through whichever
        broker this admin bootstrapped from, as a consumer finds it (SPEC.md §11.1): asked again
        while the coordinator is still loading or moving."""
        response: ResponseMessage | None = None
        for _ in range(LOAD_RETRIES):
            channel = await self._coordinator(group_id)
            if channel is not None:
                response = await _patiently(partial(channel.request, request))
                if getattr(response, "error_code", None) not in _ASK_AGAIN:
                    return response
            await trio.sleep(LOAD_RETRY)
        if response is None:
            raise AdminError("find the coordinator", ErrorCode.COORDINATOR_NOT_AVAILABLE)
        return response

    async def _coordinator(self, group_id: str) -> Channel | None:
        """A channel to the broker the cluster names as ``group_id``'s coordinator now; None
        while it names none or that broker cannot be reached."""
        response = await self.call(ClusterMetadataRequest(group_id=group_id, topics=()))
        assert isinstance(response, ClusterMetadataResponse)
        if response.error_code in _ASK_AGAIN:
            return None
        _check("find the coordinator", response.error_code)
        if response.coordinator_epoch != -1:
            return self.channel  # only the coordinator tells its epoch (SPEC.md §11.1)
        coordinator = {b.broker_id: b for b in response.brokers}.get(response.coordinator_id)
        if coordinator is None:
            return None
        try:
            return await self._channel_for(coordinator)
        except NoBrokerAvailable:
            return None

    async def metadata(
        self, topics: Sequence[str] | None = None, *, group: str | None = None
    ) -> ClusterMetadataResponse:
        """``group``: also name that group's coordinator."""
        response = await self.call(
            ClusterMetadataRequest(group_id=group, topics=None if topics is None else tuple(topics))
        )
        assert isinstance(response, ClusterMetadataResponse)
        return response

    async def cluster(self) -> ClusterReport:
        return cluster_report(await self.metadata())

    async def create_topic(
        self,
        topic: str,
        partitions: int,
        brokers: Sequence[int] | None = None,
        configs: Mapping[str, str] | None = None,
        replication_factor: int | None = None,
    ) -> None:
        """``brokers``: the ids to place the partitions on; None: every live broker.
        ``configs``: the topic's own settings by Kafka's names (``{"retention.ms": "3600000"}``;
        protocol/topic_configs.py), the broker's for those not named; one it does not take
        raises ``InvalidTopicConfig`` (a ValueError) before anything is sent.
        ``replication_factor``: replicas per partition; None: the broker's default."""
        settings = checked_configs((configs or {}).items())
        factor = -1 if replication_factor is None else replication_factor
        response = await self.call(
            CreateTopicRequest(
                topic=topic,
                partitions=partitions,
                broker_ids=None if brokers is None else tuple(brokers),
                configs=tuple(ConfigEntry(name=k, value=v) for k, v in settings),
                replication_factor=factor,
            )
        )
        assert isinstance(response, CreateTopicResponse)
        what = f"create topic {topic}"
        if response.error_code is ErrorCode.INVALID_REPLICATION_FACTOR:
            what += f": replication factor {'(the default)' if factor == -1 else factor}"
        _check(what, response.error_code)

    async def add_partitions(
        self, topic: str, total: int, brokers: Sequence[int] | None = None
    ) -> None:
        response = await self.call(
            CreatePartitionsRequest(
                topic=topic,
                total_partitions=total,
                broker_ids=None if brokers is None else tuple(brokers),
            )
        )
        assert isinstance(response, CreatePartitionsResponse)
        _check(f"alter topic {topic}", response.error_code)

    async def delete_topic(self, topic: str) -> None:
        """Delete the topic, its partitions' files and every group's offsets for it; each
        broker deletes its partitions of it as it hears, within moments (SPEC.md §8)."""
        response = await self.call(DeleteTopicRequest(topic=topic))
        assert isinstance(response, DeleteTopicResponse)
        _check(f"delete topic {topic}", response.error_code)

    async def topics(self, names: Sequence[str] | None = None) -> tuple[TopicMetadata, ...]:
        return (await self.listing(names)).topics

    async def listing(self, names: Sequence[str] | None = None) -> TopicListing:
        """The topics named (None: every one) and their ids; AdminError for one that does not
        exist."""
        metadata = await self.metadata(names)
        for topic in metadata.topics:
            _check(f"topic {topic.topic}", topic.error_code)
        ids = {identity.topic: identity.topic_id for identity in metadata.topic_ids}
        configs = {
            entry.topic: {c.name: c.value for c in entry.configs}
            for entry in metadata.topic_configs
        }
        return TopicListing(
            topics=metadata.topics, ids=ids, configs=configs, leaders=leaders_of(metadata)
        )

    async def groups(self) -> tuple[GroupSummary, ...]:
        """Every broker of the cluster lists the groups of the coordinator slots it holds
        (docs/design.md#coordinator-slots); a group whose slot is moving may be listed by
        neither, or by both once."""
        listed: dict[str, GroupSummary] = {}
        for broker in (await self.metadata(())).brokers:
            try:
                channel = await self._channel_for(broker)
            except NoBrokerAvailable:
                raise AdminError(
                    f"list the groups of broker {broker.broker_id}",
                    ErrorCode.COORDINATOR_NOT_AVAILABLE,
                ) from None
            response = await _asked_again(channel, ListGroupsRequest())
            assert isinstance(response, ListGroupsResponse)
            _check("list groups", response.error_code)
            listed.update((group.group_id, group) for group in response.groups)
        return tuple(listed[group_id] for group_id in sorted(listed))

    async def delete_group(self, group: str) -> None:
        response = await self.call_coordinator(DeleteGroupRequest(group_id=group), group)
        assert isinstance(response, DeleteGroupResponse)
        _check(f"delete group {group}", response.error_code)

    async def describe_group(self, group: str) -> GroupReport:
        """The lag is counted from the committed (durable) offset, which only moves forward."""
        response = await self.call_coordinator(DescribeGroupRequest(group_id=group), group)
        assert isinstance(response, DescribeGroupResponse)
        _check(f"group {group}", response.error_code)
        owners = {tp: m.member_id for m in response.members for tp in m.partitions}
        committed = {po.topic_partition: po.offset for po in response.offsets}
        reported = {po.topic_partition: po.offset for po in response.reported_offsets}
        known = committed.keys() | reported.keys()
        hosts = {h.member_id: h.host for h in response.member_hosts}
        awaiting = frozenset(response.awaiting)
        subscribed = {tp.topic for tp in owners} | {tp.topic for tp in known}
        ends = {tp: end for tp, (_, end) in (await self.log_bounds(sorted(subscribed))).items()}
        behind = {
            tp: done for tp, done in committed.items() if done >= 0 and ends.get(tp, -1) > done
        }
        stamps = await self.timestamps_at(behind) if behind else {}
        now_ms = time.time() * 1000  # real-clock: record timestamps are wall time
        rows = []
        for tp in sorted(set(ends) | known | set(owners)):
            end, done = ends.get(tp, -1), committed.get(tp, -1)
            rows.append(
                PartitionLag(
                    topic=tp.topic,
                    partition=tp.partition,
                    owner=owners.get(tp),
                    committed=done,
                    reported=reported.get(tp),
                    end=end,
                    lag=None if end < 0 else end - max(done, 0),
                    lag_seconds=(
                        (max(0.0, (now_ms - stamps[tp]) / 1000) if tp in stamps else None)
                        if tp in behind
                        else (0.0 if end >= 0 and done >= end else None)
                    ),
                )
            )
        return GroupReport(
            group=response.group_id or group,
            state=response.state,
            generation=response.generation,
            members=tuple(
                MemberReport(
                    id=m.member_id,
                    client_id=m.client_id,
                    host=hosts.get(m.member_id, ""),
                    partitions=tuple(sorted(m.partitions)),
                    awaiting=m.member_id in awaiting,
                )
                for m in response.members
            ),
            partitions=tuple(rows),
        )

    async def committed_offsets(self, group: str) -> dict[TopicPartition, int]:
        """The group's committed offsets, of the partitions it has one for (none: a group the
        coordinator does not know, which a reset may still create)."""
        response = await self.call_coordinator(DescribeGroupRequest(group_id=group), group)
        assert isinstance(response, DescribeGroupResponse)
        if response.error_code is ErrorCode.GROUP_ID_NOT_FOUND:
            return {}
        _check(f"group {group}", response.error_code)
        return {po.topic_partition: po.offset for po in response.offsets if po.offset >= 0}

    async def reset_offsets(self, group: str, offsets: dict[TopicPartition, int]) -> None:
        """A standalone commit: accepted only while the group has no live members."""
        request = OffsetCommitRequest(
            group_id=group,
            consumer_id=None,
            generation=-1,
            offsets=tuple(
                PartitionOffset(topic=tp.topic, partition=tp.partition, offset=offset)
                for tp, offset in sorted(offsets.items())
            ),
        )
        response = await self.call_coordinator(request, group)
        assert isinstance(response, OffsetCommitResponse)
        _check(f"reset offsets of {group}", response.error_code)

    # Users and access rules (SPEC.md §8, 29-31 and 50-51): asked of the bootstrap broker, which
    # writes them to the metadata store every broker reads them from.

    async def acls(
        self,
        *,
        principal: str | None = None,
        resource: ResourceType | None = None,
        name: str | None = None,
        operation: Operation | None = None,
    ) -> tuple[Acl, ...]:
        """The rules in force, those matching each argument given (exactly)."""
        response = await self.call(
            DescribeAclsRequest(
                principal=principal,
                resource_type=None if resource is None else resource.value,
                name=name,
                operation=None if operation is None else operation.value,
            )
        )
        assert isinstance(response, DescribeAclsResponse)
        _check("list the access rules", response.error_code)
        return tuple(acl_of(binding) for binding in response.acls)

    async def create_acls(self, acls: Sequence[Acl]) -> None:
        """Add the rules, all or none; in force on every broker within the bound of
        docs/design.md#who-may-do-what."""
        response = await self.call(CreateAclsRequest(acls=tuple(map(binding_of, acls))))
        assert isinstance(response, CreateAclsResponse)
        _check("add access rules", response.error_code)

    async def delete_acls(self, acls: Sequence[Acl]) -> tuple[Acl, ...]:
        """Remove the rules; those of them that were in force."""
        response = await self.call(DeleteAclsRequest(acls=tuple(map(binding_of, acls))))
        assert isinstance(response, DeleteAclsResponse)
        _check("remove access rules", response.error_code)
        return tuple(acl_of(binding) for binding in response.deleted)

    async def users(self, names: Sequence[str] | None = None) -> dict[str, dict[str, int]]:
        """Each user (of ``names``, or every one) with a credential: its mechanisms and their
        iteration counts."""
        response = await self.call(
            DescribeUserScramCredentialsRequest(users=None if names is None else tuple(names))
        )
        assert isinstance(response, DescribeUserScramCredentialsResponse)
        _check("list users", response.error_code)
        return {
            user.user: {c.mechanism: c.iterations for c in user.credentials}
            for user in response.users
        }

    async def set_password(
        self,
        user: str,
        password: str,
        mechanisms: Sequence[str] = MECHANISMS,
        iterations: int = ITERATIONS,
    ) -> None:
        """Add the user, or replace its credentials for ``mechanisms``: derived here, under a
        fresh salt each, so that the password never leaves this process (SPEC.md §12)."""
        upsertions = [
            scram_upsertion(user, make_credential(mechanism, password, iterations))
            for mechanism in mechanisms
        ]
        await self._alter_users(f"set {user}'s password", (), upsertions)

    async def delete_user(self, user: str) -> None:
        """Delete every credential of the user; AdminError RESOURCE_NOT_FOUND if it has none."""
        await self._alter_users(f"delete user {user}", (user,), ())

    async def _alter_users(
        self, what: str, deletions: Sequence[str], upsertions: Sequence[ScramUpsertion]
    ) -> None:
        response = await self.call(
            AlterUserScramCredentialsRequest(
                deletions=tuple(deletions), upsertions=tuple(upsertions)
            )
        )
        assert isinstance(response, AlterUserScramCredentialsResponse)
        _check(what, response.error_code)
        for result in response.results:
            _check(what, result.error_code)

    async def log_bounds(
        self, topics: Sequence[str] | None = None
    ) -> dict[TopicPartition, tuple[int, int]]:
        """(log start, end) of every partition of ``topics`` (all when None), each asked of the
        broker that holds it; partitions whose broker does not answer are left out."""
        bounds: dict[TopicPartition, tuple[int, int]] = {}
        async for tp, channel in self._partition_channels(topics):
            response = await channel.request(
                ListOffsetsRequest(topic=tp.topic, partition=tp.partition)
            )
            if isinstance(response, ListOffsetsResponse) and not response.error_code:
                bounds[tp] = (response.log_start_offset, response.high_watermark)
        return bounds

    async def offsets_for_times(
        self, timestamps: Mapping[TopicPartition, int]
    ) -> dict[TopicPartition, OffsetAndTimestamp | None]:
        """For each partition, the earliest offset whose record's timestamp (ms) is at least the
        one given, with that timestamp; None where no record is that late (Kafka's and
        aiokafka's ``offsets_for_times``; ListOffsets 1, SPEC.md §8, 2). Each asked of the broker
        that holds the partition; AdminError (UNKNOWN_TOPIC_OR_PARTITION) for a partition no
        broker that answers holds."""
        for tp, ms in timestamps.items():
            if ms < 0:
                raise ValueError(f"the timestamp for {tp} is {ms}: a timestamp is >= 0 (ms)")
        found: dict[TopicPartition, OffsetAndTimestamp | None] = {}
        async for tp, channel in self._partition_channels(sorted({tp.topic for tp in timestamps})):
            if tp not in timestamps:
                continue
            response = await channel.request(
                ListOffsetsRequest(
                    topic=tp.topic, partition=tp.partition, timestamp_ms=timestamps[tp]
                )
            )
            assert isinstance(response, ListOffsetsResponse)
            _check(f"look up {tp.topic}-{tp.partition} by time", response.error_code)
            found[tp] = (
                None
                if response.offset < 0
                else OffsetAndTimestamp(offset=response.offset, timestamp=response.timestamp_ms)
            )
        for tp in timestamps.keys() - found.keys():
            raise AdminError(
                f"look up {tp.topic}-{tp.partition} by time", ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
            )
        return {tp: found[tp] for tp in timestamps}

    async def timestamps_at(
        self, offsets: Mapping[TopicPartition, int]
    ) -> dict[TopicPartition, int]:
        """The timestamp (ms) of the record at each offset, each asked of the broker that holds
        the partition; those it cannot give are left out."""
        stamps: dict[TopicPartition, int] = {}
        async for tp, channel in self._partition_channels(sorted({tp.topic for tp in offsets})):
            offset = offsets.get(tp)
            if offset is None:
                continue
            response = await channel.request(
                FetchRequest(topic=tp.topic, partition=tp.partition, offset=offset, max_bytes=1)
            )
            if not isinstance(response, FetchResponse) or response.error_code:
                continue
            try:
                records = response.records or records_from_batches(response.batches, offset, 1)
            except RemoteProtocolError:
                continue
            first = next((r for r in records if r.offset >= offset), None)
            if first is not None:
                stamps[tp] = first.timestamp_ms
        return stamps

    async def read(
        self, tp: TopicPartition, offset: int, max_bytes: int = 1024 * 1024
    ) -> PartitionRead:
        """The stored batches of ``tp`` from the one holding ``offset`` on, up to about
        ``max_bytes``, read without a group (kcat's ``-p``/``-o``): nothing is committed and no
        coordinator is asked. Each batch is checked whole (:class:`RemoteProtocolError`
        CORRUPT_MESSAGE if one does not check out); those ending before ``offset`` are left
        out, and the first may begin before it. A broker that no longer leads ``tp`` sends the
        read to the leader the metadata names now, once."""
        request = FetchRequest(
            topic=tp.topic, partition=tp.partition, offset=offset, max_bytes=max_bytes
        )
        response: FetchResponse | None = None
        for looked_up in (False, True):
            channel = self._readers.get(tp)
            if channel is None:
                async for at, holder in self._partition_channels([tp.topic]):
                    if at == tp:
                        channel = holder
                if channel is None:
                    raise AdminError(f"read {tp}", ErrorCode.UNKNOWN_TOPIC_OR_PARTITION)
                self._readers[tp] = channel
            answer = await channel.request(request)
            assert isinstance(answer, FetchResponse)
            response = answer
            if response.error_code is ErrorCode.NONE:
                break
            del self._readers[tp]  # maybe moved to another broker: looked up again
            if looked_up or response.error_code not in LEADER_CODES:
                break
        assert response is not None
        _check(f"read {tp} at offset {offset}", response.error_code)
        batches = []
        for position, size, _, _, _ in walk_batches(response.batches):
            batch = batch_at(response.batches, position, size)
            if batch.next_offset > offset:
                batch.section()
                batches.append(batch)
        return PartitionRead(
            batches=tuple(batches),
            log_start=response.log_start_offset,
            high_watermark=response.high_watermark,
        )

    async def _partition_channels(
        self, topics: Sequence[str] | None
    ) -> AsyncIterator[tuple[TopicPartition, Channel]]:
        """Each partition of ``topics`` (all when None) with a channel to the broker that holds
        it; partitions whose broker cannot be reached are left out."""
        metadata = await self.metadata(topics)
        brokers = {b.broker_id: b for b in metadata.brokers}
        for topic in metadata.topics:
            for p in topic.partitions:
                broker = brokers.get(p.broker_id)
                if broker is None:
                    continue
                try:
                    channel = await self._channel_for(broker)
                except NoBrokerAvailable:
                    continue
                yield TopicPartition(topic=topic.topic, partition=p.partition), channel

    async def _channel_for(self, broker: BrokerInfo) -> Channel:
        if (broker.host, broker.port) == self.address:
            return self.channel
        channel = self._brokers.get(broker.broker_id)
        if channel is None:
            stream, _ = await connect_any([(broker.host, broker.port)], connect=self._connect)
            channel = await self._nursery.start(_hold_channel, stream)
            self._brokers[broker.broker_id] = channel
        return channel


async def _hold_channel(stream: trio.abc.Stream, *, task_status: trio.TaskStatus[Channel]) -> None:
    """A connection to another broker, held until the admin closes."""
    async with open_channel(stream, client_id=CLIENT_ID) as channel:
        task_status.started(channel)
        await trio.sleep_forever()


def scram_upsertion(user: str, credential: ScramCredential) -> ScramUpsertion:
    """The credential as AlterUserScramCredentials carries it: salted and hashed."""
    return ScramUpsertion(
        user=user,
        mechanism=credential.mechanism,
        iterations=credential.iterations,
        salt=credential.salt,
        stored_key=credential.stored_key,
        server_key=credential.server_key,
    )


async def _asked_again(channel: Channel, request: RequestMessage) -> ResponseMessage:
    """The broker's answer, asked again while it is still loading or busy."""
    ask = partial(_patiently, partial(channel.request, request))
    response = await ask()
    for _ in range(LOAD_RETRIES):
        if getattr(response, "error_code", None) is not ErrorCode.COORDINATOR_LOAD_IN_PROGRESS:
            break
        await trio.sleep(LOAD_RETRY)
        response = await ask()
    return response


async def _patiently(ask: Callable[[], Awaitable[ResponseMessage]]) -> ResponseMessage:
    """``ask()``'s answer, asked again with backoff and jitter while it is :data:`_BACK_OFF`'s
    (for up to :data:`PATIENCE`)."""
    give_up = trio.current_time() + PATIENCE
    backoff = BACKOFF
    while True:
        response = await ask()
        if getattr(response, "error_code", None) not in _BACK_OFF:
            return response
        wait = busy_wait(getattr(response, "throttle_time_ms", 0), backoff)
        if trio.current_time() + wait > give_up:
            return response
        await trio.sleep(wait)
        backoff = min(2 * backoff, MAX_BACKOFF)


def _check(what: str, error_code: ErrorCode) -> None:
    if error_code is not ErrorCode.NONE:
        refused = refusal(error_code, what)
        raise refused if refused is not None else AdminError(what, error_code)


@asynccontextmanager
async def open_admin(
    bootstrap: str | Sequence[Address],
    *,
    security: ClientSecurity | None = None,
    connect: Connector | None = None,
) -> AsyncIterator[Admin]:
    """An admin client of the cluster ``bootstrap`` (``"host:port[,...]"`` or a list of
    addresses) names, connecting as ``security`` says (default: plaintext, no
    authentication), or through ``connect`` (a consumer's own connector)."""
    addresses = parse_bootstrap(bootstrap) if isinstance(bootstrap, str) else bootstrap
    connect = connect or (security or ClientSecurity()).connector()
    stream, address = await connect_any(addresses, connect=connect)
    with unwrap_single():
        async with (
            open_channel(stream, client_id=CLIENT_ID) as channel,
            trio.open_nursery() as nursery,
        ):
            yield Admin(channel=channel, address=address, nursery=nursery, connect=connect)
            nursery.cancel_scope.cancel()
