"""A deterministic driver: the real coordinator, the embedded store, in-memory connections, and
simulated consumers that speak the real protocol — all on trio's clock, so under ``MockClock`` a
test runs minutes of failures in milliseconds and asserts exact instants.

Faults are chosen by the test. On a consumer: :meth:`SimulatedConsumer.kill` (the process dies and
its connection closes), :meth:`~SimulatedConsumer.freeze` (a GC pause: silent, then it resumes and
finds its lease expired), :meth:`~SimulatedConsumer.answer_slowly`,
:meth:`~SimulatedConsumer.drop_connection` (the connection breaks, the process lives on: it stops
fetching, rediscovers and re-registers), :meth:`~SimulatedConsumer.cut_network` (neither side
gets a byte for a while) and :meth:`~SimulatedConsumer.delay_delivery` (bytes one way or both stay
in flight for a while, then arrive in order). On the cluster: :meth:`SimulatedCluster.create_topic`,
:meth:`~SimulatedCluster.add_partitions`, :meth:`~SimulatedCluster.restart_coordinator`,
:meth:`~SimulatedCluster.lose_store_contact` (the coordinator stops hearing from its store, as a
deposed ZooKeeper coordinator would) and :meth:`~SimulatedCluster.pause_coordinator` (a GC pause
or SIGSTOP of the broker).

:meth:`SimulatedCluster.check_invariants` is the invariant checker: no two fetch leases on one
partition ever overlapped (the :class:`OwnershipLedger`), no committed offset went backwards (in the
store or in the coordinator's memory), generations only increased, and — after a quiet period,
``settled=True`` — every subscribed partition has exactly one owner among the live members.
``docs/testing.md`` has a walk-through; ``tests/simulation/test_example.py`` is its example.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import math
from collections import defaultdict
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from functools import partial
from pathlib import Path
from typing import Any, Literal, cast

import attrs
import trio
import trio.testing
from trio_util import AsyncValue

from broker.dispatch import handle_connection
from coordinator.config import CoordinatorConfig
from coordinator.group_coordinator import GroupCoordinator, open_group_coordinator
from protocol import (
    DeleteTopicRequest,
    DeleteTopicResponse,
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
from protocol.types import BrokerInfo, PartitionOffset, Subscription, TopicPartition, TopicStreams
from statemachine.group import GroupState
from store import (
    GroupRecord,
    MetadataStore,
    OffsetBatch,
    StoreError,
    open_embedded_store,
)
from transport.channel import Channel, ChannelClosed, ReadBounds, acknowledged_frames
from transport.limits import ConnectionLimits

from .log import MemoryLog

log = logging.getLogger(__name__)

#: :meth:`SimulatedCluster.wait_settled` looks again at least this often, in (virtual) seconds.
SETTLE_POLL = 1.0


class InvariantViolation(AssertionError):
    """Two consumers held a fetch lease on one partition at once, an offset or a generation went
    backwards, or a settled group left a partition with no owner or with two."""


# --- the fetch-lease ledger -------------------------------------------------------------------


@attrs.frozen(kw_only=True)
class LeaseInterval:
    group_id: str
    consumer_id: str
    partition: TopicPartition
    start: float
    end: float


_Holder = tuple[str, str, TopicPartition]  # group, consumer, partition


@attrs.define
class OwnershipLedger:
    """Every fetch lease each simulated consumer held, as closed intervals of trio time.

    Groups are independent: two groups may read one partition at once, two members of one group
    may not."""

    _open: dict[_Holder, float] = attrs.field(factory=dict)
    closed: list[LeaseInterval] = attrs.field(factory=list)

    def began(self, group_id: str, consumer_id: str, partition: TopicPartition, at: float) -> None:
        self._open.setdefault((group_id, consumer_id, partition), at)

    def ended(self, group_id: str, consumer_id: str, partition: TopicPartition, at: float) -> None:
        start = self._open.pop((group_id, consumer_id, partition), None)
        if start is not None:
            self.closed.append(
                LeaseInterval(
                    group_id=group_id,
                    consumer_id=consumer_id,
                    partition=partition,
                    start=start,
                    end=at,
                )
            )

    def intervals(self, now: float) -> list[LeaseInterval]:
        still_open = [
            LeaseInterval(group_id=g, consumer_id=c, partition=tp, start=start, end=now)
            for (g, c, tp), start in self._open.items()
        ]
        return self.closed + still_open

    def holders(self, group_id: str, partition: TopicPartition) -> set[str]:
        return {c for (g, c, tp) in self._open if g == group_id and tp == partition}

    def check(self, now: float | None = None) -> None:
        """Raise InvariantViolation if two leases of one group on one partition overlapped."""
        at = trio.current_time() if now is None else now
        by_partition: dict[tuple[str, TopicPartition], list[LeaseInterval]] = defaultdict(list)
        for interval in self.intervals(at):
            by_partition[(interval.group_id, interval.partition)].append(interval)
        for (group_id, partition), intervals in by_partition.items():
            intervals.sort(key=lambda i: (i.start, i.end))
            latest: LeaseInterval | None = None
            for interval in intervals:
                overlaps = latest is not None and interval.start < latest.end
                if overlaps and latest is not None and interval.consumer_id != latest.consumer_id:
                    raise InvariantViolation(
                        f"group {group_id} {partition}: {latest.consumer_id} held it until "
                        f"{latest.end:.3f} but {interval.consumer_id} took it at "
                        f"{interval.start:.3f}"
                    )
                if latest is None or interval.end > latest.end:
                    latest = interval


# --- what the store was asked to make durable ------------------------------------------------


@attrs.define
class StoreHistory:
    """The coordinator's durable writes, seen as they happen: a regression between two writes is
    caught even if a later write hides it."""

    durable_offsets: dict[tuple[str, TopicPartition], int] = attrs.field(factory=dict)
    group_generations: dict[str, int] = attrs.field(factory=dict)
    #: How often each group was deleted: a group made again after that starts its generations
    #: anew, as a group that never existed.
    deletions: dict[str, int] = attrs.field(factory=dict)
    violations: list[str] = attrs.field(factory=list)

    def offsets_written(self, batches: Sequence[OffsetBatch]) -> None:
        for batch in batches:
            if batch.generation == -1:
                continue  # a standalone committer on an empty group may reset offsets anywhere
            for tp, offset in batch.offsets.items():
                key = (batch.group_id, tp)
                before = self.durable_offsets.get(key, -1)
                if offset < before:
                    self.violations.append(
                        f"group {batch.group_id} {tp}: durable offset went from {before} "
                        f"to {offset} (generation {batch.generation})"
                    )
                self.durable_offsets[key] = max(offset, before)

    def group_written(self, record: GroupRecord) -> None:
        before = self.group_generations.get(record.group_id, -1)
        # The record of a completed attempt is written again under its generation, marked so.
        if record.generation < before or (record.generation == before and not record.complete):
            self.violations.append(
                f"group {record.group_id}: generation {record.generation} persisted after {before}"
            )
        self.group_generations[record.group_id] = max(record.generation, before)

    def topic_offsets_deleted(self, topic: str, group_id: str | None = None) -> None:
        """A deleted topic's offsets (every group's, or one group's): a topic created again
        under the name starts its offsets anew, as a topic that never existed."""
        for key in [
            k for k in self.durable_offsets if k[1].topic == topic and group_id in (None, k[0])
        ]:
            del self.durable_offsets[key]

    def group_deleted(self, group_id: str) -> None:
        self.deletions[group_id] = self.deletions.get(group_id, 0) + 1
        self.group_generations.pop(group_id, None)
        for key in [k for k in self.durable_offsets if k[0] == group_id]:
            del self.durable_offsets[key]


@attrs.define(eq=False)
class RecordingStore:
    """The real store, with every durable offset and group write reported to a StoreHistory.

    Everything else passes straight through, so the wrapper keeps up with the interface; use it
    through :func:`recording_store`, which says it is a MetadataStore."""

    inner: MetadataStore
    history: StoreHistory

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def write_group(self, epoch: int, group: GroupRecord) -> None:
        await self.inner.write_group(epoch, group)
        self.history.group_written(group)

    async def delete_group(self, epoch: int, group_id: str) -> None:
        await self.inner.delete_group(epoch, group_id)
        self.history.group_deleted(group_id)

    async def commit_offsets(self, epoch: int, batches: Sequence[OffsetBatch]) -> None:
        await self.inner.commit_offsets(epoch, batches)
        self.history.offsets_written(batches)

    async def delete_topic(self, topic: str) -> None:
        await self.inner.delete_topic(topic)
        self.history.topic_offsets_deleted(topic)

    async def delete_offsets(self, epoch: int, group_id: str, topic: str) -> None:
        await self.inner.delete_offsets(epoch, group_id, topic)
        self.history.topic_offsets_deleted(topic, group_id)


def recording_store(inner: MetadataStore, history: StoreHistory) -> MetadataStore:
    return cast(MetadataStore, RecordingStore(inner=inner, history=history))


@attrs.define
class StoreContact:
    """Whether the coordinator hears from its store, cut for a while by :meth:`lose_contact`.
    The cluster keeps it, so a cut outlives a coordinator restart."""

    lost_at: float = -math.inf
    back_at: float = -math.inf

    def lose_contact(self, seconds: float) -> None:
        now = trio.current_time()
        if now >= self.back_at:
            self.lost_at = now
        self.back_at = max(self.back_at, now + seconds)

    def until(self, inner: MetadataStore) -> float:
        if self.lost_at <= trio.current_time() < self.back_at:
            return self.lost_at
        return inner.in_contact_until()


@attrs.define(eq=False)
class ContactStore:
    """A store whose contact with its coordinator can be cut: while it is, ``in_contact_until``
    is the instant contact was lost, as for a ZooKeeper store whose session stopped answering
    then (docs/design.md#coordinator-epochs-and-the-election). Its writes still go through, so a
    test sees what the coordinator does with the answer alone. Use it through
    :func:`contact_store`, which says it is a MetadataStore."""

    inner: MetadataStore
    contact: StoreContact

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def in_contact_until(self) -> float:
        return self.contact.until(self.inner)


def contact_store(inner: MetadataStore, contact: StoreContact) -> MetadataStore:
    return cast(MetadataStore, ContactStore(inner=inner, contact=contact))


@attrs.define
class StoreLatency:
    """How long the store takes to read the groups' records, set by
    :meth:`SimulatedCluster.slow_group_reads`. The cluster keeps it, so it outlives a restart."""

    group_reads: float = 0.0


@attrs.define(eq=False)
class SlowStore:
    """A store whose reads of the groups' records take ``latency.group_reads`` seconds, as a big
    group's do on ZooKeeper, so that a coordinator's load is long enough to be seen. Use it
    through :func:`slow_store`, which says it is a MetadataStore."""

    inner: MetadataStore
    latency: StoreLatency

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def groups(self) -> Mapping[str, GroupRecord]:
        await trio.sleep(self.latency.group_reads)
        return await self.inner.groups()


def slow_store(inner: MetadataStore, latency: StoreLatency) -> MetadataStore:
    return cast(MetadataStore, SlowStore(inner=inner, latency=latency))


# --- the in-memory network --------------------------------------------------------------------


class NetworkUnreachable(OSError):
    """A connect from a host whose network is cut."""


@attrs.define(eq=False)
class SimulatedHost:
    """One consumer process's network: while it is cut, none of its connections carry a byte in
    either direction (TCP keeps what was sent and delivers it, in order, once the cut heals), and
    new connections fail. While delivery is delayed in one direction, the bytes sent that way on
    any of its connections (new ones too: they still open) stay in flight, and arrive in order
    when the delay ends: TCP retransmitting over a path that lost every packet for a while."""

    down_until: float = -math.inf
    #: Until when bytes towards the consumer, and towards the broker, stay in flight.
    to_client_held_until: float = -math.inf
    to_server_held_until: float = -math.inf
    links: list[Link] = attrs.field(factory=list)

    @property
    def reachable(self) -> bool:
        return trio.current_time() >= self.down_until

    @property
    def delayed(self) -> bool:
        now = trio.current_time()
        return now < self.to_client_held_until or now < self.to_server_held_until

    async def heal_at(self, at: float) -> None:
        await trio.sleep_until(at)
        for link in self.links:
            link.wake()

    def cut(self, seconds: float, nursery: trio.Nursery) -> None:
        """Carry no byte either way and refuse new connections for ``seconds`` from now."""
        until = trio.current_time() + seconds
        if until > self.down_until:
            self.down_until = until
            nursery.start_soon(self.heal_at, until)

    def delay(
        self, seconds: float, nursery: trio.Nursery, *, to_client: bool, to_server: bool
    ) -> None:
        """Hold the bytes sent towards the client and/or the server for ``seconds`` from now."""
        until = trio.current_time() + seconds
        if to_client:
            self.to_client_held_until = max(self.to_client_held_until, until)
        if to_server:
            self.to_server_held_until = max(self.to_server_held_until, until)
        nursery.start_soon(self.heal_at, until)


@attrs.define(eq=False)
class _Pipe:
    data: bytearray = attrs.field(factory=bytearray)
    eof: bool = False
    reader_closed: bool = False


@attrs.define(eq=False)
class Link:
    """One in-memory connection between a client host and the broker."""

    host: SimulatedHost | None
    to_server: _Pipe = attrs.field(factory=_Pipe)
    to_client: _Pipe = attrs.field(factory=_Pipe)
    reset: bool = False
    _lot: trio.lowlevel.ParkingLot = attrs.field(factory=trio.lowlevel.ParkingLot)

    @property
    def delivering(self) -> bool:
        return self.host is None or self.host.reachable

    def delivering_to(self, pipe: _Pipe) -> bool:
        """Whether bytes (and a reset) reach the reader of ``pipe`` now."""
        host = self.host
        if host is None:
            return True
        held_until = (
            host.to_client_held_until if pipe is self.to_client else host.to_server_held_until
        )
        return host.reachable and trio.current_time() >= held_until

    def wake(self) -> None:
        self._lot.unpark_all()

    async def park(self) -> None:
        await self._lot.park()

    def break_(self) -> None:
        """The connection is reset: both ends see it fail (once bytes flow on the link)."""
        self.reset = True
        self.wake()


@attrs.define(eq=False)
class LinkEnd(trio.abc.Stream):
    """One end of a :class:`Link` as a trio stream. ``hold`` is awaited before every read and
    write: a frozen process does neither."""

    link: Link
    outgoing: _Pipe
    incoming: _Pipe
    hold: Callable[[], Awaitable[None]] | None = None
    _closed: bool = False

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        await trio.lowlevel.checkpoint()
        if self.hold is not None:
            await self.hold()
        if self._closed:
            raise trio.ClosedResourceError
        # The peer's reset comes back the way its bytes do.
        delivering = self.link.delivering_to(self.incoming)
        if delivering and (self.link.reset or self.outgoing.reader_closed):
            raise trio.BrokenResourceError("connection reset by peer")
        if not self.outgoing.reader_closed:
            self.outgoing.data += data
        self.link.wake()

    async def wait_send_all_might_not_block(self) -> None:
        await trio.lowlevel.checkpoint()

    async def receive_some(self, max_bytes: int | None = None) -> bytes:
        await trio.lowlevel.checkpoint()
        while True:
            if self.hold is not None:
                await self.hold()
            if self._closed:
                raise trio.ClosedResourceError
            if self.link.delivering_to(self.incoming):
                if self.link.reset:
                    raise trio.BrokenResourceError("connection reset")
                if self.incoming.data:
                    size = len(self.incoming.data) if max_bytes is None else max_bytes
                    chunk = bytes(self.incoming.data[:size])
                    del self.incoming.data[:size]
                    return chunk
                if self.incoming.eof:
                    return b""
            await self.link.park()

    @property
    def closed(self) -> bool:
        return self._closed

    def abort(self) -> None:
        """Close with a reset (TCP's SO_LINGER zero): the peer reads a broken connection, not an
        end of stream (``Channel.abort``)."""
        self.link.break_()

    async def aclose(self) -> None:
        if not self._closed:
            self._closed = True
            self.outgoing.eof = True
            self.incoming.reader_closed = True
            self.incoming.data.clear()
            self.link.wake()
        await trio.lowlevel.checkpoint()


# --- consumers --------------------------------------------------------------------------------


@attrs.define(eq=False)
class SimulatedConsumer:
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


# --- the cluster ------------------------------------------------------------------------------


# --- the user's own code ----------------------------------------------------------------------


class ProcessKilled(trio.BrokenResourceError):
    """What a killed process's connections raise, should its code still run."""


@attrs.define(eq=False)
class SimulatedProcess:
    """The user's own code (``open_consumer`` / ``open_producer``, the real library) run as one
    process of the simulated cluster. Its connections are made by :meth:`connect`, which the
    cluster passes to its main function; they are the ones its faults act on.

    Faults: :meth:`kill` (the process dies: its sockets close, its code stops where it is and
    its ``finally`` blocks reach nobody), :meth:`freeze` (nothing is read or written on its
    connections, and no connection opens, until it thaws; its own timers run on, as a lease's
    must), :meth:`cut_network`, :meth:`delay_delivery` and :meth:`drop_connections`.
    """

    name: str
    cluster: SimulatedCluster
    host: SimulatedHost = attrs.field(factory=SimulatedHost)
    frozen_until: float = -math.inf
    killed: bool = False
    done: trio.Event = attrs.field(factory=trio.Event)
    """Set once its main function returned, raised or was killed."""
    _scope: trio.CancelScope = attrs.field(factory=trio.CancelScope)
    _ends: list[LinkEnd] = attrs.field(factory=list)

    async def connect(self, host: str, port: int) -> trio.abc.Stream:
        """The ``connect=`` for ``open_consumer`` / ``open_producer``: every address reaches
        the simulated broker."""
        await trio.lowlevel.checkpoint()
        await self._hold()
        stream, _link = self.cluster.open_link(self.host, hold=self._hold)
        assert isinstance(stream, LinkEnd)
        self._ends = [end for end in self._ends if not end.closed]
        self._ends.append(stream)
        return stream

    async def _hold(self) -> None:
        while trio.current_time() < self.frozen_until:
            await trio.sleep_until(self.frozen_until)
        if self.killed:
            raise ProcessKilled(f"process {self.name} was killed")

    async def run(self, main: Callable[..., Awaitable[object]], *args: object) -> None:
        try:
            with self._scope:
                await main(*args, connect=self.connect)
        finally:
            self.done.set()

    async def kill(self) -> None:
        """The process dies: the kernel closes its connections (the broker reads an end of
        stream) and its code runs no further; returns once it is gone."""
        self.killed = True
        for end in self._ends:
            await end.aclose()
        self._scope.cancel()
        await self.done.wait()

    def freeze(self, seconds: float) -> None:
        """Stop reading and writing for ``seconds`` (a GC pause, as the coordinator sees it)."""
        self.frozen_until = max(self.frozen_until, trio.current_time() + seconds)

    def cut_network(self, seconds: float) -> None:
        self.host.cut(seconds, self.cluster.nursery)

    def delay_delivery(
        self, seconds: float, *, to_process: bool = True, to_broker: bool = False
    ) -> None:
        self.host.delay(seconds, self.cluster.nursery, to_client=to_process, to_server=to_broker)

    def drop_connections(self) -> None:
        """Reset every connection it has; the process lives on and connects again."""
        for link in self.host.links:
            link.break_()


@attrs.define(eq=False)
class SimulatedCluster:
    """One broker on the embedded store, serving in-memory connections, and its consumers.

    ``store`` and ``coordinator`` are replaced by :meth:`restart_coordinator`; read them anew
    after one.
    """

    config: CoordinatorConfig
    data_dir: Path
    broker: BrokerInfo
    nursery: trio.Nursery
    store: MetadataStore = attrs.field(init=False)
    coordinator: GroupCoordinator = attrs.field(init=False)
    ledger: OwnershipLedger = attrs.field(factory=OwnershipLedger)
    history: StoreHistory = attrs.field(factory=StoreHistory)
    contact: StoreContact = attrs.field(factory=StoreContact)
    latency: StoreLatency = attrs.field(factory=StoreLatency)
    generations: dict[str, list[int]] = attrs.field(factory=lambda: defaultdict(list))
    consumers: dict[str, SimulatedConsumer] = attrs.field(factory=dict)
    processes: dict[str, SimulatedProcess] = attrs.field(factory=dict)
    log: MemoryLog = attrs.field(init=False)
    """The partitions' records: what the broker serves Produce, Fetch and ListOffsets from."""
    #: How many times a coordinator took office in this cluster (1 before any restart) and
    #: loaded its groups.
    incarnation: AsyncValue[int] = attrs.field(factory=lambda: AsyncValue(0))
    #: How many times a coordinator took office and accepted connections, loaded or not.
    accepting: AsyncValue[int] = attrs.field(factory=lambda: AsyncValue(0))
    #: The limits on reading that connections are served under: a real broker's defaults, so
    #: what a test sees is what a deployment would (None: none); every frame is decoded on the
    #: loop, since virtual time would jump ahead while a thread decodes.
    bounds: ReadBounds | None = attrs.field(
        factory=lambda: ReadBounds.of(ConnectionLimits(), threads=False)
    )
    _connections: trio.Nursery | None = None
    _stop_requested: trio.Event = attrs.field(factory=trio.Event)
    _down_for: float = 0.0
    _accepted: dict[tuple[str, TopicPartition], int] = attrs.field(factory=dict)
    _generations_seen: dict[tuple[int, str, int], int] = attrs.field(factory=dict)

    def __attrs_post_init__(self) -> None:
        self.log = MemoryLog(partition_count=self._partition_count)

    def _partition_count(self, topic: str) -> int | None:
        placement = self.coordinator.topics.get(topic)
        return None if placement is None else placement.partition_count

    # --- topics -------------------------------------------------------------------------------

    async def create_topic(self, name: str, *, partitions: int) -> None:
        """Create a topic and return once the coordinator's topic watch has seen it."""
        await self.store.create_topic(name, (self.broker.broker_id,) * partitions)
        await self._topics_seen(name, partitions)

    async def add_partitions(self, name: str, *, added: int) -> None:
        placement = await self.store.add_partitions(name, (self.broker.broker_id,) * added)
        await self._topics_seen(name, placement.partition_count)

    async def delete_topic(self, name: str) -> ErrorCode:
        """Send DeleteTopic, and once it succeeded return when the coordinator's topic watch
        has seen the topic gone."""
        async with self.open_client() as client:
            response = await client.request(DeleteTopicRequest(topic=name))
        assert isinstance(response, DeleteTopicResponse)
        if response.error_code is not ErrorCode.NONE:
            return response.error_code
        for attempt in itertools.count():
            if name not in self.coordinator.topics:
                break
            await trio.sleep(0 if attempt < 100 else SETTLE_POLL / 10)
        return ErrorCode.NONE

    async def _topics_seen(self, name: str, partitions: int) -> None:
        # The watch normally catches up within the same instant; after that, let virtual time
        # run, so that a caller's deadline can fire if it never does.
        for attempt in itertools.count():
            placement = self.coordinator.topics.get(name)
            if placement is not None and placement.partition_count >= partitions:
                return
            await trio.sleep(0 if attempt < 100 else SETTLE_POLL / 10)

    # --- the broker ---------------------------------------------------------------------------

    async def restart_coordinator(self, *, down_for: float = 0.0, loaded: bool = True) -> None:
        """Stop the coordinator and all its connections, stay down ``down_for`` seconds (new
        connections are refused), then reopen the store on the same data dir and take office
        again. Returns once the new coordinator has loaded its groups and serves, or with
        ``loaded=False`` once it accepts connections, while it may still be loading."""
        before = (self.incarnation if loaded else self.accepting).value
        self._down_for = down_for
        self._stop_requested.set()
        await (self.incarnation if loaded else self.accepting).wait_value(lambda n: n > before)

    def slow_group_reads(self, seconds: float) -> None:
        """From now on every read of the groups' records takes ``seconds``: a coordinator taking
        office, or rebuilding a group, loads for that long."""
        self.latency.group_reads = seconds

    def lose_store_contact(self, seconds: float) -> None:
        """The coordinator hears nothing from its store for ``seconds`` from now, and must act
        as one that may have been deposed: renew no lease."""
        self.contact.lose_contact(seconds)

    def pause_coordinator(self, seconds: float) -> None:
        """Pause the broker process for ``seconds`` (a GC pause, SIGSTOP), under trio's
        ``MockClock``: the clock jumps at once, so every timer of the broker fires late, at the
        instant it resumes, and nothing it would have done meanwhile happens.

        The consumers are other processes, but share the clock: their timers fire late too, at
        the same instant. They record what they did at the instant they should have (a lease's
        end), but the broker may see it (a close) before or after it acts on its own timers, as
        a real broker may; cut their network across the pause for one order."""
        clock = trio.lowlevel.current_clock()
        if not isinstance(clock, trio.testing.MockClock):
            raise TypeError("pause_coordinator needs trio.testing.MockClock")
        clock.jump(seconds)

    async def _serve(
        self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        while True:
            self._stop_requested = trio.Event()
            async with open_embedded_store(self.data_dir) as embedded:
                store = contact_store(
                    recording_store(slow_store(embedded, self.latency), self.history), self.contact
                )
                await store.register_broker(self.broker)
                async with (
                    open_group_coordinator(store, self.config, self.broker) as coordinator,
                    trio.open_nursery() as connections,
                ):
                    self.store, self.coordinator = store, coordinator
                    self._connections = connections
                    self.accepting.value += 1
                    await coordinator.loaded.wait()
                    self.incarnation.value += 1
                    if self.incarnation.value == 1:
                        task_status.started()
                    await self._stop_requested.wait()
                    log.info("coordinator stopping for a restart")
                    self._connections = None
                    connections.cancel_scope.cancel()
            await trio.sleep(self._down_for)

    def open_link(
        self,
        host: SimulatedHost | None = None,
        *,
        hold: Callable[[], Awaitable[None]] | None = None,
    ) -> tuple[trio.abc.Stream, Link]:
        """A new in-memory connection from ``host`` to the broker, served like a TCP one.

        Raises ConnectionRefusedError while the coordinator is down and NetworkUnreachable while
        the host's network is cut.
        """
        if self._connections is None:
            raise ConnectionRefusedError("the coordinator is down")
        if host is not None and not host.reachable:
            raise NetworkUnreachable("the network is cut")
        link = Link(host=host)
        if host is not None:
            host.links = [
                existing for existing in host.links if not existing.to_client.reader_closed
            ]
            host.links.append(link)
        client = LinkEnd(link=link, outgoing=link.to_server, incoming=link.to_client, hold=hold)
        server = LinkEnd(link=link, outgoing=link.to_client, incoming=link.to_server)
        self._connections.start_soon(
            partial(handle_connection, data_plane=self.log, bounds=self.bounds),
            self.coordinator,
            server,
        )
        return client, link

    async def connect(self) -> trio.abc.Stream:
        """A new in-memory connection to the broker from a host that no fault touches."""
        await trio.lowlevel.checkpoint()
        stream, _ = self.open_link()
        return stream

    async def connect_to(self, host: str, port: int) -> trio.abc.Stream:
        """A ``connect=`` for ``open_consumer`` / ``open_producer`` that no fault touches."""
        return await self.connect()

    def start_process(
        self, name: str, main: Callable[..., Awaitable[object]], *args: object
    ) -> SimulatedProcess:
        """Run ``await main(*args, connect=process.connect)`` as a process of its own: the
        user's code, with the library's real consumer and producer, whose faults the test
        injects through the returned :class:`SimulatedProcess`. An exception it raises (not
        being killed) ends the cluster's block with it."""
        if name in self.processes and not self.processes[name].done.is_set():
            raise ValueError(f"process {name} is running")
        process = self.processes[name] = SimulatedProcess(name=name, cluster=self)
        self.nursery.start_soon(process.run, main, *args)
        return process

    @asynccontextmanager
    async def open_client(self) -> AsyncIterator[Channel]:
        """A plain client connection (an admin tool, a standalone committer)."""
        channel = Channel.open(
            await self.connect(), Role.CONSUMER, max_frame_size=self.config.max_frame_size
        )
        async with trio.open_nursery() as nursery:

            async def refuse(request: Request) -> None:
                raise AssertionError(f"a plain client got {request}")

            nursery.start_soon(channel.run, refuse)
            try:
                yield channel
            finally:
                nursery.cancel_scope.cancel()
                with trio.CancelScope(shield=True):
                    await channel.aclose()

    # --- consumers ----------------------------------------------------------------------------

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
        """Start a consumer process and return once it has registered (or, with
        ``rejoin=False``, been refused). ``consumers`` maps each id to its latest process: a
        killed consumer's id may start again as a new process."""
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

    async def restart_consumer(
        self,
        consumer: SimulatedConsumer,
        consumer_id: str,
        *,
        end: Literal["stop", "kill", "reset", "keep"] = "stop",
        down_for: float = 0.0,
    ) -> SimulatedConsumer:
        """Start a new process under ``consumer_id`` with ``consumer``'s settings (its instance
        id too: a static member's restart, docs/design.md#static-members), after ending the old
        one: ``stop`` (a clean stop without LeaveGroup), ``kill`` (its connection ends),
        ``reset`` (killed, its connection reset) or ``keep`` (it runs on: the new process is a
        second live one under the same instance id, which fences it), then ``down_for``
        seconds. Returns once the new process has registered."""
        if end == "stop":
            await consumer.stop()
        elif end in ("kill", "reset"):
            await consumer.kill(reset=end == "reset")
        await trio.sleep(down_for)
        return await self.start_consumer(
            consumer_id,
            group=consumer.group_id,
            subscription=consumer.subscription,
            session_timeout_ms=consumer.session_timeout_ms,
            auto_commit=consumer.auto_commit,
            auto_offset_reset=consumer.auto_offset_reset,
            records_per_ping=consumer.records_per_ping,
            rejoin=consumer.rejoin,
            fetch_through_failover=consumer.fetch_through_failover,
            instance_id=consumer.instance_id,
        )

    # --- waiting ------------------------------------------------------------------------------

    async def wait_stable(self, group_id: str, *, members: int) -> int:
        """Wait until the group is Stable with ``members`` live members; returns its generation."""
        group = self.coordinator.group(group_id)

        def stable(status: tuple[GroupState, int]) -> bool:
            return status[0] is GroupState.STABLE and len(group.members) == members

        await group.status.wait_value(stable)
        return group.machine.generation

    async def wait_settled(self) -> None:
        """Wait until every group with a live consumer is Stable with exactly its live consumers
        as members, none of them frozen, cut off or delayed, each fetching under the group's
        generation.

        It looks again whenever a group's state or a consumer's fetching changes (so it returns
        at the exact instant), and every SETTLE_POLL seconds besides. Waits forever if that
        never happens: put a deadline around it."""
        while not self._settled():
            async with trio.open_nursery() as nursery:

                async def woken(transition: Callable[[], Awaitable[object]]) -> None:
                    await transition()
                    nursery.cancel_scope.cancel()

                nursery.start_soon(woken, self.incarnation.wait_transition)
                for group in self.coordinator.groups.values():
                    nursery.start_soon(woken, group.status.wait_transition)
                for consumer in self.consumers.values():
                    nursery.start_soon(woken, consumer.fetching_state.wait_transition)
                nursery.start_soon(woken, partial(trio.sleep, SETTLE_POLL))

    def _settled(self) -> bool:
        if not self.up:
            return False
        now = trio.current_time()
        by_group: dict[str, dict[str, SimulatedConsumer]] = defaultdict(dict)
        for consumer in self.consumers.values():
            if consumer.alive:
                if consumer.member_id in by_group[consumer.group_id]:
                    return False  # two processes of one static member: one is not fenced yet
                by_group[consumer.group_id][consumer.member_id] = consumer
        for group_id, live in by_group.items():
            group = self.coordinator.groups.get(group_id)
            if (
                group is None
                or group.machine.state is not GroupState.STABLE
                or group.next_attempt_at.value is not None
                or group.members.keys() != live.keys()
                # A static member away holds its partitions unowned until it is back or gone.
                or group.away
            ):
                return False
            for consumer in live.values():
                # Under the incremental protocol each member has its own generation, that of the
                # last start it was given (SPEC.md §11.4).
                member = group.members[consumer.member_id]
                if member.consumer_id != consumer.consumer_id:
                    return False
                if (
                    consumer.frozen_until > now
                    or not consumer.host.reachable
                    or consumer.host.delayed
                    or not consumer.fetching
                    or consumer.generation != group.ownership.holding(member.incarnation).generation
                ):
                    return False
        return True

    # --- invariants ---------------------------------------------------------------------------

    async def check_invariants(self, *, settled: bool = False) -> None:
        """Raise InvariantViolation unless everything the system promises held so far:

        * no two consumers ever held a fetch lease on one partition at the same instant;
        * no committed offset went backwards: not in any store write (offsets a standalone
          committer sets on an empty group excepted), and not in the coordinator's memory
          between two calls of this method;
        * generations only increased: each persisted group record's, each consumer's sequence of
          StartFetcher generations, and each coordinator's group generation between two calls;
        * with ``settled=True`` (call it after :meth:`wait_settled`): every partition of every
          topic a live consumer subscribes to has exactly one owner among its group's live
          consumers, and the coordinator agrees on who.
        """
        self.ledger.check()
        if self.history.violations:
            raise InvariantViolation("; ".join(self.history.violations))
        for consumer in self.consumers.values():
            gens = consumer.started_generations
            if any(b <= a for a, b in itertools.pairwise(gens)):
                raise InvariantViolation(
                    f"{consumer.consumer_id} started under generations {gens}: not increasing"
                )
        if self.up:
            await self._check_coordinator_memory()
        elif settled:
            raise InvariantViolation("settled=True while the coordinator is down")
        if settled:
            self._check_owners()

    @property
    def up(self) -> bool:
        """Whether a coordinator serves now (False while :meth:`restart_coordinator` has it
        down)."""
        return self._connections is not None

    async def _check_coordinator_memory(self) -> None:
        coordinator = self.coordinator
        incarnation = self.incarnation.value
        for group_id, group in coordinator.groups.items():
            key = (incarnation, group_id, self.history.deletions.get(group_id, 0))
            before = self._generations_seen.get(key, -1)
            if group.machine.generation < before:
                raise InvariantViolation(
                    f"group {group_id}: generation went from {before} to {group.machine.generation}"
                )
            self._generations_seen[key] = group.machine.generation
        group_ids = set(coordinator.groups) | {g for g, _ in self.history.durable_offsets}
        for group_id in sorted(group_ids):
            try:
                committed = await coordinator.offsets.committed(group_id)
            except StoreError:
                return  # the coordinator stopped meanwhile: its memory is gone
            for tp, offset in committed.items():
                before = self._accepted.get((group_id, tp), -1)
                if offset < before:
                    raise InvariantViolation(
                        f"group {group_id} {tp}: accepted offset went from {before} to {offset}"
                    )
                self._accepted[(group_id, tp)] = offset

    def _check_owners(self) -> None:
        topics = self.coordinator.topics
        by_group: dict[str, list[SimulatedConsumer]] = defaultdict(list)
        for consumer in self.consumers.values():
            if consumer.alive:
                by_group[consumer.group_id].append(consumer)
        for group_id, live in sorted(by_group.items()):
            subscribed = {
                TopicPartition(topic=topic, partition=p)
                for topic, placement in topics.items()
                if any(c.subscription.streams_for(topic) > 0 for c in live)
                for p in range(placement.partition_count)
            }
            owners: dict[TopicPartition, list[str]] = defaultdict(list)
            for consumer in live:
                for tp in consumer.owned:
                    owners[tp].append(consumer.consumer_id)
            for tp in sorted(subscribed | owners.keys()):
                if tp not in subscribed:
                    raise InvariantViolation(
                        f"group {group_id}: {owners[tp]} fetch unsubscribed {tp}"
                    )
                if len(owners[tp]) != 1:
                    raise InvariantViolation(
                        f"group {group_id}: {tp} has owners {sorted(owners[tp])}, not exactly one"
                    )
            group = self.coordinator.groups.get(group_id)
            members = group.members if group is not None else {}
            for consumer in live:
                member = members.get(consumer.member_id)
                owned = (
                    None
                    if member is None or group is None or member.consumer_id != consumer.consumer_id
                    else group.ownership.holding(member.incarnation).partitions
                )
                if owned != consumer.owned:
                    raise InvariantViolation(
                        f"group {group_id}: the coordinator thinks {consumer.consumer_id} owns "
                        f"{None if owned is None else sorted(owned)}, "
                        f"it fetches {sorted(consumer.owned)}"
                    )


@asynccontextmanager
async def open_simulated_cluster(
    data_dir: Path, config: CoordinatorConfig | None = None, *, broker_id: int = 1
) -> AsyncIterator[SimulatedCluster]:
    """Run a broker with its coordinator on the embedded store under ``data_dir`` for the block.

    Leaving the block stops every consumer and then the coordinator (which flushes its offsets).
    """
    config = config or CoordinatorConfig()
    broker = BrokerInfo(broker_id=broker_id, host="simulated", port=9092)
    async with trio.open_nursery() as nursery:
        cluster = SimulatedCluster(config=config, data_dir=data_dir, broker=broker, nursery=nursery)
        await nursery.start(cluster._serve)
        try:
            yield cluster
        finally:
            nursery.cancel_scope.cancel()
