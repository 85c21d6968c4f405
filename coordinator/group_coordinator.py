"""The group coordinator: the groups of one coordinator's office, their requests, and topic
watches.

A group's rules live in ``statemachine.consumer_group``; its trio side, which performs what it
decides and runs its rebalance attempts, in ``coordinator.driver`` and ``coordinator.rebalance``.
This module makes groups, routes each request to its group, and recovers groups: from the store
when taking office, and from a group's own failure (docs/failure-domains.md).
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import AsyncIterator, Iterable, Mapping
from contextlib import asynccontextmanager

import attrs
import trio

from coordinator import describe, rebalance, topic_watch, validation
from coordinator.config import CoordinatorConfig
from coordinator.context import CoordinatorContext
from coordinator.cpu_budget import CpuBudget
from coordinator.driver import GroupDriver, Member
from coordinator.heartbeat import Pinger
from coordinator.loop_lag import LoopLag
from coordinator.observer import NULL_OBSERVER, CoordinatorObserver
from coordinator.offsets import OffsetKeeper
from coordinator.overload import Governor
from coordinator.validation import HighWatermarks, LogEnd
from protocol import (
    DescribeGroupResponse,
    ErrorCode,
    GroupSummary,
    LeaveGroupRequest,
    OffsetCommitRequest,
    RegisterConsumerRequest,
    RegisterConsumerResponse,
)
from protocol.types import BrokerInfo, TopicPartition
from protocol.versions import NEWEST, PeerVersions
from statemachine.consumer_group import ConsumerGroup, Ending
from statemachine.group import GroupState
from statemachine.ownership import Claim
from store import (
    GroupRecord,
    MemberRecord,
    MetadataStore,
    StoreError,
    StoreUnavailable,
    TopicPlacement,
)
from transport.channel import Channel

log = logging.getLogger(__name__)

OFFSET_RESETS = frozenset({"smallest", "largest"})


@attrs.define(eq=False)
class GroupCoordinator:
    context: CoordinatorContext
    pinger: Pinger = attrs.field(init=False)
    groups: dict[str, GroupDriver] = attrs.field(factory=dict)
    #: Groups with committed offsets but no group in memory (a standalone committer's), and the
    #: instant their retention counts from: their last standalone commit, or when this
    #: coordinator took office (docs/design.md#group-retention).
    offset_only: dict[str, float] = attrs.field(factory=dict)
    #: Hands out member incarnations: unique across the coordinator's groups, so that a member
    #: of a group rebuilt since owns nothing in the new group's table.
    _incarnations: itertools.count[int] = attrs.field(factory=itertools.count)
    #: Set once every group's record has been read after taking office (:func:`_recover_groups`).
    loaded: trio.Event = attrs.field(factory=trio.Event)
    #: Lets whole groups go while the loop stays behind (None: never; CoordinatorConfig).
    governor: Governor | None = None
    #: Groups whose record is being read again for a rebuild (:meth:`_rebuild`).
    _reloading: set[str] = attrs.field(factory=set)

    def __attrs_post_init__(self) -> None:
        self.pinger = Pinger(context=self.context)

    # --- the office, as the broker reads it ---------------------------------------------------

    @property
    def config(self) -> CoordinatorConfig:
        return self.context.config

    @property
    def store(self) -> MetadataStore:
        return self.context.store

    @property
    def broker(self) -> BrokerInfo:
        return self.context.broker

    @property
    def epoch(self) -> int:
        return self.context.epoch

    @property
    def offsets(self) -> OffsetKeeper:
        return self.context.offsets

    @property
    def observer(self) -> CoordinatorObserver:
        return self.context.observer

    @observer.setter
    def observer(self, observer: CoordinatorObserver) -> None:
        self.context.observer = observer

    @property
    def took_office_at(self) -> float:
        return self.context.took_office_at

    @property
    def nursery(self) -> trio.Nursery:
        return self.context.nursery

    @property
    def log_end(self) -> LogEnd | None:
        return self.context.log_end

    @property
    def topics(self) -> Mapping[str, TopicPlacement]:
        return self.context.topics

    @property
    def brokers(self) -> tuple[BrokerInfo, ...]:
        return self.context.brokers

    @brokers.setter
    def brokers(self, brokers: tuple[BrokerInfo, ...]) -> None:
        self.context.brokers = brokers

    @property
    def brokers_by_listener(self) -> dict[str, tuple[BrokerInfo, ...]]:
        return self.context.brokers_by_listener

    def loading(self, group_id: str | None) -> bool:
        """Whether a request about ``group_id`` (None: about every group, as ListGroups) must be
        answered COORDINATOR_LOAD_IN_PROGRESS: this coordinator is still reading that group's
        record, so it would answer from a group it does not know yet (docs/design.md#loading)."""
        if not self.loaded.is_set():
            return True
        return group_id is not None and group_id in self._reloading

    # --- membership -----------------------------------------------------------------------

    def register(
        self,
        request: RegisterConsumerRequest,
        client_id: str,
        channel: Channel,
        connection_scope: trio.CancelScope,
        versions: PeerVersions = NEWEST,
    ) -> tuple[RegisterConsumerResponse, Member | None]:
        """Check the registration, add the member, and let the group rebalance
        (docs/design.md#generations-and-stale-offsets). ``versions``: what it reads of our requests
        (``protocol.versions.negotiate``), which says which rules it is served by."""
        error = self._registration_error(request, client_id)
        if error is not ErrorCode.NONE:
            return self._register_response(error, request.group_id), None
        held_out = self._held_out(request.group_id)
        if held_out is not None:
            # Its group was let go (docs/design.md#shedding-load), even if it lists partitions:
            # the coordinator will not take them back, and frees them when its lease runs out.
            # Only a consumer that reads StopFetcher 3 is sure to have sent RegisterConsumer 3,
            # whose answer carries the hint (protocol.versions.negotiate).
            if not versions.told_when_shed:
                return self._register_response(
                    ErrorCode.COORDINATOR_NOT_AVAILABLE, request.group_id
                ), None
            busy = attrs.evolve(
                self._register_response(ErrorCode.BROKER_BUSY, request.group_id),
                throttle_time_ms=round(1000 * held_out),
            )
            return busy, None
        driver = self.group(request.group_id)
        # A static member is known by its instance id, whatever process carries it:
        # docs/design.md#static-members.
        record = MemberRecord(
            member_id=request.instance_id or request.consumer_id,
            client_id=client_id,
            subscription=request.subscription,
            session_timeout_ms=request.session_timeout_ms,
            auto_commit=request.auto_commit,
            auto_offset_reset=request.auto_offset_reset,
            instance_id=request.instance_id,
        )
        try:
            state, effects = driver.group.join(
                record,
                consumer_id=request.consumer_id,
                incarnation=next(self._incarnations),
                reported_generation=request.generation,
                holding=request.owned_partitions,
                now=trio.current_time(),
                versions=versions,
                host=channel.host,
            )
        except Exception as exc:
            driver.fail(exc)
            return self._register_response(
                ErrorCode.COORDINATOR_NOT_AVAILABLE, request.group_id
            ), None
        member = Member(
            state=state, driver=driver, channel=channel, connection_scope=connection_scope
        )
        driver.handles[state.incarnation] = member
        self.pinger.add(member)
        driver.perform(effects)
        return self._register_response(ErrorCode.NONE, request.group_id), member

    def _held_out(self, group_id: str) -> float | None:
        """Seconds a registration in ``group_id`` must wait: the group was let go because this
        broker could not keep every member (docs/design.md#shedding-load); None: it may come."""
        if self.governor is None:
            return None
        return self.governor.retry_after(group_id, trio.current_time())

    def _registration_error(self, request: RegisterConsumerRequest, client_id: str) -> ErrorCode:
        timeout = request.session_timeout_ms
        if not self.config.min_session_timeout_ms <= timeout <= self.config.max_session_timeout_ms:
            return ErrorCode.INVALID_SESSION_TIMEOUT
        if request.auto_offset_reset not in OFFSET_RESETS:
            return ErrorCode.INVALID_OFFSET_RESET
        error = validation.request_error(request, client_id, self.config.limits)
        if error is not ErrorCode.NONE:
            return error
        if self.loading(request.group_id):
            return ErrorCode.COORDINATOR_LOAD_IN_PROGRESS
        if not self.context.in_contact():
            # Accepting renews the lease of what it holds: docs/design.md#ownership-lease.
            return ErrorCode.COORDINATOR_NOT_AVAILABLE
        driver = self.groups.get(request.group_id)
        streams = request.subscription.stream_count
        if driver is None:
            limits = self.config.limits
            too_big = limits.max_group_size < 1 or streams > limits.max_group_streams
            return ErrorCode.GROUP_MAX_SIZE_REACHED if too_big else ErrorCode.NONE
        return driver.group.registration_refusal(
            consumer_id=request.consumer_id, instance_id=request.instance_id, streams=streams
        )

    def _register_response(self, error: ErrorCode, group_id: str) -> RegisterConsumerResponse:
        driver = self.groups.get(group_id)
        generation = driver.group.generation if driver is not None else -1
        return RegisterConsumerResponse(
            error_code=error, coordinator_epoch=self.epoch, generation=generation
        )

    def connection_ended(self, member: Member, ending: Ending) -> None:
        """The member's connection task ended, as ``ending`` says (dispatch's view): a live
        member dies, a fenced process's clean close frees what it held."""
        member.driver.connection_ended(member, ending)

    def leave(self, member: Member | None, request: LeaveGroupRequest) -> ErrorCode:
        """LeaveGroup from the connection that registered ``member`` (None: none did): only the
        member itself may leave, by its consumer id or member id."""
        if (
            member is None
            or request.consumer_id not in (member.consumer_id, member.member_id)
            or member.group_id != request.group_id
        ):
            fenced = self.is_fenced(request.group_id, request.consumer_id)
            return ErrorCode.FENCED_INSTANCE_ID if fenced else ErrorCode.UNKNOWN_MEMBER_ID
        if member.fenced:
            # A newer process is the member now: docs/design.md#static-members.
            return ErrorCode.FENCED_INSTANCE_ID
        if not member.machine.alive:  # declared dead already: its connection is closing
            return ErrorCode.UNKNOWN_MEMBER_ID
        member.driver.feed(member.driver.group.left, member.state, trio.current_time())
        return ErrorCode.NONE

    def is_fenced(self, group_id: str, consumer_id: str) -> bool:
        """Whether ``consumer_id`` is a process a newer one fenced (FENCED_INSTANCE_ID)."""
        driver = self.groups.get(group_id)
        return driver is not None and consumer_id in driver.group.fenced

    # --- offsets --------------------------------------------------------------------------

    async def commit(self, request: OffsetCommitRequest, channel: Channel) -> ErrorCode:
        """OffsetCommit, checked by member and generation, answered once durable; an offset
        past its partition's log end, or a replicated partition's leader's high watermark, is
        refused (OFFSET_OUT_OF_RANGE), since members only move offsets forward and one such
        commit would pin its group there. The request has passed the checks at the boundary
        (``validation.request_error``) already."""
        driver = self.groups.get(request.group_id)
        offsets = {po.topic_partition: po.offset for po in request.offsets}
        try:
            beyond = await validation.beyond_high_watermarks(
                offsets, self.log_end, self.context.high_watermarks
            )
        except validation.LeaderUnavailable as exc:
            log.info("cannot check a commit of group %r: %s", request.group_id, exc)
            return ErrorCode.COORDINATOR_NOT_AVAILABLE
        if beyond:
            return ErrorCode.OFFSET_OUT_OF_RANGE
        if request.consumer_id is None:
            if request.generation != -1:
                return ErrorCode.ILLEGAL_GENERATION
            if driver is not None:
                refusal = driver.group.admin_refusal(trio.current_time())
                if refusal is not ErrorCode.NONE:
                    return refusal
            if not await self._partitions_exist(offsets):
                return ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
            version = await self.offsets.accept(request.group_id, -1, offsets, monotonic=False)
            if request.group_id not in self.groups:
                self.offset_only[request.group_id] = trio.current_time()
        else:
            group = driver.group if driver is not None else None
            member = group.member_of(request.consumer_id) if group is not None else None
            handle = driver.handles.get(member.incarnation) if driver and member else None
            if group is None or handle is None or handle.channel is not channel:
                if group is not None and request.consumer_id in group.fenced:
                    # docs/design.md#static-members: a newer process is the member now.
                    return ErrorCode.FENCED_INSTANCE_ID
                return ErrorCode.UNKNOWN_MEMBER_ID
            refusal = group.commit_refusal(member, request.generation, offsets)
            if refusal is not ErrorCode.NONE:
                return refusal
            # A deleted topic's count for nothing, nor those of an incarnation no longer in
            # force: the rebalance takes their partitions away (docs/design.md#topic-ids).
            offsets = group.of_current_incarnation(offsets, self.topics)
            ids = group.topic_ids
            version = await self.offsets.accept(
                request.group_id,
                request.generation,
                offsets,
                monotonic=True,
                topic_ids={tp.topic: ids[tp.topic] for tp in offsets if tp.topic in ids},
            )
        await self.offsets.wait_durable(version)
        return ErrorCode.NONE

    async def _partitions_exist(self, offsets: Mapping[TopicPartition, int]) -> bool:
        """A standalone committer names its partitions itself (a member's are checked against what
        it owns): only partitions of existing topics may hold offsets, which also bounds what a
        group's offsets can grow to. The topic watch may lag a CreateTopic just answered."""
        for topics in (self.topics, None):
            if topics is None:
                topics = await self.store.topics()
            if all(
                tp.topic in topics and tp.partition < topics[tp.topic].partition_count
                for tp in offsets
            ):
                return True
        return False

    # --- groups ---------------------------------------------------------------------------

    def group(self, group_id: str, *, generation: int = 0) -> GroupDriver:
        """The group, created (with its driver task) on first use."""
        driver = self.groups.get(group_id)
        if driver is None:
            # A member group from now on: its members' instants count for its retention.
            self.offset_only.pop(group_id, None)
            group = ConsumerGroup.new(
                group_id, self.context.rules, now=trio.current_time(), generation=generation
            )
            driver = self.groups[group_id] = GroupDriver(
                group=group, context=self.context, registry=self.groups
            )
            self.context.nursery.start_soon(self._drive, driver)
        return driver

    async def _drive(self, driver: GroupDriver) -> None:
        """The group's driver, and the edge of its failure domain (docs/failure-domains.md): an
        exception from our own code in the group's work fails that group alone, which is rebuilt
        (so does one in another task, through :meth:`GroupDriver.fail`).
        A StoreError is the shared store's, and ends the process like any failure of a shared
        component (an attempt already retries the store errors it expects, as AttemptFailed)."""
        driver.scope = scope = trio.CancelScope()
        with scope:
            try:
                await rebalance.drive(driver)
            except Exception as exc:
                if _is_shared_failure(exc):
                    raise
                driver.fail(exc)
        driver.scope = None
        if driver.failure is not None:
            await self._rebuild(driver, driver.failure)

    async def _rebuild(self, failed: GroupDriver, exc: Exception) -> None:
        """A failover for one group (docs/design.md#adoption-after-a-failover): nothing the
        failed group kept in memory can be trusted, so it is rebuilt from its last durable record
        as a new coordinator would, with every lease counted from the failure. Its members are
        disconnected and register again; each partition of that record, and each one a member
        owned or a lease held in memory, waits until T plus the lease margin after the failure,
        unless its owner re-registers under that generation holding nothing."""
        failed_at = trio.current_time()
        group = failed.group
        log.error(
            "group %s failed; disconnecting its %d members and rebuilding it from its last "
            "durable record",
            group.group_id,
            len(group.members),
            exc_info=exc,
        )
        self._reloading.add(group.group_id)
        try:
            record = (await self.store.groups()).get(group.group_id)
        finally:
            self._reloading.discard(group.group_id)
        longest = group.longest_session_timeout()
        effects = group.abandon(failed_at)
        failed.next_attempt_at.value = None
        if self.groups.get(group.group_id) is failed:
            del self.groups[group.group_id]
            self._restore(
                group.group_id,
                record,
                since=failed_at,
                generation=max(group.generation, record.generation if record else 0),
                claims=group.ownership.carryover(failed_at),
                longest=longest,
            )
        failed.perform(effects)

    def _restore(
        self,
        group_id: str,
        record: GroupRecord | None,
        *,
        since: float,
        generation: int,
        claims: Iterable[Claim] = (),
        longest: float = 0.0,
        awaiting: bool = False,
    ) -> GroupDriver:
        """The group as a coordinator that knows none of its members finds it
        (``ConsumerGroup.recover``)."""
        driver = self.group(group_id, generation=generation)
        driver.perform(
            driver.group.recover(
                record,
                since=since,
                claims=claims,
                longest=longest,
                awaiting=awaiting,
                topics=self.topics,
            )
        )
        return driver

    def list_groups(self) -> tuple[GroupSummary, ...]:
        """Every group, in its state; one only a standalone committer used is Empty, as a group
        whose members have all gone is (docs/design.md#group-retention)."""
        now = trio.current_time()
        states = {group_id: d.group.shown_state(now) for group_id, d in self.groups.items()}
        for group_id in self.offset_only.keys() - states.keys():
            states[group_id] = GroupState.EMPTY.value
        return tuple(
            GroupSummary(group_id=group_id, state=state)
            for group_id, state in sorted(states.items())
        )

    async def describe(self, group_id: str) -> DescribeGroupResponse:
        driver = self.groups.get(group_id)
        offsets = await self.offsets.view(group_id)
        statistics = driver.statistics() if driver is not None else None
        return describe.described(group_id, statistics, offsets)

    async def delete_group(self, group_id: str) -> ErrorCode:
        """DeleteGroup, refused while the group has members (NON_EMPTY_GROUP) or while a
        partition of it is under a lease (REBALANCE_IN_PROGRESS): a member that died silently
        may still be fetching, and deleting the group would forget the lease, so the next member
        to join would be started on that partition at once (docs/failure-domains.md)."""
        driver = self.groups.get(group_id)
        if driver is not None:
            refusal = driver.group.admin_refusal(trio.current_time())
            if refusal is not ErrorCode.NONE:
                return refusal
        offsets = await self.offsets.view(group_id)
        if driver is None and not offsets.accepted:
            self.offset_only.pop(group_id, None)  # one whose topics were deleted has none left
            return ErrorCode.GROUP_ID_NOT_FOUND
        await self.store.delete_group(self.epoch, group_id)
        self.offsets.forget(group_id)
        self.offset_only.pop(group_id, None)
        driver = self.groups.get(group_id)
        # A member may have joined while the store deleted: its group lives on from empty.
        if driver is not None and driver.group.deletable(trio.current_time()):
            driver.feed(driver.group.deleted, trio.current_time())
        return ErrorCode.NONE

    async def expire_groups(self) -> None:
        """Every check interval, remove the groups that have had no member for the retention
        period, with their offsets, in memory, in the store and their driver task, as DeleteGroup
        does (docs/design.md#group-retention); and the groups only a standalone committer used,
        the retention period after their last commit. A group under a lease is not deletable and
        waits for a later check; a store that cannot answer is asked again at the next one."""
        await self.loaded.wait()
        interval = self.config.group_retention_check_interval
        while True:
            await trio.sleep(interval)
            now = trio.current_time()
            offset_only = sorted(self.offset_only.keys() - self.groups.keys())
            for group_id in [*self.groups, *offset_only]:
                # Asked anew for each: a member or a commit may have come meanwhile.
                since = self._idle_since(group_id)
                if since is None or now < since + self.config.group_retention:
                    continue
                try:
                    error = await self.delete_group(group_id)
                except StoreUnavailable as exc:
                    log.warning("cannot remove group %s yet: %s", group_id, exc)
                    continue
                if error is ErrorCode.NONE:
                    log.info(
                        "group %s had no member for %.0f s: removed with its offsets",
                        group_id,
                        now - since,
                    )

    def _idle_since(self, group_id: str) -> float | None:
        """The instant the group's retention counts from; None while it may not be removed."""
        driver = self.groups.get(group_id)
        if driver is not None:
            return driver.group.idle_since(trio.current_time())
        return self.offset_only.get(group_id)

    async def watch_topics(
        self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        await topic_watch.watch_topics(self.context, self.groups, task_status=task_status)


def _is_shared_failure(exc: BaseException) -> bool:
    """Whether an exception from a group's work is a shared component's failure (the store's)
    rather than the group's own."""
    if isinstance(exc, BaseExceptionGroup):
        return exc.subgroup(StoreError) is not None
    return isinstance(exc, StoreError)


async def _recover_groups(coordinator: GroupCoordinator) -> None:
    """A new coordinator knows each group's last intended assignment but none of its members; a
    previous owner may still fetch until its lease runs out after this coordinator took office,
    unless it re-registers first. Until every record is read, group requests are answered
    COORDINATOR_LOAD_IN_PROGRESS (docs/design.md#loading)."""
    took_office_at = coordinator.context.took_office_at
    records = await coordinator.store.groups()
    for record in records.values():
        # It waits for the members the record names, at most until their lease counted from
        # now is over, and then decides once: docs/design.md#adoption-after-a-failover.
        coordinator._restore(
            record.group_id,
            record,
            since=took_office_at,
            generation=record.generation,
            awaiting=True,
        )
    # A standalone committer's groups have no record: their last commit is unknown, so their
    # retention counts from now, the safe side (docs/design.md#group-retention).
    for group_id in await coordinator.store.offset_only_groups():
        if group_id not in coordinator.groups:
            coordinator.offset_only.setdefault(group_id, took_office_at)
    coordinator.loaded.set()
    log.info("broker %d loaded %d groups", coordinator.broker.broker_id, len(records))


@asynccontextmanager
async def open_group_coordinator(
    store: MetadataStore,
    config: CoordinatorConfig,
    broker: BrokerInfo,
    *,
    log_end: LogEnd | None = None,
    observer: CoordinatorObserver = NULL_OBSERVER,
    high_watermarks: HighWatermarks | None = None,
) -> AsyncIterator[GroupCoordinator]:
    """Take office, recover the groups, and run the committer and the topic watch; offsets
    past ``log_end`` (this broker's partition logs) are refused. The coordinator is handed out
    while it still reads the groups' records, so that clients are told the load is under way
    (COORDINATOR_LOAD_IN_PROGRESS) rather than that this broker is not the coordinator;
    ``loaded`` is set once it is done. A store failure while loading ends the block."""
    epoch = await store.take_office(broker.broker_id)
    took_office_at = trio.current_time()
    offsets = OffsetKeeper(
        store=store,
        epoch=epoch,
        commit_interval=config.commit_interval,
        retry_backoff=config.store_retry_backoff,
    )
    async with trio.open_nursery() as nursery:
        context = CoordinatorContext(
            config=config,
            store=store,
            broker=broker,
            epoch=epoch,
            offsets=offsets,
            nursery=nursery,
            took_office_at=took_office_at,
            log_end=log_end,
            high_watermarks=high_watermarks,
            observer=observer,
        )
        coordinator = GroupCoordinator(context=context)
        context.brokers = await store.brokers()
        await nursery.start(coordinator.watch_topics)
        await nursery.start(offsets.run)
        await nursery.start(coordinator.pinger.run)
        if config.shed_groups_above_lag is not None:
            coordinator.governor = Governor(
                lag=LoopLag.of_run(), bound=config.shed_groups_above_lag, budget=CpuBudget.of_run()
            )
            await nursery.start(coordinator.governor.run, coordinator.groups)
        nursery.start_soon(coordinator.expire_groups)
        # No group exists before its record is read: requests that would make one wait.
        nursery.start_soon(_recover_groups, coordinator)
        log.info("broker %d is coordinator, epoch %d", broker.broker_id, epoch)
        try:
            yield coordinator
        finally:
            nursery.cancel_scope.cancel()
            with trio.CancelScope(shield=True), trio.move_on_after(5):
                try:
                    await offsets.flush()
                except StoreError as exc:
                    log.error("final offset commit failed: %s", exc)
