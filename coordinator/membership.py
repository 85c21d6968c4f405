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

from protocol import RequestMessage
from protocol.types import ConsumerThread, TopicPartition
from protocol.versions import NEWEST, PeerVersions, fit
from statemachine.group import GroupMachine, GroupState
from statemachine.member import MemberMachine
from statemachine.ownership import Ownership
from store import GroupRecord, MemberRecord
from transport.channel import Channel, ResponseHandler


@attrs.define(eq=False)
class Member:
    """One registered process. Its member id is its consumer id, or, for a static member, its
    instance id, which outlives the process (docs/design.md#static-members)."""

    group_id: str
    record: MemberRecord
    machine: MemberMachine
    channel: Channel
    #: Cancelling it ends the member's connection task, which closes the connection.
    connection_scope: trio.CancelScope
    #: This registration of the member id, in the group's ownership machine: what it owns, and
    #: under which generation, is ``group.ownership.holding(incarnation)``.
    incarnation: int
    #: The process's own id (RegisterConsumer's ``consumer_id``): its OffsetCommit and
    #: LeaveGroup name it.
    consumer_id: str
    #: A newer process registered under its instance id: it is no longer in its group.
    fenced: bool = False
    #: What it reads of the coordinator's requests (SPEC.md §3, docs/design.md#old-clients):
    #: each goes in that version, and the rules it cannot follow are not asked of it.
    versions: PeerVersions = NEWEST

    def request_nowait(self, message: RequestMessage, on_response: ResponseHandler) -> int:
        """Send a coordinator request in the version this member reads."""
        version = self.versions.of(message.API_KEY)
        return self.channel.request_nowait(fit(message, version), on_response, api_version=version)

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


@attrs.define(eq=False)
class Group:
    group_id: str
    machine: GroupMachine
    members: dict[str, Member] = attrs.field(factory=dict)
    #: Static members away, by member id: subscribers of the assignment with no process.
    away: dict[str, Away] = attrs.field(factory=dict)
    #: Live static members by their process's consumer id (``members`` is by instance id).
    processes: dict[str, Member] = attrs.field(factory=dict)
    #: Processes fenced by a newer one under their instance id, by consumer id (oldest first,
    #: bounded by the coordinator): what they ask afterwards is answered FENCED_INSTANCE_ID.
    fenced: dict[str, str] = attrs.field(factory=dict)
    #: The members' streams together, away ones included (``validation.stream_count`` of each
    #: subscription).
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
    #: The latest instant the group had a member (a registration, a departure; its creation in
    #: this coordinator): it is removed ``group_retention`` after this once it has none
    #: (docs/design.md#group-retention).
    last_member_at: float = attrs.field(factory=trio.current_time)
    #: (state, generation) after every input, for those who wait on a group (tools and tests).
    status: AsyncValue[tuple[GroupState, int]] = attrs.field(
        factory=lambda: AsyncValue((GroupState.EMPTY, 0))
    )
    attempts: int = 0
    completed: int = 0

    def member_of(self, consumer_id: str) -> Member | None:
        """The live member whose process is ``consumer_id``."""
        member = self.members.get(consumer_id)
        if member is not None and member.consumer_id == consumer_id:
            return member
        return self.processes.get(consumer_id)

    def longest_session_timeout(self) -> float:
        return max((m.machine.timeouts.session_timeout for m in self.members.values()), default=0.0)
