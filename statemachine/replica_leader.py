"""A partition's leader (DESIGN37 §2.4): its high watermark, its in-sync replicas, and the
acks=all produces waiting on them. One machine per partition led here, for one leader epoch;
inputs are events with the time passed in, outputs are effects the runtime performs (write the
ISR, read the state again, answer a produce, step down).

The rules, which are Kafka's with what it learned:

* **The high watermark** is the least end offset among every member of the *maximal* ISR
  (KIP-497): the confirmed ISR (what the store holds as far as this leader knows), plus the
  members of an ISR change written but not yet confirmed. A member being added counts at once,
  which only holds the high watermark back; a member being removed counts until the store
  confirms its removal, so no record is acknowledged on the strength of a write that may not
  have happened. The leader's own end is its durable end. A follower counts with the offset it
  last fetched from, and only under the log directory its entry names: one that has not fetched
  in this epoch, or that fetches from another directory (its disk was wiped), holds the high
  watermark where it is. It never goes down.
* **Expand**: a replica outside the ISR that fetches from at least the high watermark and the
  start of this leader's epoch, from the log directory its broker registered, joins it under that
  directory (so that the controller can elect it by that entry).
* **Shrink**: a follower that has not caught up with the log end for ``replica_lag``, or that
  fetches from another directory than its entry's, leaves it. The leader never leaves.
* **One change at a time**: while a change is written, no other is proposed. A change that lost
  its version race asks for the state again (``ReadState``) and is dropped once it comes; another
  leader or epoch in the state means this leader resigns.
* **acks=all** is refused before anything is written (NOT_ENOUGH_REPLICAS, 19) unless the
  confirmed ISR and the ISR the pending change would leave both have ``min_insync`` members;
  once appended it is answered when the high watermark covers its records, or with
  NOT_ENOUGH_REPLICAS_AFTER_APPEND (20) as soon as the confirmed ISR is below ``min_insync``.

The phase of the machine is the ISR change in flight, driven by ``TABLE``; an input the table
does not allow in the phase raises before anything changes.
"""

from __future__ import annotations

import collections
import enum
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import attrs

from protocol.errors import ErrorCode, IllegalInput
from statemachine.partition_state import (
    NO_EPOCH,
    EpochStart,
    IsrEntry,
    PartitionKey,
    PartitionState,
    StateWrite,
    epoch_end,
)
from statemachine.table import Guard, Guarded, TransitionTable

__all__ = [
    "TABLE",
    "Answered",
    "Appended",
    "BrokersSeen",
    "Effect",
    "Event",
    "Flushed",
    "FollowerFetched",
    "FollowerPosition",
    "IsrWriteLost",
    "IsrWritten",
    "LeaderPhase",
    "LeaderSettings",
    "MayAppend",
    "ProduceAsked",
    "ProduceExpired",
    "ReadState",
    "ReplicaLeader",
    "Resigned",
    "StateRead",
    "StateSeen",
    "Tick",
    "WriteIsr",
    "diverging",
    "epochs_between",
]


class LeaderPhase(enum.Enum):
    STEADY = "Steady"
    """No ISR change in flight."""
    CHANGING = "Changing"
    """One ISR change written; the store has not answered."""
    REREADING = "Rereading"
    """The change lost its version race; the state is being read again."""
    RESIGNED = "Resigned"
    """Another leader or epoch is in force: this machine is done."""


@attrs.frozen(kw_only=True)
class LeaderSettings:
    min_insync: int
    #: Seconds a follower may go without catching up with the log end before it leaves the ISR.
    replica_lag: float


@attrs.frozen(kw_only=True)
class FollowerPosition:
    """What a follower last said in this epoch: the directory it fetched from and the offset
    (None for both: it has not fetched yet), and when it last had everything up to the log end
    (when this leader was elected, if never since). Under a steady stream of produces the log
    end moves between two fetches, so a follower that fetches from the log end this leader had
    at its previous fetch had everything then (Kafka's ``lastCaughtUpTime``): ``served_end`` and
    ``fetched_at`` are that log end and that time."""

    log_dir: uuid.UUID | None = None
    fetch_offset: int | None = None
    caught_up_at: float
    served_end: int = 0
    fetched_at: float | None = None


@attrs.frozen(kw_only=True)
class IsrChange:
    isr: tuple[IsrEntry, ...]
    expected_version: int


# --- inputs ----------------------------------------------------------------------------------


@attrs.frozen(kw_only=True)
class ProduceAsked:
    """A produce for the partition, before anything is appended."""

    request: int
    acks_all: bool


@attrs.frozen(kw_only=True)
class Appended:
    """``request``'s records were appended, the log now ending at ``end``, durable up to
    ``durable_end``."""

    request: int
    acks_all: bool
    end: int
    durable_end: int


@attrs.frozen(kw_only=True)
class Flushed:
    durable_end: int


@attrs.frozen(kw_only=True)
class FollowerFetched:
    """A follower fetched from ``fetch_offset`` (it has every record below it, durable under its
    own policy) with its log in ``log_dir``."""

    broker_id: int
    log_dir: uuid.UUID
    fetch_offset: int
    now: float


@attrs.frozen(kw_only=True)
class Tick:
    """Time passed: followers that fell behind leave the ISR."""

    now: float


@attrs.frozen(kw_only=True)
class ProduceExpired:
    """``request``'s ``timeout_ms`` passed (the runtime's timer): answered REQUEST_TIMED_OUT if it
    still waits."""

    request: int


@attrs.frozen(kw_only=True)
class IsrWritten:
    """The store confirmed the ISR change in flight."""


@attrs.frozen(kw_only=True)
class IsrWriteLost:
    """The ISR change in flight lost its version race: somebody else wrote the state first."""


@attrs.frozen(kw_only=True)
class StateRead:
    """The state read again after a lost race."""

    state: PartitionState


@attrs.frozen(kw_only=True)
class StateSeen:
    """The cluster's view of the partition's state changed (a controller's write, or this
    leader's own seen back); a version not above the one known is old news."""

    state: PartitionState


@attrs.frozen(kw_only=True)
class BrokersSeen:
    """The live brokers changed: each with the log directory it registered."""

    registered: Mapping[int, uuid.UUID]


Event = (
    ProduceAsked
    | Appended
    | Flushed
    | FollowerFetched
    | Tick
    | ProduceExpired
    | IsrWritten
    | IsrWriteLost
    | StateRead
    | StateSeen
    | BrokersSeen
)


# --- effects ---------------------------------------------------------------------------------


@attrs.frozen(kw_only=True)
class MayAppend:
    request: int


@attrs.frozen(kw_only=True)
class Answered:
    """Answer ``request`` with ``code`` (NONE: acknowledged)."""

    request: int
    code: ErrorCode


@attrs.frozen(kw_only=True)
class WriteIsr:
    """Write the state, conditional on the version; answer with IsrWritten, or IsrWriteLost
    when the version did not match or the outcome is unknown (the store unreachable): reading the
    state again tells which ISR is in force."""

    write: StateWrite


@attrs.frozen(kw_only=True)
class ReadState:
    """Read the partition's state again; answer with StateRead."""

    key: PartitionKey


@attrs.frozen(kw_only=True)
class Resigned:
    """Another leader or epoch is in force: stop leading (every waiting produce was answered
    NOT_LEADER_OR_FOLLOWER)."""

    key: PartitionKey
    state: PartitionState


Effect = MayAppend | Answered | WriteIsr | ReadState | Resigned


# --- the table -------------------------------------------------------------------------------

S = LeaderPhase

PROPOSES = Guard(
    "proposes a change",
    lambda machine, event: machine.would_propose(event),
    otherwise="nothing to change",
)
DEPOSED = Guard(
    "deposed",
    lambda machine, event: machine.deposed_by(event),
    otherwise="still leading",
)


def _build_table() -> TransitionTable[LeaderPhase]:
    t: dict[tuple[LeaderPhase, type], LeaderPhase | Guarded[LeaderPhase]] = {}
    for phase in (S.STEADY, S.CHANGING, S.REREADING):
        for produced in (ProduceAsked, Appended, Flushed, ProduceExpired):
            t[(phase, produced)] = phase
        t[(phase, StateSeen)] = Guarded(((DEPOSED, S.RESIGNED), (~DEPOSED, phase)))
        t[(phase, BrokersSeen)] = phase
    for event_type in (FollowerFetched, Tick):
        t[(S.STEADY, event_type)] = Guarded(((PROPOSES, S.CHANGING), (~PROPOSES, S.STEADY)))
        t[(S.CHANGING, event_type)] = S.CHANGING
        t[(S.REREADING, event_type)] = S.REREADING
    t[(S.CHANGING, IsrWritten)] = S.STEADY
    t[(S.CHANGING, IsrWriteLost)] = S.REREADING
    t[(S.REREADING, StateRead)] = Guarded(((DEPOSED, S.RESIGNED), (~DEPOSED, S.STEADY)))
    t[(S.RESIGNED, StateSeen)] = S.RESIGNED
    return TransitionTable("Partition leader", t)


TABLE = _build_table()


# --- the machine -----------------------------------------------------------------------------


@attrs.define
class ReplicaLeader:
    """The leader of ``key`` under ``epoch``. Build it with :meth:`elected`."""

    key: PartitionKey
    broker_id: int
    log_dir: uuid.UUID
    replicas: tuple[int, ...]
    settings: LeaderSettings
    epoch: int
    #: The store version of the state as last known.
    version: int
    isr: tuple[IsrEntry, ...]
    #: Where this leader's epoch starts: a follower joins the ISR only once it has reached it.
    epoch_start: int
    leo: int
    durable_end: int
    hw: int
    followers: dict[int, FollowerPosition]
    #: Each live broker's registered log directory: only a replica fetching from it may join.
    registered: Mapping[int, uuid.UUID]
    pending: IsrChange | None = None
    phase: LeaderPhase = LeaderPhase.STEADY
    #: (end, request) of the acks=all produces waiting for the high watermark, by end.
    _waiting: collections.deque[tuple[int, int]] = attrs.field(factory=collections.deque)

    @classmethod
    def elected(
        cls,
        *,
        key: PartitionKey,
        broker_id: int,
        log_dir: uuid.UUID,
        replicas: Sequence[int],
        state: PartitionState,
        settings: LeaderSettings,
        leo: int,
        durable_end: int,
        hw: int,
        registered: Mapping[int, uuid.UUID],
        now: float,
    ) -> ReplicaLeader:
        """The leader ``state`` names this broker, its log ending at ``leo`` (durable to
        ``durable_end``) with ``hw`` checkpointed (at most the true one). Every follower is
        taken as caught up ``now``, so none leaves the ISR before ``replica_lag`` has passed."""
        me = IsrEntry(broker_id=broker_id, log_dir=log_dir)
        if state.leader != broker_id or me not in state.isr or broker_id not in replicas:
            raise IllegalInput(f"{key}: {state} does not make broker {broker_id} its leader")
        if not 0 <= durable_end <= leo or settings.min_insync < 1:
            raise IllegalInput(f"{key}: durable end {durable_end}, log end {leo}, {settings}")
        return cls(
            key=key,
            broker_id=broker_id,
            log_dir=log_dir,
            replicas=tuple(replicas),
            settings=settings,
            epoch=state.leader_epoch,
            version=state.version,
            isr=state.isr,
            epoch_start=leo,
            leo=leo,
            durable_end=durable_end,
            hw=min(hw, durable_end),
            followers={b: FollowerPosition(caught_up_at=now) for b in replicas if b != broker_id},
            registered=dict(registered),
        )

    # --- what the runtime reads ----------------------------------------------------------

    @property
    def maximal_isr(self) -> tuple[IsrEntry, ...]:
        """Every member that may be in the ISR in force: the confirmed ones and those of the
        change in flight."""
        if self.pending is None:
            return self.isr
        return self.isr + tuple(e for e in self.pending.isr if e not in self.isr)

    def waiting(self) -> tuple[int, ...]:
        """The acks=all produces waiting for the high watermark."""
        return tuple(request for _, request in self._waiting)

    # --- guards (pure) -------------------------------------------------------------------

    def would_propose(self, event: FollowerFetched | Tick) -> bool:
        followers = self._followers_after(event)
        return self._proposal(followers, event.now) is not None

    def deposed_by(self, event: StateRead | StateSeen) -> bool:
        """Whether the state names another leader or epoch: a state read again is the truth; a
        state seen in the view is old news unless its version is above the one known."""
        state = event.state
        if isinstance(event, StateSeen) and state.version <= self.version:
            return False
        return state.leader != self.broker_id or state.leader_epoch != self.epoch

    # --- input ---------------------------------------------------------------------------

    def handle(self, event: Event) -> list[Effect]:
        """Apply ``event``; raises :class:`IllegalInput` (the machine unchanged) for an input
        its phase does not take or whose offsets go back."""
        target = TABLE.next_state(self.phase, event, self)
        if isinstance(event, Appended) and not (
            self.leo <= event.end and event.durable_end <= event.end
        ):
            raise IllegalInput(f"{self.key}: appended to {event.end} below {self.leo}")
        if isinstance(event, Flushed) and event.durable_end > self.leo:
            raise IllegalInput(f"{self.key}: durable to {event.durable_end} past {self.leo}")
        handler: Callable[[ReplicaLeader, Any], list[Effect]] = _HANDLERS[type(event)]
        effects = handler(self, event)
        self.phase = target
        return effects

    def _produce_asked(self, event: ProduceAsked) -> list[Effect]:
        if event.acks_all and not self._enough_before_append():
            return [Answered(request=event.request, code=ErrorCode.NOT_ENOUGH_REPLICAS)]
        return [MayAppend(request=event.request)]

    def _appended(self, event: Appended) -> list[Effect]:
        self.leo = event.end
        self.durable_end = max(self.durable_end, event.durable_end)
        effects: list[Effect] = []
        if not event.acks_all:
            effects.append(Answered(request=event.request, code=ErrorCode.NONE))
        elif len(self.isr) < self.settings.min_insync:
            code = ErrorCode.NOT_ENOUGH_REPLICAS_AFTER_APPEND
            effects.append(Answered(request=event.request, code=code))
        else:
            self._waiting.append((event.end, event.request))
        return effects + self._settle()

    def _flushed(self, event: Flushed) -> list[Effect]:
        self.durable_end = max(self.durable_end, event.durable_end)
        return self._settle()

    def _follower_fetched(self, event: FollowerFetched) -> list[Effect]:
        self.followers = self._followers_after(event)
        return self._propose(event.now) + self._settle()

    def _tick(self, event: Tick) -> list[Effect]:
        return self._propose(event.now) + self._settle()

    def _produce_expired(self, event: ProduceExpired) -> list[Effect]:
        for item in self._waiting:
            if item[1] == event.request:
                self._waiting.remove(item)
                return [Answered(request=event.request, code=ErrorCode.REQUEST_TIMED_OUT)]
        return []  # answered already: the timer crossed the answer

    def _isr_written(self, event: IsrWritten) -> list[Effect]:
        assert self.pending is not None
        written = self.pending.expected_version + 1
        if written >= self.version:  # else the view showed a later write already
            self.isr, self.version = self.pending.isr, written
        self.pending = None
        return self._settle()

    def _isr_write_lost(self, event: IsrWriteLost) -> list[Effect]:
        # The change stays counted until the state read again says what is in force.
        return [ReadState(key=self.key)]

    def _state_read(self, event: StateRead) -> list[Effect]:
        if self.deposed_by(event):
            return self._resign(event.state)
        self.pending = None
        self._adopt(event.state)
        return self._settle()

    def _state_seen(self, event: StateSeen) -> list[Effect]:
        if self.phase is LeaderPhase.RESIGNED:
            return []
        if self.deposed_by(event):
            return self._resign(event.state)
        self._adopt(event.state)
        return self._settle()

    def _brokers_seen(self, event: BrokersSeen) -> list[Effect]:
        self.registered = dict(event.registered)
        return []

    # --- rules ---------------------------------------------------------------------------

    def _enough_before_append(self) -> bool:
        after = self.isr if self.pending is None else self.pending.isr
        return min(len(self.isr), len(after)) >= self.settings.min_insync

    def _followers_after(self, event: FollowerFetched | Tick) -> dict[int, FollowerPosition]:
        if isinstance(event, Tick) or event.broker_id not in self.followers:
            return self.followers
        old = self.followers[event.broker_id]
        caught_up = old.caught_up_at
        if event.fetch_offset >= self.leo:
            caught_up = event.now
        elif old.fetched_at is not None and event.fetch_offset >= old.served_end:
            caught_up = max(caught_up, old.fetched_at)
        position = FollowerPosition(
            log_dir=event.log_dir,
            fetch_offset=event.fetch_offset,
            caught_up_at=caught_up,
            served_end=self.leo,
            fetched_at=event.now,
        )
        return {**self.followers, event.broker_id: position}

    def _proposal(
        self, followers: dict[int, FollowerPosition], now: float
    ) -> tuple[IsrEntry, ...] | None:
        """The ISR to write, or None: members behind for ``replica_lag`` or fetching from
        another directory out, caught-up replicas outside it in."""
        if self.phase is not LeaderPhase.STEADY:
            return None
        stale = now - self.settings.replica_lag
        kept: list[IsrEntry] = []
        for entry in self.isr:
            position = followers.get(entry.broker_id)
            if entry.broker_id != self.broker_id and position is not None:
                moved = position.log_dir is not None and position.log_dir != entry.log_dir
                if moved or position.caught_up_at < stale:
                    continue
            kept.append(entry)
        members = {entry.broker_id for entry in self.isr}
        joining = max(self.hw, self.epoch_start)
        for broker, position in sorted(followers.items()):
            if broker in members or position.log_dir is None or position.fetch_offset is None:
                continue
            if self.registered.get(broker) != position.log_dir:
                continue  # a process the store does not know as this broker's now
            if position.fetch_offset >= joining and position.caught_up_at >= stale:
                kept.append(IsrEntry(broker_id=broker, log_dir=position.log_dir))
        isr = tuple(kept)
        return None if isr == self.isr else isr

    def _propose(self, now: float) -> list[Effect]:
        isr = self._proposal(self.followers, now)
        if isr is None:
            return []
        self.pending = IsrChange(isr=isr, expected_version=self.version)
        state = PartitionState(
            leader=self.broker_id, leader_epoch=self.epoch, isr=isr, version=self.version + 1
        )
        return [
            WriteIsr(write=StateWrite(key=self.key, state=state, expected_version=self.version))
        ]

    def _candidate_hw(self) -> int | None:
        """The least end among the maximal ISR's members (None: one of them holds it)."""
        ends = [self.durable_end]
        for entry in self.maximal_isr:
            if entry.broker_id == self.broker_id:
                continue
            position = self.followers.get(entry.broker_id)
            if position is None or position.log_dir != entry.log_dir:
                return None
            assert position.fetch_offset is not None
            ends.append(position.fetch_offset)
        return min(ends)

    def _settle(self) -> list[Effect]:
        """Raise the high watermark as far as the maximal ISR allows, and answer the waiting
        produces it now covers, or all of them if the ISR in force is below ``min_insync``."""
        candidate = self._candidate_hw()
        if candidate is not None and candidate > self.hw:
            self.hw = candidate
        effects: list[Effect] = []
        if len(self.isr) < self.settings.min_insync:
            code = ErrorCode.NOT_ENOUGH_REPLICAS_AFTER_APPEND
            effects = [Answered(request=request, code=code) for _, request in self._waiting]
            self._waiting.clear()
            return effects
        while self._waiting and self._waiting[0][0] <= self.hw:
            _, request = self._waiting.popleft()
            effects.append(Answered(request=request, code=ErrorCode.NONE))
        return effects

    def _adopt(self, state: PartitionState) -> None:
        if state.version > self.version:
            self.isr, self.version = state.isr, state.version

    def _resign(self, state: PartitionState) -> list[Effect]:
        code = ErrorCode.NOT_LEADER_OR_FOLLOWER
        effects: list[Effect] = [Answered(request=r, code=code) for _, r in self._waiting]
        self._waiting.clear()
        self.pending = None
        return [*effects, Resigned(key=self.key, state=state)]


_HANDLERS: dict[type, Callable[[ReplicaLeader, Any], list[Effect]]] = {
    ProduceAsked: ReplicaLeader._produce_asked,
    Appended: ReplicaLeader._appended,
    Flushed: ReplicaLeader._flushed,
    FollowerFetched: ReplicaLeader._follower_fetched,
    Tick: ReplicaLeader._tick,
    ProduceExpired: ReplicaLeader._produce_expired,
    IsrWritten: ReplicaLeader._isr_written,
    IsrWriteLost: ReplicaLeader._isr_write_lost,
    StateRead: ReplicaLeader._state_read,
    StateSeen: ReplicaLeader._state_seen,
    BrokersSeen: ReplicaLeader._brokers_seen,
}


# --- serving a follower's fetch: the leader's half of the handshake ----------------------------


def diverging(
    cache: Sequence[EpochStart], log_end: int, last_fetched_epoch: int, fetch_offset: int
) -> tuple[int, int] | None:
    """Whether a follower fetching from ``fetch_offset``, its last record of
    ``last_fetched_epoch``, has records this leader's log (``cache``, ending at ``log_end``)
    does not: then (this leader's largest epoch at or below it, where that epoch ends), for the
    follower to truncate to, and no data (KIP-320/595's diverging epoch, which makes KIP-101's
    OffsetsForLeaderEpoch round trip unneeded). A follower with records but no epoch is sent back
    to where this leader's first epoch starts; one fetching from there or before it has nothing
    to cut back that this leader can name (an empty log started at this leader's log start,
    among others), and is served."""
    if last_fetched_epoch == NO_EPOCH:
        if not cache or fetch_offset <= cache[0].start_offset:
            return None
        return NO_EPOCH, cache[0].start_offset
    if cache and last_fetched_epoch > cache[-1].epoch:
        epoch, end = cache[-1].epoch, log_end
    else:
        epoch, end = epoch_end(cache, log_end, last_fetched_epoch)
    if epoch == NO_EPOCH:
        return NO_EPOCH, 0
    if epoch < last_fetched_epoch or end < fetch_offset:
        return epoch, end
    return None


def epochs_between(cache: Sequence[EpochStart], start: int, end: int) -> tuple[EpochStart, ...]:
    """The entries of ``cache`` for the records in ``[start, end)`` that a fetch returns: the
    batch header has no epoch, so the follower learns its epochs from these."""
    if start >= end:
        return ()
    chosen = []
    for i, entry in enumerate(cache):
        next_start = cache[i + 1].start_offset if i + 1 < len(cache) else end
        if entry.start_offset < end and next_start > start:
            chosen.append(entry)
    return tuple(chosen)
