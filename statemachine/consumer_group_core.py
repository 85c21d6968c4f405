"""The state of a consumer group (:class:`statemachine.consumer_group.ConsumerGroup`) and what
its operations share."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping

import attrs

from protocol import ErrorCode
from protocol.types import PartitionOffset, TopicId, TopicPartition
from statemachine import group as group_sm
from statemachine import member as member_sm
from statemachine import ownership as ownership_sm
from statemachine.consumer_group_types import (
    Assignment,
    Away,
    CancelAttempt,
    Effect,
    GroupInput,
    GroupMember,
    GroupRules,
    LeasesFreed,
    Placed,
    Retire,
)
from statemachine.records import GroupRecord


@attrs.define(eq=False)
class GroupCore:
    """A group's state, what every operation reads of it, and how an operation feeds the group's
    machine and the ownership table."""

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
    #: The incarnation of each topic of ``assignment``, the one its partitions were given under,
    #: and of each topic whose old incarnation a process may still fetch
    #: (docs/design.md#topic-ids): while another is in force, the topic is quarantined.
    topic_ids: dict[str, TopicId] = attrs.field(factory=dict)
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

    # --- offsets ------------------------------------------------------------------------------

    def counted_offsets(
        self,
        member: GroupMember,
        generation: int,
        offsets: Iterable[PartitionOffset],
        *,
        topics: Mapping[str, Placed],
        final: bool = False,
    ) -> dict[TopicPartition, int]:
        """The offsets of a Ping response (or, ``final``, of a StopFetcher answer) that count:
        for partitions the member holds, given to it at or before the report's generation, which
        is not past its own (SPEC.md §11.8), and only while it is a member, or in its final
        report for what it stopped, accepted even if it left right after
        (docs/design.md#generations-and-stale-offsets). A deleted topic's partitions (not in
        ``topics``) count for nothing, though held until the rebalance."""
        if not final and not member.machine.alive:
            return {}
        owned = self.holding(member).counted_under(generation)
        if not owned:
            return {}
        return self.of_current_incarnation(
            {po.topic_partition: po.offset for po in offsets if po.topic_partition in owned},
            topics,
        )

    def of_current_incarnation(
        self, offsets: Mapping[TopicPartition, int], topics: Mapping[str, Placed]
    ) -> dict[TopicPartition, int]:
        """Those of a member's ``offsets`` that belong to the incarnation in force of their topic
        (``topics``): a deleted topic's count for nothing, and neither do those of a topic
        created again since the group's assignment gave it (docs/design.md#topic-ids), which
        were read from the old one."""
        ids = self.topic_ids
        return {
            tp: offset
            for tp, offset in offsets.items()
            if (placed := topics.get(tp.topic)) is not None
            and ids.get(tp.topic, placed.topic_id) == placed.topic_id
        }

    def stale_topics(self, topics: Mapping[str, Placed]) -> frozenset[str]:
        """The topics of the group's assignment whose incarnation is no longer the one in force
        (deleted, or deleted and created again)."""
        return frozenset(
            topic
            for topic, topic_id in self.topic_ids.items()
            if (placed := topics.get(topic)) is None or placed.topic_id != topic_id
        )

    def commit_refusal(
        self, member: GroupMember | None, generation: int, partitions: Iterable[TopicPartition]
    ) -> ErrorCode:
        """An OffsetCommit by ``member`` (None: no live member of this group sent it) counts
        only for partitions it holds, given at or before the commit's generation, which is not
        past its own (SPEC.md §11.8; docs/design.md#generations-and-stale-offsets)."""
        if member is None or not self.is_member(member):
            return ErrorCode.UNKNOWN_MEMBER_ID
        holding = self.holding(member)
        if generation > holding.generation or not set(partitions) <= holding.counted_under(
            generation
        ):
            return ErrorCode.ILLEGAL_GENERATION
        return ErrorCode.NONE

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
