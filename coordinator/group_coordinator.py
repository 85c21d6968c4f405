"""The group coordinator: membership, failure detection, offsets and topic watches.

Everything that changes a group goes through its machines (``statemachine.member`` and
``statemachine.group``); this module performs the effects they return. The rebalance attempt itself
lives in :mod:`coordinator.rebalance`.
"""

from __future__ import annotations

import functools
import itertools
import logging
from collections.abc import AsyncIterator, Callable, Collection, Iterable, Mapping
from contextlib import asynccontextmanager

import attrs
import trio

from coordinator import rebalance, validation
from coordinator.config import CoordinatorConfig
from coordinator.heartbeat import Pinger
from coordinator.membership import Away, Group, Member
from coordinator.observer import NULL_OBSERVER, CoordinatorObserver
from coordinator.offsets import OffsetKeeper
from coordinator.validation import LogEnd
from protocol import (
    DescribeGroupResponse,
    ErrorCode,
    GroupSummary,
    LocalProtocolError,
    MemberDescription,
    MemberHost,
    OffsetCommitRequest,
    RegisterConsumerRequest,
    RegisterConsumerResponse,
    RequestMessage,
    ResponseMessage,
    StopFetcherRequest,
    StopFetcherResponse,
)
from protocol.types import BrokerInfo, PartitionOffset, TopicPartition
from protocol.versions import NEWEST, PeerVersions
from statemachine import group as group_sm
from statemachine import member as member_sm
from statemachine import ownership
from store import (
    GroupRecord,
    MemberRecord,
    MetadataStore,
    StoreError,
    StoreUnavailable,
    TopicPlacement,
)
from transport.channel import Channel, ChannelClosed

log = logging.getLogger(__name__)

OFFSET_RESETS = frozenset({"smallest", "largest"})


@attrs.define(eq=False)
class GroupCoordinator:
    config: CoordinatorConfig
    store: MetadataStore
    broker: BrokerInfo
    epoch: int
    offsets: OffsetKeeper
    nursery: trio.Nursery
    took_office_at: float
    pinger: Pinger = attrs.field(init=False)
    groups: dict[str, Group] = attrs.field(factory=dict)
    #: Groups with committed offsets but no :class:`Group` in memory (a standalone committer's),
    #: and the instant their retention counts from: their last standalone commit, or when this
    #: coordinator took office (docs/design.md#group-retention).
    offset_only: dict[str, float] = attrs.field(factory=dict)
    topics: Mapping[str, TopicPlacement] = attrs.field(factory=dict)
    brokers: tuple[BrokerInfo, ...] = ()
    #: The brokers as the clients of each listener reach them (Kafka's advertised.listeners).
    brokers_by_listener: dict[str, tuple[BrokerInfo, ...]] = attrs.Factory(dict)
    #: The log end of partitions whose log this broker holds: an offset past it is refused.
    log_end: LogEnd | None = None
    #: Hands out member incarnations: unique across the coordinator's groups, so that a member
    #: of a group rebuilt since owns nothing in the new group's machine.
    _incarnations: itertools.count[int] = attrs.field(factory=itertools.count)
    #: Set once every group's record has been read after taking office (:func:`_recover_groups`).
    loaded: trio.Event = attrs.field(factory=trio.Event)
    #: Groups whose record is being read again for a rebuild (:meth:`_rebuild`).
    _reloading: set[str] = attrs.field(factory=set)
    #: Told of group inputs, deaths and Pings (metrics): coordinator/observer.py.
    observer: CoordinatorObserver = NULL_OBSERVER

    def __attrs_post_init__(self) -> None:
        self.pinger = Pinger(coordinator=self)

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
        (docs/design.md#generations-and-fencing). ``versions``: what it reads of our requests
        (``protocol.versions.negotiate``), which says which rules it is served by."""
        error = self._registration_error(request, client_id)
        if error is not ErrorCode.NONE:
            return self._register_response(error, request.group_id), None
        group = self.group(request.group_id)
        # A static member is known by its instance id, whatever process carries it:
        # docs/design.md#static-members.
        member_id = request.instance_id or request.consumer_id
        record = MemberRecord(
            member_id=member_id,
            client_id=client_id,
            subscription=request.subscription,
            session_timeout_ms=request.session_timeout_ms,
            auto_commit=request.auto_commit,
            auto_offset_reset=request.auto_offset_reset,
            instance_id=request.instance_id,
        )
        timeouts = member_sm.MemberTimeouts(
            session_timeout=request.session_timeout_ms / 1000,
            max_missed=self.config.max_missed_pings,
            lease_margin=self.config.lease_margin,
            follows_lease=versions.follows_lease,
        )
        machine = member_sm.MemberMachine(
            member_id=member_id, timeouts=timeouts, last_heard=trio.current_time()
        )
        member = Member(
            group_id=group.group_id,
            record=record,
            machine=machine,
            channel=channel,
            connection_scope=connection_scope,
            incarnation=next(self._incarnations),
            consumer_id=request.consumer_id,
            versions=versions,
        )
        replaced = group.members.get(member_id)
        if replaced is not None:
            self._fence(group, replaced)
        if (away := group.away.pop(member_id, None)) is not None:
            group.streams -= validation.stream_count(away.record.subscription)
            log.info("group %s: %s is back", group.group_id, member_id)
        group.members[member_id] = member
        group.last_member_at = trio.current_time()
        if member.static:
            group.processes[member.consumer_id] = member
        group.streams += validation.stream_count(record.subscription)
        group.highest_reported_generation = max(
            group.highest_reported_generation, request.generation
        )
        if versions != NEWEST:
            log.info(
                "group %s: %s joined, reading %s", group.group_id, member.member_id, versions.level
            )
        else:
            log.info("group %s: %s joined", group.group_id, member.member_id)
        self._adopt(group, member, request)
        self.pinger.add(member)
        if replaced is not None:
            self.apply(group, group_sm.MemberReplaced(member_id=member_id))
        else:
            self.apply(group, group_sm.MemberJoined(member_id=member_id))
        return self._register_response(ErrorCode.NONE, request.group_id), member

    def _fence(self, group: Group, older: Member) -> None:
        """A newer process registered under ``older``'s instance id: the older one is no longer
        the member. Telling it (StopFetcher, reason FENCED_INSTANCE_ID) proves nothing if it is
        paused, so what it holds stays leased to it until its answer, its clean close or its
        lease end, counted from that StopFetcher; only then may the newer process start it
        (docs/design.md#static-members)."""
        now = trio.current_time()
        del group.members[older.member_id]
        group.processes.pop(older.consumer_id, None)
        group.streams -= validation.stream_count(older.record.subscription)
        older.fenced = True
        group.fenced[older.consumer_id] = older.member_id
        while len(group.fenced) > self.config.limits.max_group_size:
            del group.fenced[next(iter(group.fenced))]
        (death,) = older.machine.handle(member_sm.Fenced(now=now))
        died = ownership.OwnerDied(
            incarnation=older.incarnation, until=death.partitions_free_at, now=now
        )
        self.own_or_fail(group, died)
        log.info(
            "group %s: a newer process fenced %s (process %s); its partitions are free at %.3f "
            "at the latest",
            group.group_id,
            older.member_id,
            older.consumer_id,
            death.partitions_free_at,
        )
        self.nursery.start_soon(self._tell_fenced, group, older)

    async def _tell_fenced(self, group: Group, older: Member) -> None:
        """Send the fenced process its StopFetcher and wait for its answer, which frees its
        partitions at once, or its connection's end, or the deadline; then close."""
        if trio.current_time() < self.store.in_contact_until():
            # Renews its lease, which a coordinator that may have been deposed must not:
            # docs/design.md#coordinator-epochs-and-the-election. Out of contact, only its
            # lease, already counted, frees its partitions.
            request = StopFetcherRequest(
                coordinator_epoch=self.epoch,
                generation=older.machine.generation,
                consumer_id=older.member_id,
                acknowledged_frames=older.channel.frames_received,
                partitions=None,
                reason=ErrorCode.FENCED_INSTANCE_ID,
            )

            def stopped(member: Member, response: ResponseMessage) -> None:
                if (
                    not isinstance(response, StopFetcherResponse)
                    or response.error_code is not ErrorCode.NONE
                ):
                    return  # no proof: its lease stands
                holding = group.ownership.holding(member.incarnation)
                self.accept_reported_offsets_nowait(
                    member, holding.generation, response.offsets, final=True
                )
                answered = ownership.StopAnswered(
                    incarnation=member.incarnation, now=trio.current_time()
                )
                self.own_or_fail(group, answered)

            await self.call_all({older: request}, stopped)
        older.connection_scope.cancel()

    def fenced_closed(self, member: Member) -> None:
        """A fenced process closed its connection cleanly (end of stream): it stopped fetching
        first (docs/design.md#ownership-lease), so its partitions are free now."""
        group = self.groups.get(member.group_id)
        if group is not None and member.fenced:
            closed = ownership.OwnerClosed(incarnation=member.incarnation, now=trio.current_time())
            self.own_or_fail(group, closed)

    def is_fenced(self, group_id: str, consumer_id: str) -> bool:
        """Whether ``consumer_id`` is a process a newer one fenced (FENCED_INSTANCE_ID)."""
        group = self.groups.get(group_id)
        return group is not None and consumer_id in group.fenced

    def _adopt(self, group: Group, member: Member, request: RegisterConsumerRequest) -> None:
        """A partition under a lease waits until its owner surely stopped
        (docs/design.md#adoption-after-a-failover); the owner itself can say so sooner. A member
        that registers under the generation of its lease is the process that held it (a coordinator
        has one member per id in a generation): partitions it no longer fetches are free now, and
        those it still fetches are its own (their offsets count) until its StopFetcher answer frees
        them, or its death starts a lease again. So after a failover a new coordinator waits only
        for owners that have not re-registered, and a member whose connection broke under it frees
        its partitions when it comes back. Any other generation (a new process under an old id, an
        attempt that was never persisted) proves nothing, and the lease stands."""
        registered = ownership.OwnerRegistered(
            owner=member.member_id,
            incarnation=member.incarnation,
            generation=request.generation,
            holding=request.owned_partitions,
            now=trio.current_time(),
        )
        effects = self.own_or_fail(group, registered)
        if effects:
            held = sum(len(e.partitions) for e in effects if isinstance(e, ownership.LeaseAdopted))
            freed = sum(len(e.partitions) for e in effects if isinstance(e, ownership.LeaseEnded))
            log.info(
                "group %s: %s came back under generation %d; adopted %d leased partitions, "
                "freed %d",
                group.group_id,
                member.member_id,
                request.generation,
                held,
                freed,
            )

    def own(self, group: Group, event: ownership.Event) -> list[ownership.Effect]:
        """Feed the group's ownership machine and perform its effects: a lease its owner ended
        or adopted wakes an attempt waiting on leases. An input the machine refuses raises."""
        effects = group.ownership.handle(event)
        if effects:  # a lease ended, or was adopted: an attempt waiting on leases looks again
            group.leases_freed.value += 1
        return effects

    def own_or_fail(self, group: Group, event: ownership.Event) -> list[ownership.Effect]:
        """:meth:`own` from a task that is not the group's driver (a connection, the Ping
        scheduler, a reader): an input the machine refuses is a bug in the group's work, and the
        group fails, not that task."""
        try:
            return self.own(group, event)
        except Exception as exc:
            self.fail_group(group, exc)
            return []

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
        if trio.current_time() >= self.store.in_contact_until():
            # Accepting renews the lease of what it holds: docs/design.md#ownership-lease.
            return ErrorCode.COORDINATOR_NOT_AVAILABLE
        group = self.groups.get(request.group_id)
        limits = self.config.limits
        if group is None:
            members, streams = 0, 0
        else:
            error = _identity_error(group, request)
            if error is not ErrorCode.NONE:
                return error
            members, streams = len(group.members) + len(group.away), group.streams
            # A process of a static member takes the place of the one it fences or of the
            # member away: the group does not grow.
            if request.instance_id is not None:
                same = group.members.get(request.instance_id)
                was = same.record if same is not None else None
                if (away := group.away.get(request.instance_id)) is not None:
                    was = away.record
                if was is not None:
                    members -= 1
                    streams -= validation.stream_count(was.subscription)
        if (
            members >= limits.max_group_size
            or streams + validation.stream_count(request.subscription) > limits.max_group_streams
        ):
            return ErrorCode.GROUP_MAX_SIZE_REACHED
        return ErrorCode.NONE

    def _register_response(self, error: ErrorCode, group_id: str) -> RegisterConsumerResponse:
        group = self.groups.get(group_id)
        generation = group.machine.generation if group is not None else -1
        return RegisterConsumerResponse(
            error_code=error, coordinator_epoch=self.epoch, generation=generation
        )

    def member_event(self, member: Member, event: object) -> None:
        """Feed a failure-path input (a missed deadline, a closed connection, a leave) to the
        member's machine; if it declares the member dead, handle its failure
        (docs/design.md#failure-detection): remove it, cancel an attempt in flight, close its
        connection, rebalance what is left. Safe to call more than once."""
        effects = member.machine.handle(event)
        if not member.machine.alive and not member.fenced:
            member.connection_scope.cancel()
        group = self.groups.get(member.group_id)
        if not effects or group is None or group.members.get(member.member_id) is not member:
            return
        (death,) = effects
        self.observer.member_died(group.group_id, death.cause)
        now = trio.current_time()
        holding = group.ownership.holding(member.incarnation)
        del group.members[member.member_id]
        group.processes.pop(member.consumer_id, None)
        died = ownership.OwnerDied(
            incarnation=member.incarnation,
            until=death.partitions_free_at,
            now=now,
        )
        self.own_or_fail(group, died)
        if member.static and death.cause is not member_sm.DeathCause.LEFT:
            # No rebalance: its partitions wait for a restart within T
            # (docs/design.md#static-members).
            # Its record keeps its own generation, under which a successor claims its partitions.
            record = attrs.evolve(member.record, generation=holding.generation)
            away = self.away(group, record, since=now, partitions=holding.partitions)
            log.info(
                "group %s: %s's process ended (%s); away until %.3f, its partitions free at %.3f",
                group.group_id,
                member.member_id,
                death.cause.value,
                away.until,
                death.partitions_free_at,
            )
            self.apply(group, group_sm.MemberAway(member_id=member.member_id))
            return
        group.streams -= validation.stream_count(member.record.subscription)
        log.info(
            "group %s: %s is dead (%s); its partitions are free at %.3f",
            group.group_id,
            member.member_id,
            death.cause.value,
            death.partitions_free_at,
        )
        self._departed(group, member.member_id)

    def away(
        self,
        group: Group,
        record: MemberRecord,
        *,
        since: float,
        partitions: frozenset[TopicPartition] = frozenset(),
    ) -> Away:
        """The static member ``record`` names has no process from ``since`` on: it stays in the
        group, away, for its session timeout; its last process held ``partitions``."""
        away = group.away[record.member_id] = Away(
            record=record, until=since + record.session_timeout_ms / 1000, partitions=partitions
        )
        self.nursery.start_soon(self._away_ends, group, record.member_id, away)
        return away

    async def _away_ends(self, group: Group, member_id: str, away: Away) -> None:
        """A static member away for its session timeout departs, and its group rebalances."""
        await trio.sleep_until(away.until)
        if self.groups.get(group.group_id) is not group or group.away.get(member_id) is not away:
            return  # back, or the group was rebuilt or deleted since
        del group.away[member_id]
        group.streams -= validation.stream_count(away.record.subscription)
        log.info("group %s: %s stayed away for its session timeout", group.group_id, member_id)
        self._departed(group, member_id)

    def _departed(self, group: Group, member_id: str) -> None:
        group.last_member_at = trio.current_time()
        remaining = len(group.members) + len(group.away)
        self.apply(group, group_sm.MemberDeparted(member_id=member_id, remaining=remaining))

    async def call_all(
        self,
        requests: Mapping[Member, RequestMessage],
        on_answer: Callable[[Member, ResponseMessage], None],
        on_unsent: Callable[[Member], None] | None = None,
    ) -> list[Member]:
        """Send each member its coordinator request at once, each due within 2/3 of that member's
        session timeout (docs/design.md#failure-detection), and return once every one has
        answered or missed.

        ``on_answer`` runs in the reader that got the answer, when it arrives: even if the
        member died meanwhile, since its answer may still count. A member whose deadline passes
        counts a miss, which may declare it dead. Returns the members that did not answer (a
        missed deadline, or a closed connection, whose task declares the member dead, or a
        request we could not send, after ``on_unsent`` ran: :meth:`close_unsendable`). One task
        waits for them all: a task, a cancel scope and an Event per member cost more than the
        rest of a rebalance of a thousand members.
        """
        pending: dict[Member, tuple[float, int]] = {}  # deadline, correlation id
        silent: list[Member] = []
        unsendable: list[tuple[Member, LocalProtocolError]] = []
        all_in = trio.Event()
        now = trio.current_time()

        def answered(member: Member, response: ResponseMessage | None) -> None:
            if pending.pop(member, None) is None:
                return
            if response is None:
                silent.append(member)
            else:
                on_answer(member, response)
            if not pending:
                all_in.set()

        for member, request in requests.items():
            try:
                correlation_id = member.request_nowait(request, functools.partial(answered, member))
            except ChannelClosed:
                silent.append(member)
                continue
            except LocalProtocolError as error:
                if on_unsent is not None:
                    on_unsent(member)
                unsendable.append((member, error))
                silent.append(member)
                continue
            pending[member] = (now + member.machine.timeouts.response_deadline, correlation_id)
        for member, refusal in unsendable:
            await self.close_unsendable(member, refusal)
        try:
            while pending:
                with trio.move_on_at(min(deadline for deadline, _ in pending.values())):
                    await all_in.wait()
                now = trio.current_time()
                for member, (deadline, correlation_id) in list(pending.items()):
                    if deadline <= now:
                        del pending[member]
                        member.channel.abandon(correlation_id)
                        silent.append(member)
                        if member.machine.alive:
                            missed = member_sm.DeadlineMissed(now=now, handover=True)
                            self.member_event(member, missed)
        finally:
            for member, (_, correlation_id) in pending.items():
                member.channel.abandon(correlation_id)  # cancelled: late answers are dropped
        return silent

    async def close_unsendable(self, member: Member, exc: LocalProtocolError) -> None:
        """A request we cannot encode for this member (a StartFetcher for more partitions than
        one frame holds): the limit is ours, but the failure is only this member's. It is told
        why and closed, and dies as one whose connection broke under it: whatever it may still
        fetch stays leased to it. The others go on without it."""
        log.warning(
            "group %s: closing %s: cannot send it a request: %s (%s)",
            member.group_id,
            member.member_id,
            exc,
            exc.error_code.name,
        )
        await member.channel.refuse(exc.error_code, f"the coordinator cannot send you {exc}")
        if member.machine.alive:
            self.member_event(member, member_sm.ConnectionBroken(now=trio.current_time()))

    # --- offsets --------------------------------------------------------------------------

    def accept_reported_offsets_nowait(
        self,
        member: Member,
        generation: int,
        offsets: tuple[PartitionOffset, ...],
        *,
        final: bool = False,
    ) -> None:
        """Offsets in a Ping response count only for partitions the member holds, given to it at
        or before the generation the Ping carried (its own), and only while it is a member; a
        StopFetcher answer is its ``final`` report for what it stopped, accepted even if it left
        right after
        (docs/design.md#generations-and-fencing). Called by the reader that got the answer, as it
        arrives."""
        accepted = self._fenced(member, generation, offsets, final=final)
        if not accepted:
            return
        group_id = member.group_id
        if self.offsets.accept_nowait(group_id, generation, accepted, monotonic=True) is None:
            # Not in memory (a member owns partitions only after a rebalance loaded them, and a
            # rebalance loads them before StopFetcher): load them in a task of their own.
            self.nursery.start_soon(
                functools.partial(
                    self.offsets.accept, group_id, generation, accepted, monotonic=True
                )
            )

    def _fenced(
        self, member: Member, generation: int, offsets: tuple[PartitionOffset, ...], *, final: bool
    ) -> dict[TopicPartition, int]:
        if not offsets:
            return {}
        group = self.groups.get(member.group_id)
        if group is None:
            return {}
        if not final and not member.machine.alive:
            return {}
        # Partitions the member holds, given to it at or before the report's generation, which
        # is not past its own (SPEC.md §11.8): a partition it stopped is no longer held.
        owned = group.ownership.holding(member.incarnation).counted_under(generation)
        if not owned:
            return {}
        # A deleted topic's partitions count for nothing, though held until the rebalance.
        topics = self.topics
        fenced = {
            po.topic_partition: po.offset
            for po in offsets
            if po.topic_partition in owned and po.topic in topics
        }
        if self.log_end is not None and (beyond := validation.beyond_log_end(fenced, self.log_end)):
            # A report cannot be refused as a commit is: the offending partitions are dropped.
            log.warning(
                "group %r: dropped offsets past the log end for %d partitions (%s: %d)",
                member.group_id,
                len(beyond),
                beyond[0],
                fenced[beyond[0]],
            )
            for tp in beyond:
                del fenced[tp]
        return fenced

    async def commit(self, request: OffsetCommitRequest, channel: Channel) -> ErrorCode:
        """OffsetCommit, fenced by member and generation, answered once durable; an offset
        past its partition's log end is refused (OFFSET_OUT_OF_RANGE), since members only move
        offsets forward and one such commit would pin its group there. The request has passed
        the checks at the boundary (``validation.request_error``) already."""
        group = self.groups.get(request.group_id)
        offsets = {po.topic_partition: po.offset for po in request.offsets}
        if self.log_end is not None and validation.beyond_log_end(offsets, self.log_end):
            return ErrorCode.OFFSET_OUT_OF_RANGE
        if request.consumer_id is None:
            if request.generation != -1:
                return ErrorCode.ILLEGAL_GENERATION
            refusal = _admin_refusal(group)
            if refusal is not ErrorCode.NONE:
                return refusal
            if not await self._partitions_exist(offsets):
                return ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
            version = await self.offsets.accept(request.group_id, -1, offsets, monotonic=False)
            if request.group_id not in self.groups:
                self.offset_only[request.group_id] = trio.current_time()
        else:
            member = group.member_of(request.consumer_id) if group is not None else None
            if member is None or member.channel is not channel:
                if group is not None and request.consumer_id in group.fenced:
                    # docs/design.md#static-members: a newer process is the member now.
                    return ErrorCode.FENCED_INSTANCE_ID
                return ErrorCode.UNKNOWN_MEMBER_ID
            assert group is not None
            holding = group.ownership.holding(member.incarnation)
            # Each partition held, given at or before the commit's generation, which is not past
            # the member's own (SPEC.md §11.8; docs/design.md#generations-and-fencing).
            if request.generation > holding.generation or not offsets.keys() <= (
                holding.counted_under(request.generation)
            ):
                return ErrorCode.ILLEGAL_GENERATION
            # A deleted topic's count for nothing: the rebalance takes its partitions away.
            offsets = {tp: offset for tp, offset in offsets.items() if tp.topic in self.topics}
            version = await self.offsets.accept(
                request.group_id, request.generation, offsets, monotonic=True
            )
        await self.offsets.wait_durable(version)
        return ErrorCode.NONE

    async def _partitions_exist(self, offsets: Mapping[TopicPartition, int]) -> bool:
        """A standalone committer names its partitions itself (a member's are fenced by what it
        owns): only partitions of existing topics may hold offsets, which also bounds what a
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

    def group(self, group_id: str, *, generation: int = 0) -> Group:
        """The group's record, created (with its driver task) on first use."""
        group = self.groups.get(group_id)
        if group is None:
            # A member group from now on: its members' instants count for its retention.
            self.offset_only.pop(group_id, None)
            machine = group_sm.GroupMachine(group_id=group_id, generation=generation)
            group = self.groups[group_id] = Group(group_id=group_id, machine=machine)
            self.nursery.start_soon(self._drive, group)
        return group

    async def _drive(self, group: Group) -> None:
        """The group's driver, and the edge of its failure domain (docs/failure-domains.md): an
        exception from our own code in the group's work fails that group alone, which is rebuilt
        (so does one in another task, through :meth:`fail_group`).
        A StoreError is the shared store's, and ends the process like any failure of a shared
        component (an attempt already retries the store errors it expects, as AttemptFailed)."""
        group.driver = scope = trio.CancelScope()
        with scope:
            try:
                await rebalance.drive(self, group)
            except Exception as exc:
                if _is_shared_failure(exc):
                    raise
                self.fail_group(group, exc)
        group.driver = None
        if group.failure is not None:
            await self._rebuild(group, group.failure)

    async def _rebuild(self, failed: Group, exc: Exception) -> None:
        """A failover for one group (docs/design.md#adoption-after-a-failover): nothing the
        failed group kept in memory can be trusted, so it is rebuilt from its last durable record
        as a new coordinator would, with every lease counted from the failure. Its members are
        disconnected and register again; each partition of that record, and each one a member
        owned or a lease held in memory, waits until T plus the lease margin after the failure,
        unless its owner re-registers under that generation holding nothing (``_adopt``)."""
        failed_at = trio.current_time()
        log.error(
            "group %s failed; disconnecting its %d members and rebuilding it from its last "
            "durable record",
            failed.group_id,
            len(failed.members),
            exc_info=exc,
        )
        self._reloading.add(failed.group_id)
        try:
            record = (await self.store.groups()).get(failed.group_id)
        finally:
            self._reloading.discard(failed.group_id)
        members = list(failed.members.values())
        failed.members.clear()
        failed.streams = 0
        failed.next_attempt_at.value = None
        if self.groups.get(failed.group_id) is failed:
            del self.groups[failed.group_id]
            self._restore(
                failed.group_id,
                record,
                since=failed_at,
                generation=max(failed.machine.generation, record.generation if record else 0),
                claims=failed.ownership.carryover(failed_at),
                longest=max((m.machine.timeouts.session_timeout for m in members), default=0.0),
            )
        for member in members:
            # Dead to the Ping scheduler and to offset fencing at once; what its death would
            # free is already counted above, from the failure.
            if member.machine.alive:
                member.machine.handle(member_sm.ConnectionBroken(now=failed_at))
            member.connection_scope.cancel()

    def _restore(
        self,
        group_id: str,
        record: GroupRecord | None,
        *,
        since: float,
        generation: int,
        claims: Iterable[ownership.Claim] = (),
        longest: float = 0.0,
    ) -> Group:
        """The group as a coordinator that knows none of its members finds it. The record's
        assignment stays the sticky assignor's starting point, so owners that re-register get
        their partitions back. Every partition of the record, and of each of ``claims``, waits
        until ``since`` plus the longest session timeout (of the record's members, or
        ``longest``) plus the margin (or the claim's own instant, if later), unless its owner
        re-registers under that generation first (``_adopt``)."""
        group = self.group(group_id, generation=generation)
        claims = list(claims)
        if record is not None:
            group.assignment = dict(record.assignment)
            owners: dict[str, set[TopicPartition]] = {}
            for tp, thread in record.assignment.items():
                owners.setdefault(thread.member_id, set()).add(tp)
            # Each under the member's own generation: under the incremental protocol, one the
            # record's rebalance did not start kept its older one (-1: a record from before
            # members had their own names only the group's).
            own = {m.member_id: m.generation for m in record.members if m.generation >= 0}
            claims += [
                ownership.Claim(
                    owner=m, generation=own.get(m, record.generation), partitions=frozenset(tps)
                )
                for m, tps in owners.items()
            ]
            longest = max([longest, *(m.session_timeout_ms / 1000 for m in record.members)])
            # A static member the record names is away from ``since`` on, as if its process had
            # just ended: a process that registers under its instance id within T gets its
            # partitions back (docs/design.md#static-members).
            for member in record.members:
                if member.instance_id is not None:
                    given = frozenset(owners.get(member.member_id, ()))
                    self.away(group, member, since=since, partitions=given)
                    group.streams += validation.stream_count(member.subscription)
        recovered = ownership.Recovered(
            claims=tuple(claims),
            since=since,
            longest_session=longest,
            margin=self.config.lease_margin,
        )
        self.own(group, recovered)
        return group

    def _apply(self, group: Group, effects: list[group_sm.Effect]) -> None:
        for effect in effects:
            if isinstance(effect, group_sm.CancelAttempt):
                if group.attempt_scope is not None:
                    group.attempt_scope.cancel()
            else:
                now = trio.current_time()
                current = group.next_attempt_at.value
                if effect.delay is group_sm.Delay.INITIAL:
                    group.forming_until = now + self.config.initial_rebalance_max_delay
                if effect.delay is group_sm.Delay.INITIAL_AGAIN:
                    # A join into a forming group postpones its first attempt, up to the cap.
                    due = min(now + self.config.initial_rebalance_delay, group.forming_until)
                    group.next_attempt_at.value = due if current is None else max(current, due)
                else:
                    due = now + self._delay(group, effect.delay)
                    if effect.delay is group_sm.Delay.RECOVERY:
                        due = max(now, group.recovered_until)
                    group.next_attempt_at.value = due if current is None else min(current, due)
        if group.machine.state is group_sm.GroupState.EMPTY:
            group.next_attempt_at.value = None
        group.status.value = (group.machine.state, group.machine.generation)
        if (
            group.machine.state is group_sm.GroupState.EMPTY
            and group.machine.generation == 0
            and _deletable(group)
        ):
            # Emptied before any attempt began: no generation was ever handed out or stored,
            # so nothing about it needs remembering, and a client that registers and leaves
            # under ever new group ids must not grow the broker's memory.
            self._retire(group)

    def apply(self, group: Group, event: object) -> None:
        """Feed the group's machine and perform its effects. An input it refuses is a bug in
        the group's work, whichever task fed it (a connection, the Ping scheduler, the topic
        watch): the group fails, not that task."""
        try:
            self._apply(group, group.machine.handle(event))
        except Exception as exc:
            self.fail_group(group, exc)
        else:
            self.observer.group_event(group.group_id, event, trio.current_time())

    def fail_group(self, group: Group, exc: Exception) -> None:
        """Fail the group from any task: its driver stops at its next checkpoint and rebuilds
        it (:meth:`_rebuild`). The first failure is the one reported."""
        if group.failure is None:
            group.failure = exc
        if group.driver is not None:
            group.driver.cancel()
        else:  # its driver has ended: the group was deleted, or is being rebuilt already
            log.error("group %s failed after its driver ended", group.group_id, exc_info=exc)

    def _delay(self, group: Group, delay: group_sm.Delay) -> float:
        if delay is group_sm.Delay.INITIAL:
            return self.config.initial_rebalance_delay
        if delay is group_sm.Delay.BACKOFF:
            return self.config.rebalance_backoff_fraction * group.longest_session_timeout()
        return 0.0

    def list_groups(self) -> tuple[GroupSummary, ...]:
        """Every group, in its state; one only a standalone committer used is Empty, as a group
        whose members have all gone is (docs/design.md#group-retention)."""
        states = {group_id: _shown_state(g) for group_id, g in self.groups.items()}
        for group_id in self.offset_only.keys() - states.keys():
            states[group_id] = group_sm.GroupState.EMPTY.value
        return tuple(
            GroupSummary(group_id=group_id, state=state)
            for group_id, state in sorted(states.items())
        )

    async def describe(self, group_id: str) -> DescribeGroupResponse:
        """Committed offsets are the durable ones; what was accepted but not yet written is
        reported apart, so that no restart can make a shown committed offset go backwards."""
        group = self.groups.get(group_id)
        offsets = await self.offsets.view(group_id)

        def listed(offsets: Mapping[TopicPartition, int]) -> tuple[PartitionOffset, ...]:
            return tuple(
                PartitionOffset(topic=tp.topic, partition=tp.partition, offset=offset)
                for tp, offset in sorted(offsets.items())
            )

        if group is None and not offsets.accepted:
            return DescribeGroupResponse(
                error_code=ErrorCode.GROUP_ID_NOT_FOUND,
                group_id=group_id,
                state="",
                generation=-1,
                members=(),
                offsets=(),
            )
        holding = group.ownership.holding if group else (lambda _: ownership.NOTHING)
        live = sorted(group.members.values(), key=lambda m: m.member_id) if group else []
        members = tuple(
            MemberDescription(
                member_id=m.member_id,
                client_id=m.record.client_id,
                session_timeout_ms=m.record.session_timeout_ms,
                subscription=m.record.subscription,
                partitions=tuple(sorted(holding(m.incarnation).partitions)),
            )
            for m in live
        )
        awaiting = _awaiting(group) if group else []
        given: dict[str, list[TopicPartition]] = {}
        if awaiting and group is not None and group.recovered is not None:
            for tp, thread in sorted(group.recovered.assignment.items()):
                given.setdefault(thread.member_id, []).append(tp)
        awaited = tuple(
            MemberDescription(
                member_id=m.member_id,
                client_id=m.client_id,
                session_timeout_ms=m.session_timeout_ms,
                subscription=m.subscription,
                partitions=tuple(given.get(m.member_id, ())),
            )
            for m in awaiting
        )
        return DescribeGroupResponse(
            error_code=ErrorCode.NONE,
            group_id=group_id,
            state=_shown_state(group) if group else group_sm.GroupState.EMPTY.value,
            generation=group.machine.generation if group else -1,
            members=members + awaited,
            offsets=listed(offsets.durable),
            reported_offsets=listed(offsets.pending),
            member_hosts=tuple(
                MemberHost(member_id=m.member_id, host=m.channel.host) for m in live
            ),
            awaiting=tuple(m.member_id for m in awaiting),
        )

    async def delete_group(self, group_id: str) -> ErrorCode:
        """DeleteGroup, refused while the group has members (NON_EMPTY_GROUP) or while a
        partition of it is under a lease (REBALANCE_IN_PROGRESS): a member that died silently
        may still be fetching, and deleting the group would forget the lease, so the next member
        to join would be started on that partition at once (docs/failure-domains.md)."""
        group = self.groups.get(group_id)
        refusal = _admin_refusal(group)
        if refusal is not ErrorCode.NONE:
            return refusal
        offsets = await self.offsets.view(group_id)
        if group is None and not offsets.accepted:
            self.offset_only.pop(group_id, None)  # one whose topics were deleted has none left
            return ErrorCode.GROUP_ID_NOT_FOUND
        await self.store.delete_group(self.epoch, group_id)
        self.offsets.forget(group_id)
        self.offset_only.pop(group_id, None)
        group = self.groups.get(group_id)
        # A member may have joined while the store deleted: its group lives on from empty.
        if group is not None and _deletable(group):
            self.apply(group, group_sm.Deleted())
            self._retire(group)
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
                        "group %s had no member since %.3f: removed with its offsets",
                        group_id,
                        since,
                    )

    def _idle_since(self, group_id: str) -> float | None:
        """The instant the group's retention counts from; None while it may not be removed."""
        group = self.groups.get(group_id)
        if group is not None:
            return group.last_member_at if _deletable(group) else None
        return self.offset_only.get(group_id)

    def _retire(self, group: Group) -> None:
        """Forget a group that holds nothing, and end its driver task."""
        if self.groups.get(group.group_id) is group:
            del self.groups[group.group_id]
        if group.driver is not None:
            group.driver.cancel()

    # --- topics ---------------------------------------------------------------------------

    async def watch_topics(
        self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """A new topic, new partitions or a deleted topic rebalance every interested group
        (docs/design.md#rebalance-triggers); a deleted topic's offsets are forgotten first."""
        started = False
        async for topics in self.store.topic_updates():
            deleted = self.topics.keys() - topics.keys()
            changed = deleted | {
                name
                for name, placement in topics.items()
                if name not in self.topics
                or self.topics[name].partition_count != placement.partition_count
            }
            self.topics = topics
            if deleted:
                await self._forget_topics(deleted)
            for group in list(self.groups.values()):
                if changed and any(
                    m.record.subscription.streams_for(name) > 0
                    for m in group.members.values()
                    for name in changed
                ):
                    self.apply(group, group_sm.TopicsChanged())
            if not started:
                started = True
                task_status.started()

    async def _forget_topics(self, deleted: Collection[str]) -> None:
        """Forget deleted topics' offsets: in memory, and in the store those the committer wrote
        after the store deleted the topic with every group's offsets for it (before this
        coordinator saw it gone). A report or commit for them from now on counts for nothing
        (``self.topics`` no longer has them), so none is written again."""
        written = await self.offsets.forget_topics(deleted)
        for group_id, topics in sorted(written.items()):
            for topic in sorted(topics):
                try:
                    await self.store.delete_offsets(self.epoch, group_id, topic)
                except StoreUnavailable as exc:
                    log.warning(
                        "group %r: offsets of deleted topic %r may remain in the store: %s",
                        group_id,
                        topic,
                        exc,
                    )


def _identity_error(group: Group, request: RegisterConsumerRequest) -> ErrorCode:
    """Whether the ids a registration names may join ``group`` (docs/design.md#static-members):
    a process a newer one fenced may not come back; a dynamic member may not take a static
    member's id, nor a static member a dynamic one's; the same process may not register twice
    (it gave up a connection the coordinator has not seen end yet: it retries)."""
    if request.consumer_id in group.fenced:
        return ErrorCode.FENCED_INSTANCE_ID
    if request.instance_id is None:
        existing = group.members.get(request.consumer_id)
        if request.consumer_id in group.away or (existing is not None and existing.static):
            return ErrorCode.INVALID_REQUEST
        return ErrorCode.NONE if existing is None else ErrorCode.DUPLICATE_MEMBER_ID
    existing = group.members.get(request.instance_id)
    if existing is None:
        return ErrorCode.NONE
    if not existing.static:
        return ErrorCode.INVALID_REQUEST
    if existing.consumer_id == request.consumer_id:
        return ErrorCode.DUPLICATE_MEMBER_ID
    return ErrorCode.NONE  # a newer process: it fences the older


#: How DescribeGroup names a group a new coordinator recovered from its record while none of the
#: members the record names has come back yet: never Empty, since they may still be fetching
#: under their leases (docs/design.md#adoption-after-a-failover).
AWAITING_MEMBERS = "AwaitingMembers"


def _awaiting(group: Group) -> list[MemberRecord]:
    """The members of the group's recovered record that have not come back yet, while their
    partitions may still be under their leases."""
    record, names = group.recovered, group.machine.awaiting
    if record is None or not names or not group.ownership.under_lease(trio.current_time()):
        return []
    return sorted(
        (m for m in record.members if m.member_id in names and m.member_id not in group.members),
        key=lambda m: m.member_id,
    )


def _shown_state(group: Group) -> str:
    """The group's state as ListGroups and DescribeGroup name it: the machine's, except that a
    recovered group none of whose awaited members is back yet is AwaitingMembers."""
    if not group.members and _awaiting(group):
        return AWAITING_MEMBERS
    return group.machine.state.value


def _admin_refusal(group: Group | None) -> ErrorCode:
    """Why a standalone commit (a reset) or a DeleteGroup may not touch ``group`` now: it has
    members (NON_EMPTY_GROUP), or a partition of it is under a lease, a member that died silently
    or one a failover awaits may still be fetching it (REBALANCE_IN_PROGRESS, retriable once the
    lease has run out). Such a member comes back with the partitions it holds, and its next
    report would undo a reset (docs/failure-domains.md#admin-operations-never-cut-a-lease-short).
    """
    if group is None:
        return ErrorCode.NONE
    if group.members or group.away:
        return ErrorCode.NON_EMPTY_GROUP
    if not _deletable(group):
        return ErrorCode.REBALANCE_IN_PROGRESS
    return ErrorCode.NONE


def _deletable(group: Group) -> bool:
    return (
        not group.members
        and not group.away
        and not group.ownership.under_lease(trio.current_time())
    )


def _is_shared_failure(exc: BaseException) -> bool:
    """Whether an exception from a group's work is a shared component's failure (the store's)
    rather than the group's own."""
    if isinstance(exc, BaseExceptionGroup):
        return exc.subgroup(StoreError) is not None
    return isinstance(exc, StoreError)


async def _recover_groups(coordinator: GroupCoordinator) -> None:
    """A new coordinator knows each group's last intended assignment but none of its members; a
    previous owner may still fetch until its lease runs out after this coordinator took office,
    unless it re-registers first (``GroupCoordinator._adopt``). Until every record is read, group
    requests are answered COORDINATOR_LOAD_IN_PROGRESS (docs/design.md#loading)."""
    records = await coordinator.store.groups()
    for record in records.values():
        group = coordinator._restore(
            record.group_id,
            record,
            since=coordinator.took_office_at,
            generation=record.generation,
        )
        # It waits for the members the record names, at most until their lease counted from
        # now is over, and then decides once: docs/design.md#adoption-after-a-failover.
        group.recovered = record
        group.recovered_until = (
            coordinator.took_office_at
            + coordinator.config.lease_margin
            + max((m.session_timeout_ms / 1000 for m in record.members), default=0.0)
        )
        awaiting = frozenset(m.member_id for m in record.members)
        coordinator.apply(group, group_sm.Recovered(awaiting=awaiting))
    # A standalone committer's groups have no record: their last commit is unknown, so their
    # retention counts from now, the safe side (docs/design.md#group-retention).
    for group_id in await coordinator.store.offset_only_groups():
        if group_id not in coordinator.groups:
            coordinator.offset_only.setdefault(group_id, coordinator.took_office_at)
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
        coordinator = GroupCoordinator(
            config=config,
            store=store,
            broker=broker,
            epoch=epoch,
            offsets=offsets,
            nursery=nursery,
            took_office_at=took_office_at,
            log_end=log_end,
            observer=observer,
        )
        coordinator.brokers = await store.brokers()
        await nursery.start(coordinator.watch_topics)
        await nursery.start(offsets.run)
        await nursery.start(coordinator.pinger.run)
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
