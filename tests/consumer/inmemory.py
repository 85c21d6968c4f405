"""The real coordinator in memory, for deterministic consumer tests on trio's MockClock, and a
coordinator the test plays by hand (:class:`ScriptedCoordinator`).

Every connection the consumer opens is served by ``handle_connection`` over an in-memory stream,
with the real coordinator of :func:`simulation.open_simulated_cluster`. The data plane is
a stand-in (:class:`TickingLog`): the real broker log does its file I/O in worker threads, and
MockClock's autojump jumps while a thread works, so a test with the real log could not assert exact
instants. Tests that need the real log run against a real broker process instead.
"""

from __future__ import annotations

import math
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import TypeVar

import attrs
import trio
import trio.testing
from trio_util import AsyncValue

from broker.dispatch import handle_connection
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
    PingRequest,
    PingResponse,
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
    error_response,
)
from protocol.batches import build_batch
from protocol.types import BrokerInfo, ConsumerThread, TopicPartition
from simulation import SimulatedCluster, open_simulated_cluster
from transport.channel import Channel


@attrs.define(eq=False)
class TickingLog:
    """Every partition gains ``rate`` records per second of trio time from ``start``; Fetch returns
    at most ``batch`` of them. Each Fetch is logged with its instant, so tests can see exactly
    when a consumer fetched."""

    start: float
    rate: float = 10.0
    batch: int = 5
    fetches: list[tuple[float, TopicPartition, int]] = attrs.field(factory=list)
    listed: list[int] = attrs.field(factory=list)
    """The high watermark each ListOffsets answered."""

    def high_watermark(self) -> int:
        return max(0, math.floor((trio.current_time() - self.start) * self.rate))

    async def __call__(self, request: Request) -> ResponseMessage | None:
        match request.message:
            case ListOffsetsRequest():
                self.listed.append(self.high_watermark())
                return ListOffsetsResponse(
                    error_code=ErrorCode.NONE, log_start_offset=0, high_watermark=self.listed[-1]
                )
            case FetchRequest(topic=topic, partition=partition, offset=offset):
                now = trio.current_time()
                self.fetches.append((now, TopicPartition(topic=topic, partition=partition), offset))
                end = self.high_watermark()
                if offset > end:
                    return FetchResponse(
                        error_code=ErrorCode.OFFSET_OUT_OF_RANGE,
                        high_watermark=end,
                        log_start_offset=0,
                        records=(),
                    )
                values = [
                    f"{topic}/{partition}/{o}".encode()
                    for o in range(offset, min(end, offset + self.batch))
                ]
                return FetchResponse(
                    error_code=ErrorCode.NONE,
                    high_watermark=end,
                    log_start_offset=0,
                    records=(),
                    batches=build_batch(values, timestamps_ms=[0] * len(values), base_offset=offset)
                    if values
                    else b"",
                )
        return error_response(request.message, ErrorCode.INVALID_REQUEST)


class Line(trio.abc.Stream):
    """A client's end of an in-memory connection that the test can cut silently: once cut,
    nothing more arrives and nothing sent is delivered, as when the peer process is stopped."""

    def __init__(self, inner: trio.abc.Stream) -> None:
        self.inner = inner
        self.cut = False
        self.carries_registration = False
        self.aborted = False
        self._first = True

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        if self._first:
            self._first = False
            # frame: size:int32, kind:int8 (0 = request), api_key:int16
            self.carries_registration = bytes(
                data[4:7]
            ) == b"\x00" + ApiKey.REGISTER_CONSUMER.to_bytes(2, "big")
        if self.cut:
            await trio.lowlevel.checkpoint()
            return
        await self.inner.send_all(data)

    async def wait_send_all_might_not_block(self) -> None:
        await self.inner.wait_send_all_might_not_block()

    async def receive_some(self, max_bytes: int | None = None) -> bytes | bytearray:
        if self.cut:
            await trio.sleep_forever()
        data = await self.inner.receive_some(max_bytes)
        if self.cut:
            await trio.sleep_forever()
        return data

    async def aclose(self) -> None:
        await self.inner.aclose()

    def abort(self) -> None:
        """A reset (``Channel.abort``): in memory there is none, so the close is all there is."""
        self.aborted = True


@attrs.define(eq=False)
class InMemoryCluster:
    cluster: SimulatedCluster
    log: TickingLog
    nursery: trio.Nursery
    lines: list[Line] = attrs.field(factory=list)
    refusing: bool = False
    #: The connections the broker serves: a restart ends them.
    _serving: set[trio.CancelScope] = attrs.field(factory=set)

    async def connect(self, host: str, port: int) -> trio.abc.Stream:
        """The consumer's ``connect``: every address reaches the one simulated broker."""
        await trio.lowlevel.checkpoint()
        if self.refusing:
            raise ConnectionRefusedError(f"{host}:{port} refused (the test cut the network)")
        if not self.cluster.up:
            raise ConnectionRefusedError(f"{host}:{port} refused (the broker is restarting)")
        client, server = trio.testing.memory_stream_pair()
        self.nursery.start_soon(self._serve, server)
        line = Line(client)
        self.lines.append(line)
        return line

    async def _serve(self, server: trio.abc.Stream) -> None:
        with trio.CancelScope() as scope:
            self._serving.add(scope)
            try:
                await handle_connection(self.cluster.coordinator, server, self.log)
            finally:
                self._serving.discard(scope)

    async def restart_broker(self, *, down_for: float) -> None:
        """The broker restarts on its data dir: every connection it served closes, it refuses
        connections for ``down_for``, then serves again with a new coordinator."""
        self.refusing = True
        for scope in self._serving:
            scope.cancel()
        await self.cluster.restart_coordinator(down_for=down_for)
        self.refusing = False

    def silence_coordinator(self) -> None:
        """The coordinator goes silent for every registered consumer, and nobody can connect."""
        self.refusing = True
        for line in self.lines:
            if line.carries_registration:
                line.cut = True


@asynccontextmanager
async def open_in_memory_cluster(
    data_dir: Path, config: CoordinatorConfig, topics: dict[str, int]
) -> AsyncIterator[InMemoryCluster]:
    async with open_simulated_cluster(data_dir, config) as cluster, trio.open_nursery() as nursery:
        for name, partitions in topics.items():
            await cluster.create_topic(name, partitions=partitions)
        yield InMemoryCluster(
            cluster=cluster, log=TickingLog(start=trio.current_time()), nursery=nursery
        )
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
        self, generation: int, streams: tuple[AssignedStream, ...], *, incremental: bool = False
    ) -> StartFetcherResponse:
        request = StartFetcherRequest(
            coordinator_epoch=self.epoch,
            generation=generation,
            consumer_id=self.consumer_id,
            streams=streams,
            brokers=(self.broker,),
            acknowledged_frames=self.channel.frames_received,
            incremental=incremental,
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

    async def connect(self, host: str, port: int) -> trio.abc.Stream:
        await trio.lowlevel.checkpoint()
        client, server = trio.testing.memory_stream_pair()
        line = Line(client)
        self.nursery.start_soon(self._serve, server, line)
        return line

    async def member(self, index: int = 0) -> ScriptedMember:
        """The ``index``-th registered member, once it has registered."""
        members: tuple[ScriptedMember, ...] = await self.members.wait_value(
            lambda members: len(members) > index
        )
        return members[index]

    async def _serve(self, stream: trio.abc.Stream, line: Line) -> None:
        channel = Channel.open(stream, Role.BROKER, max_frame_size=4 * 1024 * 1024)
        member: ScriptedMember | None = None

        async def on_request(request: Request) -> None:
            nonlocal member
            message = request.message
            answer: ResponseMessage | None
            match message:
                case ClusterMetadataRequest():
                    self.lookups.append(trio.current_time())
                    answer = ClusterMetadataResponse(
                        error_code=ErrorCode.NONE,
                        coordinator_id=self.broker.broker_id,
                        coordinator_epoch=self.epoch,
                        brokers=(self.broker,),
                        topics=(),
                    )
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
        yield ScriptedCoordinator(log=TickingLog(start=trio.current_time()), nursery=nursery)
        nursery.cancel_scope.cancel()
