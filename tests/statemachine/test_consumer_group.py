"""The one pure group (``statemachine/consumer_group.py``) on cases named one by one; the
differential test (``test_consumer_group_differential.py``) holds it to 453776a's behaviour."""

from protocol.types import Subscription, TopicStreams
from statemachine import member as member_sm
from statemachine.consumer_group import (
    CloseConnection,
    ConsumerGroup,
    GroupInput,
    GroupRules,
    MemberDied,
)
from statemachine.group import GroupState, MemberDeparted
from statemachine.records import MemberRecord


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
