"""The one pure group (``statemachine/consumer_group.py``) on cases named one by one; the
differential test (``test_consumer_group_differential.py``) holds it to 453776a's behaviour."""

import uuid

import attrs

from protocol.types import (
    ConsumerThread,
    PartitionOffset,
    Subscription,
    TopicPartition,
    TopicStreams,
)
from statemachine import member as member_sm
from statemachine.consumer_group import (
    AttemptPlan,
    Change,
    CloseConnection,
    ConsumerGroup,
    GroupInput,
    GroupMember,
    GroupRules,
    MemberDied,
)
from statemachine.group import GroupState, MemberDeparted
from statemachine.records import GroupRecord, MemberRecord


def test_a_leave_group_reaching_a_member_declared_dead_since_changes_nothing() -> None:
    """A LeaveGroup the connection's task took in while the member's last Ping deadline passed
    in the same instant: the member is dead already, and its request must not fail the group
    (453776a's dispatch failed only that request's task; docs/failure-domains.md)."""
    group = ConsumerGroup.new("g", GroupRules(), now=0.0)
    record = MemberRecord(
        member_id="c1",
        client_id="client",
        subscription=Subscription(topics=(TopicStreams(topic="t", streams=1),)),
        session_timeout_ms=6000,
        auto_commit=True,
        auto_offset_reset="largest",
    )
    member, _ = group.join(
        record, consumer_id="c1", incarnation=0, reported_generation=-1, holding=(), now=0.0
    )
    effects = group.deadline_missed(member, 6.0, handover=False)
    assert MemberDied(member_id="c1", cause=member_sm.DeathCause.MISSED_DEADLINES) in effects
    assert CloseConnection(incarnation=0) in effects
    departed = MemberDeparted(member_id="c1", remaining=0)
    assert GroupInput(event=departed, death=member_sm.DeathCause.MISSED_DEADLINES) in effects
    assert group.left(member, 6.0) == []
    assert group.state is GroupState.EMPTY
    assert member.machine.state is member_sm.MemberState.DEAD


# --- a topic created again (docs/design.md#topic-ids) ------------------------------------------


@attrs.frozen
class _Placement:
    topic_id: uuid.UUID
    partition_count: int = 2


OLD_ID, NEW_ID = uuid.UUID(int=1), uuid.UUID(int=2)


def _events(*partitions: int) -> frozenset[TopicPartition]:
    return frozenset(TopicPartition(topic="events", partition=p) for p in partitions)


def _run_attempt(group: ConsumerGroup, topics: dict[str, _Placement], now: float) -> AttemptPlan:
    """One attempt of the pure group, every member answering at ``now``, as
    ``coordinator/rebalance.py`` drives it."""
    counts = {topic: placement.partition_count for topic, placement in topics.items()}
    plan, _ = group.plan_attempt(counts, now, topics)
    assert plan is not None
    for order in group.stops_sent(plan, now):
        group.stop_answered(
            order.member,
            (),
            revoked=plan.changes[order.member].revoked,
            attempt_live=True,
            topics=topics,
            now=now,
        )
    group.members_stopped(now)
    starting = group.starting(plan)
    assert group.ownership.free_at(group.waits_on(plan, group.gained(starting), now)) <= now
    group.record(plan, starting)
    group.persisted(plan)
    for member in group.starts_sent(plan, starting, now):
        group.start_answered(member, now)
    group.attempt_completed(now)
    return plan


def _one_member_group() -> tuple[ConsumerGroup, GroupMember]:
    group = ConsumerGroup.new("g", GroupRules(initial_delay=0.0), now=0.0)
    record = MemberRecord(
        member_id="c1",
        client_id="client",
        subscription=Subscription(topics=(TopicStreams(topic="events", streams=1),)),
        session_timeout_ms=6000,
        auto_commit=True,
        auto_offset_reset="smallest",
    )
    member, _ = group.join(
        record, consumer_id="c1", incarnation=0, reported_generation=-1, holding=(), now=0.0
    )
    group.attempt_due()
    _run_attempt(group, {"events": _Placement(topic_id=OLD_ID)}, 0.0)
    assert group.holding(member).partitions == _events(0, 1)
    assert group.topic_ids == {"events": OLD_ID}
    return group, member


def test_a_topic_created_again_is_revoked_from_its_holder_though_the_assignment_keeps_it() -> None:
    group, member = _one_member_group()
    recreated = {"events": _Placement(topic_id=NEW_ID)}
    # Reports of the old incarnation count for nothing from the moment the new one is in force.
    reported = (PartitionOffset(topic="events", partition=0, offset=10),)
    assert group.ping_answered(member, 1, reported, topics=recreated, now=1.0) == {}
    group.topics_changed(["events"], 1.0)
    group.attempt_due()
    plan, _ = group.plan_attempt({"events": 2}, 1.0, recreated)
    assert plan is not None
    assert plan.quarantined == {"events"}
    assert plan.topic_ids == {"events": NEW_ID}
    # The same partitions are its target, yet it stops them, and is started on them afresh.
    assert plan.changes[member] == Change(target=_events(0, 1), revoked=_events(0, 1), start=True)
    # Nothing starts while a partition of the old incarnation is held.
    assert group.waits_on(plan, set(), 1.0) == set(_events(0, 1))
    assert group.stale_ids(plan, recreated) == []
    assert group.stale_ids(plan, {"events": _Placement(topic_id=uuid.UUID(int=3))}) == ["events"]


def test_a_topic_created_again_that_nobody_holds_any_more_is_a_new_topic() -> None:
    group, member = _one_member_group()
    died = group.deadline_missed(member, 1.0, handover=False)
    assert MemberDied(member_id="c1", cause=member_sm.DeathCause.MISSED_DEADLINES) in died
    recreated = {"events": _Placement(topic_id=NEW_ID)}
    # Its lease (from the StartFetcher sent at 0.0: T + the margin) holds the old incarnation.
    assert group.ownership.of_topics({"events"}, 6.0) == _events(0, 1)
    assert group.ownership.of_topics({"events"}, 6.5) == frozenset()
    assert group.stale_topics(recreated) == {"events"}
    assert group.quarantine(recreated, 6.0) == {"events"}
    assert group.topic_ids == {"events": OLD_ID}
    assert group.quarantine(recreated, 6.5) == frozenset()
    assert group.topic_ids == {} and group.assignment == {}  # released: a new topic


def test_a_record_made_before_topic_ids_is_read_as_made_under_the_ids_in_force() -> None:
    group = ConsumerGroup.new("g", GroupRules(), now=0.0)
    record = GroupRecord(
        group_id="g",
        generation=1,
        members=(),
        assignment={tp: ConsumerThread(member_id="c1", index=0) for tp in _events(0, 1)},
    )
    group.recover(record, since=0.0, topics={"events": _Placement(topic_id=NEW_ID)})
    assert group.topic_ids == {"events": NEW_ID}
    recorded = attrs.evolve(record, topic_ids={"events": OLD_ID})
    group = ConsumerGroup.new("g", GroupRules(), now=0.0)
    group.recover(recorded, since=0.0, topics={"events": _Placement(topic_id=NEW_ID)})
    assert group.topic_ids == {"events": OLD_ID}
    assert group.stale_topics({"events": _Placement(topic_id=NEW_ID)}) == {"events"}


def test_a_deleted_topic_a_dead_member_may_still_fetch_is_remembered_until_its_lease_ends() -> None:
    """Deleted while its holder's lease runs (to 6.5): the attempt assigns it nobody, but the
    group keeps its old id, so that created again before 6.5 it is quarantined, not new."""
    group, member = _one_member_group()
    record = MemberRecord(
        member_id="c2",
        client_id="client",
        subscription=Subscription(topics=(TopicStreams(topic="orders", streams=1),)),
        session_timeout_ms=6000,
        auto_commit=True,
        auto_offset_reset="smallest",
    )
    group.join(record, consumer_id="c2", incarnation=1, reported_generation=-1, holding=(), now=1.0)
    group.deadline_missed(member, 1.0, handover=False)
    group.attempt_due()
    deleted = {"orders": _Placement(topic_id=uuid.UUID(int=9), partition_count=1)}
    plan = _run_attempt(group, deleted, 2.0)
    assert plan.quarantined == {"events"} and plan.held_over == {"events": OLD_ID}
    assert group.topic_ids == {"events": OLD_ID, "orders": uuid.UUID(int=9)}
    recreated = {**deleted, "events": _Placement(topic_id=NEW_ID)}
    assert group.quarantine(recreated, 6.0) == {"events"}
    assert group.quarantine(recreated, 6.5) == frozenset()
    assert group.topic_ids == {"orders": uuid.UUID(int=9)}
