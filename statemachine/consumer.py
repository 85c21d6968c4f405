"""The consumer client's own machine (seed 03's lightweight consumer), as an explicit table.

The consumer finds its coordinator by asking brokers round-robin, registers, and then only answers
the coordinator: Ping (report offsets), StopFetcher (stop, report final offsets), StartFetcher
(start the assigned partitions). Everything here is pure: inputs arrive as values carrying the
time, effects go back as values, and the trio layer (``consumer/``) performs them **in order**.

Three rules protect invariants (docs/design.md#invariants) that the input's type alone cannot
decide. Where they choose the next state they are guards on the table's entries (``RENEWED``,
``STALE``), drawn on the diagram; stop-before-close is a property of the effects:

* **Ownership lease.** The consumer may fetch only until T after the anchor of the latest
  coordinator request (or registration answer) it got: when it queued the frame the request
  says the coordinator had received, which came before the coordinator sent the request however
  long that took to arrive (docs/design.md#ownership-lease). :meth:`ConsumerMachine.lease_deadline`
  is when that runs out and :meth:`ConsumerMachine.check_lease` applies it; besides, any input
  whose ``now`` is at or past the deadline first expires the lease (stopping the fetchers), and an
  input that came over the connection the expiry closed is then dropped as :class:`Ignored` (a
  Ping read late from the socket buffer must not revive a lease that already ran out). A
  :class:`LeaseExpired` from before the deadline is a stale timer (the guard ``RENEWED``) and is
  :class:`Ignored`.
* **Coordinator epoch** (the guard ``STALE``). Ping/StopFetcher/StartFetcher below the highest
  epoch seen come from a deposed coordinator and are :class:`Ignored`, state untouched. A
  registration answer or a discovery result below it means we reached a deposed coordinator or
  stale metadata, so it ends as a rejection or a failed discovery would: back off and look again.
  A discovery result from a broker that is not the coordinator carries no epoch
  (:data:`UNKNOWN_EPOCH`): that is not stale metadata, and the registration answer that follows
  brings the epoch to check.
* **Stop before close, or reset.** The coordinator takes a closed connection (end of stream) as
  proof that the member stopped and may restart its partitions elsewhere at once. So a close
  while fetchers run is a *reset* (:class:`CloseConnection` with ``reset``), which proves
  nothing and leaves the partitions leased; a clean close comes only after
  :class:`StopFetchers`. The consumer keeps fetching under its lease while it looks for the
  coordinator after a lost connection, a :class:`CoordinatorMoved`, or a rejected or unanswered
  re-registration, and re-registers holding its partitions under its generation, which a new
  coordinator adopts (seed 04: "the consumer does not stop fetching data during the
  co-ordinator failover and re-discovery process"); only its lease running out stops it.

Under the incremental protocol (SPEC.md §11.5, §11.6) a StopFetcher may name partitions (the
guard ``REVOCATION``): only those stop, the rest are fetched on without a pause, and the generation
stays; a StartFetcher marked ``incremental`` goes on with the partitions already fetched
(:attr:`StartFetchers.kept`) and starts only the others. A static member (``instance_id``,
SPEC.md §11.11) is *fenced* when a newer process registers under its instance id: a StopFetcher
with reason FENCED_INSTANCE_ID, or that code answering its registration or a commit (the guard
``FENCED``), stops everything, answers, closes cleanly and ends in FENCED, which never registers
again; a static member closing sends no LeaveGroup, since a restart is expected.

NOT_COORDINATOR and COORDINATOR_LOAD_IN_PROGRESS (a registration refused, a commit or leave
answered so, or a discovery pass told that the group's coordinator slot has no live holder) mean a
coordinator failover is under way: the next discovery goes after the short ``failover_retry``, not
the backoff, for at most ``max_failover_retries`` in a row (the guard ``FAILOVER``; the state is
the same either way), so the consumer reaches a new coordinator within milliseconds of its load
ending (docs/design.md#loading). BROKER_BUSY (a broker whose loop is behind sheds new clients,
SPEC.md §11.7) comes with a hint: the next look waits the longer of it and the backoff,
lengthened at random by up to ``busy_jitter`` of it.

A consumer that fetches under its lease has more at stake than one that holds nothing: until the
lease runs out it looks for the coordinator at the *failover pace* whatever went wrong (no holder
yet, a refused connection to a dead broker, NOT_COORDINATOR), with jitter, and the doubling backoff
starts only after the lease (docs/design.md#finding-the-coordinator-again). The pace grows with the
group's size as the consumer estimates it (:meth:`ConsumerMachine.failover_pace`), so a large
group's looks do not overload the brokers that survived.

While in DISCOVERING or REDISCOVERING exactly one discovery is in flight (one round-robin pass over
the known brokers, reported as :class:`CoordinatorFound` or :class:`DiscoveryFailed`); every
transition into those states either emits one :class:`Discover` or inherits the one in flight.
"""

from __future__ import annotations

import enum
from typing import TypeAlias

import attrs

from protocol.errors import ErrorCode
from protocol.types import BrokerInfo, TopicId, TopicPartition
from statemachine.consumer_events import (
    Close,
    CloseConnection,
    CommitAndLeave,
    ConnectionLost,
    CoordinatorFound,
    CoordinatorMoved,
    CoordinatorRequest,
    Discover,
    DiscoveryFailed,
    Effect,
    Fenced,
    Ignored,
    Input,
    LeaseExpired,
    PingReceived,
    Register,
    Registered,
    RegistrationRejected,
    RespondPing,
    RespondStart,
    RespondStop,
    Start,
    StartFetcherReceived,
    StartFetchers,
    StopFetcherReceived,
    StopFetchers,
    coordinator_input,
)
from statemachine.table import Guard, Guarded, IllegalTransition, TransitionTable

__all__ = [
    "FAILOVER",
    "FAILOVER_CODES",
    "FENCED",
    "INITIAL_STATE",
    "RENEWED",
    "REVOCATION",
    "SHED",
    "STALE",
    "STOP_ALL",
    "TABLE",
    "UNKNOWN_EPOCH",
    "Close",
    "CloseConnection",
    "CommitAndLeave",
    "ConnectionLost",
    "ConsumerConfig",
    "ConsumerMachine",
    "ConsumerState",
    "CoordinatorFound",
    "CoordinatorMoved",
    "CoordinatorRequest",
    "Discover",
    "DiscoveryFailed",
    "Effect",
    "Fenced",
    "Ignored",
    "Input",
    "LeaseExpired",
    "PingReceived",
    "Register",
    "Registered",
    "RegistrationRejected",
    "RespondPing",
    "RespondStart",
    "RespondStop",
    "Start",
    "StartFetcherReceived",
    "StartFetchers",
    "StopFetcherReceived",
    "StopFetchers",
    "coordinator_input",
]


class ConsumerState(enum.Enum):
    IDLE = "Idle"
    """Constructed, not started."""
    DISCOVERING = "Discovering"
    """Asking brokers round-robin which one is the coordinator; no fetchers, no connection."""
    REGISTERING = "Registering"
    """RegisterConsumer sent to the coordinator; no fetchers."""
    STOPPED = "Stopped"
    """Registered, no fetchers: waiting for StartFetcher."""
    FETCHING = "Fetching"
    """Registered and fetching the partitions of the last StartFetcher."""
    REDISCOVERING = "Rediscovering"
    """The coordinator moved; looking for the new one while still fetching under the lease."""
    REREGISTERING = "Reregistering"
    """Registering with the new coordinator, offering the partitions still fetched."""
    CLOSED = "Closed"
    FENCED = "Fenced"
    """A newer process took this member's instance id: stopped, closed, and never registering
    again (SPEC.md §11.11). The application hears FENCED_INSTANCE_ID."""


INITIAL_STATE = ConsumerState.IDLE

UNKNOWN_EPOCH = -1
"""The epoch of a CoordinatorFound from a broker that did not tell one: only the coordinator
knows its own, so a follower names it in ClusterMetadata with ``coordinator_epoch`` -1."""


_COORDINATOR_REQUESTS = (PingReceived, StopFetcherReceived, StartFetcherReceived)
_FROM_CONNECTION = (
    *_COORDINATOR_REQUESTS,
    Registered,
    RegistrationRejected,
    CoordinatorMoved,
    Fenced,
    ConnectionLost,
)
"""Inputs that arrive over the coordinator connection, so are void once it has been closed."""


# --- the table ----------------------------------------------------------------------------------


_WithEpoch: TypeAlias = (
    PingReceived | StopFetcherReceived | StartFetcherReceived | Registered | CoordinatorFound
)


def _below_epoch(machine: ConsumerMachine, event: _WithEpoch) -> bool:
    if isinstance(event, CoordinatorFound) and event.epoch == UNKNOWN_EPOCH:
        return False  # a follower's answer: the registration answer brings the epoch to check
    return event.epoch < machine.epoch


#: The input comes from a deposed coordinator or from stale metadata.
STALE = Guard("stale epoch", _below_epoch, otherwise="current epoch")


def _before_deadline(machine: ConsumerMachine, event: LeaseExpired) -> bool:
    deadline = machine.lease_deadline()
    return deadline is not None and event.now < deadline


#: The timer fired for a deadline that has moved on since: the coordinator was heard meanwhile.
RENEWED = Guard("renewed since", _before_deadline, otherwise="ran out")

FAILOVER_CODES = frozenset({ErrorCode.NOT_COORDINATOR, ErrorCode.COORDINATOR_LOAD_IN_PROGRESS})
"""The answers of a cluster in the middle of a coordinator failover: a successor that is still
reading the group's record, or a broker that is not (or not yet) the coordinator. The new
coordinator is about to answer, so they are retried after ``failover_retry`` rather than after
the backoff (docs/design.md#loading)."""


def _failover_retry(
    machine: ConsumerMachine, event: RegistrationRejected | CoordinatorMoved | DiscoveryFailed
) -> bool:
    return (
        event.error_code in FAILOVER_CODES
        and machine.failover_retries < machine.config.max_failover_retries
    )


#: The answer says a failover is under way, and the quick retries in a row are not used up.
FAILOVER = Guard("failover under way", _failover_retry, otherwise="refused")


def _fenced(machine: ConsumerMachine, event: StopFetcherReceived | RegistrationRejected) -> bool:
    if isinstance(event, StopFetcherReceived):
        fenced = event.reason is ErrorCode.FENCED_INSTANCE_ID
        return fenced and not _below_epoch(machine, event)
    return event.error_code is ErrorCode.FENCED_INSTANCE_ID


#: A newer process registered under this member's instance id (SPEC.md §11.11).
FENCED = Guard("fenced", _fenced)

#: Refused for another reason than fencing; a failover's quick retry is another outcome.
_REFUSED = Guard(
    "refused",
    lambda machine, event: not _failover_retry(machine, event) and not _fenced(machine, event),
)


def _shed(machine: ConsumerMachine, event: StopFetcherReceived | RegistrationRejected) -> bool:
    if isinstance(event, StopFetcherReceived):
        return event.reason is ErrorCode.BROKER_BUSY and not _below_epoch(machine, event)
    return event.error_code is ErrorCode.BROKER_BUSY


#: The broker let this member's group go (SPEC.md §11.7): a StopFetcher with reason BROKER_BUSY,
#: or a re-registration refused BROKER_BUSY (the door never refuses one that lists partitions:
#: only a group held out does). Stop everything, close cleanly, and come back after the hint.
SHED = Guard("shed", _shed)

#: A re-registration refused for another reason than fencing or its group held out.
_REFUSED_LEASED = Guard(
    "refused",
    lambda machine, event: _REFUSED.holds(machine, event) and not _shed(machine, event),
)


def _stop_of(machine: ConsumerMachine, event: StopFetcherReceived, *, listed: bool) -> bool:
    """A rebalance's StopFetcher at the current epoch, naming partitions (``listed``) or not."""
    if _below_epoch(machine, event) or _fenced(machine, event) or _shed(machine, event):
        return False
    return (event.partitions is not None) == listed


#: The StopFetcher names the partitions to stop: the rest go on (SPEC.md §11.5).
REVOCATION = Guard("revocation", lambda m, e: _stop_of(m, e, listed=True))
#: The StopFetcher names no partitions: stop everything.
STOP_ALL = Guard("stop all", lambda m, e: _stop_of(m, e, listed=False))


def _epoch_checked(current: ConsumerState, stale: ConsumerState) -> Guarded[ConsumerState]:
    return Guarded(((~STALE, current), (STALE, stale)))


def _lease_checked(state: ConsumerState) -> Guarded[ConsumerState]:
    return Guarded(((~RENEWED, ConsumerState.DISCOVERING), (RENEWED, state)))


def _retried(state: ConsumerState) -> Guarded[ConsumerState]:
    """The same state either way: the guard chooses the delay of the next discovery."""
    return Guarded(((FAILOVER, state), (~FAILOVER, state)))


def _registration_refused(state: ConsumerState) -> Guarded[ConsumerState]:
    """Retried in ``state`` (after a delay the guard chooses), unless the refusal is a fence."""
    return Guarded(((FAILOVER, state), (_REFUSED, state), (FENCED, ConsumerState.FENCED)))


def _stop_checked(
    current: ConsumerState, *, revoked: ConsumerState, stopped: ConsumerState
) -> Guarded[ConsumerState]:
    return Guarded(
        (
            (STALE, current),
            (REVOCATION, revoked),
            (STOP_ALL, stopped),
            (FENCED, ConsumerState.FENCED),
            (SHED, ConsumerState.DISCOVERING),
        )
    )


def _build_table() -> TransitionTable[ConsumerState]:
    S = ConsumerState
    t: dict[tuple[ConsumerState, type], ConsumerState | Guarded[ConsumerState]] = {
        (S.IDLE, Start): S.DISCOVERING,
        # Stale metadata is a failed discovery; a deposed coordinator's acceptance, a rejection.
        (S.DISCOVERING, CoordinatorFound): _epoch_checked(S.REGISTERING, S.DISCOVERING),
        (S.DISCOVERING, DiscoveryFailed): _retried(S.DISCOVERING),
        (S.REGISTERING, Registered): _epoch_checked(S.STOPPED, S.DISCOVERING),
        (S.REGISTERING, RegistrationRejected): _registration_refused(S.DISCOVERING),
        (S.REGISTERING, ConnectionLost): S.DISCOVERING,
        # A deposed coordinator's requests are ignored.
        (S.STOPPED, PingReceived): _epoch_checked(S.STOPPED, S.STOPPED),
        (S.STOPPED, StopFetcherReceived): _stop_checked(
            S.STOPPED, revoked=S.STOPPED, stopped=S.STOPPED
        ),
        (S.STOPPED, StartFetcherReceived): _epoch_checked(S.FETCHING, S.STOPPED),
        (S.STOPPED, CoordinatorMoved): _retried(S.DISCOVERING),
        (S.STOPPED, Fenced): S.FENCED,
        (S.STOPPED, ConnectionLost): S.DISCOVERING,
        (S.STOPPED, LeaseExpired): _lease_checked(S.STOPPED),
        (S.FETCHING, PingReceived): _epoch_checked(S.FETCHING, S.FETCHING),
        # A revocation stops some partitions and fetches on with the rest.
        (S.FETCHING, StopFetcherReceived): _stop_checked(
            S.FETCHING, revoked=S.FETCHING, stopped=S.STOPPED
        ),
        # A StartFetcher without a StopFetcher first replaces the assignment: stop, then start
        # (an incremental one stops only what it no longer names).
        (S.FETCHING, StartFetcherReceived): _epoch_checked(S.FETCHING, S.FETCHING),
        (S.FETCHING, CoordinatorMoved): _retried(S.REDISCOVERING),
        (S.FETCHING, Fenced): S.FENCED,
        # The lease, not the connection, bounds fetching: fetch on while looking again.
        (S.FETCHING, ConnectionLost): S.REDISCOVERING,
        (S.FETCHING, LeaseExpired): _lease_checked(S.FETCHING),
        (S.REDISCOVERING, CoordinatorFound): _epoch_checked(S.REREGISTERING, S.REDISCOVERING),
        (S.REDISCOVERING, DiscoveryFailed): _retried(S.REDISCOVERING),
        (S.REDISCOVERING, LeaseExpired): _lease_checked(S.REDISCOVERING),
        (S.REREGISTERING, Registered): _epoch_checked(S.FETCHING, S.REDISCOVERING),
        (S.REREGISTERING, RegistrationRejected): Guarded(
            (
                (FAILOVER, S.REDISCOVERING),
                (_REFUSED_LEASED, S.REDISCOVERING),
                (FENCED, S.FENCED),
                (SHED, S.DISCOVERING),
            )
        ),
        (S.REREGISTERING, ConnectionLost): S.REDISCOVERING,
        (S.REREGISTERING, LeaseExpired): _lease_checked(S.REREGISTERING),
    }
    for state in S:
        t[(state, Close)] = S.CLOSED
    t[(S.FENCED, Close)] = S.FENCED  # it has ended already; closing keeps why
    return TransitionTable("Consumer client", t)


TABLE: TransitionTable[ConsumerState] = _build_table()

_LEASED = frozenset(
    {
        ConsumerState.STOPPED,
        ConsumerState.FETCHING,
        ConsumerState.REDISCOVERING,
        ConsumerState.REREGISTERING,
    }
)
"""States that count on having heard the coordinator lately: with fetchers running, or (STOPPED)
registered and waiting, where silence for T means the coordinator is presumed dead (seed 03)."""


@attrs.frozen(kw_only=True)
class ConsumerConfig:
    session_timeout: float = attrs.field(validator=attrs.validators.gt(0))
    """T, in the same unit as ``now`` (seconds on trio's clock)."""
    retry_backoff: float = attrs.field(default=0.1, validator=attrs.validators.ge(0))
    """First delay after a failed discovery or registration; doubles per failure in a row."""
    max_retry_backoff: float = attrs.field(default=5.0, validator=attrs.validators.ge(0))
    failover_retry: float = attrs.field(default=0.05, validator=attrs.validators.ge(0))
    """Delay before looking for the coordinator again after NOT_COORDINATOR or
    COORDINATOR_LOAD_IN_PROGRESS (:data:`FAILOVER_CODES`), instead of the backoff."""
    max_failover_retries: int = attrs.field(default=250, validator=attrs.validators.ge(0))
    """How many such quick retries in a row before the backoff applies again: a broker that keeps
    saying so is misconfigured, not in a failover. The default outlasts the brokers' default
    ZooKeeper session (8 s) and a tick (2 s) at 50 ms."""
    failover_jitter: float = attrs.field(
        default=0.5, validator=[attrs.validators.ge(0), attrs.validators.le(1)]
    )
    """The share of the failover pace by which each look is moved at random, either way, so that a
    group's consumers spread their looks (0: none, for tests that assert exact instants)."""
    busy_jitter: float = attrs.field(
        default=0.5, validator=[attrs.validators.ge(0), attrs.validators.le(1)]
    )
    """After a busy broker's back-off hint (BROKER_BUSY, SPEC.md §11.7), the next look comes
    that long plus a random share of it up to this (0: exactly the hint, for tests that assert
    exact instants)."""
    failover_looks_per_second: float = attrs.field(default=200.0, validator=attrs.validators.gt(0))
    """How often a whole group may look for its coordinator while its consumers fetch under their
    leases: each consumer's pace is its estimate of the group's size divided by this, at least
    ``failover_retry`` and at most T/6 (:meth:`ConsumerMachine.failover_pace`)."""
    instance_id: str | None = None
    """A static member's name, which outlives its processes (SPEC.md §11.11): registrations carry
    it, and closing sends no LeaveGroup. None: a dynamic member."""


@attrs.define
class ConsumerMachine:
    """The consumer's view of its membership. Attributes are read-only outside :meth:`handle`."""

    config: ConsumerConfig
    state: ConsumerState = INITIAL_STATE
    coordinator: BrokerInfo | None = None
    generation: int = -1
    """The generation of the last StartFetcher; -1 before any. Re-registrations report it."""
    epoch: int = -1
    """The highest coordinator epoch seen."""
    owned: tuple[TopicPartition, ...] = ()
    """The partitions the fetchers are running for: empty whenever they are stopped."""
    topic_ids: dict[str, TopicId] = attrs.field(factory=dict)
    """The incarnation of each topic of the last StartFetcher that named one (SPEC.md §11.12)."""
    last_heard: float | None = None
    """Where the lease runs from: the latest instant known to come before the coordinator sent
    a request or registration answer this consumer got (docs/design.md#ownership-lease), which
    is when this consumer queued the frame that request named, not when the request arrived."""
    failures: int = 0
    """Discovery or registration failures in a row; drives the backoff."""
    failover_retries: int = 0
    """Quick retries after :data:`FAILOVER_CODES` since the last registration."""
    group_size: int = 1
    """The group's size as this consumer estimates it from its latest StartFetcher: the
    partitions of the assigned topics over its own share (1 while it holds nothing or knows no
    count). It sets the failover pace."""
    last_error: ErrorCode | None = None
    """The latest reason this consumer is not registered, kept across retries until a
    registration succeeds: COORDINATOR_NOT_AVAILABLE after a discovery pass found no
    coordinator, else the registration's or coordinator's error."""

    # --- time -----------------------------------------------------------------------------------

    def lease_deadline(self) -> float | None:
        """When the lease runs out (fetchers stop, the coordinator is presumed gone), or None when
        the machine holds no lease. The trio layer sleeps until it and then calls check_lease."""
        if self.state not in _LEASED or self.last_heard is None:
            return None
        return self.last_heard + self.config.session_timeout

    def check_lease(self, now: float) -> list[Effect]:
        """Expire the lease if ``now`` is at or past its deadline; otherwise do nothing."""
        deadline = self.lease_deadline()
        if deadline is None or now < deadline:
            return []
        return self._step(LeaseExpired(now=now))

    def leased(self, now: float) -> bool:
        """Whether it fetches under a lease that has not run out: what it looks for the
        coordinator with is never shed by a busy broker (SPEC.md §11.7)."""
        deadline = self.lease_deadline()
        return bool(self.owned) and deadline is not None and now < deadline

    def failover_pace(self) -> float:
        """The delay between looks for the coordinator while fetching under the lease: the
        group's looks spread to ``failover_looks_per_second`` (at least ``failover_retry``), and
        at most T/6, so a consumer looks several times before its lease can run out."""
        config = self.config
        pace = max(config.failover_retry, self.group_size / config.failover_looks_per_second)
        return min(pace, config.session_timeout / 6)

    # --- inputs ---------------------------------------------------------------------------------

    def handle(self, event: Input) -> list[Effect]:
        """Apply one input; return what the trio layer must do, in order.

        Raises IllegalTransition, changing nothing, if the table does not allow the input in the
        current state. A lease that ran out before the input arrived is expired first, as a step of
        its own through the table; the table's guards decide everything else.
        """
        if not TABLE.allows(self.state, type(event)):
            raise IllegalTransition(TABLE.name, self.state, event)
        if isinstance(event, Start | Close | LeaseExpired):
            return self._step(event)
        effects: list[Effect] = []
        deadline = self.lease_deadline()
        if deadline is not None and event.now >= deadline:
            effects = self._step(LeaseExpired(now=event.now))
            if isinstance(event, _FROM_CONNECTION) or not TABLE.allows(self.state, type(event)):
                return [*effects, Ignored(event=event, reason="arrived after the lease ran out")]
        return [*effects, *self._step(event)]

    # --- the transitions' effects ---------------------------------------------------------------

    def _step(self, event: Input) -> list[Effect]:
        """Move along the table and compute the effects; ``self.state`` is still the old state
        while the effects are worked out."""
        transition = TABLE.lookup(self.state, event, self)
        next_state = transition.target
        stale = transition.guard == STALE.name
        S = ConsumerState
        effects: list[Effect] = []
        match event:
            case PingReceived() | StopFetcherReceived() | StartFetcherReceived() if stale:
                reason = f"coordinator epoch {event.epoch} is below {self.epoch}"
                effects.append(Ignored(event=event, reason=reason))
            case LeaseExpired() if transition.guard == RENEWED.name:
                effects.append(Ignored(event=event, reason="the lease was renewed since"))
            case CoordinatorFound(now=now) if stale:
                effects += self._failed_discovery(now)
            case Registered(now=now) if stale:
                effects += self._rejected(ErrorCode.STALE_COORDINATOR_EPOCH, now)
            case Start():
                self.failures = self.failover_retries = 0
                effects.append(Discover(delay=0.0))
            case CoordinatorFound(coordinator=coordinator, epoch=epoch):
                self.coordinator = coordinator
                self.epoch = max(self.epoch, epoch)
                effects.append(
                    Register(
                        coordinator=coordinator,
                        generation=self.generation,
                        owned=self.owned,
                        instance_id=self.config.instance_id,
                    )
                )
            case DiscoveryFailed(now=now, error_code=code, retry_after=hint):
                self.last_error = code
                failover = transition.guard == FAILOVER.name
                effects.append(self._look_again(now, failover=failover, hint=hint))
            case Registered(anchor=anchor, epoch=epoch):
                # The answer's generation is the group's, not one this process was started
                # under: taking it would let a re-registration claim what another process under
                # this id holds under that generation (docs/design.md#adoption-after-a-failover).
                self._heard(anchor, epoch)
                self.failures = self.failover_retries = 0
                self.last_error = None
            case RegistrationRejected() | Fenced() if next_state is S.FENCED:
                effects += self._fenced()
            case RegistrationRejected(retry_after=hint) if transition.guard == SHED.name:
                effects += self._let_go(hint)
            case RegistrationRejected(now=now, error_code=code, retry_after=hint):
                failover = transition.guard == FAILOVER.name
                effects += self._rejected(code, now, failover=failover, hint=hint)
            case CoordinatorMoved(now=now, error_code=code):
                effects += self._rejected(code, now, failover=transition.guard == FAILOVER.name)
            case PingReceived(anchor=anchor, correlation_id=cid, epoch=epoch):
                self._heard(anchor, epoch)
                effects.append(RespondPing(correlation_id=cid, partitions=self.owned))
            case StopFetcherReceived(
                anchor=anchor, correlation_id=cid, epoch=epoch, partitions=listed
            ) if transition.guard == REVOCATION.name:
                # Only the listed partitions stop; the generation stays (SPEC.md §11.5).
                self._heard(anchor, epoch)
                revoked = frozenset(listed or ())
                stopping = tuple(p for p in self.owned if p in revoked)
                if stopping:
                    effects.append(StopFetchers(partitions=stopping))
                effects.append(RespondStop(correlation_id=cid, partitions=stopping))
                self.owned = tuple(p for p in self.owned if p not in revoked)
            case StopFetcherReceived(anchor=anchor, correlation_id=cid, epoch=epoch):
                self._heard(anchor, epoch)
                if self.state is S.FETCHING:
                    effects.append(StopFetchers())
                effects.append(RespondStop(correlation_id=cid, partitions=self.owned))
                self.owned = ()
                if next_state is S.FENCED:  # answered: now close, and never register again
                    effects += self._fenced(stopped=True)
                elif transition.guard == SHED.name:  # answered: now close, come back later
                    effects += self._let_go(event.retry_after, stopped=True)
            case StartFetcherReceived(
                anchor=anchor,
                correlation_id=cid,
                epoch=epoch,
                generation=generation,
                streams=streams,
                incremental=incremental,
                topic_ids=topic_ids,
            ):
                self._heard(anchor, epoch)
                assigned = tuple(
                    sorted(
                        TopicPartition(topic=p.topic, partition=p.partition)
                        for stream in streams
                        for p in stream.partitions
                    )
                )
                ids = {t.topic: t.topic_id for t in topic_ids}
                kept: tuple[TopicPartition, ...] = ()
                if self.state is S.FETCHING and incremental:
                    # What goes on is never stopped; what it no longer names is (SPEC.md §11.6),
                    # nor a partition of another incarnation of its topic (SPEC.md §11.12).
                    wanted = frozenset(assigned)
                    kept = tuple(
                        p for p in self.owned if p in wanted and self._same_topic(p.topic, ids)
                    )
                    dropped = tuple(p for p in self.owned if p not in kept)
                    if dropped:
                        effects.append(StopFetchers(partitions=dropped))
                elif self.state is S.FETCHING:
                    effects.append(StopFetchers())
                self.generation = generation
                self.owned = assigned
                self.topic_ids = ids
                self.group_size = _group_size(event.topic_partitions, len(assigned))
                effects += [
                    StartFetchers(
                        generation=generation, streams=streams, kept=kept, topic_ids=topic_ids
                    ),
                    RespondStart(correlation_id=cid),
                ]
            case ConnectionLost(now=now) if self.state in (S.FETCHING, S.REREGISTERING):
                # Fetch on under the lease while finding the coordinator again; the connection
                # is abandoned with a reset, since fetching goes on. The first look is at once.
                look = Discover(delay=0.0) if self.state is S.FETCHING else self._leased_look(now)
                self.coordinator = None
                effects += [CloseConnection(reset=True), look or self._backed_off()]
            case ConnectionLost() | LeaseExpired():
                if self.state is S.REGISTERING:
                    self.failures += 1
                effects += self._stop_and_disconnect()
                if self.state is not S.REDISCOVERING:  # that one's discovery is still in flight
                    effects.append(Discover(delay=self._backoff()))
            case Close() if self.state in (S.STOPPED, S.FETCHING):
                # Registered: stop, commit and leave over the connection, and only then close it.
                if self.state is S.FETCHING:
                    effects.append(StopFetchers())
                effects += [
                    CommitAndLeave(
                        generation=self.generation,
                        partitions=self.owned,
                        leave=self.config.instance_id is None,
                    ),
                    CloseConnection(),
                ]
                self.owned = ()
                self.coordinator = None
            case Close():
                effects += self._stop_and_disconnect()
        self.state = next_state
        return effects

    def _fenced(self, *, stopped: bool = False) -> list[Effect]:
        """A newer process has this member's instance id: stop (unless ``stopped`` already),
        close cleanly, and look for no coordinator again (SPEC.md §11.11)."""
        S = ConsumerState
        effects: list[Effect] = []
        if self.state in (S.FETCHING, S.REREGISTERING) and not stopped:
            effects.append(StopFetchers())
        self.owned = ()
        self.coordinator = None
        self.last_error = ErrorCode.FENCED_INSTANCE_ID
        effects.append(CloseConnection())
        return effects

    def _let_go(self, hint: float, *, stopped: bool = False) -> list[Effect]:
        """The broker let this member's group go (SPEC.md §11.7): stop (unless ``stopped``
        already), close cleanly, and look for the coordinator again after the hint, lengthened
        at random by up to ``busy_jitter`` of it. The broker asked for the wait, and chose it:
        it counts as no failure, and the backoff does not lengthen it."""
        S = ConsumerState
        effects: list[Effect] = []
        if self.state in (S.FETCHING, S.REREGISTERING) and not stopped:
            effects.append(StopFetchers())
        self.owned = ()
        self.coordinator = None
        self.last_error = ErrorCode.BROKER_BUSY
        spread = hint * self.config.busy_jitter / 2
        effects += [CloseConnection(), Discover(delay=hint + spread, jitter=spread)]
        return effects

    def _failed_discovery(self, now: float) -> list[Effect]:
        return [self._look_again(now, failover=False)]

    def _rejected(
        self, code: ErrorCode, now: float, *, failover: bool = False, hint: float = 0.0
    ) -> list[Effect]:
        """The broker we registered with is not (or no longer) our coordinator: look again, soon
        if it said a failover is under way (``failover``), else after the backoff (and at least
        a busy broker's ``hint``)."""
        self.last_error = code
        look = self._look_again(now, failover=failover, hint=hint)
        self.coordinator = None
        fetching = self.state in (ConsumerState.FETCHING, ConsumerState.REREGISTERING)
        return [CloseConnection(reset=fetching), look]

    def _look_again(self, now: float, *, failover: bool, hint: float = 0.0) -> Discover:
        """The next look after a failed one: at the failover pace while fetching under the lease
        (whatever failed: a re-registration with partitions at stake is never shed, SPEC.md
        §11.7), else soon after an answer that a failover is under way, else after the backoff,
        and no sooner than a busy broker's ``hint``."""
        leased = self._leased_look(now)
        if leased is not None:
            return leased
        if failover:
            self.failover_retries += 1
            return Discover(delay=self.config.failover_retry)
        return self._backed_off(hint)

    def _leased_look(self, now: float) -> Discover | None:
        """While fetching under a lease that has not run out, the next look at the failover pace
        with jitter; the failures in a row are not counted, so the backoff starts afresh after
        the lease (docs/design.md#finding-the-coordinator-again)."""
        S = ConsumerState
        deadline = self.lease_deadline()
        fetching = self.state in (S.FETCHING, S.REDISCOVERING, S.REREGISTERING) and self.owned
        if not fetching or deadline is None or now >= deadline:
            return None
        pace = self.failover_pace()
        return Discover(delay=pace, jitter=pace * self.config.failover_jitter)

    def _backed_off(self, hint: float = 0.0) -> Discover:
        """After the backoff; after a busy broker's ``hint`` if that is longer, lengthened at
        random by up to ``busy_jitter`` of it, so the clients it refused together do not all
        come back together."""
        self.failures += 1
        delay = self._backoff()
        if hint <= 0:
            return Discover(delay=delay)
        wait = max(delay, hint)
        spread = wait * self.config.busy_jitter / 2
        return Discover(delay=wait + spread, jitter=spread)

    def _stop_and_disconnect(self) -> list[Effect]:
        """Stop fetching (if still fetching), then close the coordinator connection (if any)."""
        S = ConsumerState
        effects: list[Effect] = []
        if self.state in (S.FETCHING, S.REDISCOVERING, S.REREGISTERING):
            effects.append(StopFetchers())
        self.owned = ()
        if self.state in (S.REGISTERING, S.STOPPED, S.FETCHING, S.REREGISTERING):
            effects.append(CloseConnection())
            self.coordinator = None
        return effects

    def _same_topic(self, topic: str, ids: dict[str, TopicId]) -> bool:
        """Whether a start names the incarnation of ``topic`` being fetched (or either names
        none: a coordinator of an older level)."""
        was, now = self.topic_ids.get(topic), ids.get(topic)
        return was is None or now is None or was == now

    def _heard(self, anchor: float | None, epoch: int) -> None:
        """The coordinator was heard: the lease runs from ``anchor`` (None: renews nothing), and
        never moves back, since an earlier request already proved a later instant."""
        if anchor is not None:
            self.last_heard = anchor if self.last_heard is None else max(self.last_heard, anchor)
        self.epoch = max(self.epoch, epoch)

    def _backoff(self) -> float:
        if self.failures == 0:
            return 0.0
        delay = self.config.retry_backoff * 2 ** min(self.failures - 1, 32)
        return float(min(delay, self.config.max_retry_backoff))


def _group_size(topic_partitions: int, share: int) -> int:
    """The group's size that a share of ``share`` of ``topic_partitions`` partitions suggests
    (the assignors give each member about as many); 1 when either is unknown."""
    if topic_partitions <= 0 or share <= 0:
        return 1
    return max(1, -(-topic_partitions // share))
