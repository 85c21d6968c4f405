"""The real coordinator in memory, for deterministic consumer tests on trio's MockClock, and a
coordinator the test plays by hand (:class:`ScriptedCoordinator`).

Every connection the consumer opens is a link of the simulated network
(``SimulatedCluster.open_link``), served by ``handle_connection`` with the real coordinator of
:func:`simulation.open_simulated_cluster` and the simulated broker's log: the broker's own
Produce / Fetch / ListOffsets handling over partitions in memory, here ones that gain records
over time (:class:`TickingLog`). Tests that need the real log's files run against a real broker
process instead.
"""

from __future__ import annotations

import math
import uuid
from collections.abc import AsyncIterator, Iterator, Mapping
from contextlib import asynccontextmanager
from pathlib import Path
from typing import TypeVar

import attrs
import trio
import trio.testing
from trio_util import AsyncValue

from coordinator.config import CoordinatorConfig
from protocol import (
    ApiKey,
    AssignedPartition,
    AssignedStream,
    ClusterMetadataRequest,
    ClusterMetadataResponse,
    ErrorCode,
    FetchRequest,
    FetchResponse,
    LeaveGroupRequest,
    LeaveGroupResponse,
    ListOffsetsRequest,
    ListOffsetsResponse,
    OffsetCommitRequest,
    OffsetCommitResponse,
    PartitionMetadata,
    PingRequest,
    PingResponse,
    ProduceRequest,
    ProduceResponse,
    RegisterConsumerRequest,
    RegisterConsumerResponse,
    Request,
    RequestMessage,
    ResponseMessage,
    Role,
    StartFetcherRequest,
    StartFetcherResponse,
    StopFetcherRequest,
    StopFetcherResponse,
    TopicIdentity,
    TopicMetadata,
)
from protocol.batches import batch_spans, build_batch
from protocol.replica_messages import PartitionReplicas, TopicReplicas
from protocol.types import NO_TOPIC_ID, BrokerInfo, ConsumerThread, TopicId, TopicPartition
from simulation import MemoryLog, SimulatedCluster, open_simulated_cluster
from simulation.log import MemoryPartition
from simulation.network import Link, LinkEnd, SimulatedHost
from store import TopicPlacement
from transport.channel import Channel


class _EveryTopic(Mapping[str, TopicPlacement]):
    """Every topic exists, with this many partitions: a scripted coordinator names its own in
    its StartFetcher requests, and its log serves whichever it names (each topic one
    incarnation, its id made from its name)."""

    partitions = 64

    def __init__(self) -> None:
        self._made: dict[str, TopicPlacement] = {}

    def __getitem__(self, topic: str) -> TopicPlacement:
        if topic not in self._made:
            self._made[topic] = TopicPlacement(
                topic=topic,
                brokers=(SCRIPTED_BROKER.broker_id,) * self.partitions,
                topic_id=uuid.uuid5(uuid.NAMESPACE_OID, topic),
            )
        return self._made[topic]

    def __iter__(self) -> Iterator[str]:
        return iter(self._made)

    def __len__(self) -> int:
        return len(self._made)


@attrs.define(eq=False)
class _TickingPartition(MemoryPartition):
    """A partition of one record per batch, whose reads stop after ``batch`` of them."""

    batch: int = 5

    async def read(self, offset: int, max_bytes: int) -> bytes:
        data = await super().read(offset, max_bytes)
        spans = batch_spans(data, check_crc=False)
        return data[: spans[self.batch].position] if len(spans) > self.batch else data


@attrs.define(eq=False)
class TickingLog(MemoryLog):
    """The simulated broker's log in which every partition gains ``rate`` records per second of
    trio time from ``start`` (offset ``o`` holds ``b"<topic>/<partition>/<o>"``), as if a
    producer kept up that rate: what has come due is appended, a batch a record, whenever a
    request looks at the partition, so the log holds, at every instant, exactly what that rate
    has made, each record stamped with the instant it came due (``due_ms``: what a lookup by
    time, ListOffsets 1, finds it by). A Fetch gets at most ``batch`` records. Each Fetch is
    logged with its instant (``fetches``), so tests can see exactly when a consumer fetched, and
    each ListOffsets answer's high watermark (``listed``)."""

    start: float = attrs.field(kw_only=True)
    rate: float = attrs.field(default=10.0, kw_only=True)
    batch: int = attrs.field(default=5, kw_only=True)
    listed: list[int] = attrs.field(factory=list)
    """The high watermark each ListOffsets answered."""

    async def partition(
        self, topic: str, partition: int, topic_id: TopicId = NO_TOPIC_ID
    ) -> MemoryPartition | None:
        found = await super().partition(topic, partition, topic_id)
        if found is None:
            return None
        if not isinstance(found, _TickingPartition):  # made just now, empty
            tp = TopicPartition(topic=topic, partition=partition)
            found = self.partitions[tp] = _TickingPartition(
                topic_id=found.topic_id, batch=self.batch
            )
        due = max(0, math.floor((trio.current_time() - self.start) * self.rate))
        for offset in range(found.log_end_offset, due):
            batch = build_batch([f"{topic}/{partition}/{offset}".encode()])
            await found.append(batch, batch_spans(batch), self.due_ms(offset))
        return found

    def due_ms(self, offset: int) -> int:
        """The virtual millisecond at which the record at ``offset`` comes due."""
        return round((self.start + (offset + 1) / self.rate) * 1000)

    async def list_offsets(
        self, message: ListOffsetsRequest, api_version: int = 2
    ) -> ListOffsetsResponse:
        answer = await super().list_offsets(message, api_version)
        self.listed.append(answer.high_watermark)
        return answer


class Line(trio.abc.Stream):
    """A client's connection over the simulated network (``SimulatedCluster.open_link``), on a
    network of its own that the test can cut silently for good: once cut, nothing more arrives
    and nothing sent is delivered, its close included, as when the peer process is stopped.
    ``carries_registration``: its first request was a RegisterConsumer; ``aborted``: it was
    closed with a reset (``Channel.abort``)."""

    def __init__(self, inner: trio.abc.Stream, network: SimulatedHost, nursery: trio.Nursery):
        self.inner = inner
        self.network = network
        self._nursery = nursery
        self.carries_registration = False
        self.aborted = False
        self._first = True

    def cut(self) -> None:
        self.network.cut(math.inf, self._nursery)

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        if self._first:
            self._first = False
            # frame: size:int32, kind:int8 (0 = request), api_key:int16
            self.carries_registration = bytes(
                data[4:7]
            ) == b"\x00" + ApiKey.REGISTER_CONSUMER.to_bytes(2, "big")
        await self.inner.send_all(data)

    async def wait_send_all_might_not_block(self) -> None:
        await self.inner.wait_send_all_might_not_block()

    async def receive_some(self, max_bytes: int | None = None) -> bytes | bytearray:
        return await self.inner.receive_some(max_bytes)

    async def aclose(self) -> None:
        await self.inner.aclose()

    def abort(self) -> None:
        self.aborted = True
        abort = getattr(self.inner, "abort", None)
        if callable(abort):
            abort()


@attrs.define(eq=False)
class InMemoryCluster:
    cluster: SimulatedCluster
    nursery: trio.Nursery
    lines: list[Line] = attrs.field(factory=list)
    refusing: bool = False

    @property
    def log(self) -> TickingLog:
        assert isinstance(self.cluster.log, TickingLog)
        return self.cluster.log

    async def connect(self, host: str, port: int) -> trio.abc.Stream:
        """The consumer's ``connect``: every address reaches the one simulated broker."""
        await trio.lowlevel.checkpoint()
        if self.refusing:
            raise ConnectionRefusedError(f"{host}:{port} refused (the test cut the network)")
        if not self.cluster.up:
            raise ConnectionRefusedError(f"{host}:{port} refused (the broker is restarting)")
        network = SimulatedHost()
        stream, _ = self.cluster.open_link(network)
        line = Line(stream, network, self.nursery)
        self.lines.append(line)
        return line

    async def restart_broker(self, *, down_for: float) -> None:
        """The broker restarts on its data dir: every connection it served closes, it refuses
        connections for ``down_for``, then serves again with a new coordinator."""
        self.refusing = True
        await self.cluster.restart_coordinator(down_for=down_for)
        self.refusing = False

    def silence_coordinator(self) -> None:
        """The coordinator goes silent for every registered consumer, and nobody can connect."""
        self.refusing = True
        for line in self.lines:
            if line.carries_registration:
                line.cut()


@asynccontextmanager
async def open_in_memory_cluster(
    data_dir: Path, config: CoordinatorConfig, topics: dict[str, int]
) -> AsyncIterator[InMemoryCluster]:
    async with open_simulated_cluster(data_dir, config) as cluster, trio.open_nursery() as nursery:
        for name, partitions in topics.items():
            await cluster.create_topic(name, partitions=partitions)
        cluster.log = TickingLog(placement=cluster.log.placement, start=trio.current_time())
        yield InMemoryCluster(cluster=cluster, nursery=nursery)
        nursery.cancel_scope.cancel()


SCRIPTED_BROKER = BrokerInfo(broker_id=1, host="broker", port=9092)
_Answer = TypeVar("_Answer", bound=ResponseMessage)


@attrs.define(eq=False)
class ScriptedMember:
    """The coordinator's end of one consumer's registered connection: the test sends it the
    requests of a rebalance by hand."""

    registration: RegisterConsumerRequest
    channel: Channel
    line: Line
    epoch: int
    broker: BrokerInfo
    ended: trio.Event = attrs.field(factory=trio.Event)
    """The consumer closed the connection (``line.aborted``: with a reset)."""

    @property
    def consumer_id(self) -> str:
        return self.registration.consumer_id

    @property
    def member_id(self) -> str:
        """The name stream ids are built on: the instance id of a static member."""
        return self.registration.instance_id or self.registration.consumer_id

    def streams(self, *partitions: tuple[str, int, int]) -> tuple[AssignedStream, ...]:
        """Stream 0 with ``(topic, partition, offset)`` each, at this coordinator's broker."""
        return self.streams_of({0: partitions})

    def streams_of(
        self, by_index: dict[int, tuple[tuple[str, int, int], ...]]
    ) -> tuple[AssignedStream, ...]:
        return tuple(
            AssignedStream(
                stream_id=ConsumerThread(member_id=self.member_id, index=index).stream_id,
                partitions=tuple(
                    AssignedPartition(
                        topic=t, partition=p, offset=o, broker_id=self.broker.broker_id
                    )
                    for t, p, o in partitions
                ),
            )
            for index, partitions in by_index.items()
        )

    async def start(
        self,
        generation: int,
        streams: tuple[AssignedStream, ...],
        *,
        incremental: bool = False,
        topic_ids: tuple[TopicIdentity, ...] = (),
    ) -> StartFetcherResponse:
        request = StartFetcherRequest(
            coordinator_epoch=self.epoch,
            generation=generation,
            consumer_id=self.consumer_id,
            streams=streams,
            brokers=(self.broker,),
            acknowledged_frames=self.channel.frames_received,
            incremental=incremental,
            topic_ids=topic_ids,
        )
        return await self._ask(request, StartFetcherResponse)

    async def stop(
        self,
        generation: int,
        partitions: tuple[TopicPartition, ...] | None = None,
        reason: ErrorCode = ErrorCode.NONE,
    ) -> StopFetcherResponse:
        request = StopFetcherRequest(
            coordinator_epoch=self.epoch,
            generation=generation,
            consumer_id=self.consumer_id,
            acknowledged_frames=self.channel.frames_received,
            partitions=partitions,
            reason=reason,
        )
        return await self._ask(request, StopFetcherResponse)

    async def ping(self, generation: int) -> PingResponse:
        request = PingRequest(
            coordinator_epoch=self.epoch,
            generation=generation,
            consumer_id=self.consumer_id,
            num_retries=0,
            acknowledged_frames=self.channel.frames_received,
        )
        return await self._ask(request, PingResponse)

    async def _ask(self, request: RequestMessage, answer: type[_Answer]) -> _Answer:
        response = await self.channel.request(request)
        assert isinstance(response, answer)
        return response


@attrs.define(eq=False)
class ScriptedCoordinator:
    """A coordinator the test plays by hand, to pin down exactly what a consumer does with each
    request of the protocol (SPEC.md §11), whatever the real coordinator would send: it names
    itself the coordinator, accepts registrations (or answers them ``register_answer``), answers
    OffsetCommit ``commit_answer`` and LeaveGroup NONE, serves the data plane from ``log``, and
    sends nothing of its own accord."""

    log: TickingLog
    nursery: trio.Nursery
    epoch: int = 1
    broker: BrokerInfo = SCRIPTED_BROKER
    register_answer: ErrorCode = ErrorCode.NONE
    commit_answer: ErrorCode = ErrorCode.NONE
    registrations: list[RegisterConsumerRequest] = attrs.field(factory=list)
    commits: list[OffsetCommitRequest] = attrs.field(factory=list)
    leaves: list[LeaveGroupRequest] = attrs.field(factory=list)
    lookups: list[float] = attrs.field(factory=list)
    """When each ClusterMetadata (a discovery) came."""
    members: AsyncValue[tuple[ScriptedMember, ...]] = attrs.field(factory=lambda: AsyncValue(()))
    leaders: dict[TopicPartition, tuple[BrokerInfo, int]] = attrs.field(factory=dict)
    """Partitions another broker leads, at that leader epoch: ClusterMetadata says so, that
    broker's address serves them from ``log``, and this one answers NOT_LEADER_OR_FOLLOWER."""
    data_requests: list[tuple[int, RequestMessage]] = attrs.field(factory=list)
    """Each Fetch, ListOffsets and Produce, with the broker it was sent to."""
    stale_leaders: list[dict[TopicPartition, tuple[BrokerInfo, int]]] = attrs.field(factory=list)
    """What the next ClusterMetadata answers name instead of ``leaders``, one each: a broker
    that has not heard of an election yet."""
    produce_answers: list[ErrorCode] = attrs.field(factory=list)
    """What the next Produce requests at their leader are answered, one each, storing nothing;
    once none is left a Produce is answered NONE at the next offset (nothing is kept)."""
    stored: int = 0

    async def connect(self, host: str, port: int) -> trio.abc.Stream:
        await trio.lowlevel.checkpoint()
        network = SimulatedHost()
        link = Link(host=network)
        client = LinkEnd(link=link, outgoing=link.to_server, incoming=link.to_client)
        server = LinkEnd(link=link, outgoing=link.to_client, incoming=link.to_server)
        line = Line(client, network, self.nursery)
        known = {b.host: b for b, _ in self.leaders.values()}
        self.nursery.start_soon(self._serve, server, line, known.get(host, self.broker))
        return line

    def _metadata(self, topics: tuple[str, ...] | None) -> ClusterMetadataResponse:
        leaders = self.stale_leaders.pop(0) if self.stale_leaders else self.leaders
        brokers = {self.broker.broker_id: self.broker}
        brokers.update((b.broker_id, b) for b, _ in (*self.leaders.values(), *leaders.values()))
        named = [
            (topic, sorted((tp, led) for tp, led in leaders.items() if tp.topic == topic))
            for topic in topics or ()
        ]
        return ClusterMetadataResponse(
            error_code=ErrorCode.NONE,
            coordinator_id=self.broker.broker_id,
            coordinator_epoch=self.epoch,
            brokers=tuple(brokers.values()),
            topics=tuple(
                TopicMetadata(
                    topic=topic,
                    error_code=ErrorCode.NONE,
                    partitions=tuple(
                        PartitionMetadata(partition=tp.partition, broker_id=b.broker_id)
                        for tp, (b, _) in led
                    ),
                )
                for topic, led in named
                if led
            ),
            replicas=tuple(
                TopicReplicas(
                    topic=topic,
                    partitions=tuple(
                        PartitionReplicas(
                            partition=tp.partition,
                            leader_epoch=epoch,
                            replicas=(b.broker_id, self.broker.broker_id),
                            isr=(b.broker_id,),
                        )
                        for tp, (b, epoch) in led
                    ),
                )
                for topic, led in named
                if led
            ),
        )

    async def member(self, index: int = 0) -> ScriptedMember:
        """The ``index``-th registered member, once it has registered."""
        members: tuple[ScriptedMember, ...] = await self.members.wait_value(
            lambda members: len(members) > index
        )
        return members[index]

    async def _serve(self, stream: trio.abc.Stream, line: Line, broker: BrokerInfo) -> None:
        channel = Channel.open(stream, Role.BROKER, max_frame_size=4 * 1024 * 1024)
        member: ScriptedMember | None = None

        async def on_request(request: Request) -> None:
            nonlocal member
            message = request.message
            answer: ResponseMessage | None
            match message:
                case ClusterMetadataRequest():
                    self.lookups.append(trio.current_time())
                    answer = self._metadata(message.topics)
                case RegisterConsumerRequest():
                    self.registrations.append(message)
                    answer = RegisterConsumerResponse(
                        error_code=self.register_answer, coordinator_epoch=self.epoch, generation=-1
                    )
                case OffsetCommitRequest():
                    self.commits.append(message)
                    answer = OffsetCommitResponse(error_code=self.commit_answer)
                case LeaveGroupRequest():
                    self.leaves.append(message)
                    answer = LeaveGroupResponse(error_code=ErrorCode.NONE)
                case FetchRequest() | ListOffsetsRequest():
                    self.data_requests.append((broker.broker_id, message))
                    tp = TopicPartition(topic=message.topic, partition=message.partition)
                    leader, epoch = self.leaders.get(tp, (self.broker, 0))
                    if leader == broker and message.current_leader_epoch in (-1, epoch):
                        # the log below leads at epoch 0: the epoch was checked here
                        unchecked = attrs.evolve(message, current_leader_epoch=-1)
                        answer = await self.log(attrs.evolve(request, message=unchecked))
                    elif isinstance(message, FetchRequest):
                        answer = FetchResponse(
                            error_code=ErrorCode.NOT_LEADER_OR_FOLLOWER,
                            high_watermark=-1,
                            log_start_offset=-1,
                            records=(),
                        )
                    else:
                        answer = ListOffsetsResponse(
                            error_code=ErrorCode.NOT_LEADER_OR_FOLLOWER,
                            log_start_offset=-1,
                            high_watermark=-1,
                        )
                case ProduceRequest():
                    self.data_requests.append((broker.broker_id, message))
                    tp = TopicPartition(topic=message.topic, partition=message.partition)
                    leader, epoch = self.leaders.get(tp, (self.broker, 0))
                    code = ErrorCode.NOT_LEADER_OR_FOLLOWER
                    if leader == broker:
                        code = self.produce_answers.pop(0) if self.produce_answers else code.NONE
                    answer = ProduceResponse(error_code=code, base_offset=self.stored)
                    self.stored += code is ErrorCode.NONE
                case _:
                    answer = await self.log(request)
            assert answer is not None
            await channel.respond(request, answer)
            if (
                isinstance(message, RegisterConsumerRequest)
                and self.register_answer is ErrorCode.NONE
            ):
                member = ScriptedMember(
                    registration=message,
                    channel=channel,
                    line=line,
                    epoch=self.epoch,
                    broker=self.broker,
                )
                self.members.value = (*self.members.value, member)

        try:
            await channel.run(on_request)
        finally:
            if member is not None:
                member.ended.set()
            with trio.CancelScope(shield=True):
                await channel.aclose()


@asynccontextmanager
async def open_scripted_coordinator() -> AsyncIterator[ScriptedCoordinator]:
    async with trio.open_nursery() as nursery:
        log = TickingLog(placement=_EveryTopic(), start=trio.current_time())
        yield ScriptedCoordinator(log=log, nursery=nursery)
        nursery.cancel_scope.cancel()
