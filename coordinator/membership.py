"""The coordinator's live records of groups and members: state machines plus what trio owns.

The machines in ``statemachine/`` decide; these records hold what deciding does not need but acting
does: the member's channel and the cancel scope that closes its connection, the group's attempt
scope that a member failure cancels, and the timer of the next attempt.
"""

from __future__ import annotations

import math

import attrs
import trio
from trio_util import AsyncValue

from protocol.types import ConsumerThread, TopicPartition
from statemachine.group import GroupMachine, GroupState
from statemachine.member import MemberMachine
from statemachine.ownership import Ownership
from store import GroupRecord, MemberRecord
from transport.channel import Channel


@attrs.define(eq=False)
class Member:
    group_id: str
    record: MemberRecord
    machine: MemberMachine
    channel: Channel
    #: Cancelling it ends the member's connection task, which closes the connection.
    connection_scope: trio.CancelScope
    #: This registration of the member id, in the group's ownership machine: what it owns, and
    #: under which generation, is ``group.ownership.holding(incarnation)``.
    incarnation: int

    @property
    def member_id(self) -> str:
        return self.record.member_id


@attrs.define(eq=False)
class Group:
    group_id: str
    machine: GroupMachine
    members: dict[str, Member] = attrs.field(factory=dict)
    #: The members' streams together (``validation.stream_count`` of each subscription).
    streams: int = 0
    #: The intended assignment of the latest attempt that reached its start phase.
    assignment: dict[TopicPartition, ConsumerThread] = attrs.field(factory=dict)
    #: Who may fetch each partition, and from when a partition is free (the machine decides;
    #: the coordinator feeds it and performs its effects).
    ownership: Ownership = attrs.field(factory=Ownership)
    #: Counts leases their owners ended early (``ownership.LeaseEnded``): an attempt waiting on
    #: leases wakes.
    leases_freed: AsyncValue[int] = attrs.field(factory=lambda: AsyncValue(0))
    #: When the next rebalance attempt is due (None: none is due).
    next_attempt_at: AsyncValue[float | None] = attrs.field(factory=lambda: AsyncValue(None))
    #: While the group forms (statemachine.group's ``forming``): joins postpone its first attempt
    #: up to this instant, set by the join that ended Empty.
    forming_until: float = math.inf
    #: The store record a new coordinator recovered the group from, until the group's first
    #: attempt decides whether its members came back as it says (statemachine.group's
    #: ``awaiting``), and the instant its lease, counted from the recovery, is over.
    recovered: GroupRecord | None = None
    recovered_until: float = -math.inf
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
