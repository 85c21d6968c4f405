"""How 453776a's trio code fed its group's machines, with trio taken out (see ``__init__.py``).

Each method names the function of 453776a it reproduces; its body is that function's, line for
line, less what the machines never see (channels, requests' bytes, the offset keeper, the
store). Where the old code read ``trio.current_time()`` a ``now`` is passed in. Where it
performed something, ``performed`` gets a tuple:

* ``("close", incarnation)``: ``member.connection_scope.cancel()``
* ``("tell_fenced", incarnation)``: ``nursery.start_soon(self._tell_fenced, group, older)``
* ``("away_until", member_id, away)``: ``nursery.start_soon(self._away_ends, group, ...)``
* ``("leases_freed",)``: ``group.leases_freed.value += 1``
* ``("cancel",)``: ``group.attempt_scope.cancel()``
* ``("died", member_id, cause)``: ``observer.member_died``
* ``("input", event)``: ``observer.group_event``
* ``("retire",)``: ``self._retire(group)``
* ``("note", text)``: ``log.info``, formatted
* ``("fail", exc)``: ``self.fail_group(group, exc)``

The rebalance attempt (``rebalance._attempt`` and what it calls) is cut at its awaits into
steps, each a method the test calls when the attempt task would run again; ``Attempt.pending``
is its ``call_all``'s requests awaiting an answer.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Collection, Iterable, Mapping

import attrs

from protocol import ErrorCode
from protocol.types import ConsumerThread, PartitionOffset, Subscription, TopicPartition
from statemachine.assignment import sticky_assign
from statemachine.records import GroupRecord, MemberRecord

from . import group as group_sm
from . import member as member_sm
from . import ownership

Assignment = dict[TopicPartition, ConsumerThread]
Performed = tuple[object, ...]


def stream_count(subscription: Subscription) -> int:
    """``coordinator/validation.py::stream_count`` at 453776a."""
    widest = max((entry.streams for entry in subscription.topics), default=0)
    if subscription.pattern is not None:
        widest = max(widest, subscription.pattern_streams)
    return widest


@attrs.frozen(kw_only=True)
class Config:
    """The ``CoordinatorConfig`` (and ``RequestLimits``) fields a group's rules read."""

    max_missed_pings: int = 1
    lease_margin: float = 0.5
    initial_rebalance_delay: float = 3.0
    initial_rebalance_max_delay: float = 30.0
    rebalance_backoff_fraction: float = 1 / 3
    #: ``rebalance_protocol is RebalanceProtocol.INCREMENTAL``
    incremental: bool = True
    max_group_size: int = 10_000
    max_group_streams: int = 10_000


@attrs.define(eq=False)
class Member:
    """``coordinator/membership.py::Member`` without its channel and connection scope."""

    group_id: str
    record: MemberRecord
    machine: member_sm.MemberMachine
    incarnation: int
    consumer_id: str
    fenced: bool = False

    @property
    def member_id(self) -> str:
        return self.record.member_id

    @property
    def static(self) -> bool:
        return self.record.instance_id is not None


@attrs.frozen(kw_only=True)
class Away:
    record: MemberRecord
    until: float
    partitions: frozenset[TopicPartition] = frozenset()


@attrs.frozen(kw_only=True)
class _Change:
    target: frozenset[TopicPartition]
    revoked: frozenset[TopicPartition] | None
    start: bool


class AttemptFailed(Exception):
    pass


@attrs.define(eq=False)
class Attempt:
    """One run of ``rebalance._attempt`` past ``AttemptBegan``: the await it waits at, and the
    locals the steps share."""

    generation: int
    members: list[Member]
    changes: dict[Member, _Change]
    assignment: Assignment
    #: ``attempt.cancel_called``
    cancel_called: bool = False
    #: committed (offsets.committed, then the stops), stops (call_all), leases (the lease wait),
    #: flush (offsets.flush, then the record), starting (offsets.committed, then the starts),
    #: starts (call_all)
    step: str = "committed"
    #: call_all's ``pending``: each member's deadline, in the order sent.
    pending: dict[Member, float] = attrs.Factory(dict)
    silent: list[Member] = attrs.Factory(list)
    failures: list[str] = attrs.Factory(list)
    starting: dict[Member, frozenset[TopicPartition]] = attrs.Factory(dict)
    gained: set[TopicPartition] = attrs.Factory(set)
    record: GroupRecord | None = None


@attrs.define(eq=False)
class Group:
    """``coordinator/membership.py::Group`` without its trio values (AsyncValues are plain)."""

    group_id: str
    machine: group_sm.GroupMachine
    last_member_at: float
    members: dict[str, Member] = attrs.field(factory=dict)
    away: dict[str, Away] = attrs.field(factory=dict)
    processes: dict[str, Member] = attrs.field(factory=dict)
    fenced: dict[str, str] = attrs.field(factory=dict)
    streams: int = 0
    assignment: Assignment = attrs.field(factory=dict)
    ownership: ownership.Ownership = attrs.field(factory=ownership.Ownership)
    leases_freed: int = 0
    next_attempt_at: float | None = None
    forming_until: float = math.inf
    recovered: GroupRecord | None = None
    recovered_until: float = -math.inf
    #: ``attempt_scope``: the attempt in flight (None: none)
    attempt: Attempt | None = None
    failure: Exception | None = None
    highest_reported_generation: int = -1
    attempts: int = 0
    completed: int = 0

    def member_of(self, consumer_id: str) -> Member | None:
        member = self.members.get(consumer_id)
        if member is not None and member.consumer_id == consumer_id:
            return member
        return self.processes.get(consumer_id)

    def longest_session_timeout(self) -> float:
        return max((m.machine.timeouts.session_timeout for m in self.members.values()), default=0.0)


@attrs.define(eq=False)
class Coordinator:
    """``GroupCoordinator`` (and the Pinger's, dispatch's and rebalance's group inputs)."""

    config: Config
    #: ``self.topics``: partition counts by topic (the test's, shared with the other side).
    topics: Mapping[str, int]
    groups: dict[str, Group] = attrs.Factory(dict)
    performed: list[Performed] = attrs.Factory(list)

    def _log(self, message: str, *args: object) -> None:
        self.performed.append(("note", message % args))

    # --- membership (group_coordinator.py) -------------------------------------------------

    def registration_error(
        self, group_id: str, consumer_id: str, instance_id: str | None, subscription: Subscription
    ) -> ErrorCode:
        """``_registration_error`` from its ``group = self.groups.get(...)`` on."""
        group = self.groups.get(group_id)
        if group is None:
            members, streams = 0, 0
        else:
            error = _identity_error(group, consumer_id, instance_id)
            if error is not ErrorCode.NONE:
                return error
            members, streams = len(group.members) + len(group.away), group.streams
            if instance_id is not None:
                same = group.members.get(instance_id)
                was = same.record if same is not None else None
                if (away := group.away.get(instance_id)) is not None:
                    was = away.record
                if was is not None:
                    members -= 1
                    streams -= stream_count(was.subscription)
        if (
            members >= self.config.max_group_size
            or streams + stream_count(subscription) > self.config.max_group_streams
        ):
            return ErrorCode.GROUP_MAX_SIZE_REACHED
        return ErrorCode.NONE

    def register(
        self,
        group_id: str,
        record: MemberRecord,
        *,
        consumer_id: str,
        incarnation: int,
        generation: int,
        owned_partitions: tuple[TopicPartition, ...],
        now: float,
    ) -> Member:
        """``register`` past its checks (the record as it builds it)."""
        group = self.group(group_id, now=now)
        member_id = record.member_id
        timeouts = member_sm.MemberTimeouts(
            session_timeout=record.session_timeout_ms / 1000,
            max_missed=self.config.max_missed_pings,
            lease_margin=self.config.lease_margin,
        )
        machine = member_sm.MemberMachine(member_id=member_id, timeouts=timeouts, last_heard=now)
        member = Member(
            group_id=group.group_id,
            record=record,
            machine=machine,
            incarnation=incarnation,
            consumer_id=consumer_id,
        )
        replaced = group.members.get(member_id)
        if replaced is not None:
            self._fence(group, replaced, now)
        if (away := group.away.pop(member_id, None)) is not None:
            group.streams -= stream_count(away.record.subscription)
            self._log("group %s: %s is back", group.group_id, member_id)
        group.members[member_id] = member
        group.last_member_at = now
        if member.static:
            group.processes[member.consumer_id] = member
        group.streams += stream_count(record.subscription)
        group.highest_reported_generation = max(group.highest_reported_generation, generation)
        self._log("group %s: %s joined", group.group_id, member.member_id)
        self._adopt(group, member, generation, owned_partitions, now)
        # self.pinger.add(member): the test's Pinger
        if replaced is not None:
            self.apply(group, group_sm.MemberReplaced(member_id=member_id), now)
        else:
            self.apply(group, group_sm.MemberJoined(member_id=member_id), now)
        return member

    def _fence(self, group: Group, older: Member, now: float) -> None:
        del group.members[older.member_id]
        group.processes.pop(older.consumer_id, None)
        group.streams -= stream_count(older.record.subscription)
        older.fenced = True
        group.fenced[older.consumer_id] = older.member_id
        while len(group.fenced) > self.config.max_group_size:
            del group.fenced[next(iter(group.fenced))]
        (death,) = older.machine.handle(member_sm.Fenced(now=now))
        died = ownership.OwnerDied(
            incarnation=older.incarnation, until=death.partitions_free_at, now=now
        )
        self.own_or_fail(group, died)
        self._log(
            "group %s: a newer process fenced %s (process %s); its partitions are free at %.3f "
            "at the latest",
            group.group_id,
            older.member_id,
            older.consumer_id,
            death.partitions_free_at,
        )
        self.performed.append(("tell_fenced", older.incarnation))

    def fenced_stop_answered(
        self, older: Member, offsets: Iterable[PartitionOffset], now: float
    ) -> dict[TopicPartition, int]:
        """``_tell_fenced``'s ``stopped``: the fenced process answered its StopFetcher."""
        group = self.groups[older.group_id]
        holding = group.ownership.holding(older.incarnation)
        counted = self.accept_reported_offsets_nowait(
            older, holding.generation, tuple(offsets), final=True
        )
        answered = ownership.StopAnswered(incarnation=older.incarnation, now=now)
        self.own_or_fail(group, answered)
        return counted

    def fenced_closed(self, member: Member, now: float) -> None:
        group = self.groups.get(member.group_id)
        if group is not None and member.fenced:
            closed = ownership.OwnerClosed(incarnation=member.incarnation, now=now)
            self.own_or_fail(group, closed)

    def _adopt(
        self,
        group: Group,
        member: Member,
        generation: int,
        owned_partitions: tuple[TopicPartition, ...],
        now: float,
    ) -> None:
        registered = ownership.OwnerRegistered(
            owner=member.member_id,
            incarnation=member.incarnation,
            generation=generation,
            holding=owned_partitions,
            now=now,
        )
        effects = self.own_or_fail(group, registered)
        if effects:
            held = sum(len(e.partitions) for e in effects if isinstance(e, ownership.LeaseAdopted))
            freed = sum(len(e.partitions) for e in effects if isinstance(e, ownership.LeaseEnded))
            self._log(
                "group %s: %s came back under generation %d; adopted %d leased partitions, "
                "freed %d",
                group.group_id,
                member.member_id,
                generation,
                held,
                freed,
            )

    def own(self, group: Group, event: ownership.Event) -> list[ownership.Effect]:
        effects = group.ownership.handle(event)
        if effects:
            group.leases_freed += 1
            self.performed.append(("leases_freed",))
        return effects

    def own_or_fail(self, group: Group, event: ownership.Event) -> list[ownership.Effect]:
        try:
            return self.own(group, event)
        except Exception as exc:
            self.fail_group(group, exc)
            return []

    def connection_ended(self, member: Member, ending: str, now: float) -> None:
        """broker/dispatch.py's ``finally`` of a member's connection: ``ending`` is closed (the
        peer's end of stream, the channel not broken), broken, or violation."""
        if member.machine.alive:
            if ending == "violation":
                event: object = member_sm.ProtocolViolation(now=now)
            elif ending == "closed":
                event = member_sm.ConnectionClosed(now=now)
            else:
                event = member_sm.ConnectionBroken(now=now)
            self.member_event(member, event, now)
        elif member.fenced and ending == "closed":
            self.fenced_closed(member, now)

    def leave(self, member: Member, now: float) -> ErrorCode | None:
        """dispatch's LeaveGroup from the member's own connection. None: the request's task
        raised, and dispatch closed that connection (``_serve``'s ``except Exception``), as for
        a LeaveGroup that reaches a member declared dead since it arrived: ``Left`` is no input
        of a Dead machine."""
        if member.fenced:
            return ErrorCode.FENCED_INSTANCE_ID
        try:
            self.member_event(member, member_sm.Left(now=now), now)
        except Exception:
            return None
        return ErrorCode.NONE

    def member_event(self, member: Member, event: object, now: float) -> None:
        effects = member.machine.handle(event)
        if not member.machine.alive and not member.fenced:
            self.performed.append(("close", member.incarnation))
        group = self.groups.get(member.group_id)
        if not effects or group is None or group.members.get(member.member_id) is not member:
            return
        (death,) = effects
        self.performed.append(("died", member.member_id, death.cause))
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
            record = attrs.evolve(member.record, generation=holding.generation)
            away = self.away(group, record, since=now, partitions=holding.partitions)
            self._log(
                "group %s: %s's process ended (%s); away until %.3f, its partitions free at %.3f",
                group.group_id,
                member.member_id,
                death.cause.value,
                away.until,
                death.partitions_free_at,
            )
            self.apply(group, group_sm.MemberAway(member_id=member.member_id), now)
            return
        group.streams -= stream_count(member.record.subscription)
        self._log(
            "group %s: %s is dead (%s); its partitions are free at %.3f",
            group.group_id,
            member.member_id,
            death.cause.value,
            death.partitions_free_at,
        )
        self._departed(group, member.member_id, now)

    def away(
        self,
        group: Group,
        record: MemberRecord,
        *,
        since: float,
        partitions: frozenset[TopicPartition] = frozenset(),
    ) -> Away:
        away = group.away[record.member_id] = Away(
            record=record, until=since + record.session_timeout_ms / 1000, partitions=partitions
        )
        self.performed.append(("away_until", record.member_id, away))
        return away

    def away_ends(self, group: Group, member_id: str, away: Away, now: float) -> None:
        """``_away_ends`` once its ``trio.sleep_until(away.until)`` returned."""
        if self.groups.get(group.group_id) is not group or group.away.get(member_id) is not away:
            return
        del group.away[member_id]
        group.streams -= stream_count(away.record.subscription)
        self._log("group %s: %s stayed away for its session timeout", group.group_id, member_id)
        self._departed(group, member_id, now)

    def _departed(self, group: Group, member_id: str, now: float) -> None:
        group.last_member_at = now
        remaining = len(group.members) + len(group.away)
        self.apply(group, group_sm.MemberDeparted(member_id=member_id, remaining=remaining), now)

    # --- Pings (heartbeat.py's Pinger) ---------------------------------------------------------

    def ping_sent(self, member: Member, now: float) -> bool:
        """``Pinger._send`` for a live member in contact: whether the Ping leaves."""
        self.member_event(member, member_sm.PingSent(now=now), now)
        return member.machine.alive

    def ping_answered(
        self, member: Member, generation: int, offsets: tuple[PartitionOffset, ...], now: float
    ) -> dict[TopicPartition, int]:
        if member.machine.alive:
            member.machine.handle(member_sm.PingAnswered(now=now))
            return self.accept_reported_offsets_nowait(member, generation, offsets)
        return {}

    def ping_missed(self, member: Member, now: float) -> None:
        """``Pinger._deadline_passed`` of the Ping still outstanding."""
        if not member.machine.alive:
            return
        self.member_event(member, member_sm.DeadlineMissed(now=now), now)

    # --- offsets ------------------------------------------------------------------------------

    def accept_reported_offsets_nowait(
        self,
        member: Member,
        generation: int,
        offsets: tuple[PartitionOffset, ...],
        *,
        final: bool = False,
    ) -> dict[TopicPartition, int]:
        """What it would hand the offset keeper (``_fenced``, without the log end)."""
        if not offsets:
            return {}
        group = self.groups.get(member.group_id)
        if group is None:
            return {}
        if not final and not member.machine.alive:
            return {}
        owned = group.ownership.holding(member.incarnation).counted_under(generation)
        if not owned:
            return {}
        topics = self.topics
        return {
            po.topic_partition: po.offset
            for po in offsets
            if po.topic_partition in owned and po.topic in topics
        }

    def commit_error(
        self,
        group_id: str,
        consumer_id: str,
        incarnation: int,
        generation: int,
        partitions: Collection[TopicPartition],
    ) -> ErrorCode:
        """``commit``'s fencing of a member's OffsetCommit sent on ``incarnation``'s connection
        (``member.channel is not channel``: another incarnation)."""
        group = self.groups.get(group_id)
        member = group.member_of(consumer_id) if group is not None else None
        if member is None or member.incarnation != incarnation:
            if group is not None and consumer_id in group.fenced:
                return ErrorCode.FENCED_INSTANCE_ID
            return ErrorCode.UNKNOWN_MEMBER_ID
        assert group is not None
        holding = group.ownership.holding(member.incarnation)
        if generation > holding.generation or not set(partitions) <= (
            holding.counted_under(generation)
        ):
            return ErrorCode.ILLEGAL_GENERATION
        return ErrorCode.NONE

    # --- groups ---------------------------------------------------------------------------

    def group(self, group_id: str, *, now: float, generation: int = 0) -> Group:
        group = self.groups.get(group_id)
        if group is None:
            machine = group_sm.GroupMachine(group_id=group_id, generation=generation)
            group = self.groups[group_id] = Group(
                group_id=group_id, machine=machine, last_member_at=now
            )
        return group

    def rebuild(self, failed: Group, record: GroupRecord | None, failed_at: float) -> Group:
        """``_rebuild`` once its store read returned ``record``."""
        members = list(failed.members.values())
        longest = max((m.machine.timeouts.session_timeout for m in members), default=0.0)
        claims = failed.ownership.carryover(failed_at)
        failed.members.clear()
        failed.streams = 0
        failed.next_attempt_at = None
        assert self.groups.get(failed.group_id) is failed
        del self.groups[failed.group_id]
        group = self._restore(
            failed.group_id,
            record,
            since=failed_at,
            generation=max(failed.machine.generation, record.generation if record else 0),
            claims=claims,
            longest=longest,
        )
        for member in members:
            if member.machine.alive:
                member.machine.handle(member_sm.ConnectionBroken(now=failed_at))
            self.performed.append(("close", member.incarnation))
        return group

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
        group = self.group(group_id, now=since, generation=generation)
        claims = list(claims)
        if record is not None:
            group.assignment = dict(record.assignment)
            owners: dict[str, set[TopicPartition]] = {}
            for tp, thread in record.assignment.items():
                owners.setdefault(thread.member_id, set()).add(tp)
            own = {m.member_id: m.generation for m in record.members if m.generation >= 0}
            claims += [
                ownership.Claim(
                    owner=m, generation=own.get(m, record.generation), partitions=frozenset(tps)
                )
                for m, tps in owners.items()
            ]
            longest = max([longest, *(m.session_timeout_ms / 1000 for m in record.members)])
            for member in record.members:
                if member.instance_id is not None:
                    given = frozenset(owners.get(member.member_id, ()))
                    self.away(group, member, since=since, partitions=given)
                    group.streams += stream_count(member.subscription)
        recovered = ownership.Recovered(
            claims=tuple(claims),
            since=since,
            longest_session=longest,
            margin=self.config.lease_margin,
        )
        self.own(group, recovered)
        return group

    def recover_group(self, record: GroupRecord, took_office_at: float) -> Group:
        """``_recover_groups``'s loop body for one record."""
        group = self._restore(
            record.group_id, record, since=took_office_at, generation=record.generation
        )
        group.recovered = record
        group.recovered_until = (
            took_office_at
            + self.config.lease_margin
            + max((m.session_timeout_ms / 1000 for m in record.members), default=0.0)
        )
        awaiting = frozenset(m.member_id for m in record.members)
        self.apply(group, group_sm.Recovered(awaiting=awaiting), took_office_at)
        return group

    def _apply(self, group: Group, effects: list[group_sm.Effect], now: float) -> None:
        for effect in effects:
            if isinstance(effect, group_sm.CancelAttempt):
                if group.attempt is not None:
                    group.attempt.cancel_called = True
                    self.performed.append(("cancel",))
            else:
                current = group.next_attempt_at
                if effect.delay is group_sm.Delay.INITIAL:
                    group.forming_until = now + self.config.initial_rebalance_max_delay
                if effect.delay is group_sm.Delay.INITIAL_AGAIN:
                    due = min(now + self.config.initial_rebalance_delay, group.forming_until)
                    group.next_attempt_at = due if current is None else max(current, due)
                else:
                    due = now + self._delay(group, effect.delay)
                    if effect.delay is group_sm.Delay.RECOVERY:
                        due = max(now, group.recovered_until)
                    group.next_attempt_at = due if current is None else min(current, due)
        if group.machine.state is group_sm.GroupState.EMPTY:
            group.next_attempt_at = None
        if (
            group.machine.state is group_sm.GroupState.EMPTY
            and group.machine.generation == 0
            and _deletable(group, now)
        ):
            self._retire(group)

    def apply(self, group: Group, event: object, now: float) -> None:
        try:
            self._apply(group, group.machine.handle(event), now)
        except Exception as exc:
            self.fail_group(group, exc)
        else:
            self.performed.append(("input", event))

    def fail_group(self, group: Group, exc: Exception) -> None:
        if group.failure is None:
            group.failure = exc
        self.performed.append(("fail", exc))

    def _delay(self, group: Group, delay: group_sm.Delay) -> float:
        if delay is group_sm.Delay.INITIAL:
            return self.config.initial_rebalance_delay
        if delay is group_sm.Delay.BACKOFF:
            return self.config.rebalance_backoff_fraction * group.longest_session_timeout()
        return 0.0

    def deletable(self, group: Group, now: float) -> bool:
        return _deletable(group, now)

    def delete_group(self, group: Group, now: float) -> None:
        """``delete_group`` once the store deleted, the group still deletable."""
        self.apply(group, group_sm.Deleted(), now)
        self._retire(group)

    def _retire(self, group: Group) -> None:
        if self.groups.get(group.group_id) is group:
            del self.groups[group.group_id]
        self.performed.append(("retire",))

    def topics_changed(self, group: Group, changed: Collection[str], now: float) -> None:
        """``watch_topics``'s loop body for one group."""
        if changed and any(
            m.record.subscription.streams_for(name) > 0
            for m in group.members.values()
            for name in changed
        ):
            self.apply(group, group_sm.TopicsChanged(), now)

    # --- the rebalance attempt (rebalance.py) ---------------------------------------------

    def attempt_due(self, group: Group, now: float) -> Attempt | None:
        """``drive`` once the attempt is due, and ``_attempt`` up to its first await."""
        group.next_attempt_at = None
        if group.machine.state is not group_sm.GroupState.PENDING:
            return None
        members = list(group.members.values())
        assignment = self.compute_assignment(group)
        recovered, group.recovered = group.recovered, None
        if recovered is not None and _adoptable(group, recovered, members, assignment):
            for member in members:
                own = group.ownership.holding(member.incarnation).generation
                member.machine.handle(member_sm.Adopted(generation=own))
            self.apply(group, group_sm.RecordAdopted(), now)
            self._log(
                "group %s: every member came back as its record says; stable at generation %d",
                group.group_id,
                recovered.generation,
            )
            return None
        incremental = self.config.incremental
        changes = _changes(group, members, assignment, incremental=incremental)
        if incremental:
            needed = any(change.start or change.revoked for change in changes.values())
        else:
            settled = all(
                m.machine.state is member_sm.MemberState.STABLE
                and group.ownership.holding(m.incarnation).generation == group.machine.generation
                for m in members
            )
            needed = not settled or assignment != group.assignment
        if not needed:
            self.apply(group, group_sm.AttemptNotNeeded(), now)
            return None
        generation = max(group.machine.generation, group.highest_reported_generation) + 1
        self.apply(group, group_sm.AttemptBegan(generation=generation), now)
        group.attempts += 1
        self._log(
            "group %s: rebalance attempt, generation %d, %d members",
            group.group_id,
            generation,
            len(members),
        )
        group.attempt = Attempt(
            generation=generation, members=members, changes=changes, assignment=assignment
        )
        return group.attempt

    def compute_assignment(self, group: Group) -> Assignment:
        subscriptions = {m.member_id: m.record.subscription for m in group.members.values()}
        subscriptions.update(
            (member_id, a.record.subscription) for member_id, a in group.away.items()
        )
        counts = {
            topic: count
            for topic, count in self.topics.items()
            if any(sub.streams_for(topic) > 0 for sub in subscriptions.values())
        }
        return sticky_assign(subscriptions, counts, group.assignment)

    def _failed(self, group: Group, attempt: Attempt, now: float) -> None:
        """``_attempt``'s ``except AttemptFailed``, then its ``finally``."""
        if not attempt.cancel_called:
            self.apply(group, group_sm.AttemptFailed(), now)
        group.attempt = None

    def cancel_delivered(self, group: Group) -> None:
        """The attempt task, cancelled, reached its next checkpoint: ``finally``, and the end."""
        assert group.attempt is not None and group.attempt.cancel_called
        group.attempt = None

    def send_stops(self, group: Group, now: float, *, store_ok: bool, in_contact: bool) -> None:
        """``offsets.committed`` returned (or failed); ``_stop_all`` up to its ``call_all``."""
        attempt = group.attempt
        assert attempt is not None and attempt.step == "committed"
        if not store_ok or not in_contact:
            self._failed(group, attempt, now)
            return
        for member, change in attempt.changes.items():
            if not member.machine.alive or (change.revoked is not None and not change.revoked):
                continue
            member.machine.handle(
                member_sm.StopFetcherSent(
                    generation=attempt.generation, now=now, start_follows=change.start
                )
            )
            attempt.pending[member] = now + member.machine.timeouts.response_deadline
        attempt.step = "stops"

    def stop_answered(
        self, group: Group, member: Member, offsets: tuple[PartitionOffset, ...], now: float
    ) -> dict[TopicPartition, int]:
        """``_stop_all``'s ``stopped``, for an answer without error."""
        attempt = group.attempt
        assert attempt is not None
        del attempt.pending[member]
        if member.machine.alive and not attempt.cancel_called:
            member.machine.handle(member_sm.StopFetcherAnswered(now=now))
        holding = group.ownership.holding(member.incarnation)
        counted = self.accept_reported_offsets_nowait(
            member, holding.generation, offsets, final=True
        )
        answered = ownership.StopAnswered(
            incarnation=member.incarnation, now=now, partitions=attempt.changes[member].revoked
        )
        self.own_or_fail(group, answered)
        return counted

    def handover_refused(self, group: Group, member: Member, now: float) -> None:
        """An error answer to the attempt's StopFetcher or StartFetcher: ``_refused``."""
        attempt = group.attempt
        assert attempt is not None
        del attempt.pending[member]
        if attempt.step == "starts" and attempt.cancel_called:
            return  # _start_all's started()
        if attempt.step == "starts" and not member.machine.alive:
            attempt.failures.append(f"{member.member_id} did not answer StartFetcher")
            return
        attempt.failures.append(f"{member.member_id} refused")
        if member.machine.alive:
            self.member_event(member, member_sm.HandoverRefused(now=now), now)

    def unanswered(self, group: Group, member: Member) -> None:
        """call_all's ``answered(member, None)``: its connection ended."""
        attempt = group.attempt
        assert attempt is not None
        del attempt.pending[member]
        attempt.silent.append(member)

    def handover_deadlines(self, group: Group, now: float) -> None:
        """call_all's loop once ``move_on_at`` fired at ``now``."""
        attempt = group.attempt
        assert attempt is not None
        for member, deadline in list(attempt.pending.items()):
            if deadline <= now:
                del attempt.pending[member]
                attempt.silent.append(member)
                if member.machine.alive:
                    missed = member_sm.DeadlineMissed(now=now, handover=True)
                    self.member_event(member, missed, now)

    def stops_done(self, group: Group, now: float) -> None:
        """call_all returned: the rest of ``_stop_all``, ``MembersStopped``, and ``_start_all``
        up to its lease wait."""
        attempt = group.attempt
        assert attempt is not None and attempt.step == "stops" and not attempt.pending
        attempt.failures.extend(f"{m.member_id} did not answer StopFetcher" for m in attempt.silent)
        attempt.silent.clear()
        if attempt.failures:
            self._failed(group, attempt, now)
            return
        if attempt.cancel_called:
            group.attempt = None
            return
        self.apply(group, group_sm.MembersStopped(), now)
        attempt.starting = {
            member: change.target
            for member, change in attempt.changes.items()
            if change.start and member.machine.alive
        }
        for member, target in attempt.starting.items():
            attempt.gained.update(target - group.ownership.holding(member.incarnation).partitions)
        attempt.step = "leases"

    def lease_wait(self, group: Group, now: float) -> float | None:
        """One turn of ``_start_all``'s lease wait at ``now``: the instant it waits for (None:
        it waits no more)."""
        attempt = group.attempt
        assert attempt is not None and attempt.step == "leases"
        if (free_at := group.ownership.free_at(attempt.gained)) > now:
            if group.ownership.held_among(attempt.gained):  # _fail_if_adopted
                self._failed(group, attempt, now)
                return None
            return free_at
        attempt.step = "flush"
        return None

    def persist(self, group: Group, now: float, *, store_ok: bool) -> GroupRecord:
        """``offsets.flush`` returned: the record, and its write, which fails unless
        ``store_ok``."""
        attempt = group.attempt
        assert attempt is not None and attempt.step == "flush"
        generation, starting = attempt.generation, attempt.starting
        record = GroupRecord(
            group_id=group.group_id,
            generation=generation,
            members=(
                *(
                    attrs.evolve(
                        m.record,
                        generation=generation
                        if m in starting
                        else group.ownership.holding(m.incarnation).generation,
                    )
                    for m in attempt.members
                ),
                *_away_records(group, attempt.assignment, generation),
            ),
            assignment=attempt.assignment,
        )
        if not store_ok:
            self._failed(group, attempt, now)
            return record
        group.assignment = dict(attempt.assignment)
        attempt.record = record
        attempt.step = "starting"
        return record

    def send_starts(
        self, group: Group, now: float, *, in_contact: bool, unsendable: int | None
    ) -> None:
        """``offsets.committed`` returned: ``_start_all`` up to its ``call_all``'s wait; the
        StartFetcher of incarnation ``unsendable`` cannot be encoded."""
        attempt = group.attempt
        assert attempt is not None and attempt.step == "starting"
        if group.ownership.held_among(attempt.gained) or not in_contact:
            self._failed(group, attempt, now)
            return
        starts: dict[int, tuple[str, frozenset[TopicPartition]]] = {}
        sent: list[Member] = []
        for member, target in attempt.starting.items():
            if not member.machine.alive:
                continue
            member.machine.handle(
                member_sm.StartFetcherSent(generation=attempt.generation, now=now)
            )
            starts[member.incarnation] = (member.member_id, target)
            sent.append(member)
        try:
            self.own(
                group, ownership.Started(generation=attempt.generation, starts=starts, now=now)
            )
        except Exception as exc:
            self.fail_group(group, exc)  # _drive's except
            return
        attempt.step = "starts"
        refused: list[Member] = []
        for member in sent:
            if member.incarnation == unsendable:
                self.own(group, ownership.StartUnsent(incarnation=member.incarnation))
                refused.append(member)
                attempt.silent.append(member)
                continue
            attempt.pending[member] = now + member.machine.timeouts.response_deadline
        for member in refused:  # close_unsendable
            if member.machine.alive:
                self.member_event(member, member_sm.ConnectionBroken(now=now), now)

    def start_answered(self, group: Group, member: Member, now: float) -> None:
        """``_start_all``'s ``started``, for an answer without error."""
        attempt = group.attempt
        assert attempt is not None
        del attempt.pending[member]
        if attempt.cancel_called:
            return
        if not member.machine.alive:
            attempt.failures.append(f"{member.member_id} did not answer StartFetcher")
            return
        member.machine.handle(member_sm.StartFetcherAnswered(now=now))

    def starts_done(self, group: Group, now: float) -> GroupRecord | None:
        """call_all returned: the rest of ``_start_all`` and of ``_attempt``; the record it
        would write once more, complete."""
        attempt = group.attempt
        assert attempt is not None and attempt.step == "starts" and not attempt.pending
        attempt.failures.extend(
            f"{m.member_id} did not answer StartFetcher" for m in attempt.silent
        )
        if attempt.failures:
            self._failed(group, attempt, now)
            return None
        group.attempt = None
        if attempt.cancel_called:
            return None
        group.completed += 1
        self.own(group, ownership.AttemptCompleted(now=now))
        self.apply(group, group_sm.AttemptCompleted(), now)
        self._log("group %s: stable at generation %d", group.group_id, attempt.generation)
        assert attempt.record is not None
        return attrs.evolve(attempt.record, complete=True)


def _identity_error(group: Group, consumer_id: str, instance_id: str | None) -> ErrorCode:
    if consumer_id in group.fenced:
        return ErrorCode.FENCED_INSTANCE_ID
    if instance_id is None:
        existing = group.members.get(consumer_id)
        if consumer_id in group.away or (existing is not None and existing.static):
            return ErrorCode.INVALID_REQUEST
        return ErrorCode.NONE if existing is None else ErrorCode.DUPLICATE_MEMBER_ID
    existing = group.members.get(instance_id)
    if existing is None:
        return ErrorCode.NONE
    if not existing.static:
        return ErrorCode.INVALID_REQUEST
    if existing.consumer_id == consumer_id:
        return ErrorCode.DUPLICATE_MEMBER_ID
    return ErrorCode.NONE


def _deletable(group: Group, now: float) -> bool:
    return not group.members and not group.away and not group.ownership.under_lease(now)


def _changes(
    group: Group, members: list[Member], assignment: Assignment, *, incremental: bool
) -> dict[Member, _Change]:
    targets: dict[str, set[TopicPartition]] = defaultdict(set)
    for tp, thread in assignment.items():
        targets[thread.member_id].add(tp)
    previous = group.assignment
    changes: dict[Member, _Change] = {}
    for member in members:
        if not member.machine.alive:
            continue
        target = frozenset(targets.get(member.member_id, ()))
        if not incremental:
            changes[member] = _Change(target=target, revoked=None, start=True)
            continue
        held = group.ownership.holding(member.incarnation).partitions
        kept = held & target
        start = (
            member.machine.state is not member_sm.MemberState.STABLE
            or len(kept) != len(target)
            or any(
                (old := previous.get(tp)) is not (new := assignment[tp]) and old != new
                for tp in kept
            )
        )
        changes[member] = _Change(target=target, revoked=held - target, start=start)
    return changes


def _away_records(
    group: Group, assignment: Assignment, generation: int
) -> tuple[MemberRecord, ...]:
    if not group.away:
        return ()
    given: dict[str, set[TopicPartition]] = {member_id: set() for member_id in group.away}
    for tp, thread in assignment.items():
        if (mine := given.get(thread.member_id)) is not None:
            mine.add(tp)
    return tuple(
        away.record
        if given[member_id] <= away.partitions
        else attrs.evolve(away.record, generation=generation)
        for member_id, away in group.away.items()
    )


def _adoptable(
    group: Group, record: GroupRecord, members: list[Member], assignment: Assignment
) -> bool:
    if not record.complete or group.machine.generation != record.generation:
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
        holding = group.ownership.holding(member.incarnation)
        if member.machine.state is not member_sm.MemberState.REGISTERED:
            return False
        mine = given.get(member.member_id)
        own = _recorded_generation(record, recorded[member.member_id])
        if not mine or holding.partitions != mine or holding.generation != own:
            return False
    return True


def _recorded_generation(record: GroupRecord, member: MemberRecord) -> int:
    return member.generation if member.generation >= 0 else record.generation
