"""The coordinator's live records of groups and members: state machines plus what trio owns.

The machines in ``statemachine/`` decide; these records hold what deciding does not need but acting
does: the member's channel and the cancel scope that closes its connection, the group's attempt
scope that a member failure cancels, and the timer of the next attempt.
"""

from __future__ import annotations

import math
from collections.abc import Collection

import attrs
import trio
from trio_util import AsyncValue

from protocol.types import ConsumerThread, TopicPartition
from statemachine.group import GroupMachine, GroupState
from statemachine.member import MemberMachine
from store import MemberRecord
from transport.channel import Channel


@attrs.define(eq=False)
class Member:
    group_id: str
    record: MemberRecord
    machine: MemberMachine
    channel: Channel
    #: Cancelling it ends the member's connection task, which closes the connection.
    connection_scope: trio.CancelScope
    #: The partitions started for this member, and the generation they were started under: only
    #: offsets for these, reported under that generation, are accepted from it.
    owned: frozenset[TopicPartition] = frozenset()
    owned_generation: int = -1

    @property
    def member_id(self) -> str:
        return self.record.member_id


@attrs.frozen(kw_only=True)
class Lease:
    """Partitions a member id held under ``generation`` and may still be fetching."""

    generation: int
    partitions: frozenset[TopicPartition]


@attrs.define(eq=False)
class Group:
    group_id: str
    machine: GroupMachine
    members: dict[str, Member] = attrs.field(factory=dict)
    #: The members' streams together (``validation.stream_count`` of each subscription).
    streams: int = 0
    #: The intended assignment of the latest attempt that reached its start phase.
    assignment: dict[TopicPartition, ConsumerThread] = attrs.field(factory=dict)
    #: Partitions whose previous owner may still be fetching until the given instant (a member
    #: that fell silent, or one that a previous coordinator knew).
    free_at: dict[TopicPartition, float] = attrs.field(factory=dict)
    #: Per member id, what a process that may still be fetching holds under a lease in
    #: ``free_at``: a member whose connection broke or that fell silent, or an owner in the
    #: record a new coordinator recovered. Its re-registration can end the lease early.
    leases: dict[str, Lease] = attrs.field(factory=dict)
    #: Counts re-registrations that freed leased partitions: an attempt waiting on leases wakes.
    leases_freed: AsyncValue[int] = attrs.field(factory=lambda: AsyncValue(0))
    #: When the next rebalance attempt is due (None: none is due).
    next_attempt_at: AsyncValue[float | None] = attrs.field(factory=lambda: AsyncValue(None))
    #: While the group forms (statemachine.group's ``forming``): joins postpone its first attempt
    #: up to this instant, set by the join that ended Empty.
    forming_until: float = math.inf
    attempt_scope: trio.CancelScope | None = None
    #: The driver task's scope while it runs: cancelling it ends the driver, which rebuilds the
    #: group if ``failure`` is set.
    driver: trio.CancelScope | None = None
    #: The first exception from the group's own work: the group is rebuilt from the store.
    failure: Exception | None = None
    #: The highest generation a registering member said it had: after a failover, a previous
    #: coordinator may have begun attempts that it never persisted, and generations must still
    #: only increase.
    highest_reported_generation: int = -1
    #: (state, generation) after every input, for those who wait on a group (tools and tests).
    status: AsyncValue[tuple[GroupState, int]] = attrs.field(
        factory=lambda: AsyncValue((GroupState.EMPTY, 0))
    )
    attempts: int = 0
    completed: int = 0

    def longest_session_timeout(self) -> float:
        return max((m.machine.timeouts.session_timeout for m in self.members.values()), default=0.0)

    def partitions_free_at(self, partitions: Collection[TopicPartition]) -> float:
        # ``free_at`` is usually empty or small, ``partitions`` a whole assignment.
        return max((at for tp, at in self.free_at.items() if tp in partitions), default=-math.inf)
