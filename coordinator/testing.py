"""A deterministic driver: the real coordinator, the embedded store, in-memory connections, and
simulated consumers that speak the real protocol — all on trio's clock, so under ``MockClock`` a
test runs minutes of failures in milliseconds and asserts exact instants.

Faults are chosen by the test: :meth:`SimulatedConsumer.kill` closes a consumer's connection,
:meth:`SimulatedConsumer.freeze` pauses it like a long GC (silent, then it resumes and finds its
lease expired), :meth:`SimulatedConsumer.answer_slowly` delays its answers. The
:class:`OwnershipLedger` records every interval in which a consumer held a fetch lease on a
partition, and :meth:`OwnershipLedger.check` proves no partition ever had two holders at once.

Example (a pytest-trio test on the autojump clock)::

    async def test_a_killed_consumer_hands_over(tmp_path, autojump_clock):
        async with open_simulated_cluster(tmp_path) as cluster:
            await cluster.create_topic("events", partitions=6)
            a = await cluster.start_consumer("a", group="g", topics={"events": 1})
            b = await cluster.start_consumer("b", group="g", topics={"events": 1})
            await cluster.wait_stable("g", members=2)
            await a.kill()
            await cluster.wait_stable("g", members=1)
            assert len(b.owned) == 6
            cluster.ledger.check()
"""

from __future__ import annotations

import contextlib
import logging
import math
from collections import defaultdict
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from pathlib import Path

import attrs
import trio
import trio.testing
from trio_util import AsyncValue

from coordinator.channel import Channel, ChannelClosed
from coordinator.client import open_channel
from coordinator.config import CoordinatorConfig
from coordinator.group_coordinator import GroupCoordinator, open_group_coordinator
from coordinator.server import handle_connection
from coordinator.store import open_embedded_store
from coordinator.store.embedded import EmbeddedStore
from protocol import (
    ErrorCode,
    OffsetCommitRequest,
    OffsetCommitResponse,
    PingRequest,
    PingResponse,
    RegisterConsumerRequest,
    RegisterConsumerResponse,
    Request,
    Role,
    StartFetcherRequest,
    StartFetcherResponse,
    StopFetcherRequest,
    StopFetcherResponse,
)
from protocol.types import BrokerInfo, PartitionOffset, Subscription, TopicPartition, TopicStreams
from statemachine.group import GroupState

log = logging.getLogger(__name__)


class InvariantViolation(AssertionError):
    """Two consumers held a fetch lease on one partition at once, or an offset went backwards."""


@attrs.frozen(kw_only=True)
class LeaseInterval:
    consumer_id: str
    partition: TopicPartition
    start: float
    end: float


@attrs.define
class OwnershipLedger:
    """Every fetch lease each simulated consumer held, as closed intervals of trio time."""

    _open: dict[tuple[str, TopicPartition], float] = attrs.field(factory=dict)
    closed: list[LeaseInterval] = attrs.field(factory=list)

    def began(self, consumer_id: str, partition: TopicPartition, at: float) -> None:
        self._open.setdefault((consumer_id, partition), at)

    def ended(self, consumer_id: str, partition: TopicPartition, at: float) -> None:
        start = self._open.pop((consumer_id, partition), None)
        if start is not None:
            self.closed.append(
                LeaseInterval(consumer_id=consumer_id, partition=partition, start=start, end=at)
            )

    def intervals(self, now: float) -> list[LeaseInterval]:
        still_open = [
            LeaseInterval(consumer_id=c, partition=tp, start=start, end=now)
            for (c, tp), start in self._open.items()
        ]
        return self.closed + still_open

    def holders(self, partition: TopicPartition) -> set[str]:
        return {c for (c, tp) in self._open if tp == partition}

    def check(self, now: float | None = None) -> None:
        """Raise InvariantViolation if any two leases on one partition overlapped in time."""
        at = trio.current_time() if now is None else now
        by_partition: dict[TopicPartition, list[LeaseInterval]] = defaultdict(list)
        for interval in self.intervals(at):
            by_partition[interval.partition].append(interval)
        for partition, intervals in by_partition.items():
            intervals.sort(key=lambda i: (i.start, i.end))
            latest: LeaseInterval | None = None
            for interval in intervals:
                overlaps = latest is not None and interval.start < latest.end
                if overlaps and latest is not None and interval.consumer_id != latest.consumer_id:
                    raise InvariantViolation(
                        f"{partition}: {latest.consumer_id} held it until {latest.end:.3f} "
                        f"but {interval.consumer_id} took it at {interval.start:.3f}"
                    )
                if latest is None or interval.end > latest.end:
                    latest = interval


@attrs.define(eq=False)
class SimulatedConsumer:
    """A consumer that follows seed 03 and DESIGN.md's ownership lease, with an application that
    finishes ``records_per_ping`` records of each owned partition between two Pings."""

    cluster: SimulatedCluster
    consumer_id: str
    group_id: str
    subscription: Subscription
    session_timeout_ms: int
    auto_commit: bool = True
    auto_offset_reset: str = "smallest"
    records_per_ping: int = 1
    rejoin: bool = True
    answer_delay: float = 0.0
    channel: Channel | None = None
    generation: int = -1
    highest_epoch: int = -1
    last_request_at: float = -math.inf
    #: The next offset to read of each partition it fetches (only while fetching).
    positions: dict[TopicPartition, int] = attrs.field(factory=dict)
    #: Whether it is fetching now; tests wait on its changes.
    fetching_state: AsyncValue[bool] = attrs.field(factory=lambda: AsyncValue(False))
    frozen_until: float = -math.inf
    registrations: int = 0
    last_register_error: ErrorCode = ErrorCode.NONE
    _scope: trio.CancelScope = attrs.field(factory=trio.CancelScope)
    _registered: trio.Event = attrs.field(factory=trio.Event)
    _killed: bool = False

    @property
    def fetching(self) -> bool:
        return bool(self.fetching_state.value)

    @property
    def owned(self) -> frozenset[TopicPartition]:
        return frozenset(self.positions) if self.fetching else frozenset()

    @property
    def session_timeout(self) -> float:
        return self.session_timeout_ms / 1000

    @property
    def lease_end(self) -> float:
        return self.last_request_at + self.session_timeout

    # --- faults -------------------------------------------------------------------------------

    async def kill(self) -> None:
        """The process dies: fetchers stop with it and its connection closes."""
        self._killed = True
        self._stop_fetching(trio.current_time())
        self._scope.cancel()
        if self.channel is not None:
            with trio.CancelScope(shield=True):
                await self.channel.aclose()

    def freeze(self, seconds: float) -> None:
        """Pause the whole process (a GC pause): nothing is read, answered or fetched."""
        self.frozen_until = max(self.frozen_until, trio.current_time() + seconds)

    def answer_slowly(self, seconds: float) -> None:
        self.answer_delay = seconds

    # --- the application ----------------------------------------------------------------------

    async def commit(self) -> ErrorCode:
        """An explicit OffsetCommit of the current positions, over a fresh connection if the
        coordinator connection is gone or its lease ran out (what a process back from a long
        pause does before it re-registers)."""
        request = OffsetCommitRequest(
            group_id=self.group_id,
            consumer_id=self.consumer_id,
            generation=self.generation,
            offsets=self._offsets(),
        )
        channel = self.channel
        if channel is None or channel.closed or trio.current_time() >= self.lease_end:
            async with self.cluster.open_client() as client:
                response = await client.request(request)
        else:
            response = await channel.request(request)
        assert isinstance(response, OffsetCommitResponse)
        return response.error_code

    # --- the consumer's work ------------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        with self._scope:
            started = False
            while not self._killed:
                await self._unfrozen()
                error = await self._session(task_status if not started else None)
                started = started or error is ErrorCode.NONE
                if not self.rejoin:
                    break
                await trio.sleep(self.session_timeout / 3)  # backoff before rediscovery
            if not started:
                task_status.started()

    async def _session(self, task_status: trio.TaskStatus[None] | None) -> ErrorCode:
        stream = await self.cluster.connect()
        channel = Channel.open(
            stream,
            Role.CONSUMER,
            client_id=self.consumer_id,
            max_frame_size=self.cluster.config.max_frame_size,
        )
        self.channel = channel
        error = ErrorCode.COORDINATOR_NOT_AVAILABLE
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._read, channel, nursery.cancel_scope)
                try:
                    response = await channel.request(self._registration())
                except ChannelClosed:
                    nursery.cancel_scope.cancel()
                    return error
                assert isinstance(response, RegisterConsumerResponse)
                error = self.last_register_error = response.error_code
                if error is not ErrorCode.NONE:
                    nursery.cancel_scope.cancel()
                    return error
                self.registrations += 1
                self.highest_epoch = max(self.highest_epoch, response.coordinator_epoch)
                self.last_request_at = trio.current_time()
                if task_status is not None:
                    task_status.started()
                nursery.start_soon(self._watch_lease, nursery.cancel_scope)
            return error
        finally:
            # Seed 03 onLostConnection: stop fetchers first, then drop the connection.
            self._stop_fetching(min(trio.current_time(), self.lease_end))
            with trio.CancelScope(shield=True):
                await channel.aclose()

    def _registration(self) -> RegisterConsumerRequest:
        return RegisterConsumerRequest(
            group_id=self.group_id,
            consumer_id=self.consumer_id,
            subscription=self.subscription,
            auto_commit=self.auto_commit,
            auto_offset_reset=self.auto_offset_reset,
            session_timeout_ms=self.session_timeout_ms,
            generation=self.generation,
            owned_partitions=tuple(sorted(self.owned)),
        )

    async def _read(self, channel: Channel, session_scope: trio.CancelScope) -> None:
        """Read until the connection ends, then end the session (seed 03: lost connection)."""

        async def on_request(request: Request) -> None:
            if not await self._handle(request):
                session_scope.cancel()

        await channel.run(on_request)
        session_scope.cancel()

    async def _watch_lease(self, session_scope: trio.CancelScope) -> None:
        while True:
            await trio.sleep_until(self.lease_end)
            await self._unfrozen()
            if trio.current_time() >= self.lease_end:
                log.info("%s: no coordinator request for T, stopping", self.consumer_id)
                self._stop_fetching(self.lease_end)
                session_scope.cancel()
                return

    async def _handle(self, request: Request) -> bool:
        """Answer one coordinator request; False ends the session."""
        await self._unfrozen()
        now = trio.current_time()
        if now >= self.lease_end:
            # Back from a pause longer than the lease: whatever is buffered is stale.
            self._stop_fetching(self.lease_end)
            return False
        message = request.message
        epoch = getattr(message, "coordinator_epoch", -1)
        if epoch < self.highest_epoch:
            return True  # a deposed coordinator: ignored (DESIGN.md, "Coordinator epoch")
        self.highest_epoch = epoch
        self.last_request_at = now
        if self.answer_delay:
            await trio.sleep(self.answer_delay)
        assert self.channel is not None
        match message:
            case PingRequest():
                if self.fetching:
                    for tp in self.positions:
                        self.positions[tp] += self.records_per_ping
                await self._respond(
                    request,
                    PingResponse(
                        error_code=ErrorCode.NONE,
                        consumer_id=self.consumer_id,
                        offsets=self._offsets() if self.auto_commit else (),
                    ),
                )
            case StopFetcherRequest():
                offsets = self._offsets() if self.auto_commit else ()
                self._stop_fetching(now)
                await self._respond(
                    request,
                    StopFetcherResponse(
                        error_code=ErrorCode.NONE, consumer_id=self.consumer_id, offsets=offsets
                    ),
                )
            case StartFetcherRequest() as start:
                self._stop_fetching(now)
                self.generation = start.generation
                self.cluster.generations[self.group_id].append(start.generation)
                self.positions = {
                    TopicPartition(topic=p.topic, partition=p.partition): max(p.offset, 0)
                    for stream in start.streams
                    for p in stream.partitions
                }
                self.fetching_state.value = True
                for tp in self.positions:
                    self.cluster.ledger.began(self.consumer_id, tp, now)
                await self._respond(
                    request,
                    StartFetcherResponse(error_code=ErrorCode.NONE, consumer_id=self.consumer_id),
                )
        return True

    async def _respond(self, request: Request, response: object) -> None:
        assert self.channel is not None
        with contextlib.suppress(ChannelClosed):
            await self.channel.respond(request, response)  # type: ignore[arg-type]

    def _offsets(self) -> tuple[PartitionOffset, ...]:
        return tuple(
            PartitionOffset(topic=tp.topic, partition=tp.partition, offset=offset)
            for tp, offset in sorted(self.positions.items())
        )

    def _stop_fetching(self, at: float) -> None:
        if self.fetching:
            for tp in self.positions:
                self.cluster.ledger.ended(self.consumer_id, tp, at)
        self.fetching_state.value = False

    async def _unfrozen(self) -> None:
        while trio.current_time() < self.frozen_until:
            await trio.sleep_until(self.frozen_until)


@attrs.define(eq=False)
class SimulatedCluster:
    config: CoordinatorConfig
    data_dir: Path
    broker: BrokerInfo
    nursery: trio.Nursery
    store: EmbeddedStore
    coordinator: GroupCoordinator
    ledger: OwnershipLedger = attrs.field(factory=OwnershipLedger)
    generations: dict[str, list[int]] = attrs.field(factory=lambda: defaultdict(list))
    consumers: dict[str, SimulatedConsumer] = attrs.field(factory=dict)
    _connections: trio.Nursery | None = None

    async def create_topic(self, name: str, *, partitions: int) -> None:
        await self.store.create_topic(name, (self.broker.broker_id,) * partitions)
        await self._topics_seen(name, partitions)

    async def add_partitions(self, name: str, *, added: int) -> None:
        placement = await self.store.add_partitions(name, (self.broker.broker_id,) * added)
        await self._topics_seen(name, placement.partition_count)

    async def _topics_seen(self, name: str, partitions: int) -> None:
        while True:
            placement = self.coordinator.topics.get(name)
            if placement is not None and placement.partition_count >= partitions:
                return
            await trio.sleep(0)

    async def connect(self) -> trio.abc.Stream:
        """A new in-memory connection to the broker, served like a TCP one."""
        client, server = trio.testing.memory_stream_pair()
        assert self._connections is not None
        self._connections.start_soon(handle_connection, self.coordinator, server)
        return client

    @asynccontextmanager
    async def open_client(self) -> AsyncIterator[Channel]:
        """A plain client connection (an admin tool, a standalone committer)."""
        async with open_channel(
            await self.connect(), max_frame_size=self.config.max_frame_size
        ) as channel:
            yield channel

    async def start_consumer(
        self,
        consumer_id: str,
        *,
        group: str,
        topics: Mapping[str, int] | None = None,
        subscription: Subscription | None = None,
        session_timeout_ms: int = 6000,
        **options: object,
    ) -> SimulatedConsumer:
        """Start a consumer and return once it has registered (or been refused)."""
        if subscription is None:
            entries = tuple(TopicStreams(topic=t, streams=n) for t, n in (topics or {}).items())
            subscription = Subscription(topics=entries)
        consumer = SimulatedConsumer(
            cluster=self,
            consumer_id=consumer_id,
            group_id=group,
            subscription=subscription,
            session_timeout_ms=session_timeout_ms,
            **options,  # type: ignore[arg-type]
        )
        self.consumers[consumer_id] = consumer
        await self.nursery.start(consumer.run)
        return consumer

    async def wait_stable(self, group_id: str, *, members: int) -> int:
        """Wait until the group is Stable with ``members`` live members; returns its generation."""
        group = self.coordinator.group(group_id)

        def stable(status: tuple[GroupState, int]) -> bool:
            return status[0] is GroupState.STABLE and len(group.members) == members

        await group.status.wait_value(stable)
        return group.machine.generation


@asynccontextmanager
async def open_simulated_cluster(
    data_dir: Path, config: CoordinatorConfig | None = None, *, broker_id: int = 1
) -> AsyncIterator[SimulatedCluster]:
    config = config or CoordinatorConfig()
    broker = BrokerInfo(broker_id=broker_id, host="simulated", port=9092)
    async with open_embedded_store(data_dir) as store:
        await store.register_broker(broker)
        async with (
            open_group_coordinator(store, config, broker) as coordinator,
            trio.open_nursery() as nursery,
            trio.open_nursery() as connections,
        ):
            cluster = SimulatedCluster(
                config=config,
                data_dir=data_dir,
                broker=broker,
                nursery=nursery,
                store=store,
                coordinator=coordinator,
            )
            cluster._connections = connections
            try:
                yield cluster
            finally:
                nursery.cancel_scope.cancel()
                connections.cancel_scope.cancel()
