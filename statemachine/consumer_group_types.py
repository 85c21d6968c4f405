"""What a consumer group (:mod:`statemachine.consumer_group`) is made of and what its
operations return: its rules and members, the effects for its driver, what an attempt asks, and
the group as DescribeGroup shows it."""

from __future__ import annotations

import enum
from collections.abc import Mapping
from typing import Protocol

import attrs

from protocol.types import ConsumerThread, Subscription, TopicId, TopicPartition
from protocol.versions import NEWEST, PeerVersions
from statemachine import member as member_sm
from statemachine.records import MemberRecord

Assignment = dict[TopicPartition, ConsumerThread]


class Placed(Protocol):
    """A topic as the coordinator knows it now (``store.TopicPlacement``): which incarnation
    of the name is in force (docs/design.md#topic-ids)."""

    @property
    def topic_id(self) -> TopicId: ...


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
    #: Let go with its group and told so over its connection (docs/design.md#shedding-load):
    #: no longer in its group, its clean close proves it stopped, as a fenced process's.
    told_shed: bool = False

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
class TellShed:
    """Send each member of a group let go its StopFetcher (reason BROKER_BUSY, the hint
    ``retry_after`` seconds) while in contact with the store, wait for their answers
    (``stop_answered``, everything), then close their connections; out of contact, only close
    them (docs/design.md#shedding-load)."""

    incarnations: tuple[int, ...]
    retry_after: float


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


@attrs.frozen
class FromNow:
    """An instant as a log line shows it: "now" or "in 4.2 s" (an instant of the coordinator's
    monotonic clock says nothing to whoever reads the log)."""

    at: float
    now: float

    def __str__(self) -> str:
        left = self.at - self.now
        return "now" if left <= 0 else f"in {left:.1f} s"


Effect = (
    CloseConnection
    | TellFenced
    | TellShed
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
    #: The incarnation of each topic of ``assignment`` the attempt starts
    #: (docs/design.md#topic-ids): what its StartFetchers and its record name.
    topic_ids: Mapping[str, TopicId] = attrs.field(factory=dict)
    #: Topics created again whose old incarnation some process may still fetch: every holder
    #: is stopped, and nothing is started until none holds any partition of them.
    quarantined: frozenset[str] = frozenset()
    #: The old incarnation of each quarantined topic the attempt does not assign (deleted, or
    #: no longer subscribed): the group remembers it while a process may still fetch it, so
    #: that a later creation of the name is quarantined too.
    held_over: Mapping[str, TopicId] = attrs.field(factory=dict)

    @property
    def recorded_ids(self) -> dict[str, TopicId]:
        """The topic ids the attempt's record names, and the group keeps once it is persisted."""
        return {**self.held_over, **self.topic_ids}


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


def topic_partition_key(tp: TopicPartition) -> tuple[str, int]:
    """Sorting by plain tuples: attrs' generated ordering costs microseconds per comparison."""
    return tp.topic, tp.partition
