"""A stand-in consumer of the tests' own: seed 03's consumer written out again over the
protocol, with modes the library's consumer has not (a member that refuses handovers or
reports partitions it no longer fetches, a level 0 client speaking only version 0 of the
coordinator requests). The simulation's consumer is the library's own
(:class:`simulation.SimulatedConsumer`); start this one with
``cluster.start_consumer(..., member=StandInConsumer)``."""

from __future__ import annotations

import contextlib
import logging
import math
from collections.abc import Mapping
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import attrs
import trio
import trio.testing
from trio_util import AsyncValue

from coordinator.config import CoordinatorConfig
from protocol import (
    ErrorCode,
    LeaveGroupRequest,
    LeaveGroupResponse,
    OffsetCommitRequest,
    OffsetCommitResponse,
    PingRequest,
    PingResponse,
    RegisterConsumerRequest,
    RegisterConsumerResponse,
    RemoteProtocolError,
    Request,
    Role,
    StartFetcherRequest,
    StartFetcherResponse,
    StopFetcherRequest,
    StopFetcherResponse,
)
from protocol.types import PartitionOffset, Subscription, TopicPartition
from simulation.cluster import open_simulated_cluster
from simulation.network import Link, SimulatedHost
from transport.channel import Channel, ChannelClosed, acknowledged_frames

if TYPE_CHECKING:
    from simulation.cluster import SimulatedCluster

log = logging.getLogger(__name__)


@attrs.define(eq=False)
class StandInConsumer:
    """A consumer that follows seed 03 and the ownership lease (docs/design.md#ownership-lease),
    with an application that finishes ``records_per_ping`` records of each owned partition
    between two Pings.

    Its reader takes each coordinator request off the wire as soon as it arrives and hands it to
    one worker that answers in order; so an answer that is slow does not hide a closed
    connection, which stops the fetchers at once. The request renews the lease from when this
    process queued the frame it names (``acknowledged_frames``), not from its arrival, so a
    request delayed in the network cannot stretch the lease.
    """

    cluster: SimulatedCluster
    consumer_id: str
    group_id: str
    subscription: Subscription
    session_timeout_ms: int
    auto_commit: bool = True
    auto_offset_reset: str = "smallest"
    records_per_ping: int = 1
    rejoin: bool = True
    #: The consumer of seed 04, which keeps fetching through a coordinator failover
    #: (docs/design.md#adoption-after-a-failover). With this, a lost connection does not stop the
    #: fetchers: they run on under the lease while the consumer registers again, claiming what it
    #: still holds, which a new coordinator adopts. A healed cut or a late delivery may hand it
    #: Pings sent long before, then the close; those renew its lease only from frames the
    #: coordinator had received before sending them, so the lease still ends before the
    #: coordinator's count (docs/design.md#ownership-lease).
    fetch_through_failover: bool = False
    #: A client of SPEC.md's level 0 (docs/design.md#old-clients): it registers in
    #: RegisterConsumer version 0, reads only version 0 of the coordinator requests (any other
    #: fails the run), and keeps no lease: it fetches until a StopFetcher or until it learns that
    #: its coordinator connection ended, never through a failover.
    level0: bool = False
    answer_delay: float = 0.0
    #: A static member's instance id (docs/design.md#static-members): the group knows the
    #: member by it, whatever process carries it; None: a dynamic member.
    instance_id: str | None = None
    #: A newer process under its instance id fenced it: it stopped, answered, closed, and does
    #: not register again.
    fenced: bool = False
    #: The error of its last OffsetCommit or LeaveGroup (FENCED_INSTANCE_ID once fenced).
    last_error: ErrorCode = ErrorCode.NONE
    #: Not NONE: StopFetcher and StartFetcher are answered with this error and not carried out.
    handover_error: ErrorCode = ErrorCode.NONE
    #: A buggy consumer: its Ping answers still carry each partition a StopFetcher revoked, at
    #: the offset it stopped at plus 1000 (which would skip records if it counted).
    report_stopped: bool = False
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
    #: Every generation it started fetching under, in order.
    started_generations: list[int] = attrs.field(factory=list)
    #: How many StopFetcher and StartFetcher requests it carried out: a member whose assignment
    #: an incremental rebalance does not change gets none.
    stops_received: int = 0
    starts_received: int = 0
    #: The partitions each StopFetcher named, in order (None: every one).
    stopped_partitions: list[frozenset[TopicPartition] | None] = attrs.field(factory=list)
    _revoked_positions: dict[TopicPartition, int] = attrs.field(factory=dict)
    host: SimulatedHost = attrs.field(factory=SimulatedHost)
    _link: Link | None = None
    _scope: trio.CancelScope = attrs.field(factory=trio.CancelScope)
    _session_scope: trio.CancelScope | None = None
    _killed: bool = False

    @property
    def fetching(self) -> bool:
        return bool(self.fetching_state.value)

    @property
    def owned(self) -> frozenset[TopicPartition]:
        return frozenset(self.positions) if self.fetching else frozenset()

    @property
    def alive(self) -> bool:
        """Whether the process runs as a member (not killed, stopped, left or fenced)."""
        return not self._killed and not self.fenced

    @property
    def member_id(self) -> str:
        """The id the group knows it by: its instance id if static, else its consumer id."""
        return self.instance_id or self.consumer_id

    @property
    def session_timeout(self) -> float:
        return self.session_timeout_ms / 1000

    @property
    def lease_end(self) -> float:
        if self.level0:
            return math.inf  # no lease: it never stops on its own clock
        return self.last_request_at + self.session_timeout

    def restart_options(self) -> dict[str, Any]:
        return {
            "group": self.group_id,
            "subscription": self.subscription,
            "session_timeout_ms": self.session_timeout_ms,
            "auto_commit": self.auto_commit,
            "auto_offset_reset": self.auto_offset_reset,
            "records_per_ping": self.records_per_ping,
            "rejoin": self.rejoin,
            "fetch_through_failover": self.fetch_through_failover,
            "instance_id": self.instance_id,
        }

    # --- faults -------------------------------------------------------------------------------

    async def kill(self, *, reset: bool = False) -> None:
        """The process dies: fetchers stop with it and its connection closes (the kernel's end
        of stream), or with ``reset`` is reset (the kernel sends RST when the socket held bytes
        not yet read), which proves nothing to the coordinator."""
        self._killed = True
        self._stop_fetching(trio.current_time())
        self._scope.cancel()
        if reset and self._link is not None:
            self._link.break_()
        if self.channel is not None:
            with trio.CancelScope(shield=True):
                await self.channel.aclose()

    async def stop(self) -> None:
        """A clean stop without LeaveGroup, as a static member's process ends when it expects to
        be restarted (docs/design.md#static-members): it stops its fetchers, commits their
        positions over its connection, and closes it cleanly."""
        channel = self.channel
        if channel is not None and not channel.closed and self.fetching:
            offsets = self._offsets()
            self._stop_fetching(trio.current_time())
            request = OffsetCommitRequest(
                group_id=self.group_id,
                consumer_id=self.consumer_id,
                generation=self.generation,
                offsets=offsets,
            )
            with contextlib.suppress(ChannelClosed):
                response = await channel.request(request)
                assert isinstance(response, OffsetCommitResponse)
                self.last_error = response.error_code
        await self.kill()

    async def leave(self) -> None:
        """A clean close: stop fetching, commit the final offsets, send LeaveGroup, close the
        connection, and do not register again (the consumer library's close). A static member
        leaves for good too (docs/design.md#static-members)."""
        self.rejoin = False
        channel = self.channel
        if channel is not None and not channel.closed:
            offsets = self._offsets()
            self._stop_fetching(trio.current_time())
            if self.auto_commit and offsets:
                await channel.request(
                    OffsetCommitRequest(
                        group_id=self.group_id,
                        consumer_id=self.consumer_id,
                        generation=self.generation,
                        offsets=offsets,
                    )
                )
            response = await channel.request(
                LeaveGroupRequest(
                    group_id=self.group_id,
                    consumer_id=self.consumer_id,
                    generation=self.generation,
                )
            )
            assert isinstance(response, LeaveGroupResponse)
            self.last_error = response.error_code
        self._killed = True
        self._scope.cancel()
        if channel is not None:
            with trio.CancelScope(shield=True):
                await channel.aclose()

    def freeze(self, seconds: float) -> None:
        """Pause the whole process (a GC pause): nothing is read, answered or fetched."""
        self.frozen_until = max(self.frozen_until, trio.current_time() + seconds)

    def answer_slowly(self, seconds: float) -> None:
        """Take ``seconds`` over each answer from now on (0 restores prompt answers)."""
        self.answer_delay = seconds

    def refuse_handovers(self, error: ErrorCode) -> None:
        """From now on answer every StopFetcher and StartFetcher with ``error`` and go on as
        before: fetching what it fetched, starting nothing (a buggy or hostile consumer)."""
        self.handover_error = error

    def drop_connection(self) -> None:
        """Reset the coordinator connection: both ends see it fail; the process lives on."""
        if self._link is not None:
            self._link.break_()

    def abandon_connection(self) -> None:
        """Give up the coordinator connection as a consumer that judged it silent does, though
        the coordinator lives, and register again after T/3. Fetching through failovers, it
        fetches on under its lease meanwhile, so it closes with a reset."""
        if self._session_scope is not None:
            self._session_scope.cancel()

    def cut_network(self, seconds: float) -> None:
        """Neither this process nor the broker gets a byte from the other for ``seconds``."""
        self.host.cut(seconds, self.cluster.nursery)

    def delay_delivery(
        self, seconds: float, *, to_consumer: bool = True, to_broker: bool = False
    ) -> None:
        """Every byte the broker sends this process for ``seconds`` from now (``to_consumer``)
        and every byte it sends the broker (``to_broker``) stays in flight until then and arrives
        in order afterwards, with whatever else was sent that way meanwhile, a close or a reset
        last. Unlike :meth:`cut_network`, connections still open and each direction is held on its
        own: TCP retransmitting over a path that lost everything for a while. A request held past
        the lease margin must not stretch the lease (docs/design.md#ownership-lease)."""
        self.host.delay(seconds, self.cluster.nursery, to_client=to_consumer, to_server=to_broker)

    # --- the application ----------------------------------------------------------------------

    async def commit(
        self,
        *,
        generation: int | None = None,
        positions: Mapping[TopicPartition, int] | None = None,
    ) -> ErrorCode:
        """An explicit OffsetCommit of the current positions, over a fresh connection if the
        coordinator connection is gone or its lease ran out (what a process back from a long
        pause does before it re-registers). ``generation`` and ``positions`` replace its own:
        a commit sent long ago and read only now."""
        request = OffsetCommitRequest(
            group_id=self.group_id,
            consumer_id=self.consumer_id,
            generation=self.generation if generation is None else generation,
            offsets=self._offsets(positions),
        )
        channel = self.channel
        if channel is None or channel.closed or trio.current_time() >= self.lease_end:
            async with self.cluster.open_client() as client:
                response = await client.request(request)
        else:
            response = await channel.request(request)
        assert isinstance(response, OffsetCommitResponse)
        if response.error_code is ErrorCode.FENCED_INSTANCE_ID:
            self._fenced_out()
        return response.error_code

    # --- the consumer's work ------------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        with self._scope:
            started = False
            while not self._killed:
                await self._unfrozen_under_lease()
                error = await self._session(task_status if not started else None)
                started = started or error is ErrorCode.NONE
                if not self.rejoin or self.fenced or error is ErrorCode.FENCED_INSTANCE_ID:
                    break
                await self._sleep_under_lease(self.session_timeout / 3)  # before rediscovery
            if not started:
                task_status.started()

    async def _session(self, task_status: trio.TaskStatus[None] | None) -> ErrorCode:
        try:
            stream, link = self.cluster.open_link(self.host, hold=self._unfrozen)
        except OSError:
            return ErrorCode.COORDINATOR_NOT_AVAILABLE
        channel = Channel.open(
            stream,
            Role.CONSUMER,
            client_id=self.consumer_id,
            max_frame_size=self.cluster.config.max_frame_size,
        )
        self.channel, self._link = channel, link
        error = ErrorCode.COORDINATOR_NOT_AVAILABLE
        send_requests, receive_requests = trio.open_memory_channel[Request](math.inf)
        try:
            async with trio.open_nursery() as nursery:
                scope = self._session_scope = nursery.cancel_scope
                watching = self.fetching
                if watching:
                    # Still under the previous coordinator's lease, which ends on time whatever
                    # this registration does.
                    nursery.start_soon(self._watch_lease, scope)
                else:
                    # The coordinator may ask something the instant it has answered: its
                    # requests on this connection count from the registration on.
                    self.last_request_at = trio.current_time()
                nursery.start_soon(self._read, channel, send_requests, scope)
                # queued before request() first yields: the registration frame's queue time
                registered_from = trio.current_time()
                try:
                    response = await channel.request(
                        self._registration(), api_version=0 if self.level0 else None
                    )
                except ChannelClosed:
                    scope.cancel()
                    return error
                assert isinstance(response, RegisterConsumerResponse)
                error = self.last_register_error = response.error_code
                if error is ErrorCode.FENCED_INSTANCE_ID:
                    self._fenced_out()
                if error is not ErrorCode.NONE:
                    scope.cancel()
                    return error
                self.registrations += 1
                self.highest_epoch = max(self.highest_epoch, response.coordinator_epoch)
                self.last_request_at = max(self.last_request_at, registered_from)
                if task_status is not None:
                    task_status.started()
                nursery.start_soon(self._work, receive_requests, scope)
                if not watching:
                    nursery.start_soon(self._watch_lease, scope)
            return error
        finally:
            # Seed 03 onLostConnection: stop fetchers first, then drop the connection.
            if self._killed or not self.fetch_through_failover or self.level0:
                self._stop_fetching(min(trio.current_time(), self.lease_end))
            with trio.CancelScope(shield=True):
                if self.fetching:
                    # Abandoned while still fetching: a reset, never an end of stream, which the
                    # coordinator takes as proof that it stopped (docs/design.md#ownership-lease).
                    await channel.abort()
                else:
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
            instance_id=self.instance_id,
        )

    async def _read(
        self,
        channel: Channel,
        requests: trio.MemorySendChannel[Request],
        session_scope: trio.CancelScope,
    ) -> None:
        """Read until the connection ends, then end the session (seed 03's onLostConnection)."""

        async def on_request(request: Request) -> None:
            if self.level0 and request.api_version != 0:
                raise AssertionError(
                    f"{self.consumer_id} reads version 0 only, and was sent"
                    f" {type(request.message).__name__} version {request.api_version}"
                )
            now = trio.current_time()
            if now >= self.lease_end:
                # Read after a pause longer than the lease: the session is over.
                self._stop_fetching(self.lease_end)
                session_scope.cancel()
                return
            epoch = getattr(request.message, "coordinator_epoch", -1)
            if epoch < self.highest_epoch:
                # A deposed coordinator, ignored:
                # docs/design.md#coordinator-epochs-and-the-election
                return
            self.highest_epoch = epoch
            # The lease runs from when this process queued the frame the request names, which the
            # coordinator had received before it sent the request; a frame it does not know (or
            # -1, 0) renews nothing, and the request is answered all the same.
            anchor = channel.sent_at(acknowledged_frames(request.message))
            if anchor is not None:
                self.last_request_at = max(self.last_request_at, anchor)
            requests.send_nowait(request)

        # A failed send leaves the connection in ERROR, which the next read reports as a
        # protocol error: either way the connection is lost.
        with contextlib.suppress(RemoteProtocolError):
            await channel.run(on_request)
        session_scope.cancel()

    async def _sleep_under_lease(self, seconds: float) -> None:
        """Sleep; fetchers that run on between sessions stop at the lease's end."""
        until = trio.current_time() + seconds
        if self.fetching and self.lease_end <= until:
            await trio.sleep_until(max(self.lease_end, trio.current_time()))
            log.info("%s: no coordinator request for T, stopping", self.consumer_id)
            self._stop_fetching(self.lease_end)
        await trio.sleep_until(until)

    async def _unfrozen_under_lease(self) -> None:
        """Wait out a freeze between two sessions. Fetching through a failover, its fetchers
        stop at the lease's end all the same, frozen or not (as ``_watch_lease`` does within a
        session)."""
        while trio.current_time() < self.frozen_until:
            if self.fetching and self.lease_end < self.frozen_until:
                await trio.sleep_until(max(self.lease_end, trio.current_time()))
                log.info("%s: no coordinator request for T, stopping", self.consumer_id)
                self._stop_fetching(self.lease_end)
            await trio.sleep_until(self.frozen_until)

    async def _watch_lease(self, session_scope: trio.CancelScope) -> None:
        # A frozen process reads nothing, so nothing renews its lease while it is frozen: its
        # leases are over at the lease's end even if it only notices when it resumes.
        while True:
            await trio.sleep_until(self.lease_end)
            if trio.current_time() >= self.lease_end:
                log.info("%s: no coordinator request for T, stopping", self.consumer_id)
                self._end_leases(self.lease_end)
                await self._unfrozen()
                self._stop_fetching(self.lease_end)
                session_scope.cancel()
                return

    async def _work(
        self, requests: trio.MemoryReceiveChannel[Request], session_scope: trio.CancelScope
    ) -> None:
        async for request in requests:
            await self._unfrozen()
            if self.answer_delay:
                await trio.sleep(self.answer_delay)
                await self._unfrozen()
            if trio.current_time() >= self.lease_end:
                self._stop_fetching(self.lease_end)
                session_scope.cancel()
                return
            await self._handle(request)
            if self.fenced:
                # Stopped and answered: close cleanly, for good (SPEC.md §11.11).
                assert self.channel is not None
                with contextlib.suppress(ChannelClosed):
                    await self.channel.flush()
                session_scope.cancel()
                return

    async def _handle(self, request: Request) -> None:
        now = trio.current_time()
        match request.message:
            case PingRequest():
                if self.fetching:
                    for tp in self.positions:
                        self.positions[tp] += self.records_per_ping
                reported = self.positions
                if self.report_stopped:
                    stale = {tp: o + 1000 for tp, o in self._revoked_positions.items()}
                    reported = stale | self.positions
                await self._respond(
                    request,
                    PingResponse(
                        error_code=ErrorCode.NONE,
                        consumer_id=self.consumer_id,
                        offsets=self._offsets(reported) if self.auto_commit else (),
                    ),
                )
            case StopFetcherRequest() if self.handover_error is not ErrorCode.NONE:
                await self._respond(
                    request,
                    StopFetcherResponse(
                        error_code=self.handover_error, consumer_id=self.consumer_id, offsets=()
                    ),
                )
            case StartFetcherRequest() if self.handover_error is not ErrorCode.NONE:
                await self._respond(
                    request,
                    StartFetcherResponse(
                        error_code=self.handover_error, consumer_id=self.consumer_id
                    ),
                )
            case StopFetcherRequest(reason=ErrorCode.FENCED_INSTANCE_ID):
                # A newer process took its instance id: stop everything, answer, and end.
                self.stops_received += 1
                self.stopped_partitions.append(None)
                offsets = self._offsets() if self.auto_commit and self.fetching else ()
                self._fenced_out()
                await self._respond(
                    request,
                    StopFetcherResponse(
                        error_code=ErrorCode.NONE, consumer_id=self.consumer_id, offsets=offsets
                    ),
                )
            case StopFetcherRequest(partitions=None):
                self.stops_received += 1
                self.stopped_partitions.append(None)
                offsets = self._offsets() if self.auto_commit else ()
                self._stop_fetching(now)
                await self._respond(
                    request,
                    StopFetcherResponse(
                        error_code=ErrorCode.NONE, consumer_id=self.consumer_id, offsets=offsets
                    ),
                )
            case StopFetcherRequest(partitions=listed) if listed is not None:
                # A revocation (SPEC.md §11.5): stop those, answer their final offsets, keep
                # fetching the rest without a pause.
                self.stops_received += 1
                revoked = frozenset(listed)
                self.stopped_partitions.append(revoked)
                stopped = {tp: o for tp, o in self.positions.items() if tp in revoked}
                offsets = self._offsets(stopped) if self.auto_commit and self.fetching else ()
                if self.fetching:
                    for tp in stopped:
                        self.cluster.ledger.ended(self.group_id, self.consumer_id, tp, now)
                for tp in stopped:
                    del self.positions[tp]
                self._revoked_positions.update(stopped)
                await self._respond(
                    request,
                    StopFetcherResponse(
                        error_code=ErrorCode.NONE, consumer_id=self.consumer_id, offsets=offsets
                    ),
                )
            case StartFetcherRequest() as start:
                self.starts_received += 1
                assigned = {
                    TopicPartition(topic=p.topic, partition=p.partition): max(p.offset, 0)
                    for stream in start.streams
                    for p in stream.partitions
                }
                if start.incremental and self.fetching:
                    # What it fetches already goes on from where it is (SPEC.md §11.6).
                    for tp in self.positions.keys() - assigned.keys():
                        self.cluster.ledger.ended(self.group_id, self.consumer_id, tp, now)
                    kept = {tp: o for tp, o in self.positions.items() if tp in assigned}
                    added = {tp: o for tp, o in assigned.items() if tp not in kept}
                else:
                    self._stop_fetching(now)
                    kept, added = {}, assigned
                self.generation = start.generation
                self.started_generations.append(start.generation)
                self.cluster.generations[self.group_id].append(start.generation)
                self.positions = kept | added
                self.fetching_state.value = True
                for tp in added:
                    self.cluster.ledger.began(self.group_id, self.consumer_id, tp, now)
                await self._respond(
                    request,
                    StartFetcherResponse(error_code=ErrorCode.NONE, consumer_id=self.consumer_id),
                )

    async def _respond(self, request: Request, response: object) -> None:
        assert self.channel is not None
        with contextlib.suppress(ChannelClosed):
            await self.channel.respond(request, response)  # type: ignore[arg-type]

    def _offsets(
        self, positions: Mapping[TopicPartition, int] | None = None
    ) -> tuple[PartitionOffset, ...]:
        positions = self.positions if positions is None else positions
        return tuple(
            PartitionOffset(topic=tp.topic, partition=tp.partition, offset=offset)
            for tp, offset in sorted(positions.items())
        )

    def _fenced_out(self) -> None:
        """Told FENCED_INSTANCE_ID: a newer process is the member; this one stops for good."""
        self.fenced = True
        self.last_error = ErrorCode.FENCED_INSTANCE_ID
        self._stop_fetching(trio.current_time())

    def _stop_fetching(self, at: float) -> None:
        self._end_leases(at)
        self.fetching_state.value = False

    def _end_leases(self, at: float) -> None:
        if self.fetching:
            for tp in self.positions:
                self.cluster.ledger.ended(self.group_id, self.consumer_id, tp, at)

    async def _unfrozen(self) -> None:
        while trio.current_time() < self.frozen_until:
            await trio.sleep_until(self.frozen_until)


def open_stand_in_cluster(
    data_dir: Path, config: CoordinatorConfig | None = None, *, broker_id: int = 1
) -> AbstractAsyncContextManager[SimulatedCluster]:
    """A simulated cluster whose ``start_consumer`` starts :class:`StandInConsumer`."""
    return open_simulated_cluster(
        data_dir, config, broker_id=broker_id, member_type=StandInConsumer
    )


def stand_in_options(cluster: SimulatedCluster, **options: Any) -> dict[str, Any]:
    """``options`` that only the stand-in has (``fetch_through_failover``), for a helper shared
    by tests on either consumer: the library's consumer always fetches through a failover."""
    return options if cluster.member_type is StandInConsumer else {}
