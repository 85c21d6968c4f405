"""A consumer group's rebalance attempts."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping

import attrs

from protocol.types import PartitionOffset, TopicId, TopicPartition
from statemachine import group as group_sm
from statemachine import member as member_sm
from statemachine import ownership as ownership_sm
from statemachine.assignment import sticky_assign
from statemachine.consumer_group_core import GroupCore
from statemachine.consumer_group_types import (
    Assignment,
    AttemptPlan,
    Change,
    Effect,
    GroupMember,
    Note,
    Placed,
    StopOrder,
    topic_partition_key,
)
from statemachine.records import GroupRecord, MemberRecord


class RebalanceAttempts(GroupCore):
    """A rebalance attempt, planned, stopped, recorded and started (docs/design.md#rebalance):
    the steps ``coordinator/rebalance.py`` takes, each deciding here."""

    __slots__ = ()

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
        self,
        partition_counts: Mapping[str, int],
        now: float,
        topics: Mapping[str, Placed] | None = None,
    ) -> tuple[AttemptPlan | None, list[Effect]]:
        """Begin the pending rebalance: adopt a recovered record whole, find none needed, or
        take a new generation and say what to ask of each member (None: no attempt follows).
        ``topics``: the incarnation in force of each topic (None: the group's own are)."""
        members = tuple(self.members.values())
        quarantined = self.quarantine(topics, now)
        assignment = self.compute_assignment(partition_counts)
        recovered, self.recovered = self.recovered, None
        if (
            recovered is not None
            and not quarantined
            and self._adoptable(recovered, members, assignment)
        ):
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
        changes = self._changes(members, assignment, quarantined)
        if self.rules.incremental:
            needed = any(change.start or change.revoked for change in changes.values())
        else:
            settled = all(
                m.machine.state is member_sm.MemberState.STABLE
                and self.holding(m).generation == self.machine.generation
                for m in members
            )
            needed = not settled or assignment != self.assignment or bool(quarantined)
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
        assigned_ids = self._assigned_ids(assignment, topics)
        plan = AttemptPlan(
            generation=generation,
            assignment=assignment,
            members=members,
            changes=changes,
            topic_ids=assigned_ids,
            quarantined=quarantined,
            held_over={t: self.topic_ids[t] for t in quarantined if t not in assigned_ids},
        )
        return plan, effects

    def quarantine(self, topics: Mapping[str, Placed] | None, now: float) -> frozenset[str]:
        """The topics of the group's assignment whose incarnation in force is another
        (docs/design.md#topic-ids) and of which some process may still fetch a partition of the
        old one. The others are released: nothing of the old incarnation is left, so the new
        one is a topic like any new one, assigned afresh."""
        if topics is None:
            return frozenset()
        stale = self.stale_topics(topics)
        if not stale:
            return frozenset()
        held = {tp.topic for tp in self.ownership.of_topics(stale, now)}
        for topic in stale - held:
            del self.topic_ids[topic]
            self.assignment = {tp: t for tp, t in self.assignment.items() if tp.topic != topic}
        return frozenset(held)

    def _assigned_ids(
        self, assignment: Assignment, topics: Mapping[str, Placed] | None
    ) -> dict[str, TopicId]:
        """The incarnation the attempt gives each topic of ``assignment`` under: the one in
        force (without ``topics``: the group's own, where it has one)."""
        names = {tp.topic for tp in assignment}
        if topics is None:
            return {topic: self.topic_ids[topic] for topic in names if topic in self.topic_ids}
        return {topic: topics[topic].topic_id for topic in names if topic in topics}

    def waits_on(
        self, plan: AttemptPlan, gained: set[TopicPartition], now: float
    ) -> set[TopicPartition]:
        """What the attempt's starts wait on: the partitions they add, and every partition of
        a quarantined topic's old incarnation some process may still fetch, whatever its
        number (docs/design.md#topic-ids)."""
        return gained | self.ownership.of_topics(plan.quarantined & plan.topic_ids.keys(), now)

    def stale_ids(self, plan: AttemptPlan, topics: Mapping[str, Placed]) -> list[str]:
        """The topics the attempt would start under an incarnation no longer in force: created
        again since it was planned (one deleted since fails the attempt when its streams are
        built)."""
        return sorted(
            topic
            for topic, topic_id in plan.topic_ids.items()
            if (placed := topics.get(topic)) is not None and placed.topic_id != topic_id
        )

    def _changes(
        self,
        members: tuple[GroupMember, ...],
        assignment: Assignment,
        quarantined: frozenset[str] = frozenset(),
    ) -> dict[GroupMember, Change]:
        """Eager: stop everyone, start everyone. Incremental: a live member stops what it holds
        outside its target, and is started if it gains a partition, if a partition it keeps moves
        to another of its streams, or if it is not Stable (new, or left Stopping or Starting by a
        failed attempt, so it may not fetch what it is meant to); the others are left alone: no
        request, no new generation (docs/design.md#rebalance). A partition of a ``quarantined``
        topic is never kept: it is of the old incarnation, and the new one's is another
        partition, started afresh (docs/design.md#topic-ids)."""
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
            if quarantined:
                kept = frozenset(tp for tp in kept if tp.topic not in quarantined)
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
            changes[member] = Change(target=target, revoked=held - kept, start=start)
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
        topics: Mapping[str, Placed],
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
            topic_ids=plan.recorded_ids,
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
        """The attempt's record is in the store: its assignment is the one in force, made under
        the incarnations it names."""
        self.assignment = dict(plan.assignment)
        self.topic_ids = plan.recorded_ids

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
