"""The simulated consumer: the library's own consumer (``open_consumer``, driving
``statemachine.consumer``) run as a :class:`~simulation.process.SimulatedProcess`, with an
application that finishes every record it is handed, and what a test asserts read from it."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Protocol

import attrs
import trio
from trio_util import AsyncValue

from consumer import CommitFailed, ConsumerSettings, InstanceFenced, open_consumer
from consumer.client import Consumer
from protocol import ErrorCode, OffsetCommitRequest, OffsetCommitResponse
from protocol.types import PartitionOffset, Subscription, TopicPartition
from statemachine import consumer as sm
from statemachine.consumer import ConsumerState
from transport.channel import Channel
from transport.connect import Connector

from .network import SimulatedHost
from .process import SimulatedProcess

if TYPE_CHECKING:
    from .cluster import SimulatedCluster

__all__ = ["ClusterMember", "SimulatedConsumer"]

_REGISTERED = (ConsumerState.STOPPED, ConsumerState.FETCHING)
_REGISTERING = (ConsumerState.REGISTERING, ConsumerState.REREGISTERING)
#: The wire's names for where to start (SPEC.md), as tests give them, and the library's.
_RESETS = {"smallest": "earliest", "largest": "latest"}


class ClusterMember(Protocol):
    """What :class:`~simulation.cluster.SimulatedCluster` reads of a consumer it started: the
    simulated consumer, or a test's own member (an adversary, an old client)."""

    @property
    def consumer_id(self) -> str: ...
    @property
    def group_id(self) -> str: ...
    @property
    def subscription(self) -> Subscription: ...
    @property
    def member_id(self) -> str: ...
    @property
    def alive(self) -> bool: ...
    @property
    def fetching(self) -> bool: ...
    @property
    def fetching_state(self) -> AsyncValue[bool]: ...
    @property
    def owned(self) -> frozenset[TopicPartition]: ...
    @property
    def generation(self) -> int: ...
    @property
    def started_generations(self) -> list[int]: ...
    @property
    def frozen_until(self) -> float: ...
    @property
    def host(self) -> SimulatedHost: ...

    async def run(self, *, task_status: trio.TaskStatus[None] = ...) -> None: ...
    async def kill(self, *, reset: bool = False) -> None: ...
    async def stop(self) -> None: ...
    def restart_options(self) -> dict[str, Any]: ...


@attrs.define(eq=False)
class SimulatedConsumer:
    """One consumer process of the simulated cluster: the real ``open_consumer`` over the
    simulated network, whose faults are the process's (:class:`SimulatedProcess`), with an
    application that finishes each record as it is handed over (so its Pings report what it
    consumed). What tests read (``owned``, ``generation``, ``registrations``...) is the real
    consumer's and its machine's state, seen in the instant it changed.

    The fetch leases it holds go into ``cluster.ledger`` as the consumer's fetchers start and stop.
    """

    cluster: SimulatedCluster
    consumer_id: str
    group_id: str
    subscription: Subscription
    session_timeout_ms: int
    auto_commit: bool = True
    auto_offset_reset: str = "smallest"
    #: False: once a registration is refused the application closes the consumer, which then
    #: registers no more.
    rejoin: bool = True
    #: A static member's instance id (docs/design.md#static-members): the group knows the
    #: member by it, whatever process carries it; None: a dynamic member.
    instance_id: str | None = None
    #: How long its fetchers wait before asking again for a partition with nothing new (the
    #: library's default; larger makes a long run with many consumers cheaper).
    fetch_idle_interval: float = 0.1
    #: The error of its last commit through :meth:`commit` (FENCED_INSTANCE_ID once fenced).
    last_error: ErrorCode = ErrorCode.NONE
    #: Why its latest registration failed (NONE: it succeeded).
    last_register_error: ErrorCode = ErrorCode.NONE
    registrations: int = 0
    #: Whether it is fetching now; tests wait on its changes.
    fetching_state: AsyncValue[bool] = attrs.field(factory=lambda: AsyncValue(False))
    #: Every generation it started fetching under, in order, and when each start was carried out
    #: (its new partitions' fetchers running).
    started_generations: list[int] = attrs.field(factory=list)
    started_at: list[float] = attrs.field(factory=list)
    #: How many StopFetcher and StartFetcher requests it carried out: a member whose assignment
    #: an incremental rebalance does not change gets none.
    stops_received: int = 0
    starts_received: int = 0
    #: What each StopFetcher it carried out stopped (None: everything).
    stopped_partitions: list[frozenset[TopicPartition] | None] = attrs.field(factory=list)
    #: When each StopFetcher it carried out was answered, in order (with stopped_partitions).
    stopped_at: list[float] = attrs.field(factory=list)
    #: Every record its application was handed: when, of which partition, its offset, value.
    delivered: list[tuple[float, TopicPartition, int, bytes | None]] = attrs.field(factory=list)
    consumer: Consumer | None = None
    """The library's consumer, once the process has opened it."""
    process: SimulatedProcess = attrs.field(init=False)
    _state: ConsumerState = ConsumerState.IDLE
    _ready: trio.Event = attrs.field(factory=trio.Event)
    _ended: bool = False
    _leased: set[TopicPartition] = attrs.field(factory=set)

    def __attrs_post_init__(self) -> None:
        self.process = SimulatedProcess(name=self.consumer_id, cluster=self.cluster)

    # --- what tests read ------------------------------------------------------------------------

    @property
    def fetching(self) -> bool:
        return bool(self.fetching_state.value)

    @property
    def owned(self) -> frozenset[TopicPartition]:
        return frozenset(self._leased)

    @property
    def generation(self) -> int:
        return -1 if self.consumer is None else self.consumer.generation

    @property
    def positions(self) -> dict[TopicPartition, int]:
        """The next offset to read of each partition it fetches, as its application finished
        them: what a commit sends."""
        return {} if self.consumer is None else self.consumer.consumed_offsets()

    @property
    def fenced(self) -> bool:
        return self._state is ConsumerState.FENCED

    @property
    def alive(self) -> bool:
        """Whether the process runs as a member (not killed, stopped, left or fenced)."""
        return not self._ended and not self.fenced

    @property
    def member_id(self) -> str:
        """The id the group knows it by: its instance id if static, else its consumer id."""
        return self.instance_id or self.consumer_id

    @property
    def session_timeout(self) -> float:
        return self.session_timeout_ms / 1000

    @property
    def last_request_at(self) -> float:
        """Where its lease runs from (the library's ``last_heard``): when it queued the latest
        frame a coordinator request named as received (-inf: none yet)."""
        heard = None if self.consumer is None else self.consumer.last_heard
        return -math.inf if heard is None else heard

    @property
    def lease_end(self) -> float:
        """When its lease runs out, as its machine counts it (-inf: it holds none)."""
        if self.consumer is None:
            return -math.inf
        deadline = self.consumer._machine.lease_deadline()
        return -math.inf if deadline is None else deadline

    @property
    def channel(self) -> Channel | None:
        """Its coordinator connection now (None between two), for a test that speaks on it."""
        session = None if self.consumer is None else self.consumer._session
        return None if session is None else session.channel

    @property
    def host(self) -> SimulatedHost:
        return self.process.host

    @property
    def frozen_until(self) -> float:
        return self.process.frozen_until

    def restart_options(self) -> dict[str, Any]:
        """What a new process under its name starts with (``restart_consumer``)."""
        return {
            "group": self.group_id,
            "subscription": self.subscription,
            "session_timeout_ms": self.session_timeout_ms,
            "auto_commit": self.auto_commit,
            "auto_offset_reset": self.auto_offset_reset,
            "rejoin": self.rejoin,
            "instance_id": self.instance_id,
            "fetch_idle_interval": self.fetch_idle_interval,
        }

    # --- faults ---------------------------------------------------------------------------------

    async def kill(self, *, reset: bool = False) -> None:
        """The process dies: fetchers stop with it and its connections close (the kernel's end
        of stream), or with ``reset`` are reset (the kernel sends RST when the socket held bytes
        not yet read), which proves nothing to the coordinator."""
        if reset:
            self.process.drop_connections()
        self._end()
        await self.process.kill()

    async def stop(self) -> None:
        """A clean stop without LeaveGroup, as a static member's process ends when it expects to
        be restarted (docs/design.md#static-members): registered, it commits what it consumed
        over its connection; then its connections close cleanly."""
        consumer = self.consumer
        registered = consumer is not None and consumer.state in _REGISTERED
        if registered and self.fetching and not self.process.killed:
            self.last_error = await self._commit_now(None)
        await self.kill()

    async def leave(self) -> None:
        """A clean close (the library's): stop fetching, commit the final offsets, send LeaveGroup
        (not a static member), close, and register no more."""
        self.rejoin = False
        if self.consumer is not None and not self.process.killed:
            await self.consumer.aclose()
        self._end()
        await self.process.kill()

    def freeze(self, seconds: float) -> None:
        """Pause the whole process (a GC pause): nothing is read or written, and no connection
        opens; its timers run on, as its lease's must (the lease ends on time)."""
        self.process.freeze(seconds)

    def answer_slowly(self, seconds: float) -> None:
        """Take ``seconds`` over each answer from now on (0 restores prompt answers)."""
        self.process.answer_slowly(seconds)

    def drop_connection(self) -> None:
        """Reset its connections: both ends see them fail; the process lives on."""
        self.process.drop_connections()

    def abandon_connection(self) -> None:
        """Give up the coordinator connection though the coordinator lives, as a consumer that
        judged it silent would: the library takes it for lost (it resets it, fetching on under
        its lease) and finds its coordinator again."""
        channel = self.channel
        if channel is not None:
            self.cluster.nursery.start_soon(channel.abort)

    def cut_network(self, seconds: float) -> None:
        """Neither this process nor the broker gets a byte from the other for ``seconds``."""
        self.process.cut_network(seconds)

    def delay_delivery(
        self, seconds: float, *, to_consumer: bool = True, to_broker: bool = False
    ) -> None:
        """Every byte the broker sends this process for ``seconds`` from now (``to_consumer``)
        and every byte it sends the broker (``to_broker``) stays in flight until then and arrives
        in order afterwards, a close or a reset last (:meth:`SimulatedHost.delay`). A request
        held past the lease margin must not stretch the lease (docs/design.md#ownership-lease)."""
        self.process.delay_delivery(seconds, to_process=to_consumer, to_broker=to_broker)

    # --- the application ------------------------------------------------------------------------

    async def commit(
        self,
        *,
        generation: int | None = None,
        positions: Mapping[TopicPartition, int] | None = None,
    ) -> ErrorCode:
        """Commit the consumed positions (or ``positions``) through the library, or, given a
        ``generation`` or when not registered, as an OffsetCommit over a fresh connection (a
        commit sent long ago and read only now, a standalone committer)."""
        code = await self._commit_now(positions, generation=generation)
        self.last_error = code
        return code

    async def _commit_now(
        self, positions: Mapping[TopicPartition, int] | None, *, generation: int | None = None
    ) -> ErrorCode:
        consumer = self.consumer
        registered = consumer is not None and consumer.state in _REGISTERED
        if consumer is not None and registered and generation is None:
            try:
                await consumer.commit(positions)
            except InstanceFenced:
                return ErrorCode.FENCED_INSTANCE_ID
            except CommitFailed as exc:
                return exc.error_code
            return ErrorCode.NONE
        offsets = self.positions if positions is None else positions
        request = OffsetCommitRequest(
            group_id=self.group_id,
            consumer_id=self.consumer_id,
            generation=self.generation if generation is None else generation,
            offsets=tuple(
                PartitionOffset(topic=tp.topic, partition=tp.partition, offset=offset)
                for tp, offset in sorted(offsets.items())
            ),
        )
        async with self.cluster.open_client() as client:
            response = await client.request(request)
        assert isinstance(response, OffsetCommitResponse)
        return response.error_code

    # --- the process ----------------------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Start the process; started once it registered, was refused, or ended."""
        self.cluster.nursery.start_soon(self.process.run, self._main)
        async with trio.open_nursery() as nursery:

            async def ended() -> None:
                await self.process.done.wait()
                nursery.cancel_scope.cancel()

            nursery.start_soon(ended)
            await self._ready.wait()
            nursery.cancel_scope.cancel()
        task_status.started()

    async def _main(self, *, connect: Connector) -> None:
        settings = ConsumerSettings(
            session_timeout=self.session_timeout,
            auto_commit=self.auto_commit,
            auto_offset_reset=_RESETS.get(self.auto_offset_reset, self.auto_offset_reset),
            client_id=self.consumer_id,
            failover_jitter=0.0,  # exact instants
            busy_jitter=0.0,
            discovery_timeout=None,
            fetch_idle_interval=self.fetch_idle_interval,
            instance_id=self.instance_id,
        )
        subscription = self.subscription
        if subscription.is_wildcard:
            topics: dict[str, int] | None = None
            pattern_streams = subscription.pattern_streams
        else:
            topics = {t.topic: t.streams for t in subscription.topics}
            pattern_streams = 1
        try:
            async with open_consumer(
                f"{self.cluster.broker.host}:{self.cluster.broker.port}",
                self.group_id,
                topics=topics,
                pattern=subscription.pattern,
                pattern_streams=pattern_streams,
                pattern_is_blacklist=subscription.pattern_is_blacklist,
                consumer_id=self.consumer_id,
                settings=settings,
                on_revoked=self._revoked,
                on_assigned=self._assigned,
                connect=connect,
            ) as consumer:
                self.consumer = consumer
                consumer.observer = self._observe
                async for record in consumer:
                    tp = TopicPartition(topic=record.topic, partition=record.partition)
                    self.delivered.append((trio.current_time(), tp, record.offset, record.value))
                    consumer.mark(record)
                    if self._gave_up():
                        break
        except InstanceFenced:
            pass
        finally:
            self._end()

    def _gave_up(self) -> bool:
        return not self.rejoin and self.last_register_error is not ErrorCode.NONE

    def _observe(self, consumer: Consumer, effects: list[sm.Effect]) -> None:
        for effect in effects:
            match effect:
                case sm.RespondStop(partitions=stopped):
                    whole = any(
                        isinstance(e, sm.StopFetchers) and e.partitions is None for e in effects
                    )
                    self.stops_received += 1
                    self.stopped_partitions.append(None if whole else frozenset(stopped))
                    self.stopped_at.append(trio.current_time())
                case sm.RespondStart():
                    self.starts_received += 1
        before, self._state = self._state, consumer.state
        if before in _REGISTERING and self._state in _REGISTERED:
            self.registrations += 1
            self.last_register_error = ErrorCode.NONE
            self._ready.set()
        elif before in _REGISTERING and self._state is not before:
            self.last_register_error = consumer.last_error or ErrorCode.NONE
            if self.fenced:
                self.last_error = ErrorCode.FENCED_INSTANCE_ID
            if self._gave_up() or self.fenced:
                self._ready.set()
                self.cluster.nursery.start_soon(consumer.aclose)
        if self.fenced:
            self.last_error = ErrorCode.FENCED_INSTANCE_ID
        self._update_fetching(consumer)

    def _update_fetching(self, consumer: Consumer) -> None:
        """Whether it fetches, from its machine's state and what it still holds: read as soon as
        either changes, so that no instant shows it fetching with nothing owned."""
        state = consumer.state
        self.fetching_state.value = state is ConsumerState.FETCHING or (
            state in (ConsumerState.REDISCOVERING, ConsumerState.REREGISTERING)
            and bool(self._leased)
        )

    async def _assigned(self, added: frozenset[TopicPartition]) -> None:
        assert self.consumer is not None
        now = trio.current_time()
        generation = self.consumer.generation
        self.started_generations.append(generation)
        self.started_at.append(now)
        self.cluster.generations[self.group_id].append(generation)
        for tp in sorted(added):
            self._leased.add(tp)
            self.cluster.ledger.began(self.group_id, self.consumer_id, tp, now)
        self.fetching_state.value = True

    async def _revoked(self, revoked: frozenset[TopicPartition]) -> None:
        now = self._fetched_until()
        for tp in sorted(revoked):
            self._leased.discard(tp)
            self.cluster.ledger.ended(self.group_id, self.consumer_id, tp, now)
        if self.consumer is not None:
            # Stopped before the machine's other effects (a close) are performed.
            self._update_fetching(self.consumer)

    def _fetched_until(self) -> float:
        """Now, or the end of its lease if that came first: its fetchers check the lease before
        every request, so they fetch nothing past it even when the timer that stops them fires
        late (a clock jump: ``SimulatedCluster.pause_coordinator``)."""
        now = trio.current_time()
        if self.consumer is None or self.consumer.last_heard is None:
            return now
        return min(now, self.consumer.last_heard + self.session_timeout)

    def _end(self) -> None:
        """The process ends: the fetch leases it held end with it."""
        self._ended = True
        now = self._fetched_until()
        for tp in sorted(self._leased):
            self.cluster.ledger.ended(self.group_id, self.consumer_id, tp, now)
        self._leased.clear()
        self.fetching_state.value = False
        self._ready.set()
