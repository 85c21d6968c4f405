"""A group's trio side: the one door through which its inputs reach its ``ConsumerGroup``, and
the performer of what the group decides.

Every input of a group, whichever task it comes from (a member's connection, the Ping scheduler,
a reader with an answer, the group's own attempt), is one synchronous call here: trio runs it
whole, so the group sees its inputs one at a time, in the order they happened, and the effects an
input returns are performed before the next one is taken, with no hop through a queue (a Ping
answer costs no task switch). What the group decides is performed here alone: a connection
closed, a fenced process told, an attempt cancelled (the attempt is a cancel-scoped child task of
the group's driver, so a member's death cancels it directly), an attempt scheduled, waiters
woken. Times are read when the effect is performed: a request's send time and the frames it
acknowledges belong to the moment it leaves.
"""

from __future__ import annotations

import functools
import logging
import math
from collections.abc import Callable, Mapping
from typing import Any

import attrs
import trio
from trio_util import AsyncValue

from coordinator import validation
from coordinator.context import CoordinatorContext
from protocol import (
    ErrorCode,
    LocalProtocolError,
    RequestMessage,
    ResponseMessage,
    StopFetcherRequest,
    StopFetcherResponse,
)
from protocol.types import PartitionOffset, TopicPartition
from protocol.versions import PeerVersions, fit
from statemachine import consumer_group as cg
from statemachine.consumer_group import ConsumerGroup, Ending, GroupMember, GroupStatistics
from statemachine.group import GroupMachine, GroupState
from statemachine.member import MemberMachine
from statemachine.ownership import Ownership
from statemachine.records import MemberRecord
from transport.channel import Channel, ChannelClosed, ResponseHandler

__all__ = ["Ending", "GroupDriver", "Member"]

log = logging.getLogger(__name__)

#: Seconds a member told it is no longer in its group (fenced, or let go by a busy broker) has to
#: close its connection after its answer, before the broker closes it.
PEER_CLOSE_GRACE = 5.0


@attrs.define(eq=False)
class Member:
    """A registered process as the trio side holds it: its place in its group (``state``) and the
    connection it came on."""

    state: GroupMember
    driver: GroupDriver
    channel: Channel
    #: Cancelling it ends the member's connection task, which closes the connection.
    connection_scope: trio.CancelScope
    #: Set when its connection task has ended, however.
    ended: trio.Event = attrs.field(factory=trio.Event)
    #: When the heartbeat last sent it a Ping (-inf: never): the next falls due from the one
    #: before (coordinator/heartbeat.py).
    pinged_at: float = -math.inf

    def request_nowait(self, message: RequestMessage, on_response: ResponseHandler) -> int:
        """Send a coordinator request in the version this member reads."""
        version = self.state.versions.of(message.API_KEY)
        return self.channel.request_nowait(fit(message, version), on_response, api_version=version)

    @property
    def group_id(self) -> str:
        return self.driver.group_id

    @property
    def member_id(self) -> str:
        return self.state.member_id

    @property
    def incarnation(self) -> int:
        return self.state.incarnation

    @property
    def consumer_id(self) -> str:
        return self.state.consumer_id

    @property
    def machine(self) -> MemberMachine:
        return self.state.machine

    @property
    def record(self) -> MemberRecord:
        return self.state.record

    @property
    def versions(self) -> PeerVersions:
        return self.state.versions

    @property
    def fenced(self) -> bool:
        return self.state.fenced

    @property
    def static(self) -> bool:
        return self.state.static


@attrs.define(eq=False)
class GroupDriver:
    group: ConsumerGroup
    context: CoordinatorContext
    #: The coordinator's groups in memory, by id: a group that retires leaves it.
    registry: dict[str, GroupDriver]
    #: The members by incarnation, from registration until their connection task ends.
    handles: dict[int, Member] = attrs.Factory(dict)
    #: Counts leases their owners ended early or adopted: an attempt waiting on leases wakes.
    leases_freed: AsyncValue[int] = attrs.field(factory=lambda: AsyncValue(0))
    #: When the next rebalance attempt is due (None: none is due): the group's, mirrored.
    next_attempt_at: AsyncValue[float | None] = attrs.field(factory=lambda: AsyncValue(None))
    #: (state, generation) after every input, for those who wait on a group (tools and tests).
    status: AsyncValue[tuple[GroupState, int]] = attrs.field(
        factory=lambda: AsyncValue((GroupState.EMPTY, 0))
    )
    attempt_scope: trio.CancelScope | None = None
    #: The driver task's scope while it runs: cancelling it ends the driver, which rebuilds the
    #: group if ``failure`` is set.
    scope: trio.CancelScope | None = None
    #: The first exception from the group's own work: the group is rebuilt from the store.
    failure: Exception | None = None

    # --- what tools and tests read ----------------------------------------------------------

    @property
    def group_id(self) -> str:
        return self.group.group_id

    @property
    def members(self) -> dict[str, GroupMember]:
        return self.group.members

    @property
    def away(self) -> dict[str, cg.Away]:
        return self.group.away

    @property
    def machine(self) -> GroupMachine:
        return self.group.machine

    @property
    def ownership(self) -> Ownership:
        return self.group.ownership

    @property
    def last_member_at(self) -> float:
        return self.group.last_member_at

    @property
    def attempts(self) -> int:
        return self.group.attempts

    @property
    def completed(self) -> int:
        return self.group.completed

    def statistics(self) -> GroupStatistics:
        return self.group.statistics(trio.current_time())

    # --- the door ---------------------------------------------------------------------------

    def perform(self, effects: list[cg.Effect]) -> None:
        if not effects:  # the group's state and schedule change only with an effect
            return
        for effect in effects:
            match effect:
                case cg.Note(message=message, args=args):
                    log.info(message, *args)
                case cg.CloseConnection(incarnation=incarnation):
                    if (handle := self.handles.get(incarnation)) is not None:
                        handle.connection_scope.cancel()
                case cg.GroupInput(event=event, death=death):
                    now = trio.current_time()
                    self.context.observer.group_event(self.group_id, event, now, death)
                case cg.MemberDied(cause=cause):
                    self.context.observer.member_died(self.group_id, cause)
                case cg.LeasesFreed():
                    self.leases_freed.value += 1
                case cg.CancelAttempt():
                    if self.attempt_scope is not None:
                        self.attempt_scope.cancel()
                case cg.AwayUntil(member_id=member_id, away=away):
                    self.context.nursery.start_soon(self._away_ends, member_id, away)
                case cg.TellFenced(incarnation=incarnation):
                    if (handle := self.handles.get(incarnation)) is not None:
                        self.context.nursery.start_soon(self._tell_fenced, handle)
                case cg.TellShed(incarnations=incarnations, retry_after=retry_after):
                    told = [h for i in incarnations if (h := self.handles.get(i)) is not None]
                    if told:
                        self.context.nursery.start_soon(self._tell_shed, told, retry_after)
                case cg.Retire():
                    self.retire()
        self.next_attempt_at.value = self.group.next_attempt_at
        self.status.value = (self.group.machine.state, self.group.machine.generation)

    def feed(self, operation: Callable[..., list[cg.Effect]], *args: Any, **kwargs: Any) -> None:
        """Run one of the group's operations from a task that is not the group's own (a
        connection, the Ping scheduler, a reader) and perform its effects. An input the group
        refuses is a bug in the group's work: the group fails, not that task."""
        try:
            effects = operation(*args, **kwargs)
        except Exception as exc:
            self.fail(exc)
            return
        self.perform(effects)

    def fail(self, exc: Exception) -> None:
        """Fail the group from any task: its driver stops at its next checkpoint and the group is
        rebuilt. The first failure is the one reported."""
        if self.failure is None:
            self.failure = exc
        if self.scope is not None:
            self.scope.cancel()
        else:  # its driver has ended: the group was deleted, or is being rebuilt already
            log.error("group %s failed after its driver ended", self.group_id, exc_info=exc)

    def retire(self) -> None:
        """Forget a group that holds nothing, and end its driver task."""
        if self.registry.get(self.group_id) is self:
            del self.registry[self.group_id]
        if self.scope is not None:
            self.scope.cancel()

    # --- members ------------------------------------------------------------------------------

    def connection_ended(self, member: Member, ending: Ending) -> None:
        member.ended.set()
        self.handles.pop(member.incarnation, None)
        self.feed(self.group.connection_ended, member.state, ending, trio.current_time())

    async def _away_ends(self, member_id: str, away: cg.Away) -> None:
        await trio.sleep_until(away.until)
        if self.registry.get(self.group_id) is self:  # not rebuilt or deleted since
            self.feed(self.group.away_ended, member_id, away, trio.current_time())

    async def _tell_fenced(self, older: Member) -> None:
        """Send the fenced process its StopFetcher and wait for its answer, which frees its
        partitions at once, or its connection's end, or the deadline; then close."""
        await self._tell_stopped([older], ErrorCode.FENCED_INSTANCE_ID)

    async def _tell_shed(self, members: list[Member], retry_after: float) -> None:
        """Tell each member of a group let go so (docs/design.md#shedding-load), with the hint,
        and wait for their answers, their connections' ends or the deadline; then close."""
        await self._tell_stopped(members, ErrorCode.BROKER_BUSY, round(1000 * retry_after))

    async def _tell_stopped(
        self, members: list[Member], reason: ErrorCode, throttle_time_ms: int = 0
    ) -> None:
        """Send members no longer in the group a StopFetcher saying why (``reason``) and wait
        for their answers, each of which frees its partitions at once; then close their
        connections."""
        if self.context.in_contact():
            # Renews their leases, which a coordinator that may have been deposed must not:
            # docs/design.md#coordinator-epochs-and-the-election. Out of contact, only their
            # leases, already counted, free their partitions.
            requests: dict[Member, RequestMessage] = {
                member: StopFetcherRequest(
                    coordinator_epoch=self.context.epoch,
                    generation=member.machine.generation,
                    consumer_id=member.member_id,
                    acknowledged_frames=member.channel.frames_received,
                    partitions=None,
                    reason=reason,
                    throttle_time_ms=throttle_time_ms,
                )
                for member in members
            }

            def stopped(member: Member, response: ResponseMessage) -> None:
                if (
                    not isinstance(response, StopFetcherResponse)
                    or response.error_code is not ErrorCode.NONE
                ):
                    return  # no proof: its lease stands
                self.stop_answered(member, response.offsets, revoked=None, attempt_live=False)

            await self.call_all(requests, stopped)
            # Told, each closes its end itself: its connection task ends at that end of stream,
            # which costs the loop far less than a cancelled task (a broker letting thousands
            # go is short of CPU). One that does not close is closed after the grace.
            with trio.move_on_after(PEER_CLOSE_GRACE):
                for member in members:
                    await member.ended.wait()
        for member in members:
            member.connection_scope.cancel()

    def stop_answered(
        self,
        member: Member,
        offsets: tuple[PartitionOffset, ...],
        *,
        revoked: frozenset[TopicPartition] | None,
        attempt_live: bool,
    ) -> None:
        """A StopFetcher answer: its offsets are the member's final report for what it stopped,
        and what it stopped is free."""
        generation = self.group.holding(member.state).generation
        try:
            counted, effects = self.group.stop_answered(
                member.state,
                offsets,
                revoked=revoked,
                attempt_live=attempt_live,
                topics=self.context.topics,
                now=trio.current_time(),
            )
        except Exception as exc:
            self.fail(exc)
            return
        self.accept_counted(member, generation, counted)
        self.perform(effects)

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
            self.feed(self.group.connection_ended, member.state, Ending.BROKEN, trio.current_time())

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
                        self.feed(self.group.deadline_missed, member.state, now, handover=True)
        finally:
            for member, (_, correlation_id) in pending.items():
                member.channel.abandon(correlation_id)  # cancelled: late answers are dropped
        return silent

    # --- Pings (coordinator/heartbeat.py sends them) ---------------------------------------

    def ping_sent(self, member: Member, now: float) -> bool:
        """A Ping to ``member`` leaves ``now``, unless its lease ran out: whether it still lives.
        Called once per Ping of every member: :meth:`feed` spelled out, without its generic
        call."""
        try:
            effects = self.group.ping_sent(member.state, now)
        except Exception as exc:
            self.fail(exc)
            return False
        if effects:
            self.perform(effects)
        return member.state.machine.alive

    def ping_withheld(self, member: Member) -> None:
        self.feed(self.group.ping_withheld, member.state)

    def ping_answered(
        self, member: Member, generation: int, offsets: tuple[PartitionOffset, ...], now: float
    ) -> None:
        counted = self.group.ping_answered(
            member.state, generation, offsets, topics=self.context.topics, now=now
        )
        if counted:
            self.accept_counted(member, generation, counted)

    def ping_missed(self, member: Member) -> None:
        self.feed(self.group.deadline_missed, member.state, trio.current_time(), handover=False)

    # --- offsets ------------------------------------------------------------------------------

    def accept_counted(
        self, member: Member, generation: int, counted: dict[TopicPartition, int]
    ) -> None:
        """Record offsets the group counted, less those past the log end: a report cannot be
        refused as a commit is, so the offending partitions are dropped."""
        if not counted or self.registry.get(self.group_id) is not self:
            return
        log_end = self.context.log_end
        if log_end is not None and (beyond := validation.beyond_log_end(counted, log_end)):
            log.warning(
                "group %r: dropped offsets past the log end for %d partitions (%s: %d)",
                self.group_id,
                len(beyond),
                beyond[0],
                counted[beyond[0]],
            )
            for tp in beyond:
                del counted[tp]
        offsets = self.context.offsets
        # Read from the incarnation the group's assignment gave them under: the committer
        # writes them as that one's, and drops them if it is no longer in force.
        ids = self.group.topic_ids
        read_from = {tp.topic: ids[tp.topic] for tp in counted if tp.topic in ids}
        accepted = offsets.accept_nowait(
            self.group_id, generation, counted, monotonic=True, topic_ids=read_from
        )
        if accepted is None:
            # Not in memory (a member owns partitions only after a rebalance loaded them, and a
            # rebalance loads them before StopFetcher): load them in a task of their own.
            self.context.nursery.start_soon(
                functools.partial(
                    offsets.accept,
                    self.group_id,
                    generation,
                    counted,
                    monotonic=True,
                    topic_ids=read_from,
                )
            )
