"""A broker's connections: one task per connection, in the manner of trio's serve_listeners.

Each connection task owns a nursery with two jobs: the channel (its reader and writer) and a worker
that answers the peer's requests in order; a registered member's Pings come from the coordinator's
one scheduler (:mod:`coordinator.heartbeat`) and their answers back through the reader.
Cancelling the nursery (``Member.connection_scope``) is how the coordinator closes a member's
connection; a connection that ends for any reason kills its member at once, and a peer that breaks
the protocol is told why and closed without touching anyone else.
"""

from __future__ import annotations

import contextlib
import logging
import random
import weakref
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping
from functools import partial

import attrs
import trio
import trio_util

from broker import authorization, placement, rights
from broker.authorization import Access
from broker.door import Door
from broker.offices import (
    BySlot,
    Offices,
    coordinator_of,
    distinct,
    group_slot,
    topic_reads,
    whole_office,
)
from broker.pace import ANSWER_CHUNK, Pace
from coordinator import validation
from coordinator.driver import Ending, Member
from coordinator.group_coordinator import GroupCoordinator
from coordinator.limits import RequestLimits
from protocol import (
    ClusterMetadataRequest,
    ClusterMetadataResponse,
    ConfigEntry,
    CreatePartitionsRequest,
    CreatePartitionsResponse,
    CreateTopicRequest,
    CreateTopicResponse,
    DeleteGroupRequest,
    DeleteGroupResponse,
    DeleteTopicRequest,
    DeleteTopicResponse,
    DescribeGroupRequest,
    ErrorCode,
    LeaveGroupRequest,
    LeaveGroupResponse,
    ListGroupsRequest,
    ListGroupsResponse,
    OffsetCommitRequest,
    OffsetCommitResponse,
    OffsetFetchRequest,
    OffsetFetchResponse,
    PartitionMetadata,
    PartitionReplicas,
    RegisterConsumerRequest,
    RegisterConsumerResponse,
    RemoteProtocolError,
    ReplicaFetchRequest,
    Request,
    ResponseMessage,
    Role,
    TopicConfigs,
    TopicIdentity,
    TopicMetadata,
    TopicReplicas,
    error_response,
)
from protocol.replica_messages import MAX_REPLICA_WAIT_MS
from protocol.topic_configs import InvalidTopicConfig
from protocol.types import BrokerInfo, PartitionOffset, TopicPartition
from protocol.versions import Refusal, negotiate
from statemachine.partition_state import NO_EPOCH, NO_LEADER, PartitionKey, PartitionState
from store import (
    InvalidPartitions,
    InvalidReplicationFactor,
    StoreError,
    StoreUnavailable,
    TopicExists,
    TopicPlacement,
    TopicStore,
    UnknownTopic,
)
from transport.channel import Channel, ReadBounds
from transport.security import Peer

log = logging.getLogger(__name__)

#: Where a new topic's round robin starts (broker/placement.py).
_RANDOM = random.Random()

#: How long a CreateTopic of a replicated topic waits for its partitions' first states before it
#: answers anyway (clients then see no leader for a moment, and retry).
FIRST_STATES_BOUND = 5.0

#: Requests a connection may have queued before its reader waits for the worker.
REQUEST_QUEUE = 64
#: OffsetCommits of one connection waiting for durability at once; the next waits (and with it
#: the worker, then the reader): a peer that pipelines commits gets no task per commit.
COMMITS_IN_FLIGHT = 16

DataPlane = Callable[[Request], Awaitable[ResponseMessage | None]]


#: Requests about one group: answered by the coordinator of the group's slot, if this broker
#: holds it (docs/design.md#coordinator-slots), NOT_COORDINATOR otherwise.
GroupRequest = (
    RegisterConsumerRequest
    | OffsetCommitRequest
    | OffsetFetchRequest
    | LeaveGroupRequest
    | DescribeGroupRequest
    | DeleteGroupRequest
)


@attrs.define(eq=False)
class _Session:
    offices: Offices
    channel: Channel
    nursery: trio.Nursery
    data_plane: DataPlane | None
    #: The access rules in force; None: everyone may do everything.
    access: Access | None = None
    #: What puts new work off while the broker's loop is behind; None: nothing is.
    door: Door | None = None
    member: Member | None = None
    #: The coordinator ``member`` registered with.
    member_coordinator: GroupCoordinator | None = None
    #: The coordinators this connection asked: it closes when one of them leaves this broker.
    used: set[GroupCoordinator] = attrs.Factory(set)
    _commits: trio.Semaphore = attrs.field(factory=lambda: trio.Semaphore(COMMITS_IN_FLIGHT))

    async def work(self, requests: trio.MemoryReceiveChannel[Request]) -> None:
        # A connection is new until the door lets one of its requests through.
        new = True
        async for request in requests:
            response = None if self.door is None else self.door.refusal(request, first=new)
            if response is None:
                new = False
                response = await self.answer(request)
            if self.member is not None:
                self.channel.never_idle()
            if response is not None:
                await self.channel.respond(request, response)

    async def answer(self, request: Request) -> ResponseMessage | None:
        access = self.access
        if access is None:
            return await self._answer(request)
        principal = self.channel.principal
        refused = authorization.refusal(access.current, principal, request.message)
        if refused is not None:
            return refused
        message = request.message
        if isinstance(message, RegisterConsumerRequest):
            subscription = authorization.narrowed(access.current, principal, message.subscription)
            if subscription is not message.subscription:
                request = attrs.evolve(
                    request, message=attrs.evolve(message, subscription=subscription)
                )
        response = await self._answer(request)
        if response is None:
            return None
        return await authorization.visible(access.current, principal, request.message, response)

    def _route(self, group_id: str) -> GroupCoordinator | None:
        coordinator = coordinator_of(self.offices, group_id)
        if coordinator is not None:
            self.used.add(coordinator)
        return coordinator

    async def _answer(self, request: Request) -> ResponseMessage | None:
        message = request.message
        if isinstance(message, rights.RightsRequest):
            access = self.access
            if access is None or access.store is None:
                return error_response(message, ErrorCode.INVALID_REQUEST)
            return await rights.answer(access, access.store, message, self.limits)
        if isinstance(message, GroupRequest):
            if not isinstance(message, RegisterConsumerRequest):  # answered with its epoch
                error = validation.request_error(message, request.client_id, self.limits)
                if error is not ErrorCode.NONE:
                    return error_response(message, error)
            coordinator = self._route(message.group_id)
            if coordinator is None:
                return error_response(message, ErrorCode.NOT_COORDINATOR)
            if not isinstance(message, RegisterConsumerRequest) and coordinator.loading(
                message.group_id
            ):
                return error_response(message, ErrorCode.COORDINATOR_LOAD_IN_PROGRESS)
            return await self._answer_group(request, message, coordinator)
        error = validation.request_error(message, request.client_id, self.limits)
        if (
            error is ErrorCode.NONE
            and isinstance(message, ListGroupsRequest)
            and any(c.loading(None) for c in self._coordinators())
        ):
            error = ErrorCode.COORDINATOR_LOAD_IN_PROGRESS
        if error is ErrorCode.NONE and isinstance(message, ReplicaFetchRequest):
            error = replica_fetch_error(message, self.limits)
        if error is not ErrorCode.NONE:
            return error_response(message, error)
        match message:
            case ClusterMetadataRequest():
                return await self._metadata(message)
            case CreateTopicRequest():
                error = await create_topic(
                    self.offices.store,
                    message,
                    self.limits,
                    default_factor=self.offices.default_replication_factor,
                    wait_states=self.offices.wait_states,
                )
                return CreateTopicResponse(error_code=error)
            case CreatePartitionsRequest():
                return CreatePartitionsResponse(error_code=await self._add_partitions(message))
            case DeleteTopicRequest():
                return DeleteTopicResponse(
                    error_code=await delete_topic(self.offices.store, message, self.limits)
                )
            case ListGroupsRequest():
                coordinators = self._coordinators()
                self.used.update(coordinators)
                groups = [group for c in coordinators for group in c.list_groups()]
                return ListGroupsResponse(error_code=ErrorCode.NONE, groups=tuple(groups))
        if self.data_plane is not None:
            return await self.data_plane(request)
        return error_response(message, ErrorCode.INVALID_REQUEST)

    def _coordinators(self) -> list[GroupCoordinator]:
        """Each coordinator this broker runs, once."""
        return distinct(self.offices.by_slot.value)

    async def _answer_group(
        self, request: Request, message: GroupRequest, coordinator: GroupCoordinator
    ) -> ResponseMessage | None:
        match message:
            case RegisterConsumerRequest():
                if self.member is not None:
                    return RegisterConsumerResponse(
                        error_code=ErrorCode.INVALID_REQUEST,
                        coordinator_epoch=coordinator.epoch,
                        generation=-1,
                    )
                versions = negotiate(message, request.api_version)
                if isinstance(versions, Refusal):
                    # Never accepted and then lost: docs/design.md#old-clients.
                    log.info(
                        "refusing %s's registration in %s: %s",
                        self.channel.peer,
                        message.group_id,
                        versions.message,
                    )
                    await self.channel.refuse(versions.error_code, versions.message)
                    self.nursery.cancel_scope.cancel()
                    return None
                response, member = coordinator.register(
                    message, request.client_id, self.channel, self.nursery.cancel_scope, versions
                )
                if member is not None:
                    self.member = member
                    self.member_coordinator = coordinator
                return response
            case OffsetCommitRequest():
                # Waits for durability: answered from its own task so later requests go on.
                await self._commits.acquire()  # released by _commit
                self.nursery.start_soon(self._commit, request, message, coordinator)
                return None
            case LeaveGroupRequest():
                member = self.member if self.member_coordinator is coordinator else None
                error = coordinator.leave(member, message)
                if error is not ErrorCode.NONE:
                    return LeaveGroupResponse(error_code=error)
                # The connection is closing (its writer with it): the answer leaves from here.
                await self.channel.respond(request, LeaveGroupResponse(error_code=ErrorCode.NONE))
                await self.channel.flush()
                return None
            case OffsetFetchRequest():
                return await self._offset_fetch(message, coordinator)
            case DescribeGroupRequest():
                return await coordinator.describe(message.group_id)
            case DeleteGroupRequest():
                return DeleteGroupResponse(
                    error_code=await coordinator.delete_group(message.group_id)
                )

    @property
    def limits(self) -> RequestLimits:
        return self.offices.config.limits

    async def _offset_fetch(
        self, message: OffsetFetchRequest, coordinator: GroupCoordinator
    ) -> OffsetFetchResponse:
        """The answer is built a chunk at a time with a checkpoint between chunks, so a
        request naming its maximum of partitions (or a group holding offsets for as many) does
        not hold the event loop for other connections; sorting plain tuples, not
        TopicPartitions (attrs' ordering costs microseconds per comparison)."""
        committed = (await coordinator.offsets.view(message.group_id)).durable
        wanted = committed.keys() if message.partitions is None else message.partitions
        keys = sorted({(tp.topic, tp.partition) for tp in wanted})
        offsets: list[PartitionOffset] = []
        for start in range(0, len(keys), ANSWER_CHUNK):
            if start:
                await trio.lowlevel.checkpoint()
            for topic, partition in keys[start : start + ANSWER_CHUNK]:
                offset = committed.get(TopicPartition(topic=topic, partition=partition), -1)
                offsets.append(PartitionOffset(topic=topic, partition=partition, offset=offset))
        return OffsetFetchResponse(error_code=ErrorCode.NONE, offsets=tuple(offsets))

    async def _commit(
        self, request: Request, message: OffsetCommitRequest, coordinator: GroupCoordinator
    ) -> None:
        try:
            error = await coordinator.commit(message, self.channel)
            await self.channel.respond(request, OffsetCommitResponse(error_code=error))
        finally:
            self._commits.release()

    async def _metadata(self, message: ClusterMetadataRequest) -> ClusterMetadataResponse:
        offices = self.offices
        asked = trio.current_time()
        try:
            view = await offices.view(self.channel.listener)
        except StoreUnavailable as exc:
            log.warning("cannot answer ClusterMetadata: %s", exc)
            return ClusterMetadataResponse(
                error_code=ErrorCode.COORDINATOR_NOT_AVAILABLE,
                coordinator_id=-1,
                coordinator_epoch=-1,
                brokers=(),
                topics=(),
            )
        topics = view.topics
        if message.topics is not None and not topics.keys() >= set(message.topics):
            # Perhaps created since the view was read (the topic watch lags a write elsewhere).
            with contextlib.suppress(StoreUnavailable):
                topics = await topic_reads(offices.store).since(asked)
        slots = offices.config.coordinator_slots
        holders = tuple(view.holders.get(slot, -1) for slot in range(slots))
        coordinator_id, epoch = -1, -1
        error = ErrorCode.NONE
        if message.group_id is not None:
            slot = group_slot(offices, message.group_id)
            coordinator_id = holders[slot]
            coordinator = offices.by_slot.value.get(slot)
            if coordinator is not None:
                coordinator_id, epoch = offices.broker.broker_id, coordinator.epoch
            elif coordinator_id not in {b.broker_id for b in view.brokers}:
                # The slot has no live holder: its holder's session ended (or it gave the slot
                # up) and a survivor is about to take it. A failover is under way, which
                # clients retry at the failover pace (SPEC.md §11.7), not "no coordinator".
                coordinator_id, error = -1, ErrorCode.COORDINATOR_LOAD_IN_PROGRESS
        elif len(set(holders)) == 1:
            # One broker coordinates every group: it is the cluster's coordinator.
            coordinator_id = holders[0]
            running = self._coordinators()
            if len(running) == 1:
                epoch = running[0].epoch
        answer = await cluster_metadata(
            message,
            topics=topics,
            brokers=view.brokers,
            coordinator_id=coordinator_id,
            coordinator_epoch=epoch,
            limits=self.limits,
            slot_holders=holders,
            states=view.states,
        )
        if error is not ErrorCode.NONE and answer.error_code is ErrorCode.NONE:
            answer = attrs.evolve(answer, error_code=error)
        return answer

    async def _add_partitions(self, message: CreatePartitionsRequest) -> ErrorCode:
        return await add_partitions(self.offices.store, message, self.limits)


def replica_fetch_error(message: ReplicaFetchRequest, limits: RequestLimits) -> ErrorCode:
    """A REPLICA_FETCH's bounds (SPEC.md §8, 1000): a short long poll, and no more partitions
    than any request may name, since the answer repeats each one."""
    if not 0 <= message.max_wait_ms <= MAX_REPLICA_WAIT_MS:
        return ErrorCode.INVALID_REQUEST
    if len(message.partitions) > limits.max_partitions_per_request:
        return ErrorCode.INVALID_REQUEST
    return ErrorCode.NONE


async def cluster_metadata(
    message: ClusterMetadataRequest,
    *,
    topics: Mapping[str, TopicPlacement],
    brokers: tuple[BrokerInfo, ...],
    coordinator_id: int,
    coordinator_epoch: int,
    limits: RequestLimits,
    slot_holders: tuple[int, ...] = (),
    states: Mapping[PartitionKey, PartitionState] | None = None,
) -> ClusterMetadataResponse:
    """The answer to ClusterMetadata from a broker that knows these topics and brokers; each
    topic named once however often it was asked for (the answer repeats its partitions), with
    the id of each that exists (``topic_ids``: version 2 on), the settings of each created
    with any (``topic_configs``: version 3 on) and its replicas (``replicas``: version 5 on).
    At factor 1 each partition's one broker leads it, at epoch 0, the only replica and in sync;
    a replicated partition's leader, epoch and in-sync replicas are its state's (``states``),
    leader -1 while it has none.

    A request of a few bytes asks for every partition of the cluster (or of a thousand named
    topics): each topic is built once per placement and kept, and the answer is put together
    with a checkpoint after about every :data:`ANSWER_CHUNK` entries (topics, and partitions of
    a topic built anew), so no such request holds the event loop for other connections
    (docs/limits.md)."""
    error = validation.request_error(message, "", limits)
    if error is not ErrorCode.NONE:
        refusal = error_response(message, error)
        assert isinstance(refusal, ClusterMetadataResponse)
        return refusal
    names = sorted(topics) if message.topics is None else list(dict.fromkeys(message.topics))
    found = []
    identities = []
    settings = []
    replicas = []
    pace = Pace()
    for name in names:
        await pace.did(1)
        placement = topics.get(name)
        if placement is None:
            found.append(
                TopicMetadata(
                    topic=name, error_code=ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, partitions=()
                )
            )
            continue
        described: tuple[TopicMetadata, TopicReplicas | None] | None = _DESCRIBED.get(placement)
        if placement.replication_factor > 1:
            # States change under an unchanged placement: described afresh every time.
            described = await _replicated(name, placement, states or {}, pace)
        elif described is None or described[0].topic != name:
            # One replica per partition: no replicas entry (SPEC.md §7), so that v5 costs a
            # topic of one replica no more than v4 (a discovery naming a wide topic must still
            # fit a frame).
            partitions: list[PartitionMetadata] = []
            for start in range(0, placement.partition_count, ANSWER_CHUNK):
                chunk = placement.brokers[start : start + ANSWER_CHUNK]
                partitions.extend(
                    PartitionMetadata(partition=p, broker_id=b) for p, b in enumerate(chunk, start)
                )
                await pace.did(len(chunk))
            described = _DESCRIBED[placement] = (
                TopicMetadata(topic=name, error_code=ErrorCode.NONE, partitions=tuple(partitions)),
                None,
            )
        found.append(described[0])
        if described[1] is not None:
            replicas.append(described[1])
        identities.append(TopicIdentity(topic=name, topic_id=placement.topic_id))
        if placement.configs:
            entries = tuple(ConfigEntry(name=k, value=v) for k, v in placement.configs)
            settings.append(TopicConfigs(topic=name, configs=entries))
    return ClusterMetadataResponse(
        error_code=ErrorCode.NONE,
        coordinator_id=coordinator_id,
        coordinator_epoch=coordinator_epoch,
        brokers=brokers,
        topics=tuple(found),
        slot_holders=slot_holders,
        topic_ids=tuple(identities),
        topic_configs=tuple(settings),
        replicas=tuple(replicas),
    )


async def _replicated(
    name: str,
    placement: TopicPlacement,
    states: Mapping[PartitionKey, PartitionState],
    pace: Pace,
) -> tuple[TopicMetadata, TopicReplicas]:
    """A replicated topic as ClusterMetadata answers it, from its partitions' states."""
    partitions: list[PartitionMetadata] = []
    held: list[PartitionReplicas] = []
    for p, replicas in enumerate(placement.replicas):
        state = states.get(PartitionKey(topic_id=placement.topic_id, partition=p))
        isr: tuple[int, ...] = ()
        if state is None:
            leader, epoch = NO_LEADER, NO_EPOCH
        else:
            leader, epoch = state.leader, state.leader_epoch
            isr = tuple(entry.broker_id for entry in state.isr)
        partitions.append(PartitionMetadata(partition=p, broker_id=leader))
        held.append(PartitionReplicas(partition=p, leader_epoch=epoch, replicas=replicas, isr=isr))
        if p % ANSWER_CHUNK == ANSWER_CHUNK - 1:
            await pace.did(ANSWER_CHUNK)
    return (
        TopicMetadata(topic=name, error_code=ErrorCode.NONE, partitions=tuple(partitions)),
        TopicReplicas(topic=name, partitions=tuple(held)),
    )


#: Each topic as ClusterMetadata answers it (its partitions' leaders, and their replicas), for as
#: long as a view of the topics holds its placement: built once, not for every request (a topic
#: may have 10,000 partitions).
_DESCRIBED: weakref.WeakKeyDictionary[
    TopicPlacement, tuple[TopicMetadata, TopicReplicas | None]
] = weakref.WeakKeyDictionary()


async def create_topic(
    store: TopicStore,
    message: CreateTopicRequest,
    limits: RequestLimits,
    rng: random.Random | None = None,
    *,
    default_factor: int = 1,
    wait_states: Callable[[tuple[PartitionKey, ...]], Awaitable[None]] | None = None,
) -> ErrorCode:
    """Create the topic with its partitions spread over the live brokers, or those the request
    names (broker/placement.py), within the limits per topic and per broker (which count
    replicas). Two CreateTopics at once may both pass the per-broker check and overshoot it by
    one topic's partitions at most; the bound is on resources, not exact.

    A replicated topic needs as many brokers as its factor, never
    fewer replicas; once created, the answer waits (at most :data:`FIRST_STATES_BOUND`) until
    ``wait_states`` returns, once its controllers have given every partition its first state,
    so that a produce right after it finds each partition's leader."""
    error = validation.request_error(message, "", limits)
    if error is ErrorCode.NONE:
        error = replication_factor_error(message.replication_factor)
    if error is not ErrorCode.NONE:
        return error
    factor = message.replication_factor
    if factor == -1:
        factor = default_factor
    live = [b.broker_id for b in await store.brokers()]
    brokers, error = placement.chosen_brokers(message.broker_ids, live)
    if error is not ErrorCode.NONE:
        return error
    placed: placement.Replicas | tuple[int, ...]
    if factor == 1:
        placed = placement.new_topic(brokers, message.partitions, rng or _RANDOM)
        counted: tuple[int, ...] = placed
    else:
        placed, error = placement.new_topic_replicas(
            brokers, message.partitions, factor, rng or _RANDOM
        )
        if error is not ErrorCode.NONE:
            log.info(
                "refusing topic %s: replication factor %d over %d brokers",
                message.topic,
                factor,
                len(brokers),
            )
            return error
        counted = tuple(broker for replicas in placed for broker in replicas)
    error = _per_broker_error(counted, await store.topics(), limits)
    if error is not ErrorCode.NONE:
        return error
    try:
        created = await store.create_topic(
            message.topic, placed, tuple((c.name, c.value) for c in message.configs)
        )
    except TopicExists:
        return ErrorCode.TOPIC_ALREADY_EXISTS
    except InvalidTopicConfig as exc:
        # A setting checked against the replication factor (min.insync.replicas), which the
        # request's own check cannot know.
        log.info("refusing topic %s: %s", message.topic, exc)
        return ErrorCode.INVALID_CONFIG
    except InvalidReplicationFactor as exc:
        log.info("refusing topic %s: %s", message.topic, exc)
        return ErrorCode.INVALID_REPLICATION_FACTOR
    if factor > 1 and wait_states is not None:
        keys = tuple(
            PartitionKey(topic_id=created.topic_id, partition=p)
            for p in range(created.partition_count)
        )
        with trio.move_on_after(FIRST_STATES_BOUND):
            await wait_states(keys)
    return ErrorCode.NONE


def replication_factor_error(factor: int) -> ErrorCode:
    """A CreateTopic's ``replication_factor`` (SPEC.md §8, 10): -1 is the broker's default
    (``Offices.default_replication_factor``); 0 and below -1 are never a factor."""
    if factor == -1 or factor >= 1:
        return ErrorCode.NONE
    return ErrorCode.INVALID_REPLICATION_FACTOR


async def delete_topic(
    store: TopicStore, message: DeleteTopicRequest, limits: RequestLimits
) -> ErrorCode:
    """Delete the topic and every group's offsets for it (the store's ``delete_topic``); each
    broker's data plane then deletes its partitions, and the coordinator rebalances the groups
    subscribed to it, as their topic watches show it gone."""
    error = validation.request_error(message, "", limits)
    if error is not ErrorCode.NONE:
        return error
    try:
        await store.delete_topic(message.topic)
    except UnknownTopic:
        return ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    return ErrorCode.NONE


async def add_partitions(
    store: TopicStore,
    message: CreatePartitionsRequest,
    limits: RequestLimits,
) -> ErrorCode:
    """Grow the topic to ``total_partitions``, the new ones spread like a new topic's (with as
    many replicas), within the limits per topic and per broker."""
    error = validation.request_error(message, "", limits)
    if error is not ErrorCode.NONE:
        return error
    topics = await store.topics()
    current = topics.get(message.topic)
    if current is None:
        return ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    count = message.total_partitions - current.partition_count
    if count < 1:
        return ErrorCode.INVALID_PARTITIONS
    live = [b.broker_id for b in await store.brokers()]
    brokers, error = placement.chosen_brokers(message.broker_ids, live)
    if error is not ErrorCode.NONE:
        return error
    added: placement.Replicas | tuple[int, ...]
    if current.replication_factor == 1:
        added = counted = placement.added(brokers, current.brokers, count)
    else:
        # Replicated: as many replicas as the topic's.
        added, error = placement.added_replicas(brokers, current.replicas, count)
        if error is not ErrorCode.NONE:
            return error
        counted = tuple(broker for replicas in added for broker in replicas)
    error = _per_broker_error(counted, topics, limits)
    if error is not ErrorCode.NONE:
        return error
    try:
        await store.add_partitions(message.topic, added)
    except UnknownTopic:
        return ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    except InvalidPartitions:
        return ErrorCode.INVALID_PARTITIONS
    except InvalidReplicationFactor:
        return ErrorCode.INVALID_REPLICATION_FACTOR
    return ErrorCode.NONE


def _per_broker_error(
    placed: tuple[int, ...], topics: Mapping[str, TopicPlacement], limits: RequestLimits
) -> ErrorCode:
    """POLICY_VIOLATION if any broker would hold more than its limit with ``placed`` (a broker
    per replica) added; every replica a broker holds counts."""
    for broker_id, count in Counter(placed).items():
        held = sum(_replicas_on(topic, broker_id) for topic in topics.values())
        error = validation.broker_partitions_error(held, count, limits)
        if error is not ErrorCode.NONE:
            return error
    return ErrorCode.NONE


def _replicas_on(topic: TopicPlacement, broker_id: int) -> int:
    if topic.replication_factor == 1:
        return topic.brokers.count(broker_id)
    return sum(broker_id in replicas for replicas in topic.replicas)


async def handle_connection(
    offices: Offices | GroupCoordinator,
    stream: trio.abc.Stream,
    data_plane: DataPlane | None = None,
    *,
    bounds: ReadBounds | None = None,
    peer: Peer | None = None,
    access: Access | None = None,
    door: Door | None = None,
) -> None:
    """Serve one peer until it closes, breaks the protocol, or its member is declared dead;
    group requests go to the coordinator of the group's slot among ``offices`` (a coordinator:
    one that holds every slot).

    Nothing raised while serving it leaves this task: whatever went wrong ends this connection
    (its member dies as if the connection broke) and nothing else. A connection that asked a
    coordinator closes when that coordinator leaves this broker (its slot moved or its office
    ended), so that its client finds the group's coordinator afresh. ``bounds``: the broker's
    limits on reading (none: unbounded, for tests of other things); ``peer``: who the listener
    admitted, and on which listener (None: a connection no listener admitted, for tests);
    ``access``: the rules every request is checked against (None: none); ``door``: what puts
    new work off while the broker's loop is behind (None: nothing is)."""
    if isinstance(offices, GroupCoordinator):
        offices = whole_office(offices)
    channel = Channel.open(
        stream, Role.BROKER, max_frame_size=offices.config.max_frame_size, bounds=bounds
    )
    if peer is not None:
        channel.listener = peer.listener
        channel.principal = peer.principal
        channel.host = peer.host
    used: set[GroupCoordinator] = set()
    serve = partial(_serve, offices, channel, used, data_plane, access, door)
    if offices.fixed:
        await serve()
        return

    def gone(by_slot: BySlot) -> bool:
        return not used.issubset(by_slot.values())

    async with trio_util.move_on_when(offices.by_slot.wait_value, gone):
        await serve()


async def _serve(
    offices: Offices,
    channel: Channel,
    used: set[GroupCoordinator],
    data_plane: DataPlane | None,
    access: Access | None,
    door: Door | None,
) -> None:
    send_requests, receive_requests = trio.open_memory_channel[Request](REQUEST_QUEUE)
    violation = False
    #: The peer closed cleanly (end of stream), rather than this side ending the connection.
    peer_ended = False
    session: _Session | None = None
    try:
        async with trio.open_nursery() as nursery:
            session = _Session(
                offices=offices,
                channel=channel,
                nursery=nursery,
                data_plane=data_plane,
                access=access,
                door=door,
                used=used,
            )
            nursery.start_soon(session.work, receive_requests)
            try:
                await channel.run(send_requests.send)
                peer_ended = not channel.broken
            except RemoteProtocolError:
                violation = True
            nursery.cancel_scope.cancel()
    except Exception as exc:
        # Ours, not the peer's: its member may not know, as after a reset. A store that fails
        # under one request (a lost ZooKeeper connection) is no bug: the client retries.
        if (cause := _store_failure(exc)) is not None:
            log.warning("serving %s: %s; closing that connection", channel.peer, cause)
        else:
            log.exception("serving %s failed; closing that connection", channel.peer)
        channel.broken = True
    finally:
        member = session.member if session is not None else None
        coordinator = session.member_coordinator if session is not None else None
        if member is not None and coordinator is not None:
            if violation:
                ending = Ending.VIOLATION
            elif peer_ended and not channel.broken:
                ending = Ending.CLOSED
            else:
                # Reset, or ended by this side (its coordinator stopping, its slot moving): the
                # member's own end of stream is the only proof that it stopped fetching
                # (docs/design.md#ownership-lease).
                ending = Ending.BROKEN
            coordinator.connection_ended(member, ending)
        with trio.CancelScope(shield=True):
            await channel.aclose()


def _store_failure(exc: BaseException) -> StoreError | None:
    """The store's error, if that is all ``exc`` is (trio wraps task errors in groups)."""
    if isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        return _store_failure(exc.exceptions[0])
    return exc if isinstance(exc, StoreError) else None
