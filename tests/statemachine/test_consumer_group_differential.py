"""Issue 31's differential test: the same random inputs to the one pure group
(``statemachine/consumer_group.py``) and to 453776a's machines as 453776a's trio code fed them
(``tests/statemachine/reference_453776a``), compared after every step.

Each side is driven as its own trio code drives it: the new one through ``ConsumerGroup``'s
operations in the order ``coordinator/driver.py`` and ``coordinator/rebalance.py`` call them, the
old one through the reference composer. The test plays the rest of the world for both at once:
processes that register (static or dynamic, fresh or coming back after a failover with a
generation and what they still fetch), Ping and miss, answer or refuse StopFetcher and
StartFetcher, leave, lose their connection by each cause, commit; topics that gain partitions
or are deleted; a new coordinator that recovers the group from a record; a group rebuilt after a
failure. Time is one monotonic clock both sides read.

After every step both sides must agree on the group's state, generation and next attempt, each
member's machine, the members away and until when, what each incarnation holds, every
partition's state and when it is free, the attempt in flight, the effects (in the vocabulary of
``reference_453776a/composer.py``), the records an attempt persists and the offsets each report
or commit counts.

Left out, as the old code cannot express them: members that read older versions (issue 29:
every member here is NEWEST), topics deleted while an attempt is in flight (89e72bb made that an
AttemptFailed; the old code's KeyError failed the group), and the refusal codes of DeleteGroup
and standalone commits (d5851ee: REBALANCE_IN_PROGRESS under a lease): only whether a group is
deletable is compared. What dispatch makes of a connection's end (closed, broken, a protocol
violation) is an input here, not compared: b80d104 changed it for a clean close after a failed
request (broken now, its lease honoured).

Rules that walk an attempt or a round of Pings through several steps (each step checked) keep
long sequences reaching completed attempts, reports and adoptions. ``DIFF_EXAMPLES`` sets the
number of examples (long runs).
"""

from __future__ import annotations

import hashlib
import os
import pathlib
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import attrs
from hypothesis import event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from protocol import ErrorCode
from protocol.types import (
    NO_TOPIC_ID,
    PartitionOffset,
    Subscription,
    TopicId,
    TopicPartition,
    TopicStreams,
)
from statemachine import consumer_group as cg
from statemachine.assignment import sticky_assign
from statemachine.consumer_group import ConsumerGroup, Ending, GroupMember
from statemachine.group import GroupState
from statemachine.records import GroupRecord, MemberRecord
from tests.statemachine.reference_453776a import composer as ref

GROUP = "g"
CONSUMERS = ("p1", "p2", "p3", "p4")
INSTANCES = (None, None, "s1", "s2")
TOPIC_NAMES = ("a", "b", "c")
SESSIONS_MS = (3000, 6000)
ENDINGS = {"closed": Ending.CLOSED, "broken": Ending.BROKEN, "violation": Ending.VIOLATION}

Performed = tuple[Any, ...]


# --- the new side, driven as coordinator/driver.py and rebalance.py drive it ------------------


@attrs.define(eq=False)
class NewAttempt:
    """``rebalance._attempt`` past its plan: the await it waits at, and its locals."""

    plan: cg.AttemptPlan
    cancel_called: bool = False
    step: str = "committed"
    pending: dict[GroupMember, float] = attrs.Factory(dict)
    silent: list[GroupMember] = attrs.Factory(list)
    failures: list[str] = attrs.Factory(list)
    starting: dict[GroupMember, frozenset[TopicPartition]] = attrs.Factory(dict)
    gained: set[TopicPartition] = attrs.Factory(set)
    record: GroupRecord | None = None


@attrs.frozen
class _Placed:
    topic_id: TopicId = NO_TOPIC_ID


_ONE_INCARNATION = _Placed()


@attrs.define(eq=False)
class NewSide:
    """A ``GroupDriver`` (and the coordinator's calls into it) without trio."""

    rules: cg.GroupRules
    topics: Mapping[str, int]
    group: ConsumerGroup | None = None
    attempt: NewAttempt | None = None
    performed: list[Performed] = attrs.Factory(list)

    @property
    def placed(self) -> dict[str, _Placed]:
        """The topics as the coordinator's view holds them: one incarnation each (the reference
        knows no topic ids, and none is created again here)."""
        return {topic: _ONE_INCARNATION for topic in self.topics}

    # --- the door ---------------------------------------------------------------------------

    def perform(self, effects: list[cg.Effect]) -> None:
        for effect in effects:
            match effect:
                case cg.Note(message=message, args=args):
                    self.performed.append(("note", _in_old_words(message, args)))
                case cg.CloseConnection(incarnation=incarnation):
                    self.performed.append(("close", incarnation))
                case cg.GroupInput(event=event):
                    self.performed.append(("input", event))
                case cg.MemberDied(member_id=member_id, cause=cause):
                    self.performed.append(("died", member_id, cause))
                case cg.LeasesFreed():
                    self.performed.append(("leases_freed",))
                case cg.CancelAttempt():
                    if self.attempt is not None:
                        self.attempt.cancel_called = True
                        self.performed.append(("cancel",))
                case cg.AwayUntil(member_id=member_id, away=away):
                    self.performed.append(("away_until", member_id, away))
                case cg.TellFenced(incarnation=incarnation):
                    self.performed.append(("tell_fenced", incarnation))
                case cg.Retire():
                    self.performed.append(("retire",))
                    self.group = None
                    self.attempt = None  # the driver's scope, cancelled, ends the attempt too
                case _:
                    raise AssertionError(f"unknown effect {effect!r}")

    def feed(self, operation: Callable[..., list[cg.Effect]], *args: Any, **kwargs: Any) -> None:
        try:
            effects = operation(*args, **kwargs)
        except Exception as exc:
            self.performed.append(("fail", exc))
            return
        self.perform(effects)

    # --- membership -------------------------------------------------------------------------

    def registration_refusal(
        self, consumer_id: str, instance_id: str | None, subscription: Subscription
    ) -> ErrorCode:
        streams = subscription.stream_count
        if self.group is None:  # GroupCoordinator._registration_error
            too_big = self.rules.max_members < 1 or streams > self.rules.max_streams
            return ErrorCode.GROUP_MAX_SIZE_REACHED if too_big else ErrorCode.NONE
        return self.group.registration_refusal(
            consumer_id=consumer_id, instance_id=instance_id, streams=streams
        )

    def join(
        self,
        record: MemberRecord,
        *,
        consumer_id: str,
        incarnation: int,
        generation: int,
        holding: tuple[TopicPartition, ...],
        now: float,
    ) -> GroupMember | None:
        if self.group is None:
            self.group = ConsumerGroup.new(GROUP, self.rules, now=now)
        try:
            member, effects = self.group.join(
                record,
                consumer_id=consumer_id,
                incarnation=incarnation,
                reported_generation=generation,
                holding=holding,
                now=now,
            )
        except Exception as exc:
            self.performed.append(("fail", exc))
            return None
        self.perform(effects)
        return member

    def leave(self, group: ConsumerGroup, member: GroupMember, now: float) -> ErrorCode:
        """``GroupCoordinator.leave`` from the member's own connection."""
        if member.fenced:
            return ErrorCode.FENCED_INSTANCE_ID
        self.feed(group.left, member, now)
        return ErrorCode.NONE

    def accept_counted(
        self, group: ConsumerGroup, counted: dict[TopicPartition, int]
    ) -> dict[TopicPartition, int]:
        """``GroupDriver.accept_counted``: only a group still in the registry records any."""
        return counted if counted and group is self.group else {}

    def stop_answered(
        self,
        group: ConsumerGroup,
        member: GroupMember,
        offsets: tuple[PartitionOffset, ...],
        *,
        revoked: frozenset[TopicPartition] | None,
        attempt_live: bool,
        now: float,
    ) -> dict[TopicPartition, int]:
        """``GroupDriver.stop_answered``."""
        try:
            counted, effects = group.stop_answered(
                member,
                offsets,
                revoked=revoked,
                attempt_live=attempt_live,
                topics=self.placed,
                now=now,
            )
        except Exception as exc:
            self.performed.append(("fail", exc))
            return {}
        counted = self.accept_counted(group, counted)
        self.perform(effects)
        return counted

    def ping_answered(
        self,
        group: ConsumerGroup,
        member: GroupMember,
        generation: int,
        offsets: tuple[PartitionOffset, ...],
        now: float,
    ) -> dict[TopicPartition, int]:
        """``GroupDriver.ping_answered``."""
        counted = group.ping_answered(member, generation, offsets, topics=self.placed, now=now)
        if not counted:
            return {}
        return self.accept_counted(group, counted)

    def commit_refusal(
        self,
        consumer_id: str,
        incarnation: int,
        generation: int,
        partitions: frozenset[TopicPartition],
    ) -> ErrorCode:
        """``GroupCoordinator.commit``'s checks of a member's OffsetCommit sent on
        ``incarnation``'s connection."""
        group = self.group
        member = group.member_of(consumer_id) if group is not None else None
        if group is None or member is None or member.incarnation != incarnation:
            if group is not None and consumer_id in group.fenced:
                return ErrorCode.FENCED_INSTANCE_ID
            return ErrorCode.UNKNOWN_MEMBER_ID
        return group.commit_refusal(member, generation, partitions)

    # --- the attempt (rebalance.py) -----------------------------------------------------------

    def _failed(self, now: float) -> None:
        assert self.group is not None and self.attempt is not None
        if not self.attempt.cancel_called:
            self.perform(self.group.attempt_failed(now))
        self.attempt = None

    def attempt_due(self, now: float) -> None:
        group = self.group
        assert group is not None
        group.attempt_due()
        if group.machine.state is not GroupState.PENDING:
            return
        plan, effects = group.plan_attempt(dict(self.topics), now)
        self.perform(effects)
        if plan is not None:
            self.attempt = NewAttempt(plan=plan)

    def cancel_delivered(self) -> None:
        assert self.attempt is not None and self.attempt.cancel_called
        self.attempt = None

    def send_stops(self, now: float, *, store_ok: bool, in_contact: bool) -> None:
        attempt, group = self.attempt, self.group
        assert attempt is not None and group is not None and attempt.step == "committed"
        if not store_ok or not in_contact:
            self._failed(now)
            return
        for order in group.stops_sent(attempt.plan, now):
            attempt.pending[order.member] = now + order.member.machine.timeouts.response_deadline
        attempt.step = "stops"

    def stop_answer(
        self, member: GroupMember, offsets: tuple[PartitionOffset, ...], now: float
    ) -> dict[TopicPartition, int]:
        attempt, group = self.attempt, self.group
        assert attempt is not None and group is not None
        del attempt.pending[member]
        return self.stop_answered(
            group,
            member,
            offsets,
            revoked=attempt.plan.changes[member].revoked,
            attempt_live=not attempt.cancel_called,
            now=now,
        )

    def handover_refused(self, member: GroupMember, now: float) -> None:
        attempt, group = self.attempt, self.group
        assert attempt is not None and group is not None
        del attempt.pending[member]
        if attempt.step == "starts" and attempt.cancel_called:
            return
        if attempt.step == "starts" and not member.machine.alive:
            attempt.failures.append(f"{member.member_id} did not answer StartFetcher")
            return
        attempt.failures.append(f"{member.member_id} refused")
        self.feed(group.handover_refused, member, now)

    def unanswered(self, member: GroupMember) -> None:
        assert self.attempt is not None
        del self.attempt.pending[member]
        self.attempt.silent.append(member)

    def handover_deadlines(self, now: float) -> None:
        attempt, group = self.attempt, self.group
        assert attempt is not None and group is not None
        for member, deadline in list(attempt.pending.items()):
            if deadline <= now:
                del attempt.pending[member]
                attempt.silent.append(member)
                self.feed(group.deadline_missed, member, now, handover=True)

    def stops_done(self, now: float) -> None:
        attempt, group = self.attempt, self.group
        assert attempt is not None and group is not None and not attempt.pending
        attempt.failures.extend(f"{m.member_id} did not answer StopFetcher" for m in attempt.silent)
        attempt.silent.clear()
        if attempt.failures:
            self._failed(now)
            return
        if attempt.cancel_called:
            self.attempt = None
            return
        self.perform(group.members_stopped(now))
        attempt.starting = group.starting(attempt.plan)
        attempt.gained = group.gained(attempt.starting)
        attempt.step = "leases"

    def lease_wait(self, now: float) -> float | None:
        attempt, group = self.attempt, self.group
        assert attempt is not None and group is not None and attempt.step == "leases"
        if (free_at := group.ownership.free_at(attempt.gained)) > now:
            if group.ownership.held_among(attempt.gained):
                self._failed(now)
                return None
            return free_at
        attempt.step = "flush"
        return None

    def persist(self, now: float, *, store_ok: bool) -> GroupRecord:
        attempt, group = self.attempt, self.group
        assert attempt is not None and group is not None and attempt.step == "flush"
        record = group.record(attempt.plan, attempt.starting)
        if not store_ok:
            self._failed(now)
            return record
        group.persisted(attempt.plan)
        attempt.record = record
        attempt.step = "starting"
        return record

    def send_starts(self, now: float, *, in_contact: bool, unsendable: int | None) -> None:
        attempt, group = self.attempt, self.group
        assert attempt is not None and group is not None and attempt.step == "starting"
        if group.ownership.held_among(attempt.gained) or not in_contact:
            self._failed(now)
            return
        try:
            started = group.starts_sent(attempt.plan, attempt.starting, now)
        except Exception as exc:
            self.performed.append(("fail", exc))
            return
        attempt.step = "starts"
        refused: list[GroupMember] = []
        for member in started:
            if member.incarnation == unsendable:
                self.perform(group.start_unsent(member))
                refused.append(member)
                attempt.silent.append(member)
                continue
            attempt.pending[member] = now + member.machine.timeouts.response_deadline
        for member in refused:  # GroupDriver.close_unsendable
            if member.machine.alive:
                self.feed(group.connection_ended, member, Ending.BROKEN, now)

    def start_answer(self, member: GroupMember, now: float) -> None:
        attempt, group = self.attempt, self.group
        assert attempt is not None and group is not None
        del attempt.pending[member]
        if attempt.cancel_called:
            return
        if not member.machine.alive:
            attempt.failures.append(f"{member.member_id} did not answer StartFetcher")
            return
        group.start_answered(member, now)

    def starts_done(self, now: float) -> GroupRecord | None:
        attempt, group = self.attempt, self.group
        assert attempt is not None and group is not None and not attempt.pending
        attempt.failures.extend(
            f"{m.member_id} did not answer StartFetcher" for m in attempt.silent
        )
        if attempt.failures:
            self._failed(now)
            return None
        self.attempt = None
        if attempt.cancel_called:
            return None
        self.perform(group.attempt_completed(now))
        assert attempt.record is not None
        return attrs.evolve(attempt.record, complete=True)


# --- the world both sides see -----------------------------------------------------------------


@attrs.define(eq=False)
class Proc:
    """One registration: a process's connection, known to both sides by its incarnation."""

    incarnation: int
    consumer_id: str
    member_id: str
    old: ref.Member
    new: GroupMember
    #: The group each side put it in (a group replaced since ignores it).
    old_group: ref.Group
    new_group: ConsumerGroup
    open: bool = True
    #: The Ping outstanding: (sent at, generation it carries, deadline).
    ping: tuple[float, int, float] | None = None
    told: bool = False

    def __repr__(self) -> str:
        return f"<process {self.consumer_id}, member {self.member_id}, #{self.incarnation}>"

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        """How Hypothesis shows a falsifying example's draws: briefly."""
        printer.text(repr(self))


@attrs.define(eq=False)
class AwayTimer:
    until: float
    member_id: str
    old_group: ref.Group
    old: ref.Away
    new_group: ConsumerGroup
    new: cg.Away


#: Log lines whose words changed on purpose after 453776a (issue 35: an instant of the monotonic
#: clock as "in 4.2 s", a clean leave as "left"), and the reference's words for them.
_OLD_WORDS = {
    "group %s: %s's process ended (%s); away (its session timeout ends %s), its partitions free "
    "%s": "group %s: %s's process ended (%s); away until %.3f, its partitions free at %.3f",
    "group %s: %s is dead (%s); its partitions are free %s": (
        "group %s: %s is dead (%s); its partitions are free at %.3f"
    ),
    "group %s: a newer process fenced %s (process %s); its partitions are free %s at the latest": (
        "group %s: a newer process fenced %s (process %s); its partitions are free at %.3f "
        "at the latest"
    ),
}


def _in_old_words(message: str, args: tuple[object, ...]) -> str:
    """The new group's log line as 453776a worded it, each instant where it said one."""
    shown = tuple(a.at if isinstance(a, cg.FromNow) else a for a in args)
    if message == "group %s: %s left; its partitions are free %s":
        group, member, free = shown
        cause = "left the group"  # DeathCause.LEFT's words
        return _OLD_WORDS["group %s: %s is dead (%s); its partitions are free %s"] % (
            group,
            member,
            cause,
            free,
        )
    return _OLD_WORDS.get(message, message) % shown


def _normalized(performed: Performed) -> Performed:
    match performed:
        case ("input", event):
            fields = tuple(sorted(attrs.asdict(event, recurse=False).items()))
            return ("input", type(event).__name__, fields)
        case ("died", member_id, cause):
            return ("died", member_id, cause.value)
        case ("away_until", member_id, away):
            return ("away_until", member_id, away.until, away.partitions, away.record)
        case ("fail", _):
            return ("fail",)
    return performed


def _holding(holding: Any) -> Any:
    if holding is None:
        return None
    return (
        holding.owner,
        holding.generation,
        holding.partitions,
        holding.layers,
        _holding(holding.before),
        holding.dead,
    )


def _value(value: Any) -> tuple[object, ...]:
    return (type(value).__name__, *attrs.astuple(value, recurse=False))


def _machine(machine: Any) -> tuple[object, ...]:
    return (
        machine.state.value,
        machine.generation,
        machine.missed,
        machine.handovers_missed,
        machine.last_heard,
        machine.last_sent,
        machine.stop_answered,
        machine.start_follows,
        machine.timeouts.session_timeout,
    )


def _config(draw: st.DataObject) -> ref.Config:
    return ref.Config(
        max_missed_pings=draw.draw(st.sampled_from([1, 2]), label="max_missed"),
        initial_rebalance_delay=draw.draw(st.sampled_from([0.0, 3.0]), label="initial_delay"),
        initial_rebalance_max_delay=draw.draw(st.sampled_from([4.0, 30.0]), label="max_delay"),
        incremental=draw.draw(st.booleans(), label="incremental"),
        max_group_size=draw.draw(st.sampled_from([3, 1000]), label="max_group_size"),
        max_group_streams=draw.draw(st.sampled_from([5, 10_000]), label="max_group_streams"),
    )


def _rules(config: ref.Config) -> cg.GroupRules:
    return cg.GroupRules(
        max_missed=config.max_missed_pings,
        lease_margin=config.lease_margin,
        initial_delay=config.initial_rebalance_delay,
        initial_max_delay=config.initial_rebalance_max_delay,
        backoff_fraction=config.rebalance_backoff_fraction,
        incremental=config.incremental,
        max_members=config.max_group_size,
        max_streams=config.max_group_streams,
    )


subscriptions = st.builds(
    lambda topics, streams, pattern: Subscription(
        topics=tuple(TopicStreams(topic=t, streams=streams) for t in sorted(topics)),
        pattern=pattern,
    ),
    st.sets(st.sampled_from(TOPIC_NAMES), min_size=1, max_size=3),
    st.sampled_from([1, 1, 2]),
    st.sampled_from([None, None, None, "a|c"]),
)


class Differential(RuleBasedStateMachine):
    """One group under one coordinator id, on both sides."""

    def __init__(self) -> None:
        super().__init__()
        self.now = 0.0
        self.topics: dict[str, int] = {}
        self.config = ref.Config()
        self.old = ref.Coordinator(config=self.config, topics=self.topics)
        self.new = NewSide(rules=_rules(self.config), topics=self.topics)
        self.procs: list[Proc] = []
        self.timers: list[AwayTimer] = []
        self.incarnations = 0
        #: What each member id was last seen holding, under which generation: what its process
        #: reports when it registers again (after a failover, or after its connection broke).
        self.known: dict[str, tuple[int, frozenset[TopicPartition]]] = {}
        #: The members of the record the group was last recovered from.
        self.recorded: dict[str, MemberRecord] = {}
        #: The store: the latest record an attempt wrote (marked complete once it completed).
        self.stored: GroupRecord | None = None
        self.failed = False
        #: Counted offsets and refusals both sides gave in this step, compared in the check.
        self.answers: list[tuple[object, object]] = []

    # --- helpers ------------------------------------------------------------------------------

    def _tp_universe(self) -> list[TopicPartition]:
        return [TopicPartition(topic=t, partition=p) for t in TOPIC_NAMES for p in range(4)]

    def _group_old(self) -> ref.Group | None:
        return self.old.groups.get(GROUP)

    def _attempt_old(self) -> ref.Attempt | None:
        group = self._group_old()
        return group.attempt if group is not None else None

    def _answer(self, old: object, new: object) -> None:
        self.answers.append((old, new))

    def _proc_of(self, member: ref.Member) -> Proc:
        return next(p for p in self.procs if p.old is member)

    def _remember(self, procs: list[Proc]) -> None:
        """What these processes hold, as they would report it registering again."""
        for proc in procs:
            holding = proc.old_group.ownership.holding(proc.incarnation)
            if holding.partitions or holding.generation >= 0:
                self.known[proc.member_id] = (holding.generation, holding.partitions)

    def _forget(self, procs: list[Proc]) -> None:
        self._remember(procs)
        self.procs = [p for p in self.procs if p not in procs]

    def _live(self) -> list[Proc]:
        return [p for p in self.procs if p.open and p.old.machine.alive and not p.old.fenced]

    def _current(self, proc: Proc) -> bool:
        return proc.old_group is self._group_old() and proc.new_group is self.new.group

    def _note_timers(self) -> None:
        """Pair the away timers each side started in this step."""
        olds = [p for p in self.old.performed if p[0] == "away_until"]
        news = [p for p in self.new.performed if p[0] == "away_until"]
        old_group, new_group = self._group_old(), self.new.group
        if not olds or old_group is None or new_group is None:
            return
        for (_, member_id, old), (_, _, new) in zip(olds, news, strict=False):
            assert isinstance(member_id, str) and isinstance(old, ref.Away)
            assert isinstance(new, cg.Away)
            self.timers.append(
                AwayTimer(
                    until=old.until,
                    member_id=member_id,
                    old_group=old_group,
                    old=old,
                    new_group=new_group,
                    new=new,
                )
            )

    def _drop_group(self) -> None:
        """The group is gone from both sides (retired, rebuilt, or a new coordinator took
        over): its processes are forgotten, as their connections end with it."""
        self._forget([p for p in self.procs if not self._current(p)])

    # --- setup ----------------------------------------------------------------------------------

    @initialize(data=st.data())
    def setup(self, data: st.DataObject) -> None:
        config = _config(data)
        self.config = config
        self.topics.update(
            data.draw(
                st.dictionaries(
                    st.sampled_from(TOPIC_NAMES), st.integers(1, 3), min_size=1, max_size=3
                ),
                label="topics",
            )
        )
        self.old = ref.Coordinator(config=config, topics=self.topics)
        self.new = NewSide(rules=_rules(config), topics=self.topics)
        if data.draw(st.booleans(), label="recovered"):
            self._recover(self._synthesized(data))

    # --- time -----------------------------------------------------------------------------------

    @rule(dt=st.sampled_from([0.0, 0.1, 0.5, 1.0, 2.0, 3.5, 7.0]))
    def tick(self, dt: float) -> None:
        self.now += dt

    # --- membership -----------------------------------------------------------------------------

    @precondition(lambda self: not self.failed)
    @rule(
        consumer=st.sampled_from(CONSUMERS),
        instance=st.sampled_from(INSTANCES),
        subscription=subscriptions,
        session_ms=st.sampled_from(SESSIONS_MS),
        report=st.sampled_from(["fresh", "known", "known", "some", "other generation", "random"]),
        as_recorded=st.booleans(),
        data=st.data(),
    )
    def register(
        self,
        consumer: str,
        instance: str | None,
        subscription: Subscription,
        session_ms: int,
        report: str,
        as_recorded: bool,
        data: st.DataObject,
    ) -> None:
        member_id = instance or consumer
        if as_recorded and (recorded := self.recorded.get(member_id)) is not None:
            # The process a recovered record names, back as it was.
            subscription, session_ms = recorded.subscription, recorded.session_timeout_ms
        old_refusal = self.old.registration_error(GROUP, consumer, instance, subscription)
        new_refusal = self.new.registration_refusal(consumer, instance, subscription)
        self._answer(("refusal", old_refusal), ("refusal", new_refusal))
        if old_refusal is not ErrorCode.NONE or new_refusal is not ErrorCode.NONE:
            return
        generation, holding = self.known.get(member_id, (-1, frozenset()))
        if report == "fresh":
            generation, holding = -1, frozenset()
        elif report == "some":
            holding = frozenset(
                data.draw(st.sets(st.sampled_from(sorted(holding))), label="some")
                if holding
                else ()
            )
        elif report == "other generation":
            generation = data.draw(st.integers(-1, 6), label="generation")
        elif report == "random":
            generation = data.draw(st.integers(-1, 6), label="generation")
            holding = frozenset(
                data.draw(st.sets(st.sampled_from(self._tp_universe()), max_size=4), label="tps")
            )
        owned = tuple(sorted(holding))
        record = MemberRecord(
            member_id=member_id,
            client_id="client",
            subscription=subscription,
            session_timeout_ms=session_ms,
            auto_commit=True,
            auto_offset_reset="largest",
            instance_id=instance,
        )
        incarnation = self.incarnations
        self.incarnations += 1
        kwargs: dict[str, Any] = dict(
            consumer_id=consumer, incarnation=incarnation, generation=generation, now=self.now
        )
        old = self.old.register(GROUP, record, owned_partitions=owned, **kwargs)
        new = self.new.join(record, holding=owned, **kwargs)
        old_group, new_group = self._group_old(), self.new.group
        if new is None or old_group is None or new_group is None:
            return  # a failure: the check compares it
        self.procs.append(
            Proc(
                incarnation=incarnation,
                consumer_id=consumer,
                member_id=member_id,
                old=old,
                new=new,
                old_group=old_group,
                new_group=new_group,
            )
        )

    def _unreturned(self) -> list[MemberRecord]:
        back = {p.member_id for p in self._live()}
        return [m for m in self.recorded.values() if m.member_id not in back]

    @precondition(lambda self: not self.failed and bool(self._unreturned()))
    @rule(
        data=st.data(),
        consumer=st.sampled_from(CONSUMERS),
        report=st.sampled_from(["known", "known", "other generation"]),
    )
    def recorded_member_returns(self, data: st.DataObject, consumer: str, report: str) -> None:
        """A process the recovered record names registers again as it was, reporting the
        generation it holds its partitions under (or another) and the partitions it still
        fetches."""
        member = data.draw(st.sampled_from(self._unreturned()), label="recorded")
        self.register(
            consumer=member.member_id if member.instance_id is None else consumer,
            instance=member.instance_id,
            subscription=member.subscription,
            session_ms=member.session_timeout_ms,
            report=report,
            as_recorded=True,
            data=data,
        )

    @precondition(lambda self: not self.failed and any(p.open for p in self.procs))
    @rule(data=st.data(), ending=st.sampled_from(sorted(ENDINGS)))
    def connection_ends(self, data: st.DataObject, ending: str) -> None:
        proc = data.draw(st.sampled_from([p for p in self.procs if p.open]), label="proc")
        proc.open = False
        proc.ping = None  # Pinger._answered(None)
        old_attempt, new_attempt = self._attempt_old(), self.new.attempt
        if old_attempt is not None and proc.old in old_attempt.pending:
            self.old.unanswered(proc.old_group, proc.old)
        if new_attempt is not None and proc.new in new_attempt.pending:
            self.new.unanswered(proc.new)
        self.old.connection_ended(proc.old, ending, self.now)
        self.new.feed(proc.new_group.connection_ended, proc.new, ENDINGS[ending], self.now)

    @precondition(lambda self: not self.failed and bool(self._live()))
    @rule(data=st.data())
    def leave(self, data: st.DataObject) -> None:
        self._leave(data.draw(st.sampled_from(self._live()), label="proc"))

    def _leave(self, proc: Proc) -> None:
        old = self.old.leave(proc.old, self.now)
        new = self.new.leave(proc.new_group, proc.new, self.now)
        if old is None:
            # The old dispatch failed the request's task and closed the connection, which its
            # death had closed already: the answer does not leave either way.
            assert not proc.new.machine.alive
            old = ErrorCode.NONE
        self._answer(("leave", old), ("leave", new))

    def _dead_but_connected(self) -> list[Proc]:
        return [p for p in self.procs if p.open and not p.old.machine.alive and not p.old.fenced]

    @precondition(lambda self: not self.failed and bool(self._dead_but_connected()))
    @rule(data=st.data())
    def leave_after_death(self, data: st.DataObject) -> None:
        """A LeaveGroup already received when its member was declared dead (the member's last
        Ping deadline passed in the same instant): the request's task goes on to it."""
        self._leave(data.draw(st.sampled_from(self._dead_but_connected()), label="proc"))

    # --- Pings ----------------------------------------------------------------------------------

    @precondition(lambda self: not self.failed and any(p.ping is None for p in self._live()))
    @rule(data=st.data())
    def ping_sent(self, data: st.DataObject) -> None:
        self._ping_sent(
            data.draw(st.sampled_from([p for p in self._live() if p.ping is None]), label="proc")
        )

    def _ping_sent(self, proc: Proc) -> None:
        generation = proc.old.machine.generation
        old_sent = self.old.ping_sent(proc.old, self.now)
        self.new.feed(proc.new_group.ping_sent, proc.new, self.now)
        self._answer(("ping leaves", old_sent), ("ping leaves", proc.new.machine.alive))
        if old_sent:
            deadline = self.now + proc.old.machine.timeouts.response_deadline
            proc.ping = (self.now, generation, deadline)

    def _pinged(self) -> list[Proc]:
        return [p for p in self.procs if p.ping is not None]

    def _answerable(self) -> list[Proc]:
        """Those whose Ping is outstanding, its deadline not passed."""
        return [p for p in self.procs if p.ping is not None and p.ping[2] > self.now]

    @precondition(lambda self: not self.failed and bool(self._answerable()))
    @rule(data=st.data(), generation=st.sampled_from(["ping", "ping", "other"]))
    def ping_answered(self, data: st.DataObject, generation: str) -> None:
        self._ping_answered(
            data.draw(st.sampled_from(self._answerable()), label="proc"), data, generation
        )

    def _ping_answered(self, proc: Proc, data: st.DataObject, generation: str) -> None:
        assert proc.ping is not None
        reported = proc.ping[1]
        if generation == "other":
            reported = data.draw(st.integers(-1, 7), label="generation")
        proc.ping = None
        offsets = self._offsets(data, proc)
        old = self.old.ping_answered(proc.old, reported, offsets, self.now)
        new = self.new.ping_answered(proc.new_group, proc.new, reported, offsets, self.now)
        self._answer(("counted", old), ("counted", new))
        if old:
            event("a Ping's report counted")
        held = proc.old_group.ownership.holding(proc.incarnation).partitions
        if any(tp.topic not in self.topics for tp in held):
            event("a Ping answered holding a deleted topic's partition")

    @precondition(lambda self: not self.failed and bool(self._live()))
    @rule(data=st.data())
    def heartbeats(self, data: st.DataObject) -> None:
        """A round of Pings: each live member is sent one, and answers it with a report of
        what it fetches (checked after each)."""
        for proc in self._live():
            if proc.ping is None:
                self._ping_sent(proc)
                self.both_sides_agree()
            if proc in self._answerable():
                self._ping_answered(proc, data, "ping")
                self.both_sides_agree()

    @precondition(lambda self: not self.failed and bool(self._pinged()))
    @rule(data=st.data())
    def ping_missed(self, data: st.DataObject) -> None:
        proc = data.draw(st.sampled_from(self._pinged()), label="proc")
        assert proc.ping is not None
        self.now = max(self.now, proc.ping[2])
        proc.ping = None
        self.old.ping_missed(proc.old, self.now)
        self.new.feed(proc.new_group.deadline_missed, proc.new, self.now, handover=False)

    def _offsets(self, data: st.DataObject, proc: Proc) -> tuple[PartitionOffset, ...]:
        """A report: mostly of what the process holds, some of it perhaps deleted topics'."""
        held = sorted(proc.old_group.ownership.holding(proc.incarnation).partitions)
        pool = held + held + self._tp_universe()
        tps = data.draw(st.sets(st.sampled_from(pool), min_size=1, max_size=5), label="tps")
        return tuple(
            PartitionOffset(topic=tp.topic, partition=tp.partition, offset=7) for tp in sorted(tps)
        )

    # --- fencing --------------------------------------------------------------------------------

    @precondition(lambda self: not self.failed and any(p.told and p.open for p in self.procs))
    @rule(data=st.data())
    def fenced_stop_answered(self, data: st.DataObject) -> None:
        proc = data.draw(st.sampled_from([p for p in self.procs if p.told and p.open]), label="p")
        proc.told = False
        offsets = self._offsets(data, proc)
        old = self.old.fenced_stop_answered(proc.old, offsets, self.now)
        new = self.new.stop_answered(
            proc.new_group, proc.new, offsets, revoked=None, attempt_live=False, now=self.now
        )
        self._answer(("counted", old), ("counted", new))

    # --- commits --------------------------------------------------------------------------------

    @precondition(lambda self: not self.failed and any(p.open for p in self.procs))
    @rule(data=st.data(), generation=st.integers(-1, 7))
    def commit(self, data: st.DataObject, generation: int) -> None:
        proc = data.draw(st.sampled_from([p for p in self.procs if p.open]), label="proc")
        holding = proc.old_group.ownership.holding(proc.incarnation)
        pool = sorted(holding.partitions) + self._tp_universe()[:3]
        partitions = frozenset(data.draw(st.sets(st.sampled_from(pool), max_size=3), label="tps"))
        if data.draw(st.booleans(), label="own generation"):
            generation = holding.generation
        old = self.old.commit_error(
            GROUP, proc.consumer_id, proc.incarnation, generation, partitions
        )
        new = self.new.commit_refusal(proc.consumer_id, proc.incarnation, generation, partitions)
        self._answer(("commit", old), ("commit", new))

    # --- away members, topics, the group's life ------------------------------------------------

    @precondition(lambda self: not self.failed and bool(self.timers))
    @rule()
    def away_ends(self) -> None:
        timer = min(self.timers, key=lambda t: t.until)
        self.timers.remove(timer)
        self.now = max(self.now, timer.until)
        self.old.away_ends(timer.old_group, timer.member_id, timer.old, self.now)
        if timer.new_group is self.new.group:  # GroupDriver._away_ends: not rebuilt or deleted
            self.new.feed(timer.new_group.away_ended, timer.member_id, timer.new, self.now)

    def _no_attempt(self) -> bool:
        return self._attempt_old() is None and self.new.attempt is None

    @precondition(lambda self: not self.failed)
    @rule(topic=st.sampled_from(TOPIC_NAMES), change=st.sampled_from(["grow", "grow", "delete"]))
    def topic_changes(self, topic: str, change: str) -> None:
        if change == "delete":
            if topic not in self.topics or not self._no_attempt():
                return
            del self.topics[topic]
        else:
            count = self.topics.get(topic, 0)
            if count >= 4:
                return
            self.topics[topic] = count + 1
        group = self._group_old()
        if group is not None:
            self.old.topics_changed(group, [topic], self.now)
        if self.new.group is not None:
            self.new.feed(self.new.group.topics_changed, [topic], self.now)

    @precondition(lambda self: not self.failed and self._group_old() is not None)
    @rule(delete=st.sampled_from([True, False, False, False]))
    def delete_group(self, delete: bool) -> None:
        """Whether DeleteGroup (or the retention) may remove the group; it does, if ``delete``."""
        group, new_group = self._group_old(), self.new.group
        assert group is not None and new_group is not None
        deletable = self.old.deletable(group, self.now)
        self._answer(("deletable", deletable), ("deletable", new_group.deletable(self.now)))
        if delete and deletable and new_group.deletable(self.now):
            self.old.delete_group(group, self.now)
            self.new.feed(new_group.deleted, self.now)

    def _synthesized(self, data: st.DataObject) -> GroupRecord:
        """A record a previous coordinator could have written."""
        ids = data.draw(
            st.lists(st.sampled_from(["p1", "p2", "p3", "s1", "s2"]), unique=True, max_size=3),
            label="record members",
        )
        generation = data.draw(st.integers(1, 5), label="record generation")
        members = tuple(
            MemberRecord(
                member_id=member_id,
                client_id="client",
                subscription=data.draw(subscriptions, label="subscription"),
                session_timeout_ms=data.draw(st.sampled_from(SESSIONS_MS), label="session"),
                auto_commit=True,
                auto_offset_reset="largest",
                generation=data.draw(st.integers(-1, generation), label="member generation"),
                instance_id=member_id if member_id.startswith("s") else None,
            )
            for member_id in ids
        )
        counts = {
            t: n
            for t, n in self.topics.items()
            if any(m.subscription.streams_for(t) > 0 for m in members)
        }
        assignment = sticky_assign({m.member_id: m.subscription for m in members}, counts, {})
        return GroupRecord(
            group_id=GROUP,
            generation=generation,
            members=members,
            assignment=assignment,
            complete=data.draw(st.booleans(), label="complete"),
        )

    def _recover(self, record: GroupRecord) -> None:
        """A new coordinator takes office now and recovers the group from ``record``."""
        self._forget(list(self.procs))
        # Its processes come back holding what the record says, mostly (``register``'s
        # ``report`` varies it).
        self.recorded = {m.member_id: m for m in record.members}
        for member in record.members:
            mine = frozenset(
                tp for tp, t in record.assignment.items() if t.member_id == member.member_id
            )
            own = member.generation if member.generation >= 0 else record.generation
            self.known[member.member_id] = (own, mine)
        self.old = ref.Coordinator(config=self.config, topics=self.topics)
        self.new = NewSide(rules=self.new.rules, topics=self.topics)
        self.timers.clear()
        self.old.recover_group(record, self.now)
        self.new.group = ConsumerGroup.new(
            GROUP, self.new.rules, now=self.now, generation=record.generation
        )
        self.new.feed(self.new.group.recover, record, since=self.now, awaiting=True)

    @precondition(lambda self: not self.failed)
    @rule(data=st.data(), stored=st.booleans(), rare=st.integers(0, 2))
    def failover(self, data: st.DataObject, stored: bool, rare: int) -> None:
        if rare:
            return
        record = self.stored if stored and self.stored is not None else self._synthesized(data)
        self._recover(record)

    @precondition(lambda self: not self.failed and self._group_old() is not None)
    @rule(rare=st.integers(0, 2))
    def rebuild(self, rare: int) -> None:
        """The group failed and is rebuilt from its stored record (``_rebuild``)."""
        if rare:
            return
        failed, new_failed = self._group_old(), self.new.group
        assert failed is not None and new_failed is not None
        record = self.stored
        self.old.rebuild(failed, record, self.now)
        longest = new_failed.longest_session_timeout()
        effects = new_failed.abandon(self.now)
        self.new.attempt = None
        self.new.group = ConsumerGroup.new(
            GROUP,
            self.new.rules,
            now=self.now,
            generation=max(new_failed.generation, record.generation if record else 0),
        )
        self.new.feed(
            self.new.group.recover,
            record,
            since=self.now,
            claims=new_failed.ownership.carryover(self.now),
            longest=longest,
        )
        self.new.perform(effects)

    # --- the attempt ----------------------------------------------------------------------------

    def _step(self, *steps: str) -> bool:
        attempt = self._attempt_old()
        return (
            not self.failed
            and attempt is not None
            and not attempt.cancel_called
            and attempt.step in steps
        )

    @precondition(
        lambda self: (
            not self.failed
            and self._no_attempt()
            and self._group_old() is not None
            and self._group_old().next_attempt_at is not None
        )
    )
    @rule()
    def attempt_due(self) -> None:
        group = self._group_old()
        assert group is not None and group.next_attempt_at is not None
        self.now = max(self.now, group.next_attempt_at)
        self.old.attempt_due(group, self.now)
        self.new.attempt_due(self.now)

    @precondition(lambda self: self._step("committed"))
    @rule(
        store_ok=st.sampled_from([True, True, True, False]),
        in_contact=st.sampled_from([True, True, True, False]),
    )
    def send_stops(self, store_ok: bool, in_contact: bool) -> None:
        group = self._group_old()
        assert group is not None
        self.old.send_stops(group, self.now, store_ok=store_ok, in_contact=in_contact)
        self.new.send_stops(self.now, store_ok=store_ok, in_contact=in_contact)
        if self._step("stops") and group.attempt is not None and not group.attempt.pending:
            self._stops_done()  # call_all returned at once: no checkpoint

    def _pending(self) -> list[Proc]:
        attempt = self._attempt_old()
        if attempt is None:
            return []
        return [self._proc_of(m) for m, deadline in attempt.pending.items() if deadline > self.now]

    @precondition(
        lambda self: (
            not self.failed
            and self._attempt_old() is not None
            and self._attempt_old().step in ("stops", "starts")
            and bool(self._pending())
        )
    )
    @rule(data=st.data(), ok=st.sampled_from([True, True, True, False]))
    def handover_answered(self, data: st.DataObject, ok: bool) -> None:
        group = self._group_old()
        assert group is not None and group.attempt is not None
        proc = data.draw(st.sampled_from(self._pending()), label="proc")
        if not ok:
            self.old.handover_refused(group, proc.old, self.now)
            self.new.handover_refused(proc.new, self.now)
        elif group.attempt.step == "stops":
            offsets = self._offsets(data, proc)
            old = self.old.stop_answered(group, proc.old, offsets, self.now)
            new = self.new.stop_answer(proc.new, offsets, self.now)
            self._answer(("counted", old), ("counted", new))
        else:
            self.old.start_answered(group, proc.old, self.now)
            self.new.start_answer(proc.new, self.now)

    @precondition(lambda self: self._step("stops", "starts") and bool(self._attempt_old().pending))
    @rule()
    def handover_deadline(self) -> None:
        group = self._group_old()
        assert group is not None and group.attempt is not None
        self.now = max(self.now, min(group.attempt.pending.values()))
        self.old.handover_deadlines(group, self.now)
        self.new.handover_deadlines(self.now)

    def _stops_done(self) -> None:
        group = self._group_old()
        assert group is not None
        self.old.stops_done(group, self.now)
        self.new.stops_done(self.now)

    @precondition(lambda self: self._step("stops") and not self._attempt_old().pending)
    @rule()
    def stops_done(self) -> None:
        self._stops_done()

    @precondition(lambda self: self._step("leases"))
    @rule(wait=st.booleans())
    def lease_wait(self, wait: bool) -> None:
        group = self._group_old()
        assert group is not None and group.attempt is not None
        free_at = group.ownership.free_at(group.attempt.gained)
        if wait and free_at > self.now:
            self.now = free_at
        self._answer(
            ("waits for", self.old.lease_wait(group, self.now)),
            ("waits for", self.new.lease_wait(self.now)),
        )

    @precondition(lambda self: self._step("flush"))
    @rule(store_ok=st.sampled_from([True, True, True, False]))
    def persist(self, store_ok: bool) -> None:
        group = self._group_old()
        assert group is not None
        old = self.old.persist(group, self.now, store_ok=store_ok)
        new = self.new.persist(self.now, store_ok=store_ok)
        self._answer(("record", old), ("record", new))
        if store_ok:
            self.stored = old

    @precondition(lambda self: self._step("starting"))
    @rule(in_contact=st.sampled_from([True, True, True, False]), data=st.data())
    def send_starts(self, in_contact: bool, data: st.DataObject) -> None:
        group = self._group_old()
        assert group is not None and group.attempt is not None
        unsendable = None
        if data.draw(st.integers(0, 9), label="unsendable?") == 0 and group.attempt.starting:
            unsendable = data.draw(
                st.sampled_from([m.incarnation for m in group.attempt.starting]), label="which"
            )
        self._send_starts(in_contact=in_contact, unsendable=unsendable)

    def _send_starts(self, *, in_contact: bool, unsendable: int | None) -> None:
        group = self._group_old()
        assert group is not None
        self.old.send_starts(group, self.now, in_contact=in_contact, unsendable=unsendable)
        self.new.send_starts(self.now, in_contact=in_contact, unsendable=unsendable)
        attempt = group.attempt
        if attempt is not None and not attempt.cancel_called and not attempt.pending:
            self._starts_done()

    def _starts_done(self) -> None:
        group = self._group_old()
        assert group is not None
        old = self.old.starts_done(group, self.now)
        new = self.new.starts_done(self.now)
        self._answer(("complete record", old), ("complete record", new))
        if old is not None:
            self.stored = old

    @precondition(lambda self: self._step("starts") and not self._attempt_old().pending)
    @rule()
    def starts_done(self) -> None:
        self._starts_done()

    @precondition(
        lambda self: (
            not self.failed
            and self._attempt_old() is not None
            and self._attempt_old().cancel_called
        )
    )
    @rule()
    def cancel_delivered(self) -> None:
        group = self._group_old()
        assert group is not None
        self.old.cancel_delivered(group)
        self.new.cancel_delivered()

    @precondition(
        lambda self: (
            not self.failed and (self._attempt_old() is not None or self._group_old() is not None)
        )
    )
    @rule(steps=st.integers(1, 12))
    def attempt_goes_on(self, steps: int) -> None:
        """The attempt's happy path, a step at a time (checked after each): due, stops sent and
        answered, leases waited out, the record persisted, starts sent and answered."""
        for _ in range(steps):
            group = self._group_old()
            attempt = group.attempt if group is not None else None
            if self.failed or group is None:
                return
            if attempt is None:
                if group.next_attempt_at is None or self.new.attempt is not None:
                    return
                self.attempt_due()
            elif attempt.cancel_called:
                self.cancel_delivered()
            elif attempt.step == "committed":
                self.send_stops(store_ok=True, in_contact=True)
            elif attempt.step in ("stops", "starts") and attempt.pending:
                member = next(iter(attempt.pending))
                proc = self._proc_of(member)
                if attempt.step == "stops":
                    self._answer(
                        ("counted", self.old.stop_answered(group, proc.old, (), self.now)),
                        ("counted", self.new.stop_answer(proc.new, (), self.now)),
                    )
                else:
                    self.old.start_answered(group, proc.old, self.now)
                    self.new.start_answer(proc.new, self.now)
            elif attempt.step == "stops":
                self._stops_done()
            elif attempt.step == "leases":
                self.lease_wait(wait=True)
            elif attempt.step == "flush":
                self.persist(store_ok=True)
            elif attempt.step == "starting":
                self._send_starts(in_contact=True, unsendable=None)
            else:
                self._starts_done()
            self.both_sides_agree()

    # --- the comparison -------------------------------------------------------------------------

    @invariant()
    def both_sides_agree(self) -> None:
        if self.failed:
            return
        old_performed = [_normalized(p) for p in self.old.performed]
        new_performed = [_normalized(p) for p in self.new.performed]
        old_failed = ("fail",) in old_performed
        assert old_failed == (("fail",) in new_performed), (old_performed, new_performed)
        if old_failed:
            # Both failed the group (an input a machine refused): the rebuild is the trio side's.
            self.failed = True
            return
        inputs = [p for p in old_performed if p[0] == "input"]
        assert inputs == [p for p in new_performed if p[0] == "input"]
        assert Counter(p for p in old_performed if p[0] != "input") == Counter(
            p for p in new_performed if p[0] != "input"
        ), (old_performed, new_performed)
        for old, new in self.answers:
            assert old == new
        for performed in old_performed:
            if performed[0] == "input":
                event(f"input {performed[1]}")
            elif performed[0] == "died":
                event(f"died: {performed[2]}")
            elif performed[0] != "note":
                event(performed[0])
        for proc in self.procs:
            if ("tell_fenced", proc.incarnation) in old_performed:
                proc.told = True
        self._note_timers()
        self.old.performed.clear()
        self.new.performed.clear()
        self.answers.clear()
        self._compare_state()
        self._remember([p for p in self.procs if not p.old.machine.alive])
        self._drop_group()

    def _compare_state(self) -> None:
        old, new = self._group_old(), self.new.group
        assert (old is None) == (new is None)
        for proc in self.procs:
            assert _machine(proc.old.machine) == _machine(proc.new.machine)
            assert proc.old.fenced == proc.new.fenced
        if old is None or new is None:
            return
        now = self.now
        assert old.machine.state.value == new.machine.state.value
        assert (
            attrs.astuple(old.machine, recurse=False)[2:]
            == attrs.astuple(new.machine, recurse=False)[2:]
        )
        assert old.next_attempt_at == new.next_attempt_at
        assert old.forming_until == new.forming_until
        assert old.recovered == new.recovered
        assert old.recovered_until == new.recovered_until
        assert old.highest_reported_generation == new.highest_reported_generation
        assert old.streams == new.streams
        assert old.last_member_at == new.last_member_at
        assert (old.attempts, old.completed) == (new.attempts, new.completed)
        assert old.assignment == new.assignment
        assert old.fenced == new.fenced
        assert {k: m.incarnation for k, m in old.processes.items()} == {
            k: m.incarnation for k, m in new.processes.items()
        }
        assert {k: (m.incarnation, m.consumer_id, m.record) for k, m in old.members.items()} == {
            k: (m.incarnation, m.consumer_id, m.record) for k, m in new.members.items()
        }
        assert {k: (a.record, a.until, a.partitions) for k, a in old.away.items()} == {
            k: (a.record, a.until, a.partitions) for k, a in new.away.items()
        }
        # Who owns what, and from when each partition is free.
        universe = self._tp_universe()
        for incarnation in range(self.incarnations):
            assert _holding(old.ownership.holding(incarnation)) == _holding(
                new.ownership.holding(incarnation)
            )
        for tp in universe:
            assert _value(old.ownership.state(tp, now)) == _value(new.ownership.state(tp, now))
            assert old.ownership.free_at([tp]) == new.ownership.free_at([tp])
        assert old.ownership.free_at(universe) == new.ownership.free_at(universe)
        assert old.ownership.held_among(universe) == new.ownership.held_among(universe)
        assert old.ownership.under_lease(now) == new.ownership.under_lease(now)
        assert _claims(old.ownership.carryover(now)) == _claims(new.ownership.carryover(now))
        # The attempt in flight.
        old_attempt, new_attempt = old.attempt, self.new.attempt
        assert (old_attempt is None) == (new_attempt is None)
        if old_attempt is None or new_attempt is None:
            return
        assert old_attempt.generation == new_attempt.plan.generation
        assert old_attempt.assignment == dict(new_attempt.plan.assignment)
        assert (old_attempt.step, old_attempt.cancel_called) == (
            new_attempt.step,
            new_attempt.cancel_called,
        )
        assert [(m.incarnation, d) for m, d in old_attempt.pending.items()] == [
            (m.incarnation, d) for m, d in new_attempt.pending.items()
        ]
        assert {
            m.incarnation: (c.target, c.revoked, c.start) for m, c in old_attempt.changes.items()
        } == {
            m.incarnation: (c.target, c.revoked, c.start)
            for m, c in new_attempt.plan.changes.items()
        }
        assert {m.incarnation: t for m, t in old_attempt.starting.items()} == {
            m.incarnation: t for m, t in new_attempt.starting.items()
        }
        assert old_attempt.gained == new_attempt.gained
        assert len(old_attempt.failures) == len(new_attempt.failures)
        assert [m.incarnation for m in old_attempt.silent] == [
            m.incarnation for m in new_attempt.silent
        ]


Differential.TestCase.settings = settings(
    max_examples=int(os.environ.get("DIFF_EXAMPLES", "150")),
    stateful_step_count=100,
    deadline=None,
)
TestDifferential = Differential.TestCase


def _code_lines(text: str) -> bytes:
    """The lines that are neither blank nor the import of ``table``: what copying kept."""
    kept = [line for line in text.splitlines() if line.strip() and "table import " not in line]
    return "\n".join(kept).encode()


#: sha256 (first 16 digits) of ``_code_lines`` of ``git show 453776a:statemachine/<name>.py``.
FROZEN = {
    "table": "d78cca7ba203dda9",
    "group": "9a65ff28d4a436b1",
    "member": "e0419af611029330",
    "ownership": "37c9a6746189a924",
}


def test_the_reference_machines_are_453776a_verbatim() -> None:
    """The frozen copies, their first line dropped, are 453776a's files but for the import of
    ``table``: an edit to the reference shows here."""
    here = pathlib.Path(__file__).parent / "reference_453776a"
    for name, digest in FROZEN.items():
        text = (here / f"{name}.py").read_text().split("\n", 1)[1]
        assert hashlib.sha256(_code_lines(text)).hexdigest()[:16] == digest, name


def _claims(claims: Iterable[Any]) -> list[tuple[str, int, float, list[tuple[str, int]]]]:
    """Claims compared by value: a frozenset's repr follows its hash table, which the order of
    its making decides."""
    return sorted(
        (
            repr(claim.owner),
            claim.generation,
            claim.until,
            sorted((tp.topic, tp.partition) for tp in claim.partitions),
        )
        for claim in claims
    )
