"""One group's rebalance, an attempt at a time, each in its own cancel scope.

A group's driver task owns its attempts, so one group's rebalances never overlap while different
groups rebalance concurrently. A member's failure cancels the attempt in flight through
``group.attempt_scope`` (docs/design.md#failure-detection); the group machine has by then
scheduled the next attempt.

An attempt follows the order of docs/design.md#rebalance, which is what keeps a partition from
having two owners and an offset from going backwards: take generation N+1; StopFetcher and wait;
wait until every partition to be started that moves away from a silent member is past that
member's lease; force the offset commit; persist N+1 and the intended assignment; StartFetcher with
the committed offsets; wait; complete. The eager protocol (the seeds') stops and starts every
member; the incremental one (the default) stops at each member only what it loses, and starts
only the members that gain, so a member whose assignment does not change hears nothing.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Callable, Collection, Mapping
from typing import Protocol

import attrs
import trio

from coordinator.config import CoordinatorConfig, RebalanceProtocol
from coordinator.membership import Group, Member
from coordinator.offsets import OffsetKeeper
from protocol import (
    AssignedPartition,
    AssignedStream,
    ErrorCode,
    RequestMessage,
    ResponseMessage,
    StartFetcherRequest,
    StartFetcherResponse,
    StopFetcherRequest,
    StopFetcherResponse,
)
from protocol.types import BrokerInfo, ConsumerThread, PartitionOffset, TopicPartition
from statemachine import group as group_sm
from statemachine import member as member_sm
from statemachine import ownership
from statemachine.assignment import sticky_assign
from store import GroupRecord, MemberRecord, MetadataStore, StoreError, TopicPlacement

log = logging.getLogger(__name__)

Assignment = dict[TopicPartition, ConsumerThread]


class RebalanceHost(Protocol):
    """What an attempt needs of the coordinator it runs in: its epoch, store, offsets and view
    of the cluster; the group's machines, fed through it so that their effects are performed;
    and its way of asking every member at once."""

    epoch: int
    config: CoordinatorConfig
    store: MetadataStore
    offsets: OffsetKeeper
    topics: Mapping[str, TopicPlacement]
    brokers: tuple[BrokerInfo, ...]
    brokers_by_listener: dict[str, tuple[BrokerInfo, ...]]

    def apply(self, group: Group, event: object) -> None: ...

    def own(self, group: Group, event: ownership.Event) -> list[ownership.Effect]: ...

    def own_or_fail(self, group: Group, event: ownership.Event) -> list[ownership.Effect]: ...

    def member_event(self, member: Member, event: object) -> None: ...

    def accept_reported_offsets_nowait(
        self,
        member: Member,
        generation: int,
        offsets: tuple[PartitionOffset, ...],
        *,
        final: bool = False,
    ) -> None: ...

    async def call_all(
        self,
        requests: Mapping[Member, RequestMessage],
        on_answer: Callable[[Member, ResponseMessage], None],
        on_unsent: Callable[[Member], None] | None = None,
    ) -> list[Member]: ...


@attrs.frozen(kw_only=True)
class _Change:
    """What an attempt asks of one member: stop ``revoked`` (None: everything, the eager
    protocol; empty: no StopFetcher), then, if ``start``, a StartFetcher for ``target``."""

    target: frozenset[TopicPartition]
    revoked: frozenset[TopicPartition] | None
    start: bool


class AttemptFailed(Exception):
    """A member answered with an error, or missed a deadline without being declared dead, or
    the store failed: the attempt is abandoned and retried after a backoff."""


async def drive(coordinator: RebalanceHost, group: Group) -> None:
    """The group's driver: wait until an attempt is due, then run it."""
    while True:
        due = await group.next_attempt_at.wait_value(lambda at: at is not None)
        assert due is not None
        with trio.move_on_at(due):
            await group.next_attempt_at.wait_transition()
            continue  # rescheduled (or cleared) while waiting
        group.next_attempt_at.value = None
        if group.machine.state is group_sm.GroupState.PENDING:
            await _attempt(coordinator, group)
        elif group.machine.state is group_sm.GroupState.DEAD:
            return


def compute_assignment(coordinator: RebalanceHost, group: Group) -> Assignment:
    subscriptions = {m.member_id: m.record.subscription for m in group.members.values()}
    # A static member away keeps its partitions, unowned: docs/design.md#static-members.
    subscriptions.update((member_id, a.record.subscription) for member_id, a in group.away.items())
    counts = {
        topic: placement.partition_count
        for topic, placement in coordinator.topics.items()
        if any(sub.streams_for(topic) > 0 for sub in subscriptions.values())
    }
    return sticky_assign(subscriptions, counts, group.assignment)


async def _attempt(coordinator: RebalanceHost, group: Group) -> None:
    members = list(group.members.values())
    assignment = compute_assignment(coordinator, group)
    recovered, group.recovered = group.recovered, None
    if recovered is not None and _adoptable(group, recovered, members, assignment):
        for member in members:
            own = group.ownership.holding(member.incarnation).generation
            member.machine.handle(member_sm.Adopted(generation=own))
        coordinator.apply(group, group_sm.RecordAdopted())
        log.info(
            "group %s: every member came back as its record says; stable at generation %d",
            group.group_id,
            recovered.generation,
        )
        return
    incremental = coordinator.config.rebalance_protocol is RebalanceProtocol.INCREMENTAL
    changes = _changes(group, members, assignment, incremental=incremental)
    if incremental:
        needed = any(change.start or change.revoked for change in changes.values())
    else:
        settled = all(
            m.machine.state is member_sm.MemberState.STABLE
            and group.ownership.holding(m.incarnation).generation == group.machine.generation
            for m in members
        )
        needed = not settled or assignment != group.assignment
    if not needed:
        coordinator.apply(group, group_sm.AttemptNotNeeded())
        return
    generation = max(group.machine.generation, group.highest_reported_generation) + 1
    coordinator.apply(group, group_sm.AttemptBegan(generation=generation))
    group.attempts += 1
    log.info(
        "group %s: rebalance attempt, generation %d, %d members",
        group.group_id,
        generation,
        len(members),
    )
    # Once a member failure cancels the attempt, the attempt feeds no machine another input: the
    # group machine has already moved on (Pending or Empty) and the dead member's machine is Dead,
    # and the code below may run on until its next checkpoint delivers the cancellation.
    completed: GroupRecord | None = None
    with trio.CancelScope() as attempt:
        group.attempt_scope = attempt
        try:
            # Loaded first: StopFetcher answers' offsets are accepted as they arrive.
            try:
                await coordinator.offsets.committed(group.group_id)
            except StoreError as exc:
                raise AttemptFailed(f"store: {exc}") from exc
            await _stop_all(coordinator, group, changes, generation, attempt)
            if attempt.cancel_called:
                return
            coordinator.apply(group, group_sm.MembersStopped())
            record = await _start_all(
                coordinator, group, members, changes, assignment, generation, attempt
            )
        except AttemptFailed as exc:
            if not attempt.cancel_called:
                log.warning("group %s: attempt %d failed: %s", group.group_id, generation, exc)
                coordinator.apply(group, group_sm.AttemptFailed())
            return
        finally:
            group.attempt_scope = None
        if attempt.cancel_called:
            return
        group.completed += 1
        coordinator.own(group, ownership.AttemptCompleted(now=_now()))
        coordinator.apply(group, group_sm.AttemptCompleted())
        log.info("group %s: stable at generation %d", group.group_id, generation)
        completed = record
    if attempt.cancelled_caught:
        log.info("group %s: attempt %d cancelled by a member failure", group.group_id, generation)
    elif completed is not None:
        # Outside the attempt's scope: a member failure from now on does not undo the starts.
        await _record_completed(coordinator, completed)


def _changes(
    group: Group, members: list[Member], assignment: Assignment, *, incremental: bool
) -> dict[Member, _Change]:
    """What the attempt asks of each member. Eager: stop everyone, start everyone. Incremental:
    a live member stops what it holds outside its target, and is started if it gains a partition,
    if a partition it keeps moves to another of its streams, or if it is not Stable (new, or left
    Stopping or Starting by a failed attempt, so it may not fetch what it is meant to); the
    others are left alone: no request, no new generation (docs/design.md#rebalance)."""
    targets: dict[str, set[TopicPartition]] = defaultdict(set)
    for tp, thread in assignment.items():
        targets[thread.member_id].add(tp)
    previous = group.assignment
    changes: dict[Member, _Change] = {}
    for member in members:
        if not member.machine.alive:
            continue
        target = frozenset(targets.get(member.member_id, ()))
        if not incremental:
            changes[member] = _Change(target=target, revoked=None, start=True)
            continue
        held = group.ownership.holding(member.incarnation).partitions
        kept = held & target
        start = (
            member.machine.state is not member_sm.MemberState.STABLE
            or len(kept) != len(target)
            or any(
                (old := previous.get(tp)) is not (new := assignment[tp]) and old != new
                for tp in kept
            )
        )
        if not member.versions.incremental and (start or held - target):
            # It cannot read a partial stop or an incremental start: stopped and started whole,
            # the eager protocol for it alone (docs/design.md#old-clients).
            changes[member] = _Change(target=target, revoked=None, start=True)
            continue
        changes[member] = _Change(target=target, revoked=held - target, start=start)
    return changes


async def _stop_all(
    coordinator: RebalanceHost,
    group: Group,
    changes: Mapping[Member, _Change],
    generation: int,
    attempt: trio.CancelScope,
) -> None:
    """StopFetcher to each member with something to stop (every member, eager), all at once;
    each answer frees what it stopped."""
    failures: list[str] = []
    requests: dict[Member, RequestMessage] = {}
    _check_contact(coordinator)
    now = _now()
    for member, change in changes.items():
        if not member.machine.alive or (change.revoked is not None and not change.revoked):
            continue
        member.machine.handle(
            member_sm.StopFetcherSent(generation=generation, now=now, start_follows=change.start)
        )
        requests[member] = StopFetcherRequest(
            coordinator_epoch=coordinator.epoch,
            generation=generation,
            consumer_id=member.member_id,
            acknowledged_frames=member.channel.frames_received,
            partitions=None
            if change.revoked is None
            else tuple(sorted(change.revoked, key=_topic_partition_key)),
        )

    def stopped(member: Member, response: ResponseMessage) -> None:
        if (
            not isinstance(response, StopFetcherResponse)
            or response.error_code is not ErrorCode.NONE
        ):
            failures.append(_refused(coordinator, member, "StopFetcher", response))
            return
        if member.machine.alive and not attempt.cancel_called:
            member.machine.handle(member_sm.StopFetcherAnswered(now=_now()))
        # The member's final report for the partitions it stopped: accepted even if it left or
        # the attempt was cancelled since it answered; then it fetches none of them, so no lease
        # need hold them any longer (one adopted after a failover).
        holding = group.ownership.holding(member.incarnation)
        coordinator.accept_reported_offsets_nowait(
            member, holding.generation, response.offsets, final=True
        )
        answered = ownership.StopAnswered(
            incarnation=member.incarnation, now=_now(), partitions=changes[member].revoked
        )
        coordinator.own_or_fail(group, answered)

    silent = await coordinator.call_all(requests, stopped)
    failures.extend(f"{member.member_id} did not answer StopFetcher" for member in silent)
    if failures:
        raise AttemptFailed("; ".join(failures))


async def _start_all(
    coordinator: RebalanceHost,
    group: Group,
    members: list[Member],
    changes: Mapping[Member, _Change],
    assignment: Assignment,
    generation: int,
    attempt: trio.CancelScope,
) -> GroupRecord | None:
    """Start every member the attempt starts; returns the record persisted before the starts
    (None: cancelled before it was written)."""
    starting = {
        member: change.target
        for member, change in changes.items()
        if change.start and member.machine.alive
    }
    # Only what a start gains waits: a member keeps what it holds.
    gained: set[TopicPartition] = set()
    for member, target in starting.items():
        gained.update(target - group.ownership.holding(member.incarnation).partitions)
    # A partition leaving a member that fell silent waits until that member's lease ran out, or,
    # after a failover, until its owner came back and said it no longer fetches it.
    # A member that comes back meanwhile still fetching what it adopted fails the wait at once:
    # the next attempt stops it first, rather than this one waiting out a lease for nothing.
    while (free_at := group.ownership.free_at(gained)) > _now():
        _fail_if_adopted(group, gained)
        log.info("group %s: waiting until %.3f for leases to run out", group.group_id, free_at)
        with trio.move_on_at(free_at):
            await group.leases_freed.wait_transition()
    if attempt.cancel_called:
        return None
    try:
        await coordinator.offsets.flush()
        # Each member under its own generation after this attempt: the new one for those it
        # starts, its own for those it leaves alone.
        record = GroupRecord(
            group_id=group.group_id,
            generation=generation,
            members=(
                *(
                    attrs.evolve(
                        m.record,
                        generation=generation
                        if m in starting
                        else group.ownership.holding(m.incarnation).generation,
                    )
                    for m in members
                ),
                *_away_records(group, assignment, generation),
            ),
            assignment=assignment,
        )
        await coordinator.store.write_group(coordinator.epoch, record)
    except StoreError as exc:
        raise AttemptFailed(f"store: {exc}") from exc
    group.assignment = dict(assignment)
    committed = await coordinator.offsets.committed(group.group_id)
    streams = _streams_by_member(
        coordinator, assignment, committed, only={m.member_id for m in starting}
    )
    failures: list[str] = []
    _fail_if_adopted(group, gained)
    requests: dict[Member, RequestMessage] = {}
    starts: dict[int, tuple[str, frozenset[TopicPartition]]] = {}
    _check_contact(coordinator)
    now = _now()
    incremental = coordinator.config.rebalance_protocol is RebalanceProtocol.INCREMENTAL
    for member, target in starting.items():
        if not member.machine.alive:
            continue
        member_streams = streams.get(member.member_id, ())
        member.machine.handle(member_sm.StartFetcherSent(generation=generation, now=now))
        starts[member.incarnation] = (member.member_id, target)
        requests[member] = StartFetcherRequest(
            coordinator_epoch=coordinator.epoch,
            generation=generation,
            consumer_id=member.member_id,
            streams=member_streams,
            brokers=coordinator.brokers_by_listener.get(
                member.channel.listener, coordinator.brokers
            ),
            acknowledged_frames=member.channel.frames_received,
            incremental=incremental and member.versions.incremental,
        )

    # A start the machine refuses (a partition someone else may fetch) raises here, before any
    # StartFetcher is sent: the group fails and is rebuilt.
    coordinator.own(group, ownership.Started(generation=generation, starts=starts, now=now))

    def started(member: Member, response: ResponseMessage) -> None:
        if attempt.cancel_called:
            return
        if not member.machine.alive:
            failures.append(f"{member.member_id} did not answer StartFetcher")
            return
        if (
            not isinstance(response, StartFetcherResponse)
            or response.error_code is not ErrorCode.NONE
        ):
            failures.append(_refused(coordinator, member, "StartFetcher", response))
            return
        member.machine.handle(member_sm.StartFetcherAnswered(now=_now()))

    def unsent(member: Member) -> None:
        coordinator.own(group, ownership.StartUnsent(incarnation=member.incarnation))

    silent = await coordinator.call_all(requests, started, unsent)
    failures.extend(f"{member.member_id} did not answer StartFetcher" for member in silent)
    if failures:
        raise AttemptFailed("; ".join(failures))
    return record


def _away_records(
    group: Group, assignment: Assignment, generation: int
) -> tuple[MemberRecord, ...]:
    """The away members' records. A record's claim under a member's own generation is one its
    next process may free at once by registering under it without those partitions
    (docs/design.md#adoption-after-a-failover), so it may name only what the member's last
    process held: an away member given more than that (the partitions of members that departed,
    whose leases may still run) is recorded under this attempt's generation, which no process of
    it ever held, and a successor waits out its lease on them."""
    if not group.away:
        return ()
    given: dict[str, set[TopicPartition]] = {member_id: set() for member_id in group.away}
    for tp, thread in assignment.items():
        if (mine := given.get(thread.member_id)) is not None:
            mine.add(tp)
    return tuple(
        away.record
        if given[member_id] <= away.partitions
        else attrs.evolve(away.record, generation=generation)
        for member_id, away in group.away.items()
    )


async def _record_completed(coordinator: RebalanceHost, record: GroupRecord) -> None:
    """Write the record once more, marked complete: every start under it was answered, so a
    successor may adopt members that come back holding what it says
    (docs/design.md#adoption-after-a-failover). One more store write per rebalance; if it
    fails, a successor only rebalances once more, so the group goes on."""
    try:
        await coordinator.store.write_group(coordinator.epoch, attrs.evolve(record, complete=True))
    except StoreError as exc:
        log.warning("group %s: cannot mark its record complete: %s", record.group_id, exc)


def _adoptable(
    group: Group, record: GroupRecord, members: list[Member], assignment: Assignment
) -> bool:
    """Whether the recovered group may go on as its record says, with no new generation: the
    record is complete (every start under it was answered), its members are exactly the live
    ones (with the same subscriptions and session timeouts, which a successor's lease count
    reads from it), the assignment computed now is the record's, and each member came back
    under its own generation by the record holding, adopted, exactly its partitions of the
    record (so a record that gave a member nothing is never adopted)."""
    if not record.complete or group.machine.generation != record.generation:
        return False
    recorded = {r.member_id: r for r in record.members}
    if len(members) != len(record.members) or any(
        m.member_id not in recorded
        or attrs.evolve(recorded[m.member_id], generation=m.record.generation) != m.record
        for m in members
    ):
        return False
    if assignment != dict(record.assignment):
        return False
    given: dict[str, set[TopicPartition]] = defaultdict(set)
    for tp, thread in record.assignment.items():
        given[thread.member_id].add(tp)
    for member in members:
        holding = group.ownership.holding(member.incarnation)
        if member.machine.state is not member_sm.MemberState.REGISTERED:
            return False
        # A member given nothing holds nothing whether it still runs under that start or has
        # stopped (its lease ran out) and waits for one: only a start tells it which, so such a
        # group rebalances.
        mine = given.get(member.member_id)
        own = _recorded_generation(record, recorded[member.member_id])
        if not mine or holding.partitions != mine or holding.generation != own:
            return False
    return True


def _recorded_generation(record: GroupRecord, member: MemberRecord) -> int:
    """The member's own generation by ``record``: a record written before members had their own
    names only the group's."""
    return member.generation if member.generation >= 0 else record.generation


def _fail_if_adopted(group: Group, gained: Collection[TopicPartition]) -> None:
    """A member that re-registered after this attempt began (so was not stopped by it) may have
    adopted some of the partitions to be started, which it fetches on under its lease from this
    coordinator: the attempt fails, and the next one stops it first."""
    if adopted := group.ownership.held_among(gained):
        raise AttemptFailed(
            f"{len(adopted)} partitions to be started are held by a member that came back since"
        )


def _check_contact(coordinator: RebalanceHost) -> None:
    """StopFetcher and StartFetcher renew leases, which a coordinator that may have been deposed
    must not do (docs/design.md#coordinator-epochs-and-the-election): the attempt fails before
    it sends any, and is retried after its backoff."""
    if _now() >= coordinator.store.in_contact_until():
        raise AttemptFailed("out of contact with the store")


def _refused(
    coordinator: RebalanceHost, member: Member, request: str, response: ResponseMessage
) -> str:
    """A StopFetcher or StartFetcher answered with an error, or with something else, counts as
    a miss: a member that refuses every time is dead after its allowed misses (its lease
    honoured, since whether it stopped is unknown), and the others go on without it."""
    if isinstance(response, StopFetcherResponse | StartFetcherResponse):
        what = f"{member.member_id} answered {request} {response.error_code.name}"
    else:
        what = f"{member.member_id} answered {request} with {type(response).__name__}"
    if member.machine.alive:
        coordinator.member_event(member, member_sm.HandoverRefused(now=_now()))
    return what


def _streams_by_member(
    coordinator: RebalanceHost,
    assignment: Assignment,
    committed: Mapping[TopicPartition, int],
    *,
    only: Collection[str],
) -> dict[str, tuple[AssignedStream, ...]]:
    """The StartFetcher streams of each member in ``only``, built from the assignment's own
    ``TopicPartition`` objects: over 10,000 partitions every object created or attrs comparison
    made here is a visible part of the rebalance."""
    # Sorted by plain tuples: attrs' generated ordering costs microseconds per comparison.
    by_thread: dict[tuple[str, int], list[TopicPartition]] = defaultdict(list)
    for tp, thread in assignment.items():
        if thread.member_id in only:
            by_thread[thread.member_id, thread.index].append(tp)
    brokers = {topic: placement.brokers for topic, placement in coordinator.topics.items()}
    gone = sorted({tp.topic for tps in by_thread.values() for tp in tps} - brokers.keys())
    if gone:
        # Deleted while the attempt waited (for leases, the store): nothing is started yet, and
        # the retry plans without them (the topic watch has asked for one).
        raise AttemptFailed(f"topics deleted during the attempt: {', '.join(gone)}")
    streams: dict[str, list[AssignedStream]] = defaultdict(list)
    for (member_id, index), tps in sorted(by_thread.items(), key=_first):
        tps.sort(key=_topic_partition_key)
        partitions = tuple(
            AssignedPartition(
                topic=tp.topic,
                partition=tp.partition,
                offset=committed.get(tp, -1),
                broker_id=brokers[tp.topic][tp.partition],
            )
            for tp in tps
        )
        stream_id = ConsumerThread(member_id=member_id, index=index).stream_id
        streams[member_id].append(AssignedStream(stream_id=stream_id, partitions=partitions))
    return {member_id: tuple(member_streams) for member_id, member_streams in streams.items()}


def _first(item: tuple[tuple[str, int], object]) -> tuple[str, int]:
    return item[0]


def _topic_partition_key(tp: TopicPartition) -> tuple[str, int]:
    return tp.topic, tp.partition


def _now() -> float:
    return trio.current_time()
