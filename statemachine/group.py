"""A consumer group on the coordinator: when it rebalances, and which triggers coalesce.

The seeds keep a ``rebalanceInitiated`` bit so a burst of joins causes one rebalance, and let only a
member's failure cut an attempt short (docs/design.md#rebalance-triggers). Here that policy is a
table: joins and topic changes during an attempt only mark another one pending; a departure
cancels the attempt in flight. A group that leaves Empty is *forming* until its first attempt
begins: each join restarts its wait (within a cap the trio layer keeps), so a crowd that connects
over many seconds still forms in one attempt rather than in one per attempt's worth of late
joiners. A group a new coordinator *recovered* from its store record does not form: it waits for
the members its record names, and decides at once when the last of them is back (or when their
lease is over, the trio layer's instant), so one member coming back late causes no second
rebalance; an attempt may then find the record adopted whole, with no new generation
(docs/design.md#adoption-after-a-failover). The trio layer performs the effects: it owns the timer
and the cancel scope of the attempt.
"""

from __future__ import annotations

import enum

import attrs

from protocol.errors import IllegalInput
from statemachine.table import Guard, Guarded, TransitionTable


class GroupState(enum.Enum):
    EMPTY = "Empty"
    PENDING = "PendingRebalance"
    STOPPING = "RebalancingStop"
    STARTING = "RebalancingStart"
    STABLE = "Stable"
    DEAD = "Dead"


# --- inputs ---------------------------------------------------------------------------------


@attrs.frozen(kw_only=True)
class MemberJoined:
    member_id: str


@attrs.frozen(kw_only=True)
class Recovered:
    """A coordinator that knows none of the group's members recovered it from its store record,
    which names ``awaiting``: the group waits for them before it decides anything."""

    awaiting: frozenset[str]


@attrs.frozen(kw_only=True)
class MemberDeparted:
    """A member left, was declared dead, or (a static member) stayed away past its session
    timeout; ``remaining`` is how many members are left, live or away."""

    member_id: str
    remaining: int


@attrs.frozen(kw_only=True)
class MemberAway:
    """A static member's process ended without LeaveGroup: the member stays in the group, its
    partitions assigned to it and unowned, for its session timeout, so that a restart gets them
    back without a rebalance (docs/design.md#static-members). Only an attempt in flight, which
    would wait on the process's answers for nothing, is cut short; when the member's time away
    is over it departs (``MemberDeparted``)."""

    member_id: str


@attrs.frozen(kw_only=True)
class MemberReplaced:
    """A newer process registered under a live static member's instance id, fencing the older:
    the member's partitions must move to the newer process, once the older stopped
    (docs/design.md#static-members)."""

    member_id: str


@attrs.frozen(kw_only=True)
class TopicsChanged:
    """A subscribed topic appeared or gained partitions (docs/design.md#rebalance-triggers)."""


@attrs.frozen(kw_only=True)
class AttemptBegan:
    """The pending rebalance began an attempt under a new generation."""

    generation: int


@attrs.frozen(kw_only=True)
class AttemptNotNeeded:
    """The computed assignment equals the one in force (docs/design.md#rebalance, step 1)."""


@attrs.frozen(kw_only=True)
class RecordAdopted:
    """Every member came back holding what the recovered group's completed record gave it,
    under its generation: the group is Stable under that generation, with no Stop or Start
    (docs/design.md#adoption-after-a-failover)."""


@attrs.frozen(kw_only=True)
class MembersStopped:
    """Every member answered StopFetcher and the offsets were committed."""


@attrs.frozen(kw_only=True)
class AttemptCompleted:
    """Every member answered StartFetcher."""


@attrs.frozen(kw_only=True)
class AttemptFailed:
    """A deadline passed without a death, or the store failed: back off and try again."""


@attrs.frozen(kw_only=True)
class Deleted:
    pass


# --- effects --------------------------------------------------------------------------------


class Delay(enum.Enum):
    """How long to wait before the next attempt; the trio layer turns these into seconds."""

    NONE = "none"
    INITIAL = "initial"  # a forming group waits for the crowd that joins with its first member
    #: another member of that crowd joined: the wait starts over, within a cap from the first join
    #: (Kafka's group.initial.rebalance.delay.ms), so a crowd that takes a while still causes one
    #: rebalance; the attempt is postponed, never brought forward
    INITIAL_AGAIN = "initial_again"
    BACKOFF = "backoff"  # after a failed attempt, scaled to the session timeouts
    #: a recovered group still waits for members its record names: at the latest when their
    #: lease, counted from the recovery, is over
    RECOVERY = "recovery"


@attrs.frozen(kw_only=True)
class ScheduleRebalance:
    delay: Delay


@attrs.frozen(kw_only=True)
class CancelAttempt:
    """Cancel the attempt in flight at once (docs/design.md#rebalance)."""


Effect = ScheduleRebalance | CancelAttempt

_IN_FLIGHT = (GroupState.STOPPING, GroupState.STARTING)


def _last_member(machine: GroupMachine, event: MemberDeparted) -> bool:
    return event.remaining == 0


def _rebalance_owed(machine: GroupMachine, event: AttemptCompleted) -> bool:
    return machine.rebalance_pending


#: The departure left no live member: the group is empty, with nothing to rebalance.
LAST = Guard("last", _last_member, otherwise="others remain")
#: A join or topic change arrived during the attempt: another one begins at once.
OWED = Guard("rebalance owed", _rebalance_owed, otherwise="none owed")


def _build_table() -> TransitionTable[GroupState]:
    departed: Guarded[GroupState] = Guarded(((LAST, GroupState.EMPTY), (~LAST, GroupState.PENDING)))
    t: dict[tuple[GroupState, type], GroupState | Guarded[GroupState]] = {
        (GroupState.EMPTY, MemberJoined): GroupState.PENDING,
        (GroupState.EMPTY, TopicsChanged): GroupState.EMPTY,
        (GroupState.EMPTY, Deleted): GroupState.DEAD,
        (GroupState.EMPTY, Recovered): GroupState.EMPTY,
        # A static member of a recovered group that never came back departs from an empty
        # group (docs/design.md#static-members): nothing to rebalance.
        (GroupState.EMPTY, MemberDeparted): GroupState.EMPTY,
        (GroupState.PENDING, MemberJoined): GroupState.PENDING,
        (GroupState.PENDING, MemberDeparted): departed,
        (GroupState.PENDING, TopicsChanged): GroupState.PENDING,
        (GroupState.PENDING, AttemptBegan): GroupState.STOPPING,
        (GroupState.PENDING, AttemptNotNeeded): GroupState.STABLE,
        (GroupState.PENDING, RecordAdopted): GroupState.STABLE,
        (GroupState.PENDING, AttemptFailed): GroupState.PENDING,
        (GroupState.STOPPING, MembersStopped): GroupState.STARTING,
        (GroupState.STARTING, AttemptCompleted): Guarded(
            ((OWED, GroupState.PENDING), (~OWED, GroupState.STABLE))
        ),
        (GroupState.STABLE, MemberJoined): GroupState.PENDING,
        (GroupState.STABLE, MemberDeparted): departed,
        (GroupState.STABLE, TopicsChanged): GroupState.PENDING,
        (GroupState.PENDING, MemberAway): GroupState.PENDING,
        (GroupState.STABLE, MemberAway): GroupState.STABLE,
        (GroupState.PENDING, MemberReplaced): GroupState.PENDING,
        (GroupState.STABLE, MemberReplaced): GroupState.PENDING,
    }
    for state in _IN_FLIGHT:
        t[(state, MemberJoined)] = state
        t[(state, TopicsChanged)] = state
        t[(state, MemberDeparted)] = departed
        t[(state, AttemptFailed)] = GroupState.PENDING
        # Both cut the attempt short: it waits on the process that ended, or on the older one.
        t[(state, MemberAway)] = GroupState.PENDING
        t[(state, MemberReplaced)] = GroupState.PENDING
    return TransitionTable("Group", t)


TABLE = _build_table()


@attrs.define
class GroupMachine:
    group_id: str
    state: GroupState = GroupState.EMPTY
    generation: int = 0
    #: seed 01's ``rebalanceInitiated``: another attempt is owed after the one in flight.
    rebalance_pending: bool = False
    #: The group left Empty and has not begun an attempt since: joins postpone the first one.
    forming: bool = False
    #: Recovered from a record and no attempt since: the members it names not yet back (a set
    #: of its own, emptied one join at a time: a record of thousands of members costs no copy
    #: per join).
    awaiting: set[str] | None = None

    def handle(self, event: object) -> list[Effect]:
        next_state = TABLE.next_state(self.state, event, self)  # raises before any change
        effects: list[Effect] = []
        match event:
            case Recovered(awaiting=awaiting):
                self.awaiting = set(awaiting) if awaiting else None
            case MemberJoined(member_id=member_id) if self.awaiting is not None and (
                self.state in (GroupState.EMPTY, GroupState.PENDING)
            ):
                self.awaiting.discard(member_id)
                delay = Delay.RECOVERY if self.awaiting else Delay.NONE
                effects.append(ScheduleRebalance(delay=delay))
            case MemberJoined() | TopicsChanged():
                if self.state in _IN_FLIGHT:
                    self.rebalance_pending = True
                elif self.state is GroupState.EMPTY and isinstance(event, MemberJoined):
                    self.forming = True
                    effects.append(ScheduleRebalance(delay=Delay.INITIAL))
                elif self.forming and isinstance(event, MemberJoined):
                    effects.append(ScheduleRebalance(delay=Delay.INITIAL_AGAIN))
                elif self.state is GroupState.STABLE:
                    effects.append(ScheduleRebalance(delay=Delay.NONE))
            case MemberAway() | MemberReplaced():
                if self.state in _IN_FLIGHT:
                    effects.append(CancelAttempt())
                    self.rebalance_pending = False
                    effects.append(ScheduleRebalance(delay=Delay.NONE))
                elif self.state is GroupState.STABLE and isinstance(event, MemberReplaced):
                    effects.append(ScheduleRebalance(delay=Delay.NONE))
            case MemberDeparted():
                if self.state in _IN_FLIGHT:
                    effects.append(CancelAttempt())
                self.rebalance_pending = False
                if next_state is GroupState.EMPTY:
                    self.forming = False
                elif self.state is not GroupState.PENDING:
                    effects.append(ScheduleRebalance(delay=Delay.NONE))
            case AttemptBegan(generation=generation):
                if generation <= self.generation:
                    raise IllegalInput(f"generation {generation} is not above {self.generation}")
                self.generation = generation
                self.rebalance_pending = False
                self.forming = False
                self.awaiting = None
            case AttemptNotNeeded() | RecordAdopted():
                self.rebalance_pending = False
                self.forming = False
                self.awaiting = None
            case AttemptCompleted():
                if next_state is GroupState.PENDING:
                    self.rebalance_pending = False
                    effects.append(ScheduleRebalance(delay=Delay.NONE))
            case AttemptFailed():
                self.rebalance_pending = False
                self.forming = False
                effects.append(ScheduleRebalance(delay=Delay.BACKOFF))
        self.state = next_state
        return effects
