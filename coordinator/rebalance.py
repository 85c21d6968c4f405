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
from collections.abc import Collection, Mapping

import attrs
import trio

from coordinator.driver import GroupDriver, Member
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
    TopicIdentity,
)
from protocol.types import ConsumerThread, TopicPartition
from statemachine.consumer_group import AttemptPlan, GroupMember, topic_partition_key
from statemachine.group import GroupState
from store import GroupRecord, StoreError, TopicPlacement

log = logging.getLogger(__name__)

Assignment = dict[TopicPartition, ConsumerThread]


class AttemptFailed(Exception):
    """A member answered with an error, or missed a deadline without being declared dead, or
    the store failed: the attempt is abandoned and retried after a backoff."""


async def drive(driver: GroupDriver) -> None:
    """The group's driver: wait until an attempt is due, then run it."""
    group = driver.group
    while True:
        due = await driver.next_attempt_at.wait_value(lambda at: at is not None)
        assert due is not None
        with trio.move_on_at(due):
            await driver.next_attempt_at.wait_transition()
            continue  # rescheduled (or cleared) while waiting
        group.attempt_due()
        driver.next_attempt_at.value = None
        if group.machine.state is GroupState.PENDING:
            await _attempt(driver)
        elif group.machine.state is GroupState.DEAD:
            return


def _partition_counts(driver: GroupDriver) -> dict[str, int]:
    return {topic: p.partition_count for topic, p in driver.context.topics.items()}


async def _attempt(driver: GroupDriver) -> None:
    group = driver.group
    plan, effects = group.plan_attempt(_partition_counts(driver), _now(), driver.context.topics)
    driver.perform(effects)
    if plan is None:
        return
    # Once a member failure cancels the attempt, the attempt feeds the group no other input of
    # the attempt: the group has already moved on (Pending or Empty) and the dead member's
    # machine is Dead, and the code below may run on until its next checkpoint delivers the
    # cancellation.
    completed: GroupRecord | None = None
    with trio.CancelScope() as attempt:
        driver.attempt_scope = attempt
        try:
            # Loaded first: StopFetcher answers' offsets are accepted as they arrive.
            try:
                await driver.context.offsets.committed(group.group_id)
            except StoreError as exc:
                raise AttemptFailed(f"store: {exc}") from exc
            await _stop_all(driver, plan, attempt)
            if attempt.cancel_called:
                return
            driver.perform(group.members_stopped(_now()))
            record = await _start_all(driver, plan, attempt)
        except AttemptFailed as exc:
            if not attempt.cancel_called:
                log.warning("group %s: attempt %d failed: %s", group.group_id, plan.generation, exc)
                driver.perform(group.attempt_failed(_now()))
            return
        finally:
            driver.attempt_scope = None
        if attempt.cancel_called:
            return
        driver.perform(group.attempt_completed(_now()))
        completed = record
    if attempt.cancelled_caught:
        log.info(
            "group %s: attempt %d cancelled by a member failure", group.group_id, plan.generation
        )
    elif completed is not None:
        # Outside the attempt's scope: a member failure from now on does not undo the starts.
        await _record_completed(driver, completed)


def _handles(driver: GroupDriver, members: Collection[GroupMember]) -> dict[GroupMember, Member]:
    """The connections of ``members`` that are still open."""
    handles = driver.handles
    return {m: h for m in members if (h := handles.get(m.incarnation)) is not None}


async def _stop_all(driver: GroupDriver, plan: AttemptPlan, attempt: trio.CancelScope) -> None:
    """StopFetcher to each member with something to stop (every member, eager), all at once;
    each answer frees what it stopped."""
    failures: list[str] = []
    context = driver.context
    _check_contact(driver)
    orders = driver.group.stops_sent(plan, _now())
    handles = _handles(driver, [order.member for order in orders])
    requests: dict[Member, RequestMessage] = {}
    for order in orders:
        handle = handles.get(order.member)
        if handle is None:
            failures.append(f"{order.member.member_id} did not answer StopFetcher")
            continue
        requests[handle] = StopFetcherRequest(
            coordinator_epoch=context.epoch,
            generation=order.generation,
            consumer_id=order.member.member_id,
            acknowledged_frames=handle.channel.frames_received,
            partitions=order.partitions,
        )

    def stopped(member: Member, response: ResponseMessage) -> None:
        if (
            not isinstance(response, StopFetcherResponse)
            or response.error_code is not ErrorCode.NONE
        ):
            failures.append(_refused(driver, member, "StopFetcher", response))
            return
        driver.stop_answered(
            member,
            response.offsets,
            revoked=plan.changes[member.state].revoked,
            attempt_live=not attempt.cancel_called,
        )

    silent = await driver.call_all(requests, stopped)
    failures.extend(f"{member.member_id} did not answer StopFetcher" for member in silent)
    if failures:
        raise AttemptFailed("; ".join(failures))


async def _start_all(
    driver: GroupDriver, plan: AttemptPlan, attempt: trio.CancelScope
) -> GroupRecord | None:
    """Start every member the attempt starts; returns the record persisted before the starts
    (None: cancelled before it was written)."""
    group, context = driver.group, driver.context
    starting = group.starting(plan)
    gained = group.gained(starting)
    # A partition leaving a member that fell silent waits until that member's lease ran out, or,
    # after a failover, until its owner came back and said it no longer fetches it.
    # A member that comes back meanwhile still fetching what it adopted fails the wait at once:
    # the next attempt stops it first, rather than this one waiting out a lease for nothing.
    # A topic created again starts only once no process may fetch its old incarnation any more
    # (docs/design.md#topic-ids): its old partitions are waited on as well, whatever the starts.
    while (
        free_at := group.ownership.free_at(waits := group.waits_on(plan, gained, _now()))
    ) > _now():
        _fail_if_adopted(driver, waits)
        log.info("group %s: waiting %.1f s for leases to run out", group.group_id, free_at - _now())
        with trio.move_on_at(free_at):
            await driver.leases_freed.wait_transition()
    if attempt.cancel_called:
        return None
    if recreated := group.stale_ids(plan, context.topics):
        # The attempt would start an incarnation that is no longer the topic's: the topic
        # watch has asked for another attempt, which stops its holders first.
        raise AttemptFailed(f"topics created again during the attempt: {', '.join(recreated)}")
    try:
        await context.offsets.flush()
        record = group.record(plan, starting)
        await context.store.write_group(context.epoch, record)
    except StoreError as exc:
        raise AttemptFailed(f"store: {exc}") from exc
    group.persisted(plan)
    committed = await context.offsets.committed(group.group_id)
    streams = _streams_by_member(
        context.topics, plan.assignment, committed, only={m.member_id for m in starting}
    )
    failures: list[str] = []
    _fail_if_adopted(driver, group.waits_on(plan, gained, _now()))
    _check_contact(driver)
    # A start the group refuses (a partition someone else may fetch) raises here, before any
    # StartFetcher is sent: the group fails and is rebuilt.
    started = group.starts_sent(plan, starting, _now())
    handles = _handles(driver, started)
    incremental = group.rules.incremental
    requests: dict[Member, RequestMessage] = {}
    for member in started:
        handle = handles.get(member)
        if handle is None:
            failures.append(f"{member.member_id} did not answer StartFetcher")
            continue
        requests[handle] = StartFetcherRequest(
            coordinator_epoch=context.epoch,
            generation=plan.generation,
            consumer_id=member.member_id,
            streams=streams.get(member.member_id, ()),
            brokers=context.brokers_by_listener.get(handle.channel.listener, context.brokers),
            acknowledged_frames=handle.channel.frames_received,
            incremental=incremental and member.versions.incremental,
            topic_ids=_topic_ids(plan, streams.get(member.member_id, ())),
        )

    def answered(member: Member, response: ResponseMessage) -> None:
        if attempt.cancel_called:
            return
        if not member.machine.alive:
            failures.append(f"{member.member_id} did not answer StartFetcher")
            return
        if (
            not isinstance(response, StartFetcherResponse)
            or response.error_code is not ErrorCode.NONE
        ):
            failures.append(_refused(driver, member, "StartFetcher", response))
            return
        group.start_answered(member.state, _now())

    def unsent(member: Member) -> None:
        driver.perform(group.start_unsent(member.state))

    silent = await driver.call_all(requests, answered, unsent)
    failures.extend(f"{member.member_id} did not answer StartFetcher" for member in silent)
    if failures:
        raise AttemptFailed("; ".join(failures))
    return record


async def _record_completed(driver: GroupDriver, record: GroupRecord) -> None:
    """Write the record once more, marked complete: every start under it was answered, so a
    successor may adopt members that come back holding what it says
    (docs/design.md#adoption-after-a-failover). One more store write per rebalance; if it
    fails, a successor only rebalances once more, so the group goes on."""
    context = driver.context
    try:
        await context.store.write_group(context.epoch, attrs.evolve(record, complete=True))
    except StoreError as exc:
        log.warning("group %s: cannot mark its record complete: %s", record.group_id, exc)


def _fail_if_adopted(driver: GroupDriver, gained: Collection[TopicPartition]) -> None:
    """A member that re-registered after this attempt began (so was not stopped by it) may have
    adopted some of the partitions to be started, which it fetches on under its lease from this
    coordinator: the attempt fails, and the next one stops it first."""
    if adopted := driver.group.ownership.held_among(gained):
        raise AttemptFailed(
            f"{len(adopted)} partitions to be started are held by a member that came back since"
        )


def _check_contact(driver: GroupDriver) -> None:
    """StopFetcher and StartFetcher renew leases, which a coordinator that may have been deposed
    must not do (docs/design.md#coordinator-epochs-and-the-election): the attempt fails before
    it sends any, and is retried after its backoff."""
    if not driver.context.in_contact():
        raise AttemptFailed("out of contact with the store")


def _refused(driver: GroupDriver, member: Member, request: str, response: ResponseMessage) -> str:
    """A StopFetcher or StartFetcher answered with an error, or with something else, counts as
    a miss: a member that refuses every time is dead after its allowed misses (its lease
    honoured, since whether it stopped is unknown), and the others go on without it."""
    if isinstance(response, StopFetcherResponse | StartFetcherResponse):
        what = f"{member.member_id} answered {request} {response.error_code.name}"
    else:
        what = f"{member.member_id} answered {request} with {type(response).__name__}"
    driver.feed(driver.group.handover_refused, member.state, _now())
    return what


def _streams_by_member(
    topics: Mapping[str, TopicPlacement],
    assignment: Mapping[TopicPartition, ConsumerThread],
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
    brokers = {topic: placement.brokers for topic, placement in topics.items()}
    gone = sorted({tp.topic for tps in by_thread.values() for tp in tps} - brokers.keys())
    if gone:
        # Deleted while the attempt waited (for leases, the store): nothing is started yet, and
        # the retry plans without them (the topic watch has asked for one).
        raise AttemptFailed(f"topics deleted during the attempt: {', '.join(gone)}")
    streams: dict[str, list[AssignedStream]] = defaultdict(list)
    for (member_id, index), tps in sorted(by_thread.items(), key=_first):
        tps.sort(key=topic_partition_key)
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


def _topic_ids(plan: AttemptPlan, streams: tuple[AssignedStream, ...]) -> tuple[TopicIdentity, ...]:
    """The incarnation of each topic of a member's ``streams``: the one the attempt planned
    with, which it checked is still in force before the starts (docs/design.md#topic-ids)."""
    names = sorted({p.topic for stream in streams for p in stream.partitions})
    return tuple(
        TopicIdentity(topic=t, topic_id=plan.topic_ids[t]) for t in names if t in plan.topic_ids
    )


def _first(item: tuple[tuple[str, int], object]) -> tuple[str, int]:
    return item[0]


def _now() -> float:
    return trio.current_time()
