"""A group member as the coordinator sees it: ``Registered -> Stopping -> Starting -> Stable``.

An incremental rebalance (docs/design.md#rebalance) asks a member only what its assignment
needs: a member that only loses partitions goes ``Stable -> Stopping -> Stable`` (no start
follows its stop), one that only gains goes ``Registered/Stable -> Starting -> Stable`` (no stop
before its start), and one whose assignment does not change gets no input at all.

The machine owns the two facts that keep the invariants on the coordinator side: how many of the
member's deadlines it has missed (declared dead after a configured number:
docs/design.md#failure-detection), and when the member was last heard from, which bounds how long
it may still be fetching under its ownership lease after it falls silent
(docs/design.md#ownership-lease). Time is passed in; nothing here reads a clock.
"""

from __future__ import annotations

import enum
import math

import attrs

from statemachine.table import Guard, Guarded, TransitionTable


class MemberState(enum.Enum):
    REGISTERED = "Registered"
    STOPPING = "Stopping"
    STARTING = "Starting"
    STABLE = "Stable"
    DEAD = "Dead"


class DeathCause(enum.Enum):
    CONNECTION_CLOSED = "connection closed"
    CONNECTION_BROKEN = "connection broken"
    MISSED_DEADLINES = "missed deadlines"
    REFUSED_HANDOVERS = "refused or missed StopFetcher/StartFetcher"
    LEFT = "left the group"
    PROTOCOL_ERROR = "protocol error"
    LEASE_LAPSED = "lease ran out before its next Ping"
    FENCED = "fenced by a newer process under its instance id"
    SHED = "let go with its group: its broker could not keep every member"


# --- inputs ---------------------------------------------------------------------------------


@attrs.frozen(kw_only=True)
class StopFetcherSent:
    """A rebalance attempt asked the member to stop fetching (everything, or what it revokes),
    under ``generation``. ``start_follows`` False: the attempt only revokes, and the member is
    Stable again once it answered, under its own generation (the eager protocol always starts
    everyone it stopped)."""

    generation: int
    now: float
    start_follows: bool = True


@attrs.frozen(kw_only=True)
class StopFetcherAnswered:
    now: float


@attrs.frozen(kw_only=True)
class StartFetcherSent:
    generation: int
    now: float


@attrs.frozen(kw_only=True)
class StartFetcherAnswered:
    now: float


@attrs.frozen(kw_only=True)
class Adopted:
    """The member came back after a failover holding what its group's completed record gave it
    under ``generation``, and the group took it as it is: Stable, with no Stop or Start
    (docs/design.md#adoption-after-a-failover)."""

    generation: int


@attrs.frozen(kw_only=True)
class PingSent:
    """A Ping is about to be sent. If the member's lease has run out by now (the coordinator
    itself was paused, or out of contact with its store), the member stopped by its own rule and
    the Ping would restart its lease: the member is dead instead, its partitions free at once."""

    now: float


@attrs.frozen(kw_only=True)
class PingAnswered:
    now: float


@attrs.frozen(kw_only=True)
class DeadlineMissed:
    """A Ping, StopFetcher or StartFetcher went unanswered for 2/3 of the session timeout;
    ``handover`` for StopFetcher and StartFetcher."""

    now: float
    handover: bool = False


@attrs.frozen(kw_only=True)
class HandoverRefused:
    """The member answered StopFetcher or StartFetcher with an error (or with something else):
    a miss like a deadline passed, or one misbehaving member holds its group hostage, every
    member stopped, while attempt after attempt fails."""

    now: float


@attrs.frozen(kw_only=True)
class ConnectionClosed:
    """The member closed its connection (the peer's end of stream): it stops fetching before it
    closes (docs/design.md#ownership-lease), so its partitions are free at once."""

    now: float


@attrs.frozen(kw_only=True)
class ConnectionBroken:
    """The member's connection failed (a reset, a send error) instead of ending with the member's
    own close: the member may not know yet, and fetches on until it notices or its lease runs out
    (a paused process notices only when it resumes)."""

    now: float


@attrs.frozen(kw_only=True)
class Left:
    """LeaveGroup: a graceful close after the member stopped its fetchers and committed."""

    now: float


@attrs.frozen(kw_only=True)
class Fenced:
    """A newer process registered under this static member's instance id, and a StopFetcher
    telling this one so (reason FENCED_INSTANCE_ID) is about to be sent: it is no longer the
    member. Being told proves nothing (it may be paused), so what it holds stays its own until
    its answer, its clean close or its lease end, counted from that StopFetcher
    (docs/design.md#static-members)."""

    now: float


@attrs.frozen(kw_only=True)
class Shed:
    """Its broker, too far behind to keep every member, lets this member's group go
    (docs/design.md#shedding-load). ``told``: a StopFetcher saying so (reason BROKER_BUSY, with
    a back-off hint) is about to be sent, which renews its lease, as a fenced process's; what it
    holds is free at its answer, its clean close or its lease end counted from that StopFetcher.
    Otherwise (a member that cannot read it) its connection is closed under it, and it may fetch
    on until its lease runs out, as after a broken connection."""

    now: float
    told: bool


@attrs.frozen(kw_only=True)
class ProtocolViolation:
    """The member's connection broke the protocol and is being closed."""

    now: float


# --- effects --------------------------------------------------------------------------------


@attrs.frozen(kw_only=True)
class DeclaredDead:
    """The member is gone; its partitions may start elsewhere from ``partitions_free_at`` on:
    at once if it closed its connection or left, else when its lease has surely run out."""

    cause: DeathCause
    partitions_free_at: float


Effect = DeclaredDead

_LIVE = (MemberState.REGISTERED, MemberState.STOPPING, MemberState.STARTING, MemberState.STABLE)


def _uses_up_misses(machine: MemberMachine, event: DeadlineMissed | HandoverRefused) -> bool:
    missed, handovers_missed = machine.misses_after(event)
    if isinstance(event, HandoverRefused):
        # It answered, so only its handover misses count against it.
        return handovers_missed >= machine.timeouts.max_missed
    return max(missed, handovers_missed) >= machine.timeouts.max_missed


#: The miss uses up the member's allowance (``MemberTimeouts.max_missed``): it is dead.
LIMIT = Guard("misses used up", _uses_up_misses, otherwise="misses left")


def _lease_lapsed(machine: MemberMachine, event: PingSent) -> bool:
    # A member that does not keep the lease does not stop by itself: a Ping restarts nothing.
    return machine.timeouts.follows_lease and event.now >= machine.lease_end()


def _start_follows(machine: MemberMachine, event: StopFetcherAnswered) -> bool:
    return machine.start_follows


#: The attempt that stopped the member will start it: it waits in Stopping. Otherwise it was
#: only revoked, and is Stable again.
START_FOLLOWS = Guard("start follows", _start_follows, otherwise="revoked only")


#: The member's lease has run out: only a StartFetcher or an adoption may start it again
#: (docs/design.md#ownership-lease), never a Ping.
LAPSED = Guard("lease ran out", _lease_lapsed, otherwise="lease in force")


def _build_table() -> TransitionTable[MemberState]:
    t: dict[tuple[MemberState, type], MemberState | Guarded[MemberState]] = {}
    for state in _LIVE:
        # A new rebalance attempt may begin from any live state: a failed attempt leaves members
        # in Stopping or Starting, and the next attempt stops everyone again.
        t[(state, StopFetcherSent)] = MemberState.STOPPING
        t[(state, PingSent)] = Guarded(((LAPSED, MemberState.DEAD), (~LAPSED, state)))
        t[(state, PingAnswered)] = state
        for miss in (DeadlineMissed, HandoverRefused):
            t[(state, miss)] = Guarded(((LIMIT, MemberState.DEAD), (~LIMIT, state)))
        endings: tuple[type, ...] = (
            ConnectionClosed,
            ConnectionBroken,
            Left,
            ProtocolViolation,
            Fenced,
            Shed,
        )
        for event in endings:
            t[(state, event)] = MemberState.DEAD
    t[(MemberState.STOPPING, StopFetcherAnswered)] = Guarded(
        ((START_FOLLOWS, MemberState.STOPPING), (~START_FOLLOWS, MemberState.STABLE))
    )
    # An incremental attempt starts a member that gains partitions without stopping it first,
    # and one a failed attempt left Starting with no more than a new start.
    for state in _LIVE:
        t[(state, StartFetcherSent)] = MemberState.STARTING
    t[(MemberState.STARTING, StartFetcherAnswered)] = MemberState.STABLE
    t[(MemberState.REGISTERED, Adopted)] = MemberState.STABLE
    # A dead member's connection may still close, or a stale deadline fire, after death: absorbed.
    t[(MemberState.DEAD, ConnectionClosed)] = MemberState.DEAD
    t[(MemberState.DEAD, ConnectionBroken)] = MemberState.DEAD
    t[(MemberState.DEAD, DeadlineMissed)] = MemberState.DEAD
    t[(MemberState.DEAD, HandoverRefused)] = MemberState.DEAD
    return TransitionTable("Member (coordinator side)", t)


TABLE = _build_table()


@attrs.frozen(kw_only=True)
class MemberTimeouts:
    """The failure-detection numbers (docs/design.md#failure-detection), derived from the
    member's session timeout T."""

    session_timeout: float
    max_missed: int = 1
    lease_margin: float = 0.5
    #: False: a client older than the ownership lease (it reads no version-1 Ping), which
    #: fetches until told to stop or until its connection ends: whatever way it goes, its
    #: partitions wait T plus the margin after now, unless its StopFetcher answer freed them
    #: (docs/design.md#old-clients).
    follows_lease: bool = True

    @property
    def ping_interval(self) -> float:
        return self.session_timeout / 3

    @property
    def response_deadline(self) -> float:
        return self.session_timeout * 2 / 3


@attrs.define
class MemberMachine:
    member_id: str
    timeouts: MemberTimeouts
    last_heard: float
    #: When the coordinator last sent the member a request. The member may have received it
    #: even if its answer is lost, and each request it receives renews its lease.
    last_sent: float = -math.inf
    state: MemberState = MemberState.REGISTERED
    generation: int = -1
    missed: int = 0
    #: StopFetcher and StartFetcher requests in a row that the member refused or left
    #: unanswered. Only carrying one out clears it, not a Ping answer: a member that answers
    #: every Ping but refuses every StopFetcher would otherwise never use up its misses.
    handovers_missed: int = 0
    stop_answered: bool = False
    #: Whether the attempt that stopped the member will start it (``StopFetcherSent``).
    start_follows: bool = True

    def handle(self, event: object) -> list[Effect]:
        next_state = TABLE.next_state(self.state, event, self)  # raises before any change
        if self.state is MemberState.DEAD:
            return []
        effects: list[Effect] = []
        match event:
            case StopFetcherSent(now=now, start_follows=start_follows):
                # Its generation is that of the last start it was sent: Pings carry it, and a
                # member only revoked keeps its own (docs/design.md#generations-and-stale-offsets).
                self.stop_answered = False
                self.start_follows = start_follows
                self._sent(now)
            case StartFetcherSent(generation=generation, now=now):
                self.generation = generation
                self._sent(now)
            case Adopted(generation=generation):
                self.generation = generation
            case PingSent(now=now):
                if next_state is MemberState.DEAD:
                    effects.append(self._death(DeathCause.LEASE_LAPSED, now, silent=True))
                else:
                    self._sent(now)
            case StopFetcherAnswered(now=now):
                self.stop_answered = True
                self.handovers_missed = 0
                self._heard(now)
            case StartFetcherAnswered(now=now):
                self.handovers_missed = 0
                self._heard(now)
            case PingAnswered(now=now):
                self._heard(now)
            case DeadlineMissed(now=now):
                self.missed, self.handovers_missed = self.misses_after(event)
                if next_state is MemberState.DEAD:
                    cause = (
                        DeathCause.REFUSED_HANDOVERS
                        if self.handovers_missed >= self.timeouts.max_missed
                        else DeathCause.MISSED_DEADLINES
                    )
                    effects.append(self._death(cause, now, silent=True))
            case HandoverRefused(now=now):
                # It answered, but whether it stopped (or started) is unknown: its lease holds,
                # counted from this answer at the latest, and the misses stand.
                self.last_heard = max(self.last_heard, now)
                self.missed, self.handovers_missed = self.misses_after(event)
                if next_state is MemberState.DEAD:
                    effects.append(self._death(DeathCause.REFUSED_HANDOVERS, now, silent=True))
            case ConnectionClosed(now=now):
                effects.append(self._death(DeathCause.CONNECTION_CLOSED, now, silent=False))
            case ConnectionBroken(now=now):
                effects.append(self._death(DeathCause.CONNECTION_BROKEN, now, silent=True))
            case Left(now=now):
                effects.append(self._death(DeathCause.LEFT, now, silent=False))
            case ProtocolViolation(now=now):
                effects.append(self._death(DeathCause.PROTOCOL_ERROR, now, silent=True))
            case Fenced(now=now):
                self._sent(now)  # the StopFetcher that tells it renews its lease
                effects.append(self._death(DeathCause.FENCED, now, silent=True))
            case Shed(now=now, told=told):
                if told:
                    self._sent(now)  # as Fenced
                effects.append(self._death(DeathCause.SHED, now, silent=True))
        self.state = next_state
        return effects

    def misses_after(self, event: DeadlineMissed | HandoverRefused) -> tuple[int, int]:
        """``(missed, handovers_missed)`` as ``event`` leaves them: the table's guard and
        :meth:`handle` both count from here, so they cannot disagree."""
        if isinstance(event, HandoverRefused):
            return self.missed, self.handovers_missed + 1
        return self.missed + 1, self.handovers_missed + event.handover

    @property
    def alive(self) -> bool:
        return self.state is not MemberState.DEAD

    def lease_end(self) -> float:
        """The latest instant the member may still be fetching if it has heard nothing since.

        Its lease runs from a moment before the last request it received was sent
        (docs/design.md#ownership-lease), which may be later than its last answer that arrived
        (a request got through, its answer did not): so count from the last request sent, or
        the last answer if that came later."""
        last_contact = max(self.last_heard, self.last_sent)
        return last_contact + self.timeouts.session_timeout + self.timeouts.lease_margin

    def _sent(self, now: float) -> None:
        self.last_sent = max(self.last_sent, now)

    def _heard(self, now: float) -> None:
        self.last_heard = max(self.last_heard, now)
        self.missed = 0

    def _death(self, cause: DeathCause, now: float, *, silent: bool) -> DeclaredDead:
        # A member that closed or left stopped its fetchers first. One that fell silent, whose
        # connection broke under it, or that broke the protocol may still be fetching until its
        # lease runs out.
        free_at = max(now, self.lease_end()) if silent else now
        if not self.timeouts.follows_lease:
            # No lease of its own: it stops when it learns that its connection ended, which
            # the coordinator closes now (docs/design.md#old-clients).
            free_at = max(free_at, now + self.timeouts.session_timeout + self.timeouts.lease_margin)
        return DeclaredDead(cause=cause, partitions_free_at=free_at)
