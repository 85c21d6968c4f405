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

An input a machine refuses raises (``protocol.IllegalInput``) before the operation changes that
machine; the driver fails the group then (docs/failure-domains.md), as any bug in the group's work.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import attrs

from protocol import ErrorCode
from protocol.types import TopicPartition
from protocol.versions import NEWEST, PeerVersions
from statemachine import group as group_sm
from statemachine import member as member_sm
from statemachine import ownership as ownership_sm
from statemachine.consumer_group_attempts import RebalanceAttempts
from statemachine.consumer_group_failures import FailureDetection
from statemachine.consumer_group_types import (
    AWAITING_MEMBERS,
    Assignment,
    AttemptPlan,
    Away,
    AwayUntil,
    CancelAttempt,
    Change,
    CloseConnection,
    Effect,
    Ending,
    FromNow,
    GroupInput,
    GroupMember,
    GroupRules,
    GroupStatistics,
    LeasesFreed,
    MemberDied,
    MemberStatistics,
    Note,
    Placed,
    Retire,
    StopOrder,
    TellFenced,
    TellShed,
    topic_partition_key,
)
from statemachine.records import GroupRecord, MemberRecord

__all__ = [
    "AWAITING_MEMBERS",
    "Assignment",
    "AttemptPlan",
    "Away",
    "AwayUntil",
    "CancelAttempt",
    "Change",
    "CloseConnection",
    "ConsumerGroup",
    "Effect",
    "Ending",
    "FromNow",
    "GroupInput",
    "GroupMember",
    "GroupRules",
    "GroupStatistics",
    "LeasesFreed",
    "MemberDied",
    "MemberStatistics",
    "Note",
    "Retire",
    "StopOrder",
    "TellFenced",
    "TellShed",
    "topic_partition_key",
]


@attrs.define(eq=False)
class ConsumerGroup(RebalanceAttempts, FailureDetection):
    """The group aggregate the driver holds: its state is in ``consumer_group_core``, its
    failure detection in ``consumer_group_failures``, its rebalance attempts in
    ``consumer_group_attempts``; registration, queries for the views, and the group's life are
    here."""

    @classmethod
    def new(
        cls, group_id: str, rules: GroupRules, *, now: float, generation: int = 0
    ) -> ConsumerGroup:
        machine = group_sm.GroupMachine(group_id=group_id, generation=generation)
        return cls(group_id=group_id, rules=rules, machine=machine, last_member_at=now)

    # --- queries ----------------------------------------------------------------------------

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
        group rebalance (docs/design.md#generations-and-stale-offsets); a newer process of a live
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
                "group %s: a newer process fenced %s (process %s); its partitions are free %s "
                "at the latest",
                (
                    self.group_id,
                    older.member_id,
                    older.consumer_id,
                    FromNow(death.partitions_free_at, now),
                ),
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
        topics: Mapping[str, Placed] | None = None,
    ) -> list[Effect]:
        """The group as a coordinator that knows none of its members finds it. The record's
        assignment stays the sticky assignor's starting point, so owners that re-register get
        their partitions back. Every partition of the record, and of each of ``claims``, waits
        until ``since`` plus the longest session timeout (of the record's members, or
        ``longest``) plus the margin (or the claim's own instant, if later), unless its owner
        re-registers under that generation first. ``awaiting``: a new coordinator recovered it
        from the store, and it waits for the members the record names, at most until their
        lease counted from ``since`` is over, and then decides once
        (docs/design.md#adoption-after-a-failover). The record's assignment was made under
        the topic ids it names, or, in a record from before ids, under those in force
        (``topics``): a topic created again since is quarantined (docs/design.md#topic-ids)."""
        claims = list(claims)
        effects: list[Effect] = []
        if record is not None:
            self.assignment = dict(record.assignment)
            self.topic_ids = dict(record.topic_ids)
            if not record.topic_ids and topics is not None:
                assigned = {tp.topic for tp in record.assignment}
                self.topic_ids = {t: topics[t].topic_id for t in assigned if t in topics}
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
        replaces it. Its members are dead to the Ping scheduler and to the offsets' generation
        check at once (what their deaths would free the rebuild counts from the failure, with
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

    def shed(self, now: float, retry_after: float) -> list[Effect]:
        """Its broker, too far behind to keep every member, lets the whole group go
        (docs/design.md#shedding-load): every member dies at once. One that reads StopFetcher 3
        is told so over its connection, with ``retry_after`` as its hint, which costs the broker
        one request and no reconnection: its partitions are free at its answer or clean close,
        else when the lease that StopFetcher renews runs out. Any other has its connection
        closed, and its partitions are free when its lease runs out (it may fetch until then).
        The whole group, so that no rebalance runs among members about to follow them; the
        group is left empty, its record and offsets kept for when its members come back."""
        members = [m for m in self.members.values() if m.machine.alive]
        if not members:
            return []
        effects: list[Effect] = []
        told: list[int] = []
        latest_free = now
        for member in members:
            tell = member.versions.told_when_shed
            (death,) = member.machine.handle(member_sm.Shed(now=now, told=tell))
            latest_free = max(latest_free, death.partitions_free_at)
            if tell:
                member.told_shed = True
                told.append(member.incarnation)
            else:
                effects.append(CloseConnection(incarnation=member.incarnation))
            effects.append(MemberDied(member_id=member.member_id, cause=death.cause))
            died = ownership_sm.OwnerDied(
                incarnation=member.incarnation, until=death.partitions_free_at, now=now
            )
            effects += self._own(died)
        if told:
            effects.append(TellShed(incarnations=tuple(told), retry_after=retry_after))
        self.members.clear()
        self.processes.clear()
        self.away.clear()
        self._streams = 0
        effects.append(
            Note(
                "group %s: let its %d members go (%d told over their connections), the broker "
                "too far behind to keep them all; their partitions are free %s at the latest",
                (self.group_id, len(members), len(told), FromNow(latest_free, now)),
            )
        )
        return effects + self._departed(members[-1].member_id, now, member_sm.DeathCause.SHED)

    def deleted(self, now: float) -> list[Effect]:
        """DeleteGroup, or its retention ran out: the group's driver ends."""
        return [*self._group_input(group_sm.Deleted(), now), Retire()]
