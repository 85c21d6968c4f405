"""One consumer group on the coordinator, whole: its members, its rebalances, who owns what.

A group's rules are those of three machines (the group's, one per member, the ownership table)
and of what ties them together: which death frees what when, which join fences whom, which
offsets count. One object owns all of a group's state (the machines, the membership indexes, the
assignment in force, the record a successor recovered it from), so every rule that changes it is
in one place and can be tested with no network, as ``statemachine.consumer`` is on the
consumer's side. It offers the operations of the field: a member joins, its connection ends, it
leaves, a Ping is sent or answered or missed, a StopFetcher or StartFetcher is answered, an
attempt is planned, a report's offsets are counted. Each operation decides every transition
itself and returns what the trio driver (``coordinator/driver.py``) must do: close a connection,
tell a fenced process, cancel or schedule an attempt, wake an attempt waiting on leases. Nothing
here reads a clock, sends a byte or knows a task: ``now`` is passed in, the instant the driver
performs what the operation decides (a request's send time is the time it leaves).

An input a machine refuses raises before the operation changes that machine; the driver fails the
group then (docs/failure-domains.md), as any bug in the group's work.
"""

from __future__ import annotations

import enum
import math
from collections import defaultdict
from collections.abc import Iterable, Mapping

import attrs

from protocol import ErrorCode
from protocol.types import ConsumerThread, PartitionOffset, Subscription, TopicPartition
from protocol.versions import NEWEST, PeerVersions
from statemachine import group as group_sm
from statemachine import member as member_sm
from statemachine import ownership as ownership_sm
from statemachine.assignment import sticky_assign
from statemachine.records import GroupRecord, MemberRecord

Assignment = dict[TopicPartition, ConsumerThread]


@attrs.frozen(kw_only=True)
class GroupRules:
    """The coordinator's settings a group's decisions read."""

    max_missed: int = 1
    lease_margin: float = 0.5
    #: A forming group's wait for the crowd that joins with its first member, and its cap.
    initial_delay: float = 3.0
    initial_max_delay: float = 30.0
    #: After a failed attempt, this fraction of the longest session timeout.
    backoff_fraction: float = 1 / 3
    #: The incremental protocol (docs/design.md#rebalance); False: the seeds' eager one.
    incremental: bool = True
    #: Most members (live or away) and streams a group may have.
    max_members: int = 1000
    max_streams: int = 10_000


@attrs.define(eq=False)
class GroupMember:
    """One registered process. Its member id is its consumer id, or, for a static member, its
    instance id, which outlives the process (docs/design.md#static-members)."""

    record: MemberRecord
    machine: member_sm.MemberMachine
    #: This registration of the member id, in the ownership table: what it owns, and under which
    #: generation, is ``group.holding(member)``.
    incarnation: int
    #: The process's own id (RegisterConsumer's ``consumer_id``): its OffsetCommit and
    #: LeaveGroup name it.
    consumer_id: str
    #: What it reads of the coordinator's requests (SPEC.md §3, docs/design.md#old-clients).
    versions: PeerVersions = NEWEST
    #: Where it connected from, as DescribeGroup shows it.
    host: str = ""
    #: A newer process registered under its instance id: it is no longer in its group.
    fenced: bool = False

    @property
    def member_id(self) -> str:
        return self.record.member_id

    @property
    def static(self) -> bool:
        return self.record.instance_id is not None


@attrs.frozen(kw_only=True)
class Away:
    """A static member whose process ended without LeaveGroup: it stays in its group, its
    partitions assigned to it, until ``until`` (its session timeout after the departure), unless
    a process registers under its instance id first (docs/design.md#static-members)."""

    record: MemberRecord
    until: float
    #: What its last process held under the record's generation (or a recovered record gave it):
    #: all that generation may claim (docs/design.md#static-members).
    partitions: frozenset[TopicPartition] = frozenset()


class Ending(enum.Enum):
    """How a member's connection ended, as its connection task saw it."""

    #: The peer's own end of stream: it stopped fetching before it closed.
    CLOSED = "closed"
    #: A reset, or ended by this side: it may fetch on until its lease runs out.
    BROKEN = "broken"
    #: It broke the protocol and is being closed.
    VIOLATION = "violation"


_ENDINGS: dict[
    Ending,
    type[member_sm.ConnectionClosed | member_sm.ConnectionBroken | member_sm.ProtocolViolation],
] = {
    Ending.CLOSED: member_sm.ConnectionClosed,
    Ending.BROKEN: member_sm.ConnectionBroken,
    Ending.VIOLATION: member_sm.ProtocolViolation,
}


# --- effects ---------------------------------------------------------------------------------


@attrs.frozen(kw_only=True)
class CloseConnection:
    """End the member's connection: it is dead, or its group is rebuilt."""

    incarnation: int


@attrs.frozen(kw_only=True)
class TellFenced:
    """Send the fenced process its StopFetcher (reason FENCED_INSTANCE_ID) while in contact with
    the store, wait for its answer (``stop_answered``, everything), then close its connection."""

    incarnation: int


@attrs.frozen(kw_only=True)
class CancelAttempt:
    """Cancel the attempt in flight at once (docs/design.md#rebalance)."""


@attrs.frozen(kw_only=True)
class LeasesFreed:
    """A lease ended by its owner's word, or was adopted: an attempt waiting on leases looks
    again."""


@attrs.frozen(kw_only=True)
class AwayUntil:
    """Call ``away_ended(member_id, away)`` at ``away.until``."""

    member_id: str
    away: Away


@attrs.frozen(kw_only=True)
class MemberDied:
    """A member was declared dead (or left), before its group heard of it."""

    member_id: str
    cause: member_sm.DeathCause


@attrs.frozen(kw_only=True)
class GroupInput:
    """``event`` was fed to the group's machine (for whoever watches: metrics); a departure
    carries the death that caused it (None: a static member away past its session timeout)."""

    event: object
    death: member_sm.DeathCause | None = None


@attrs.frozen(kw_only=True)
class Retire:
    """The group holds nothing worth remembering: forget it and end its driver."""


@attrs.frozen
class Note:
    """A line for the log, at info level: ``message % args``."""

    message: str
    args: tuple[object, ...] = ()


Effect = (
    CloseConnection
    | TellFenced
    | CancelAttempt
    | LeasesFreed
    | AwayUntil
    | MemberDied
    | GroupInput
    | Retire
    | Note
)


# --- what an attempt asks ----------------------------------------------------------------------


@attrs.frozen(kw_only=True)
class Change:
    """What an attempt asks of one member: stop ``revoked`` (None: everything, the eager
    protocol; empty: no StopFetcher), then, if ``start``, a StartFetcher for ``target``."""

    target: frozenset[TopicPartition]
    revoked: frozenset[TopicPartition] | None
    start: bool


@attrs.frozen(kw_only=True)
class AttemptPlan:
    """An attempt under a new generation: the members it began with, in order, and what it asks
    of each."""

    generation: int
    assignment: Mapping[TopicPartition, ConsumerThread]
    members: tuple[GroupMember, ...]
    changes: Mapping[GroupMember, Change]


@attrs.frozen(kw_only=True)
class StopOrder:
    """A StopFetcher to send now: ``partitions`` None stops everything."""

    member: GroupMember
    generation: int
    partitions: tuple[TopicPartition, ...] | None


@attrs.frozen(kw_only=True)
class MemberStatistics:
    member_id: str
    client_id: str
    session_timeout_ms: int
    subscription: Subscription
    partitions: tuple[TopicPartition, ...]
    host: str = ""
    #: A static member whose process ended, still in its group (docs/design.md#static-members).
    away: bool = False
    #: Named by the recovered record, not back yet, its partitions perhaps still fetched.
    awaiting: bool = False


@attrs.frozen(kw_only=True)
class GroupStatistics:
    """One view of a group at an instant, for DescribeGroup, the metrics and the status page."""

    group_id: str
    #: As ListGroups and DescribeGroup name it (AwaitingMembers for a recovered group waiting).
    state: str
    #: The group machine's own state, as the metrics count groups by it.
    machine_state: str
    generation: int
    #: Live members, then the awaited ones, then those away, each by member id.
    members: tuple[MemberStatistics, ...]


#: How DescribeGroup names a group a new coordinator recovered from its record while none of the
#: members the record names has come back yet: never Empty, since they may still be fetching
#: under their leases (docs/design.md#adoption-after-a-failover).
AWAITING_MEMBERS = "AwaitingMembers"


def _first(item: tuple[tuple[str, int], object]) -> tuple[str, int]:
    return item[0]


def topic_partition_key(tp: TopicPartition) -> tuple[str, int]:
    """Sorting by plain tuples: attrs' generated ordering costs microseconds per comparison."""
    return tp.topic, tp.partition


@attrs.define(eq=False)
class ConsumerGroup:
    group_id: str
    rules: GroupRules
    machine: group_sm.GroupMachine
    #: The latest instant the group had a member (a registration, a departure; its creation in
    #: this coordinator): it is removed ``group_retention`` after this once it has none
    #: (docs/design.md#group-retention).
    last_member_at: float
    members: dict[str, GroupMember] = attrs.field(factory=dict)
    #: Static members away, by member id: subscribers of the assignment with no process.
    away: dict[str, Away] = attrs.field(factory=dict)
    #: Live static members by their process's consumer id (``members`` is by instance id).
    processes: dict[str, GroupMember] = attrs.field(factory=dict)
    #: Processes fenced by a newer one under their instance id, by consumer id (oldest first,
    #: bounded by ``rules.max_members``): what they ask afterwards is answered
    #: FENCED_INSTANCE_ID.
    fenced: dict[str, str] = attrs.field(factory=dict)
    #: The intended assignment of the latest attempt that reached its start phase.
    assignment: Assignment = attrs.field(factory=dict)
    #: Who may fetch each partition, and from when a partition is free.
    ownership: ownership_sm.Ownership = attrs.field(factory=ownership_sm.Ownership)
    #: When the next rebalance attempt is due (None: none is due).
    next_attempt_at: float | None = None
    #: While the group forms (statemachine.group's ``forming``): joins postpone its first attempt
    #: up to this instant, set by the join that ended Empty.
    forming_until: float = math.inf
    #: The store record a new coordinator recovered the group from, until the group's first
    #: attempt decides whether its members came back as it says, and the instant its lease,
    #: counted from the recovery, is over.
    recovered: GroupRecord | None = None
    recovered_until: float = -math.inf
    #: The highest generation a registering member said it had: after a failover, a previous
    #: coordinator may have begun attempts that it never persisted, and generations must still
    #: only increase.
    highest_reported_generation: int = -1
    attempts: int = 0
    completed: int = 0
    #: The members' streams together, away ones included: kept by ``_counted_in`` and
    #: ``_counted_out`` alone.
    _streams: int = 0

    @classmethod
    def new(
        cls, group_id: str, rules: GroupRules, *, now: float, generation: int = 0
    ) -> ConsumerGroup:
        machine = group_sm.GroupMachine(group_id=group_id, generation=generation)
        return cls(group_id=group_id, rules=rules, machine=machine, last_member_at=now)

    # --- queries ----------------------------------------------------------------------------

    @property
    def streams(self) -> int:
        return self._streams

    @property
    def state(self) -> group_sm.GroupState:
        return self.machine.state

    @property
    def generation(self) -> int:
        return self.machine.generation

    def holding(self, member: GroupMember) -> ownership_sm.Holding:
        return self.ownership.holding(member.incarnation)

    def member_of(self, consumer_id: str) -> GroupMember | None:
        """The live member whose process is ``consumer_id``."""
        member = self.members.get(consumer_id)
        if member is not None and member.consumer_id == consumer_id:
            return member
        return self.processes.get(consumer_id)

    def is_member(self, member: GroupMember) -> bool:
        return self.members.get(member.member_id) is member

    def longest_session_timeout(self) -> float:
        return max((m.machine.timeouts.session_timeout for m in self.members.values()), default=0.0)

    def deletable(self, now: float) -> bool:
        return not self.members and not self.away and not self.ownership.under_lease(now)

    def admin_refusal(self, now: float) -> ErrorCode:
        """Why a standalone commit (a reset) or a DeleteGroup may not touch the group now: it has
        members (NON_EMPTY_GROUP), or a partition of it is under a lease, a member that died
        silently or one a failover awaits may still be fetching it (REBALANCE_IN_PROGRESS,
        retriable once the lease has run out). Such a member comes back with the partitions it
        holds, and its next report would undo a reset
        (docs/failure-domains.md#admin-operations-never-cut-a-lease-short)."""
        if self.members or self.away:
            return ErrorCode.NON_EMPTY_GROUP
        if not self.deletable(now):
            return ErrorCode.REBALANCE_IN_PROGRESS
        return ErrorCode.NONE

    def idle_since(self, now: float) -> float | None:
        """The instant the group's retention counts from; None while it may not be removed."""
        return self.last_member_at if self.deletable(now) else None

    def awaiting(self, now: float) -> list[MemberRecord]:
        """The members of the group's recovered record that have not come back yet, while their
        partitions may still be under their leases."""
        record, names = self.recovered, self.machine.awaiting
        if record is None or not names or not self.ownership.under_lease(now):
            return []
        return sorted(
            (m for m in record.members if m.member_id in names and m.member_id not in self.members),
            key=lambda m: m.member_id,
        )

    def shown_state(self, now: float) -> str:
        """The group's state as ListGroups and DescribeGroup name it: the machine's, except that a
        recovered group none of whose awaited members is back yet is AwaitingMembers."""
        if not self.members and self.awaiting(now):
            return AWAITING_MEMBERS
        return self.machine.state.value

    def statistics(self, now: float) -> GroupStatistics:
        live = [
            MemberStatistics(
                member_id=m.member_id,
                client_id=m.record.client_id,
                session_timeout_ms=m.record.session_timeout_ms,
                subscription=m.record.subscription,
                partitions=tuple(sorted(self.holding(m).partitions, key=topic_partition_key)),
                host=m.host,
            )
            for m in sorted(self.members.values(), key=lambda m: m.member_id)
        ]
        awaiting = self.awaiting(now)
        given: dict[str, list[TopicPartition]] = {}
        if awaiting and self.recovered is not None:
            for tp, thread in sorted(self.recovered.assignment.items()):
                given.setdefault(thread.member_id, []).append(tp)
        awaited = [
            MemberStatistics(
                member_id=m.member_id,
                client_id=m.client_id,
                session_timeout_ms=m.session_timeout_ms,
                subscription=m.subscription,
                partitions=tuple(given.get(m.member_id, ())),
                awaiting=True,
            )
            for m in awaiting
        ]
        away = [
            MemberStatistics(
                member_id=member_id,
                client_id=a.record.client_id,
                session_timeout_ms=a.record.session_timeout_ms,
                subscription=a.record.subscription,
                partitions=(),
                away=True,
            )
            for member_id, a in sorted(self.away.items())
        ]
        return GroupStatistics(
            group_id=self.group_id,
            state=self.shown_state(now),
            machine_state=self.machine.state.value,
            generation=self.machine.generation,
            members=(*live, *awaited, *away),
        )

    # --- registration -------------------------------------------------------------------------

    def registration_refusal(
        self, *, consumer_id: str, instance_id: str | None, streams: int
    ) -> ErrorCode:
        """Whether a process may register: the ids it names may join
        (docs/design.md#static-members), and the group stays within its size. A process a newer
        one fenced may not come back; a dynamic member may not take a static member's id, nor a
        static member a dynamic one's; the same process may not register twice (it gave up a
        connection the coordinator has not seen end yet: it retries)."""
        if consumer_id in self.fenced:
            return ErrorCode.FENCED_INSTANCE_ID
        members, total = len(self.members) + len(self.away), self._streams
        if instance_id is None:
            existing = self.members.get(consumer_id)
            if consumer_id in self.away or (existing is not None and existing.static):
                return ErrorCode.INVALID_REQUEST
            if existing is not None:
                return ErrorCode.DUPLICATE_MEMBER_ID
        else:
            existing = self.members.get(instance_id)
            if existing is not None and not existing.static:
                return ErrorCode.INVALID_REQUEST
            if existing is not None and existing.consumer_id == consumer_id:
                return ErrorCode.DUPLICATE_MEMBER_ID
            # A process of a static member takes the place of the one it fences or of the
            # member away: the group does not grow.
            was = existing.record if existing is not None else None
            if (away := self.away.get(instance_id)) is not None:
                was = away.record
            if was is not None:
                members -= 1
                total -= was.subscription.stream_count
        if members >= self.rules.max_members or total + streams > self.rules.max_streams:
            return ErrorCode.GROUP_MAX_SIZE_REACHED
        return ErrorCode.NONE

    def join(
        self,
        record: MemberRecord,
        *,
        consumer_id: str,
        incarnation: int,
        reported_generation: int,
        holding: tuple[TopicPartition, ...],
        now: float,
        versions: PeerVersions = NEWEST,
        host: str = "",
    ) -> tuple[GroupMember, list[Effect]]:
        """Add the member (its registration passed :meth:`registration_refusal`) and let the
        group rebalance (docs/design.md#generations-and-fencing); a newer process of a live
        static member fences the older one."""
        timeouts = member_sm.MemberTimeouts(
            session_timeout=record.session_timeout_ms / 1000,
            max_missed=self.rules.max_missed,
            lease_margin=self.rules.lease_margin,
            follows_lease=versions.follows_lease,
        )
        member = GroupMember(
            record=record,
            machine=member_sm.MemberMachine(
                member_id=record.member_id, timeouts=timeouts, last_heard=now
            ),
            incarnation=incarnation,
            consumer_id=consumer_id,
            versions=versions,
            host=host,
        )
        effects: list[Effect] = []
        replaced = self.members.get(member.member_id)
        if replaced is not None:
            effects += self._fence(replaced, now)
        if (away := self.away.pop(member.member_id, None)) is not None:
            self._streams -= away.record.subscription.stream_count
            effects.append(Note("group %s: %s is back", (self.group_id, member.member_id)))
        self.members[member.member_id] = member
        self.last_member_at = now
        if member.static:
            self.processes[consumer_id] = member
        self._streams += record.subscription.stream_count
        self.highest_reported_generation = max(
            self.highest_reported_generation, reported_generation
        )
        if versions != NEWEST:
            joined = Note(
                "group %s: %s joined, reading %s", (self.group_id, member.member_id, versions.level)
            )
        else:
            joined = Note("group %s: %s joined", (self.group_id, member.member_id))
        effects.append(joined)
        effects += self._adopt(member, reported_generation, holding, now)
        if replaced is not None:
            effects += self._group_input(group_sm.MemberReplaced(member_id=member.member_id), now)
        else:
            effects += self._group_input(group_sm.MemberJoined(member_id=member.member_id), now)
        return member, effects

    def _fence(self, older: GroupMember, now: float) -> list[Effect]:
        """A newer process registered under ``older``'s instance id: the older one is no longer
        the member. Telling it (StopFetcher, reason FENCED_INSTANCE_ID) proves nothing if it is
        paused, so what it holds stays leased to it until its answer, its clean close or its
        lease end, counted from that StopFetcher; only then may the newer process start it
        (docs/design.md#static-members)."""
        del self.members[older.member_id]
        self.processes.pop(older.consumer_id, None)
        self._streams -= older.record.subscription.stream_count
        older.fenced = True
        self.fenced[older.consumer_id] = older.member_id
        while len(self.fenced) > self.rules.max_members:
            del self.fenced[next(iter(self.fenced))]
        (death,) = older.machine.handle(member_sm.Fenced(now=now))
        died = ownership_sm.OwnerDied(
            incarnation=older.incarnation, until=death.partitions_free_at, now=now
        )
        effects = self._own(died)
        effects.append(
            Note(
                "group %s: a newer process fenced %s (process %s); its partitions are free at "
                "%.3f at the latest",
                (self.group_id, older.member_id, older.consumer_id, death.partitions_free_at),
            )
        )
        effects.append(TellFenced(incarnation=older.incarnation))
        return effects

    def _adopt(
        self,
        member: GroupMember,
        generation: int,
        holding: tuple[TopicPartition, ...],
        now: float,
    ) -> list[Effect]:
        """A partition under a lease waits until its owner surely stopped
        (docs/design.md#adoption-after-a-failover); the owner itself can say so sooner. A member
        that registers under the generation of its lease is the process that held it (a
        coordinator has one member per id in a generation): partitions it no longer fetches are
        free now, and those it still fetches are its own (their offsets count) until its
        StopFetcher answer frees them, or its death starts a lease again. So after a failover a
        new coordinator waits only for owners that have not re-registered, and a member whose
        connection broke under it frees its partitions when it comes back. Any other generation
        (a new process under an old id, an attempt that was never persisted) proves nothing, and
        the lease stands."""
        registered = ownership_sm.OwnerRegistered(
            owner=member.member_id,
            incarnation=member.incarnation,
            generation=generation,
            holding=holding,
            now=now,
        )
        outcome = self.ownership.handle(registered)
        if not outcome:
            return []
        held = sum(len(e.partitions) for e in outcome if isinstance(e, ownership_sm.LeaseAdopted))
        freed = sum(len(e.partitions) for e in outcome if isinstance(e, ownership_sm.LeaseEnded))
        return [
            LeasesFreed(),
            Note(
                "group %s: %s came back under generation %d; adopted %d leased partitions, "
                "freed %d",
                (self.group_id, member.member_id, generation, held, freed),
            ),
        ]

    def fenced_closed(self, older: GroupMember, now: float) -> list[Effect]:
        """A fenced process closed its connection cleanly (end of stream): it stopped fetching
        first (docs/design.md#ownership-lease), so its partitions are free now."""
        if not older.fenced:
            return []
        return self._own(ownership_sm.OwnerClosed(incarnation=older.incarnation, now=now))

    # --- failure detection and departures ----------------------------------------------------

    def connection_ended(self, member: GroupMember, ending: Ending, now: float) -> list[Effect]:
        """The member's connection task ended: a fenced process's clean close frees what it
        held; a live member dies, as the ending says."""
        if member.machine.alive:
            return self._member_input(member, _ENDINGS[ending](now=now), now)
        if ending is Ending.CLOSED:
            return self.fenced_closed(member, now)
        return []

    def left(self, member: GroupMember, now: float) -> list[Effect]:
        """LeaveGroup: a graceful close after the member stopped its fetchers and committed. One
        that reaches a member declared dead since it arrived (its last Ping deadline passed in
        the same instant) changes nothing: its death has decided, and its connection is closing.
        The machine refuses ``Left`` in Dead, and a refusal here would fail the whole group for
        one peer's request."""
        if not member.machine.alive:
            return []
        return self._member_input(member, member_sm.Left(now=now), now)

    def ping_sent(self, member: GroupMember, now: float) -> list[Effect]:
        """A Ping is about to leave now. A member whose lease ran out stopped by its own rule; a
        Ping would restart it, so it is dead instead (docs/design.md#ownership-lease)."""
        return self._member_input(member, member_sm.PingSent(now=now), now)

    def ping_withheld(self, member: GroupMember) -> list[Effect]:
        """A Ping was held back: this coordinator is out of contact with its store, perhaps
        deposed, and renews no lease. A member that keeps no lease would fetch on while a
        successor counts its lease from taking office: its connection ends now, which it stops
        at (docs/design.md#old-clients)."""
        if member.machine.timeouts.follows_lease:
            return []
        return [CloseConnection(incarnation=member.incarnation)]

    def ping_answered(
        self,
        member: GroupMember,
        generation: int,
        offsets: Iterable[PartitionOffset],
        *,
        topics: Mapping[str, object],
        now: float,
    ) -> dict[TopicPartition, int]:
        """The member answered a Ping sent under ``generation``: it is heard from, and the
        offsets its answer reports count as :meth:`counted_offsets` says (returned)."""
        machine = member.machine
        if not machine.alive:
            return {}
        machine.handle(member_sm.PingAnswered(now=now))
        if not offsets:
            return {}
        return self.counted_offsets(member, generation, offsets, topics=topics)

    def deadline_missed(self, member: GroupMember, now: float, *, handover: bool) -> list[Effect]:
        """A Ping (or, ``handover``, a StopFetcher or StartFetcher) went unanswered for 2/3 of
        the session timeout: a miss, which may declare the member dead."""
        if not member.machine.alive:
            return []
        return self._member_input(member, member_sm.DeadlineMissed(now=now, handover=handover), now)

    def handover_refused(self, member: GroupMember, now: float) -> list[Effect]:
        """A StopFetcher or StartFetcher answered with an error (or with something else) counts
        as a miss: a member that refuses every time is dead after its allowed misses (its lease
        honoured, since whether it stopped is unknown)."""
        if not member.machine.alive:
            return []
        return self._member_input(member, member_sm.HandoverRefused(now=now), now)

    def _member_input(self, member: GroupMember, event: object, now: float) -> list[Effect]:
        """Feed a failure-path input to the member's machine; if it declares the member dead,
        handle its failure (docs/design.md#failure-detection): close its connection, remove it,
        cancel an attempt in flight, rebalance what is left."""
        deaths = member.machine.handle(event)
        if not deaths and member.machine.alive:  # the common case: a Ping that renews nothing
            return []
        effects: list[Effect] = []
        if not member.machine.alive and not member.fenced:
            effects.append(CloseConnection(incarnation=member.incarnation))
        if not deaths or not self.is_member(member):
            return effects
        (death,) = deaths
        effects.append(MemberDied(member_id=member.member_id, cause=death.cause))
        holding = self.holding(member)
        del self.members[member.member_id]
        self.processes.pop(member.consumer_id, None)
        died = ownership_sm.OwnerDied(
            incarnation=member.incarnation, until=death.partitions_free_at, now=now
        )
        effects += self._own(died)
        if member.static and death.cause is not member_sm.DeathCause.LEFT:
            # No rebalance: its partitions wait for a restart within T
            # (docs/design.md#static-members). Its record keeps its own generation, under which
            # a successor claims its partitions.
            record = attrs.evolve(member.record, generation=holding.generation)
            away = self._set_away(record, since=now, partitions=holding.partitions)
            effects.append(AwayUntil(member_id=member.member_id, away=away))
            effects.append(
                Note(
                    "group %s: %s's process ended (%s); away until %.3f, its partitions free at "
                    "%.3f",
                    (
                        self.group_id,
                        member.member_id,
                        death.cause.value,
                        away.until,
                        death.partitions_free_at,
                    ),
                )
            )
            effects += self._group_input(group_sm.MemberAway(member_id=member.member_id), now)
            return effects
        self._streams -= member.record.subscription.stream_count
        effects.append(
            Note(
                "group %s: %s is dead (%s); its partitions are free at %.3f",
                (self.group_id, member.member_id, death.cause.value, death.partitions_free_at),
            )
        )
        effects += self._departed(member.member_id, now, death.cause)
        return effects

    def _set_away(
        self,
        record: MemberRecord,
        *,
        since: float,
        partitions: frozenset[TopicPartition] = frozenset(),
    ) -> Away:
        away = self.away[record.member_id] = Away(
            record=record, until=since + record.session_timeout_ms / 1000, partitions=partitions
        )
        return away

    def away_ended(self, member_id: str, away: Away, now: float) -> list[Effect]:
        """A static member away for its session timeout departs, and its group rebalances;
        nothing if it came back since."""
        if self.away.get(member_id) is not away:
            return []
        del self.away[member_id]
        self._streams -= away.record.subscription.stream_count
        effects: list[Effect] = [
            Note("group %s: %s stayed away for its session timeout", (self.group_id, member_id))
        ]
        return effects + self._departed(member_id, now)

    def _departed(
        self, member_id: str, now: float, death: member_sm.DeathCause | None = None
    ) -> list[Effect]:
        self.last_member_at = now
        remaining = len(self.members) + len(self.away)
        departed = group_sm.MemberDeparted(member_id=member_id, remaining=remaining)
        return self._group_input(departed, now, death)

    # --- offsets ------------------------------------------------------------------------------

    def counted_offsets(
        self,
        member: GroupMember,
        generation: int,
        offsets: Iterable[PartitionOffset],
        *,
        topics: Mapping[str, object],
        final: bool = False,
    ) -> dict[TopicPartition, int]:
        """The offsets of a Ping response (or, ``final``, of a StopFetcher answer) that count:
        for partitions the member holds, given to it at or before the report's generation, which
        is not past its own (SPEC.md §11.8), and only while it is a member, or in its final
        report for what it stopped, accepted even if it left right after
        (docs/design.md#generations-and-fencing). A deleted topic's partitions (not in
        ``topics``) count for nothing, though held until the rebalance."""
        if not final and not member.machine.alive:
            return {}
        owned = self.holding(member).counted_under(generation)
        if not owned:
            return {}
        return {
            po.topic_partition: po.offset
            for po in offsets
            if po.topic_partition in owned and po.topic in topics
        }

    def commit_refusal(
        self, member: GroupMember | None, generation: int, partitions: Iterable[TopicPartition]
    ) -> ErrorCode:
        """An OffsetCommit by ``member`` (None: no live member of this group sent it) counts
        only for partitions it holds, given at or before the commit's generation, which is not
        past its own (SPEC.md §11.8; docs/design.md#generations-and-fencing)."""
        if member is None or not self.is_member(member):
            return ErrorCode.UNKNOWN_MEMBER_ID
        holding = self.holding(member)
        if generation > holding.generation or not set(partitions) <= holding.counted_under(
            generation
        ):
            return ErrorCode.ILLEGAL_GENERATION
        return ErrorCode.NONE

    # --- group lifecycle -------------------------------------------------------------------------

    def topics_changed(self, changed: Iterable[str], now: float) -> list[Effect]:
        """A subscribed topic appeared, gained partitions or was deleted
        (docs/design.md#rebalance-triggers)."""
        changed = list(changed)
        if not any(
            m.record.subscription.streams_for(name) > 0
            for m in self.members.values()
            for name in changed
        ):
            return []
        return self._group_input(group_sm.TopicsChanged(), now)

    def recover(
        self,
        record: GroupRecord | None,
        *,
        since: float,
        claims: Iterable[ownership_sm.Claim] = (),
        longest: float = 0.0,
        awaiting: bool = False,
    ) -> list[Effect]:
        """The group as a coordinator that knows none of its members finds it. The record's
        assignment stays the sticky assignor's starting point, so owners that re-register get
        their partitions back. Every partition of the record, and of each of ``claims``, waits
        until ``since`` plus the longest session timeout (of the record's members, or
        ``longest``) plus the margin (or the claim's own instant, if later), unless its owner
        re-registers under that generation first. ``awaiting``: a new coordinator recovered it
        from the store, and it waits for the members the record names, at most until their
        lease counted from ``since`` is over, and then decides once
        (docs/design.md#adoption-after-a-failover)."""
        claims = list(claims)
        effects: list[Effect] = []
        if record is not None:
            self.assignment = dict(record.assignment)
            owners: dict[str, set[TopicPartition]] = {}
            for tp, thread in record.assignment.items():
                owners.setdefault(thread.member_id, set()).add(tp)
            # Each under the member's own generation: under the incremental protocol, one the
            # record's rebalance did not start kept its older one (-1: a record from before
            # members had their own names only the group's).
            own = {m.member_id: m.generation for m in record.members if m.generation >= 0}
            claims += [
                ownership_sm.Claim(
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
                    away = self._set_away(member, since=since, partitions=given)
                    self._streams += member.subscription.stream_count
                    effects.append(AwayUntil(member_id=member.member_id, away=away))
        recovered = ownership_sm.Recovered(
            claims=tuple(claims),
            since=since,
            longest_session=longest,
            margin=self.rules.lease_margin,
        )
        effects += self._own(recovered)
        if awaiting and record is not None:
            self.recovered = record
            self.recovered_until = (
                since
                + self.rules.lease_margin
                + max((m.session_timeout_ms / 1000 for m in record.members), default=0.0)
            )
            names = frozenset(m.member_id for m in record.members)
            effects += self._group_input(group_sm.Recovered(awaiting=names), since)
        return effects

    def abandon(self, now: float) -> list[Effect]:
        """The group failed: nothing it kept can be trusted, and a rebuild from its record
        replaces it. Its members are dead to the Ping scheduler and to offset fencing at once
        (what their deaths would free the rebuild counts from the failure, with
        ``ownership.carryover``), and their connections close."""
        members = list(self.members.values())
        self.members.clear()
        self.processes.clear()
        self._streams = 0
        self.next_attempt_at = None
        effects: list[Effect] = []
        for member in members:
            if member.machine.alive:
                member.machine.handle(member_sm.ConnectionBroken(now=now))
            effects.append(CloseConnection(incarnation=member.incarnation))
        return effects

    def deleted(self, now: float) -> list[Effect]:
        """DeleteGroup, or its retention ran out: the group's driver ends."""
        return [*self._group_input(group_sm.Deleted(), now), Retire()]

    # --- the machine's schedule -----------------------------------------------------------------

    def _group_input(
        self, event: object, now: float, death: member_sm.DeathCause | None = None
    ) -> list[Effect]:
        """Feed the group's machine and turn its effects into the next attempt's instant."""
        effects: list[Effect] = []
        for decided in self.machine.handle(event):
            if isinstance(decided, group_sm.CancelAttempt):
                effects.append(CancelAttempt())
                continue
            current = self.next_attempt_at
            if decided.delay is group_sm.Delay.INITIAL:
                self.forming_until = now + self.rules.initial_max_delay
            if decided.delay is group_sm.Delay.INITIAL_AGAIN:
                # A join into a forming group postpones its first attempt, up to the cap.
                due = min(now + self.rules.initial_delay, self.forming_until)
                self.next_attempt_at = due if current is None else max(current, due)
            else:
                due = now + self._delay(decided.delay)
                if decided.delay is group_sm.Delay.RECOVERY:
                    due = max(now, self.recovered_until)
                self.next_attempt_at = due if current is None else min(current, due)
        if self.machine.state is group_sm.GroupState.EMPTY:
            self.next_attempt_at = None
        effects.append(GroupInput(event=event, death=death))
        if (
            self.machine.state is group_sm.GroupState.EMPTY
            and self.machine.generation == 0
            and self.deletable(now)
        ):
            # Emptied before any attempt began: no generation was ever handed out or stored,
            # so nothing about it needs remembering, and a client that registers and leaves
            # under ever new group ids must not grow the broker's memory.
            effects.append(Retire())
        return effects

    def _delay(self, delay: group_sm.Delay) -> float:
        if delay is group_sm.Delay.INITIAL:
            return self.rules.initial_delay
        if delay is group_sm.Delay.BACKOFF:
            return self.rules.backoff_fraction * self.longest_session_timeout()
        return 0.0

    def _own(self, event: ownership_sm.Event) -> list[Effect]:
        """Feed the ownership table: a lease its owner ended or adopted wakes an attempt waiting
        on leases."""
        return [LeasesFreed()] if self.ownership.handle(event) else []

    # --- rebalance attempts -----------------------------------------------------------------------

    def attempt_due(self) -> None:
        """The driver takes the due attempt: none is due until an input schedules one."""
        self.next_attempt_at = None

    def compute_assignment(self, partition_counts: Mapping[str, int]) -> Assignment:
        subscriptions = {m.member_id: m.record.subscription for m in self.members.values()}
        # A static member away keeps its partitions, unowned: docs/design.md#static-members.
        subscriptions.update(
            (member_id, a.record.subscription) for member_id, a in self.away.items()
        )
        counts = {
            topic: count
            for topic, count in partition_counts.items()
            if any(sub.streams_for(topic) > 0 for sub in subscriptions.values())
        }
        return sticky_assign(subscriptions, counts, self.assignment)

    def plan_attempt(
        self, partition_counts: Mapping[str, int], now: float
    ) -> tuple[AttemptPlan | None, list[Effect]]:
        """Begin the pending rebalance: adopt a recovered record whole, find none needed, or
        take a new generation and say what to ask of each member (None: no attempt follows)."""
        members = tuple(self.members.values())
        assignment = self.compute_assignment(partition_counts)
        recovered, self.recovered = self.recovered, None
        if recovered is not None and self._adoptable(recovered, members, assignment):
            for member in members:
                member.machine.handle(member_sm.Adopted(generation=self.holding(member).generation))
            effects = self._group_input(group_sm.RecordAdopted(), now)
            effects.append(
                Note(
                    "group %s: every member came back as its record says; stable at generation %d",
                    (self.group_id, recovered.generation),
                )
            )
            return None, effects
        changes = self._changes(members, assignment)
        if self.rules.incremental:
            needed = any(change.start or change.revoked for change in changes.values())
        else:
            settled = all(
                m.machine.state is member_sm.MemberState.STABLE
                and self.holding(m).generation == self.machine.generation
                for m in members
            )
            needed = not settled or assignment != self.assignment
        if not needed:
            return None, self._group_input(group_sm.AttemptNotNeeded(), now)
        generation = max(self.machine.generation, self.highest_reported_generation) + 1
        effects = self._group_input(group_sm.AttemptBegan(generation=generation), now)
        self.attempts += 1
        effects.append(
            Note(
                "group %s: rebalance attempt, generation %d, %d members",
                (self.group_id, generation, len(members)),
            )
        )
        plan = AttemptPlan(
            generation=generation, assignment=assignment, members=members, changes=changes
        )
        return plan, effects

    def _changes(
        self, members: tuple[GroupMember, ...], assignment: Assignment
    ) -> dict[GroupMember, Change]:
        """Eager: stop everyone, start everyone. Incremental: a live member stops what it holds
        outside its target, and is started if it gains a partition, if a partition it keeps moves
        to another of its streams, or if it is not Stable (new, or left Stopping or Starting by a
        failed attempt, so it may not fetch what it is meant to); the others are left alone: no
        request, no new generation (docs/design.md#rebalance)."""
        targets: dict[str, set[TopicPartition]] = defaultdict(set)
        for tp, thread in assignment.items():
            targets[thread.member_id].add(tp)
        previous = self.assignment
        changes: dict[GroupMember, Change] = {}
        for member in members:
            if not member.machine.alive:
                continue
            target = frozenset(targets.get(member.member_id, ()))
            if not self.rules.incremental:
                changes[member] = Change(target=target, revoked=None, start=True)
                continue
            held = self.holding(member).partitions
            kept = held & target
            start = (
                member.machine.state is not member_sm.MemberState.STABLE
                or len(kept) != len(target)
                or any(
                    (old := previous.get(tp)) is not (new := assignment[tp]) and old != new
                    for tp in kept
                )
            )
            if not member.versions.incremental and (start or held - target):
                # It cannot read a partial stop or an incremental start: stopped and started
                # whole, the eager protocol for it alone (docs/design.md#old-clients).
                changes[member] = Change(target=target, revoked=None, start=True)
                continue
            changes[member] = Change(target=target, revoked=held - target, start=start)
        return changes

    def _adoptable(
        self, record: GroupRecord, members: tuple[GroupMember, ...], assignment: Assignment
    ) -> bool:
        """Whether the recovered group may go on as its record says, with no new generation: the
        record is complete (every start under it was answered), its members are exactly the live
        ones (with the same subscriptions and session timeouts, which a successor's lease count
        reads from it), the assignment computed now is the record's, and each member came back
        under its own generation by the record holding, adopted, exactly its partitions of the
        record (so a record that gave a member nothing is never adopted)."""
        if not record.complete or self.machine.generation != record.generation:
            return False
        recorded = {r.member_id: r for r in record.members}
        if len(members) != len(record.members) or any(
            m.member_id not in recorded
            or attrs.evolve(recorded[m.member_id], generation=m.record.generation) != m.record
            for m in members
        ):
            return False
        if assignment != dict(record.assignment):
            return False
        given: dict[str, set[TopicPartition]] = defaultdict(set)
        for tp, thread in record.assignment.items():
            given[thread.member_id].add(tp)
        for member in members:
            holding = self.holding(member)
            if member.machine.state is not member_sm.MemberState.REGISTERED:
                return False
            # A member given nothing holds nothing whether it still runs under that start or has
            # stopped (its lease ran out) and waits for one: only a start tells it which, so such
            # a group rebalances.
            mine = given.get(member.member_id)
            mine_record = recorded[member.member_id]
            own = mine_record.generation if mine_record.generation >= 0 else record.generation
            if not mine or holding.partitions != mine or holding.generation != own:
                return False
        return True

    def stops_sent(self, plan: AttemptPlan, now: float) -> list[StopOrder]:
        """The StopFetchers of the attempt, leaving now: to each live member with something to
        stop (every member, eager)."""
        orders: list[StopOrder] = []
        for member, change in plan.changes.items():
            if not member.machine.alive or (change.revoked is not None and not change.revoked):
                continue
            member.machine.handle(
                member_sm.StopFetcherSent(
                    generation=plan.generation, now=now, start_follows=change.start
                )
            )
            partitions = (
                None
                if change.revoked is None
                else tuple(sorted(change.revoked, key=topic_partition_key))
            )
            orders.append(
                StopOrder(member=member, generation=plan.generation, partitions=partitions)
            )
        return orders

    def stop_answered(
        self,
        member: GroupMember,
        offsets: Iterable[PartitionOffset],
        *,
        revoked: frozenset[TopicPartition] | None,
        attempt_live: bool,
        topics: Mapping[str, object],
        now: float,
    ) -> tuple[dict[TopicPartition, int], list[Effect]]:
        """The member answered StopFetcher: its final report for the partitions it stopped
        counts (returned), even if it left or the attempt was cancelled since it answered; then
        it fetches none of them, so no lease need hold them any longer (one adopted after a
        failover)."""
        if member.machine.alive and attempt_live:
            member.machine.handle(member_sm.StopFetcherAnswered(now=now))
        counted = self.counted_offsets(
            member, self.holding(member).generation, offsets, topics=topics, final=True
        )
        answered = ownership_sm.StopAnswered(
            incarnation=member.incarnation, now=now, partitions=revoked
        )
        return counted, self._own(answered)

    def members_stopped(self, now: float) -> list[Effect]:
        return self._group_input(group_sm.MembersStopped(), now)

    def starting(self, plan: AttemptPlan) -> dict[GroupMember, frozenset[TopicPartition]]:
        """The members the attempt starts, each with its whole new assignment."""
        return {
            member: change.target
            for member, change in plan.changes.items()
            if change.start and member.machine.alive
        }

    def gained(
        self, starting: Mapping[GroupMember, frozenset[TopicPartition]]
    ) -> set[TopicPartition]:
        """What the starts add: only that waits on leases, a member keeps what it holds."""
        gained: set[TopicPartition] = set()
        for member, target in starting.items():
            gained.update(target - self.holding(member).partitions)
        return gained

    def record(
        self, plan: AttemptPlan, starting: Mapping[GroupMember, frozenset[TopicPartition]]
    ) -> GroupRecord:
        """The record to persist before the starts: each member under its own generation after
        this attempt, the new one for those it starts, its own for those it leaves alone."""
        return GroupRecord(
            group_id=self.group_id,
            generation=plan.generation,
            members=(
                *(
                    attrs.evolve(
                        m.record,
                        generation=plan.generation if m in starting else self.holding(m).generation,
                    )
                    for m in plan.members
                ),
                *self._away_records(plan),
            ),
            assignment=plan.assignment,
        )

    def _away_records(self, plan: AttemptPlan) -> tuple[MemberRecord, ...]:
        """The away members' records. A record's claim under a member's own generation is one
        its next process may free at once by registering under it without those partitions
        (docs/design.md#adoption-after-a-failover), so it may name only what the member's last
        process held: an away member given more than that (the partitions of members that
        departed, whose leases may still run) is recorded under this attempt's generation, which
        no process of it ever held, and a successor waits out its lease on them."""
        if not self.away:
            return ()
        given: dict[str, set[TopicPartition]] = {member_id: set() for member_id in self.away}
        for tp, thread in plan.assignment.items():
            if (mine := given.get(thread.member_id)) is not None:
                mine.add(tp)
        return tuple(
            away.record
            if given[member_id] <= away.partitions
            else attrs.evolve(away.record, generation=plan.generation)
            for member_id, away in self.away.items()
        )

    def persisted(self, plan: AttemptPlan) -> None:
        """The attempt's record is in the store: its assignment is the one in force."""
        self.assignment = dict(plan.assignment)

    def starts_sent(
        self,
        plan: AttemptPlan,
        starting: Mapping[GroupMember, frozenset[TopicPartition]],
        now: float,
    ) -> list[GroupMember]:
        """The StartFetchers of the attempt, leaving now, to each member still alive. A start
        the ownership table refuses (a partition someone else may fetch) raises before any is
        sent."""
        started: list[GroupMember] = []
        starts: dict[int, tuple[str, frozenset[TopicPartition]]] = {}
        for member, target in starting.items():
            if not member.machine.alive:
                continue
            member.machine.handle(member_sm.StartFetcherSent(generation=plan.generation, now=now))
            starts[member.incarnation] = (member.member_id, target)
            started.append(member)
        self.ownership.handle(
            ownership_sm.Started(generation=plan.generation, starts=starts, now=now)
        )
        return started

    def start_unsent(self, member: GroupMember) -> list[Effect]:
        """Its StartFetcher could not be sent: it holds what it held before it."""
        return self._own(ownership_sm.StartUnsent(incarnation=member.incarnation))

    def start_answered(self, member: GroupMember, now: float) -> None:
        member.machine.handle(member_sm.StartFetcherAnswered(now=now))

    def attempt_completed(self, now: float) -> list[Effect]:
        """Every member answered StartFetcher: leases that ran out are forgotten."""
        self.completed += 1
        effects = self._own(ownership_sm.AttemptCompleted(now=now))
        effects += self._group_input(group_sm.AttemptCompleted(), now)
        effects.append(
            Note("group %s: stable at generation %d", (self.group_id, self.machine.generation))
        )
        return effects

    def attempt_failed(self, now: float) -> list[Effect]:
        return self._group_input(group_sm.AttemptFailed(), now)
