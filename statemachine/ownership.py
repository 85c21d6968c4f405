"""Who may fetch each partition of a group, and from when a partition is free: one machine per
group, one state per partition.

This is the rule that keeps a partition from having two owners (docs/design.md#ownership-lease). A
partition is

* **Free**: nobody fetches it; an attempt may start it.
* **Held** by a member incarnation under a generation: started for that process, whose offsets
  for it count (the generation check) until it answers StopFetcher, dies, or a start that never
  reached it is reverted.
* **Leased** until an instant: a process that may still be fetching it (a member whose connection
  broke, that fell silent, or that the record of a previous coordinator named) surely stopped by
  then. Only the process's own word ends the lease sooner: its StopFetcher answer, or its
  re-registration under the lease's generation (a coordinator has one member per id in a
  generation, so that is the process that held it). A lease two different claims put on one
  partition (a rebuild that finds another owner in the record than in memory) ends only with time.
* **Adopted** by a member incarnation that re-registered still fetching the partition: Held, and
  still leased until the lease's instant, so that an attempt that did not stop the adopter does
  not start the partition elsewhere before then. Under the lease's generation that is the lease's
  own process; under any other the registration proves nothing about the lease, which stands,
  but accepting it renews the registrant's lease on what it fetches, so the registrant holds it
  too, and its StopFetcher answer frees it: only the lease's own process can fetch a partition
  under a lease in force (docs/design.md#adoption-after-a-failover).

A *member incarnation* is one registration of a member id: an int the coordinator hands out per
registration, so that two processes under one member id are never taken for each other.

Time is passed in. A lease whose instant has passed has run out (``LeaseRanOut``) whatever input
comes next: the machine reads every state at the input's ``now``, and ``AttemptCompleted`` forgets
leases that ran out. Inputs name members and incarnations; the machine turns each into a
per-partition input looked up in ``TABLE``, all before changing anything, so an input that is
illegal for any partition it touches raises :class:`~statemachine.table.IllegalTransition` and
changes nothing (an input no table decides, a start that is not newer than what its member holds,
raises its base, :class:`~protocol.errors.IllegalInput`, as well before any change); then each
partition goes to the state the table gave it (``Ownership._enter``), so the table drives the
transitions, not only checks them. The only effects, ``LeaseEnded`` and
``LeaseAdopted``, tell the group (``statemachine.consumer_group``) that an attempt waiting on
leases may go on, and what to log.

Cost: an eager rebalance of 10,000 partitions starts and stops every one of them, so Held
partitions are kept per incarnation as the frozensets the attempt built, in one set of every held
partition, and never as an object per partition; set operations between sets reuse the hashes
stored in them. An incremental one touches only what moves: a holding keeps its partitions in
layers by assignment generation, so a start adds one layer of what it gains and a partial stop
rebuilds only the layers it takes from; members it does not start or stop are never looked at.
Only leased and adopted partitions, which carry an instant each, are kept per partition.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Callable, Collection, Iterable, Mapping
from typing import Any

import attrs

from protocol.errors import IllegalInput
from protocol.types import TopicPartition
from statemachine.table import IllegalTransition, TransitionTable


class PartitionState(enum.Enum):
    FREE = "Free"
    HELD = "Held"
    ADOPTED = "Adopted"
    LEASED = "Leased"


# --- a partition's state, as values --------------------------------------------------------


@attrs.frozen(kw_only=True)
class Free:
    pass


FREE = Free()


@attrs.frozen(kw_only=True)
class Held:
    owner: str
    incarnation: int
    generation: int


@attrs.frozen(kw_only=True)
class Adopted:
    owner: str
    incarnation: int
    generation: int
    until: float


@attrs.frozen(kw_only=True)
class Leased:
    """``owner`` None: two claims of different owners or generations met on the partition, and
    neither may end the other's lease."""

    owner: str | None
    generation: int
    #: The process the lease came from, when this coordinator knew it (its death): its
    #: StopFetcher answer, read after it died, ends the lease too.
    incarnation: int | None
    until: float


Value = Free | Held | Adopted | Leased
_Timed = Adopted | Leased


@attrs.frozen(kw_only=True)
class Holding:
    """What a member incarnation owns, for the generation check of its offsets: the partitions it
    holds (Held or Adopted, or Leased after its death), its *member generation* (that of the last
    start it was given) and each partition's *assignment generation* (that of the start that gave
    it: an incremental start keeps what the member held and adds to it,
    docs/design.md#generations-and-stale-offsets). It holds nothing under the generation of its last
    StopFetcher answer once it answered one for everything."""

    owner: str
    generation: int
    partitions: frozenset[TopicPartition]
    #: ``partitions`` by assignment generation, oldest first, each partition in exactly one
    #: layer: a start adds one layer, so a start or a stop costs what moves, not what stays.
    layers: tuple[tuple[int, frozenset[TopicPartition]], ...] = ()
    #: The holding before the start that gave this one: a start that never reached the member
    #: reverts to it (None: no start to revert).
    before: Holding | None = None
    dead: bool = False

    def counted_under(self, generation: int) -> frozenset[TopicPartition]:
        """The partitions whose offsets count in a report or commit under ``generation``: those
        whose assignment generation <= ``generation`` <= the member generation (SPEC.md §11.8).
        """
        if generation == self.generation:
            return self.partitions
        if generation > self.generation:
            return frozenset()
        counted = [tps for given, tps in self.layers if given <= generation]
        return frozenset().union(*counted) if counted else frozenset()

    def assignment_generation(self, tp: TopicPartition) -> int | None:
        """The generation of the start that gave ``tp`` (None: not held)."""
        for given, tps in self.layers:
            if tp in tps:
                return given
        return None

    def without(self, partitions: Collection[TopicPartition]) -> Holding:
        """This holding less ``partitions``: each layer that loses none is kept as it is."""
        if not partitions:
            return self
        layers = tuple(
            (given, tps if tps.isdisjoint(partitions) else tps.difference(partitions))
            for given, tps in self.layers
        )
        return attrs.evolve(
            self,
            partitions=self.partitions.difference(partitions),
            layers=tuple((given, tps) for given, tps in layers if tps),
        )


NOTHING = Holding(owner="", generation=-1, partitions=frozenset())


@attrs.frozen(kw_only=True)
class Claim:
    """Partitions ``owner`` may hold under ``generation``, by the record of a previous coordinator
    or the memory of a failed group; leased at least until ``until``."""

    owner: str | None
    generation: int
    partitions: frozenset[TopicPartition]
    until: float = -math.inf


# --- inputs ----------------------------------------------------------------------------------


@attrs.frozen(kw_only=True)
class Started:
    """An attempt is about to send its StartFetchers under ``generation``: to each incarnation
    in ``starts``, for its whole new assignment (one input for the attempt: a rebalance of a
    thousand members pays for one, not a thousand). What the incarnation holds already it keeps,
    under its assignment generation; it must hold nothing outside its start (the attempt revoked
    that first), and every partition it gains must be free."""

    generation: int
    #: incarnation -> (member id, every partition it is to hold)
    starts: Mapping[int, tuple[str, frozenset[TopicPartition]]]
    now: float


@attrs.frozen(kw_only=True)
class StartUnsent:
    """The last StartFetcher of ``incarnation`` could not be sent: it holds what it held before
    that start (nothing after an answer that stopped everything; what it kept after a partial
    one), each partition under its assignment generation."""

    incarnation: int


@attrs.frozen(kw_only=True)
class StopAnswered:
    """``incarnation`` answered StopFetcher: it fetches none of ``partitions`` any more (None:
    nothing at all), even if it died since. The rest it holds as before."""

    incarnation: int
    now: float
    partitions: frozenset[TopicPartition] | None = None


@attrs.frozen(kw_only=True)
class OwnerDied:
    """``incarnation`` was declared dead; what it holds is leased until ``until``
    (``statemachine.member.DeclaredDead.partitions_free_at``)."""

    incarnation: int
    until: float
    now: float


@attrs.frozen(kw_only=True)
class OwnerClosed:
    """``incarnation``, declared dead while it may still have been fetching (a static member's
    process fenced by a newer one), closed its connection cleanly: like its StopFetcher answer,
    that proves it stopped (docs/design.md#static-members), so its lease ends now."""

    incarnation: int
    now: float


@attrs.frozen(kw_only=True)
class OwnerRegistered:
    """``owner`` registered as ``incarnation`` saying it held ``holding`` under ``generation``."""

    owner: str
    incarnation: int
    generation: int
    holding: tuple[TopicPartition, ...]
    now: float


@attrs.frozen(kw_only=True)
class Recovered:
    """A coordinator that knows none of the group's members took it over at ``since`` (from the
    record of a previous one, or rebuilding a failed group): every claimed partition is leased until
    ``since`` plus the longest session timeout plus the margin, or the claim's own instant if later.
    """

    claims: tuple[Claim, ...]
    since: float
    longest_session: float
    margin: float


@attrs.frozen(kw_only=True)
class AttemptCompleted:
    """Every member answered StartFetcher: leases that ran out are forgotten."""

    now: float


Event = (
    Started
    | StartUnsent
    | StopAnswered
    | OwnerDied
    | OwnerRegistered
    | Recovered
    | AttemptCompleted
    | OwnerClosed
)


# Per-partition inputs: what one of the inputs above means to one partition. OwnerRegistered reads
# as one of the first three; AttemptCompleted, and any input past a lease's instant, as the last.


@attrs.frozen(kw_only=True)
class StillFetching:
    """The lease's owner re-registered under its generation and still fetches the partition."""


@attrs.frozen(kw_only=True)
class NoLongerFetching:
    """The lease's owner re-registered under its generation and no longer fetches the partition."""


@attrs.frozen(kw_only=True)
class FetchingUnproven:
    """A registrant that does not name the lease's owner and generation still fetches the
    partition: it proves nothing about the lease, but its registration, once accepted, renews its
    own lease on what it fetches, so it holds the partition as well until the lease's instant."""


@attrs.frozen(kw_only=True)
class LeaseRanOut:
    """The lease's instant passed."""


# --- effects ---------------------------------------------------------------------------------


@attrs.frozen(kw_only=True)
class LeaseEnded:
    """Leased partitions became free before their instant, by their owner's word: an attempt
    waiting on them may go on."""

    partitions: frozenset[TopicPartition]


@attrs.frozen(kw_only=True)
class LeaseAdopted:
    partitions: frozenset[TopicPartition]


Effect = LeaseEnded | LeaseAdopted

P = PartitionState


def _build_table() -> TransitionTable[PartitionState]:
    t: dict[tuple[PartitionState, type], PartitionState] = {
        (P.FREE, Started): P.HELD,
        (P.HELD, StartUnsent): P.FREE,
        (P.HELD, StopAnswered): P.FREE,
        (P.ADOPTED, StopAnswered): P.FREE,
        (P.LEASED, StopAnswered): P.FREE,
        # A partition of the answering process whose lease already ran out: nothing to end.
        (P.FREE, StopAnswered): P.FREE,
        (P.HELD, OwnerDied): P.LEASED,
        (P.ADOPTED, OwnerDied): P.LEASED,
        (P.LEASED, StillFetching): P.ADOPTED,
        (P.LEASED, NoLongerFetching): P.FREE,
        (P.LEASED, FetchingUnproven): P.ADOPTED,
        (P.FREE, Recovered): P.LEASED,
        (P.LEASED, Recovered): P.LEASED,
        (P.LEASED, LeaseRanOut): P.FREE,
        (P.ADOPTED, LeaseRanOut): P.HELD,
        (P.LEASED, OwnerClosed): P.FREE,
        (P.FREE, OwnerClosed): P.FREE,
    }
    return TransitionTable("Partition ownership", t)


TABLE = _build_table()


_TRANSITIONS = TABLE.transitions


def _next(kind: PartitionState, event: object) -> PartitionState:
    """``TABLE``'s next state, read straight from its entries (none is guarded): every start and
    stop of a rebalance looks one up."""
    target = _TRANSITIONS.get((kind, type(event)))
    if target is None:
        raise IllegalTransition(TABLE.name, kind, event)
    assert isinstance(target, PartitionState)
    return target


#: Read once from the table for the common case of a stop, a live member's Held partitions.
_STOP_OF_HELD = _next(P.HELD, StopAnswered(incarnation=-1, now=0.0))


def _untimed_kind(value: _Timed) -> PartitionState:
    return P.ADOPTED if type(value) is Adopted else P.LEASED


def _kind(value: _Timed, now: float) -> PartitionState:
    """The partition's state at ``now``: past its instant, its lease has run out."""
    if value.until <= now:
        return _next(_untimed_kind(value), LeaseRanOut())
    return _untimed_kind(value)


def _targets(
    kinds: Iterable[PartitionState], event: object
) -> dict[PartitionState, PartitionState]:
    """Where the input takes each kind of partition it meets, all looked up before anything
    changes: the handlers move partitions where this says (:meth:`Ownership._enter`)."""
    return {kind: _next(kind, event) for kind in set(kinds)}


@attrs.define
class Ownership:
    """One group's partitions. Free partitions are not stored."""

    _holdings: dict[int, Holding] = attrs.field(factory=dict)
    #: Every Held partition (not Adopted): the union of the live holdings' partitions less
    #: ``_timed``'s.
    _held: set[TopicPartition] = attrs.field(factory=set)
    #: Leased and Adopted partitions: what a possibly still fetching process holds, to when.
    _timed: dict[TopicPartition, _Timed] = attrs.field(factory=dict)
    #: Leased partitions by (owner, generation): what a re-registration may free or adopt.
    _claims: dict[tuple[str, int], set[TopicPartition]] = attrs.field(factory=dict)

    # --- queries ------------------------------------------------------------------------

    def holding(self, incarnation: int) -> Holding:
        """What ``incarnation`` owns and under which generation (which of its offsets count)."""
        return self._holdings.get(incarnation, NOTHING)

    def free_at(self, partitions: Collection[TopicPartition]) -> float:
        """The instant from which no possibly still fetching process holds any of ``partitions``
        (``-inf``: none ever did). Held partitions do not count: an attempt stops them first."""
        return max(
            (value.until for value in self._timed_among(partitions).values()), default=-math.inf
        )

    def held_among(self, partitions: Collection[TopicPartition]) -> frozenset[TopicPartition]:
        """Those of ``partitions`` some process holds (Held or Adopted): an attempt that stopped
        its members holds none of them, unless a member that re-registered since adopted some."""
        held = self._held
        found = (
            {tp for tp in partitions if tp in held}
            if len(partitions) <= len(held)
            else {tp for tp in held if tp in partitions}
        )
        found.update(
            tp for tp, value in self._timed_among(partitions).items() if type(value) is Adopted
        )
        return frozenset(found)

    def of_topics(self, topics: Collection[str], now: float) -> frozenset[TopicPartition]:
        """The partitions of ``topics`` some process holds or may still fetch at ``now`` (Held,
        Adopted, or Leased): a topic created again starts only once none is left of the old
        one (docs/design.md#topic-ids). Scans what is held: asked only while one is."""
        if not topics:
            return frozenset()
        found = {tp for tp in self._held if tp.topic in topics}
        found.update(
            tp
            for tp, value in self._timed.items()
            if tp.topic in topics and (type(value) is Adopted or value.until > now)
        )
        return frozenset(found)

    def under_lease(self, now: float) -> bool:
        """Whether some process may still be fetching a partition at ``now``."""
        return any(value.until > now for value in self._timed.values())

    def state(self, tp: TopicPartition, now: float) -> Value:
        """``tp``'s state at ``now`` (for tests and tools: it scans the holdings)."""
        value = self._timed.get(tp)
        if value is not None:
            if value.until > now:
                return value
            if type(value) is Leased:
                return FREE
        if tp in self._held or value is not None:
            for incarnation, holding in self._holdings.items():
                if tp in holding.partitions:
                    return Held(
                        owner=holding.owner, incarnation=incarnation, generation=holding.generation
                    )
        return FREE

    def carryover(self, now: float) -> tuple[Claim, ...]:
        """What a rebuild of this group must hold on to: each live holding, and each lease in
        force at ``now``, with its instant."""
        claims = [
            Claim(
                owner=h.owner,
                generation=h.generation,
                partitions=h.partitions.difference(self._timed),
            )
            for h in self._holdings.values()
            if not h.dead and h.partitions
        ]
        timed: dict[tuple[str | None, int, float], set[TopicPartition]] = {}
        for tp, value in self._timed.items():
            if value.until > now:
                timed.setdefault((value.owner, value.generation, value.until), set()).add(tp)
        claims += [
            Claim(owner=owner, generation=generation, partitions=frozenset(tps), until=until)
            for (owner, generation, until), tps in timed.items()
        ]
        return tuple(claim for claim in claims if claim.partitions)

    # --- inputs -------------------------------------------------------------------------

    def handle(self, event: Event) -> list[Effect]:
        try:
            handler = _HANDLERS[type(event)]
        except KeyError:
            raise IllegalInput(f"not an ownership input: {event!r}") from None
        return handler(self, event)

    def _started(self, event: Started) -> list[Effect]:
        holdings = self._holdings
        previous = [holdings.get(incarnation, NOTHING) for incarnation in event.starts]
        gained: list[frozenset[TopicPartition]] = []
        for (incarnation, (_, target)), holding in zip(event.starts.items(), previous, strict=True):
            if holding.dead or not holding.partitions <= target:
                # Revoked first, or new: an incarnation never holds what its start leaves out.
                raise IllegalInput(
                    f"incarnation {incarnation} is started while holding partitions outside it"
                )
            if holding.partitions and event.generation <= holding.generation:
                # What it keeps was given under its generation: a start's is always newer.
                raise IllegalInput(
                    f"incarnation {incarnation} is started under generation "
                    f"{event.generation}, not after the {holding.generation} it holds under"
                )
            gained.append(target.difference(holding.partitions) if holding.partitions else target)
        partitions: set[TopicPartition] = set().union(*gained)
        if len(partitions) != sum(map(len, gained)) or not partitions.isdisjoint(self._held):
            _next(P.HELD, event)  # started twice in one attempt, or held by someone else
        timed = self._timed_among(partitions)
        targets = _targets([P.FREE, *(_kind(value, event.now) for value in timed.values())], event)
        # A lease that ran out leaves the dead holding it came from.
        self._enter(targets[P.FREE], held=partitions.difference(timed), timed=timed)
        generation = event.generation
        for (incarnation, (owner, target)), holding, added in zip(
            event.starts.items(), previous, gained, strict=True
        ):
            layers = (*holding.layers, (generation, added)) if added else holding.layers
            holdings[incarnation] = Holding(
                owner=owner,
                generation=generation,
                partitions=holding.partitions | added if holding.partitions else target,
                layers=layers,
                before=attrs.evolve(holding, before=None),
            )
        return []

    def _start_unsent(self, event: StartUnsent) -> list[Effect]:
        holding = self._holdings.get(event.incarnation)
        if holding is None or holding.before is None:
            raise IllegalInput(f"incarnation {event.incarnation} was never started")
        before = holding.before
        added = holding.partitions.difference(before.partitions)
        timed = self._timed_among(added)
        # Adopted or leased partitions were not given by a start: reverting one is a bug.
        targets = _targets([P.HELD, *(_untimed_kind(value) for value in timed.values())], event)
        self._enter(targets[P.HELD], held=added)
        self._holdings[event.incarnation] = attrs.evolve(
            holding.without(added), generation=before.generation, before=None
        )
        return []

    def _stop_answered(self, event: StopAnswered) -> list[Effect]:
        holding = self._holdings.get(event.incarnation)
        if holding is None:
            return []
        stopped = (
            holding.partitions
            if event.partitions is None
            else holding.partitions.intersection(event.partitions)
        )
        # Everything stopped: it holds nothing, last under its member generation.
        left = holding.without(stopped) if event.partitions is not None else NOTHING
        left = attrs.evolve(left, owner=holding.owner, generation=holding.generation, before=None)
        timed = self._timed_among(stopped)
        if not timed:  # the common case: a live member's Held partitions
            self._enter(_STOP_OF_HELD, held=stopped)
            self._holdings[event.incarnation] = left
            return []
        kinds = {tp: _kind(value, event.now) for tp, value in timed.items()}
        targets = _targets([P.HELD, *kinds.values()], event)
        self._enter(targets[P.HELD], held=stopped.difference(timed))
        for kind, target in targets.items():
            self._enter(target, timed={tp: timed[tp] for tp, k in kinds.items() if k is kind})
        ended = frozenset(
            tp for tp, kind in kinds.items() if kind is P.LEASED and targets[kind] is P.FREE
        )
        if holding.dead and not left.partitions:
            self._holdings.pop(event.incarnation, None)
        else:
            self._holdings[event.incarnation] = attrs.evolve(left, dead=holding.dead)
        return [LeaseEnded(partitions=ended)] if ended else []

    def _owner_died(self, event: OwnerDied) -> list[Effect]:
        holding = self._holdings.get(event.incarnation)
        if holding is None:
            return []
        if not holding.partitions:
            del self._holdings[event.incarnation]
            return []
        timed = self._timed_among(holding.partitions)
        kinds = {tp: _kind(value, event.now) for tp, value in timed.items()}
        targets = _targets([P.HELD, *kinds.values()], event)
        lease = Leased(
            owner=holding.owner,
            generation=holding.generation,
            incarnation=event.incarnation,
            until=event.until,
        )

        def leased(value: _Timed | None) -> _Timed:
            # An adopted partition's lease stands if it ends later.
            return (
                lease if value is None else attrs.evolve(lease, until=max(value.until, lease.until))
            )

        self._enter(targets[P.HELD], held=holding.partitions.difference(timed), value=leased)
        for kind, target in targets.items():
            chosen = {tp: timed[tp] for tp, k in kinds.items() if k is kind}
            self._enter(target, timed=chosen, value=leased)
        self._holdings[event.incarnation] = attrs.evolve(holding, dead=True)
        return []

    def _owner_closed(self, event: OwnerClosed) -> list[Effect]:
        """A dead incarnation's clean close ends its leases as its StopFetcher answer would."""
        holding = self._holdings.get(event.incarnation)
        if holding is None:
            return []
        timed = self._timed_among(holding.partitions)
        kinds = [_kind(value, event.now) for value in timed.values()]
        if len(timed) < len(holding.partitions):
            kinds.append(P.HELD)  # a live holding: its close is a death, not this input
        _targets(kinds, event)
        return self._stop_answered(StopAnswered(incarnation=event.incarnation, now=event.now))

    def _owner_registered(self, event: OwnerRegistered) -> list[Effect]:
        """Under its lease's generation the registrant is the lease's process: what it no longer
        fetches is free now, what it still fetches it adopts. Whatever else it says it still
        fetches under a lease in force it adopts as well, though the lease stands: this
        coordinator renews the registrant's lease from its registration on, so the partition
        waits for its stop answer, or for its own lease after its death."""
        if event.incarnation in self._holdings:
            raise IllegalInput(f"incarnation {event.incarnation} registered twice")
        claimed = self._claims.get((event.owner, event.generation), ())
        in_force = {
            tp: value
            for tp in claimed
            if (value := self._timed[tp]).until > event.now and type(value) is Leased
        }
        still = set(event.holding).intersection(in_force)
        unproven = {
            tp: value
            for tp, value in self._timed_among(set(event.holding).difference(in_force)).items()
            if value.until > event.now and type(value) is Leased
        }
        # Each group of partitions as its per-partition input reads it, all looked up first.
        readings: list[tuple[object, dict[TopicPartition, _Timed]]] = [
            (StillFetching(), {tp: in_force[tp] for tp in still}),
            (NoLongerFetching(), {tp: v for tp, v in in_force.items() if tp not in still}),
            (FetchingUnproven(), dict(unproven)),
        ]
        moves = [(_next(P.LEASED, reading), chosen) for reading, chosen in readings if chosen]

        def adopted_by_registrant(value: _Timed | None) -> _Timed:
            assert value is not None
            return Adopted(
                owner=event.owner,
                incarnation=event.incarnation,
                generation=event.generation,
                until=value.until,
            )

        for target, chosen in moves:
            self._enter(target, timed=chosen, value=adopted_by_registrant)
        freed = frozenset(tp for target, chosen in moves if target is P.FREE for tp in chosen)
        adopted = frozenset(tp for target, chosen in moves if target is P.ADOPTED for tp in chosen)
        if adopted:
            self._holdings[event.incarnation] = Holding(
                owner=event.owner,
                generation=event.generation,
                partitions=adopted,
                layers=((event.generation, adopted),),
            )
        effects: list[Effect] = []
        if freed:
            effects.append(LeaseEnded(partitions=freed))
        if adopted:
            effects.append(LeaseAdopted(partitions=adopted))
        return effects

    def _recovered(self, event: Recovered) -> list[Effect]:
        base = event.since + event.longest_session + event.margin
        claims = [claim for claim in event.claims if claim.partitions]
        for claim in claims:
            if not claim.partitions.isdisjoint(self._held):
                _next(P.HELD, event)
            timed = self._timed_among(claim.partitions)
            _targets([P.FREE, *(_kind(value, event.since) for value in timed.values())], event)
        for claim in claims:
            until = max(base, claim.until)
            fresh = Leased(
                owner=claim.owner, generation=claim.generation, incarnation=None, until=until
            )

            def claimed(
                value: _Timed | None, claim: Claim = claim, fresh: Leased = fresh
            ) -> _Timed:
                if value is None or value.until <= event.since:  # free, or its lease ran out
                    return fresh
                merged = max(fresh.until, value.until)
                if (value.owner, value.generation) == (claim.owner, claim.generation):
                    return attrs.evolve(value, until=merged)
                # Neither claim's process may end it now, nor may the dead process it came from.
                return Leased(owner=None, generation=-1, incarnation=None, until=merged)

            timed = self._timed_among(claim.partitions)
            free = claim.partitions.difference(timed)
            self._enter(_next(P.FREE, event), held=free, value=claimed)
            kinds = {tp: _kind(value, event.since) for tp, value in timed.items()}
            for kind in set(kinds.values()):
                chosen = {tp: timed[tp] for tp, k in kinds.items() if k is kind}
                self._enter(_next(kind, event), timed=chosen, value=claimed)
        return []

    def _attempt_completed(self, event: AttemptCompleted) -> list[Effect]:
        ran_out = {tp: value for tp, value in self._timed.items() if value.until <= event.now}
        ending = LeaseRanOut()
        for kind in (P.ADOPTED, P.LEASED):
            chosen = {tp: v for tp, v in ran_out.items() if _untimed_kind(v) is kind}
            if chosen:
                # An adopter keeps its partitions, now Held; a dead owner's lease is over.
                self._enter(_next(kind, ending), timed=chosen, keeps=True)
        return []

    def _enter(
        self,
        target: PartitionState,
        *,
        held: Collection[TopicPartition] = (),
        timed: Mapping[TopicPartition, _Timed] | None = None,
        value: Callable[[_Timed | None], _Timed] | None = None,
        keeps: bool = False,
    ) -> None:
        """Put partitions into ``target``, the state the table gave them: ``held`` have no timed
        value (Held, or Free), ``timed`` are Leased or Adopted. ``value`` makes the Leased or
        Adopted value of each from its old one (None for one of ``held``: the same for all of
        them). A partition leaves the holding of the process its old value came from, unless
        its new value names the same process, or (``keeps``) it becomes Held by that process.
        """
        if target is P.FREE:
            self._held.difference_update(held)
            if timed:
                self._forget(timed)
        elif target is P.HELD:
            if timed:
                self._forget(timed, release=not keeps)
                self._held.update(timed)
            self._held.update(held)
        else:
            assert value is not None
            self._held.difference_update(held)
            moved = {tp: value(old) for tp, old in timed.items()} if timed else {}
            if timed:
                self._forget(
                    {tp: v for tp, v in timed.items() if v.incarnation != moved[tp].incarnation}
                )
                self._forget(
                    {tp: v for tp, v in timed.items() if v.incarnation == moved[tp].incarnation},
                    release=False,
                )
            if held:
                self._place(target, value(None), held)
            for tp, new in moved.items():
                self._place(target, new, (tp,))

    def _place(
        self, target: PartitionState, value: _Timed, partitions: Collection[TopicPartition]
    ) -> None:
        """``partitions`` are ``value`` (of ``target``) from now on, in every index."""
        if _untimed_kind(value) is not target:
            raise ValueError(f"{value!r} is not a value of {target.value}")
        self._timed.update(dict.fromkeys(partitions, value))
        if type(value) is Leased and value.owner is not None:
            self._claims.setdefault((value.owner, value.generation), set()).update(partitions)

    # --- bookkeeping ----------------------------------------------------------------------

    def _timed_among(self, partitions: Collection[TopicPartition]) -> dict[TopicPartition, _Timed]:
        """The leased or adopted ones of ``partitions``, looking up the fewer."""
        timed = self._timed
        if not timed:
            return {}
        if len(partitions) <= len(timed):
            return {tp: value for tp in partitions if (value := timed.get(tp)) is not None}
        return {tp: value for tp, value in timed.items() if tp in partitions}

    def _forget(self, timed: Mapping[TopicPartition, _Timed], *, release: bool = True) -> None:
        """Drop these leased or adopted partitions from every index, and (``release``) from the
        holding of the process they came from: the caller gives them their next state."""
        lost: dict[int, set[TopicPartition]] = {}
        for tp, value in timed.items():
            self._timed.pop(tp, None)
            if type(value) is Leased and value.owner is not None:
                key = (value.owner, value.generation)
                claimed = self._claims[key]
                claimed.discard(tp)
                if not claimed:
                    del self._claims[key]
            if release and value.incarnation is not None:
                lost.setdefault(value.incarnation, set()).add(tp)
        for incarnation, tps in lost.items():
            holding = self._holdings.get(incarnation)
            if holding is None:
                continue
            rest = holding.without(tps)
            if holding.dead and not rest.partitions:
                del self._holdings[incarnation]
            else:
                self._holdings[incarnation] = rest


_HANDLERS: dict[type, Callable[[Ownership, Any], list[Effect]]] = {
    Started: Ownership._started,
    StartUnsent: Ownership._start_unsent,
    StopAnswered: Ownership._stop_answered,
    OwnerDied: Ownership._owner_died,
    OwnerRegistered: Ownership._owner_registered,
    Recovered: Ownership._recovered,
    AttemptCompleted: Ownership._attempt_completed,
    OwnerClosed: Ownership._owner_closed,
}
