"""What a group's store record holds: its members and the assignment its latest attempt intends.

The records are the group's own data, written by the coordinator and read back by a successor
(docs/design.md#adoption-after-a-failover), so they live beside the group's rules
(:mod:`statemachine.consumer_group`), and the store keeps them as they are. Frozen all the way
down: a caller that goes on mutating the dict it passed in must not change what the store holds.
"""

from __future__ import annotations

import types
from collections.abc import Iterable, Mapping

import attrs

from protocol.types import ConsumerThread, Subscription, TopicId, TopicPartition


def _member_tuple(values: Iterable[MemberRecord]) -> tuple[MemberRecord, ...]:
    return tuple(values)


def _frozen_ids(topic_ids: Mapping[str, TopicId]) -> Mapping[str, TopicId]:
    return types.MappingProxyType(dict(topic_ids))


def _frozen_assignment(
    assignment: Mapping[TopicPartition, ConsumerThread],
) -> Mapping[TopicPartition, ConsumerThread]:
    return types.MappingProxyType(dict(assignment))


@attrs.frozen(kw_only=True)
class MemberRecord:
    """What a newly elected coordinator needs to know about a member to adopt it when it
    re-registers, without asking it again (docs/design.md#adoption-after-a-failover)."""

    member_id: str
    client_id: str
    subscription: Subscription
    session_timeout_ms: int
    auto_commit: bool
    auto_offset_reset: str
    #: The member's own generation, that of the last StartFetcher the group's record gave it:
    #: under the incremental protocol a member the latest rebalance left alone keeps an older
    #: one, and a successor adopts it under that (docs/design.md#adoption-after-a-failover).
    #: -1 in a record written before members had their own (read as the group's generation).
    generation: int = -1
    #: A static member's instance id (equal to ``member_id``, which names the member rather than
    #: one of its processes); None for a dynamic member. A successor coordinator reads it to know
    #: that the member outlives its processes (docs/design.md#static-members).
    instance_id: str | None = None


@attrs.frozen(kw_only=True)
class GroupRecord:
    """A group's registry: its members, the generation of its latest rebalance *attempt*, and the
    assignment that attempt intends (the seeds' owners).

    It is written before StartFetcher is sent (docs/design.md#rebalance, step 6), so a
    coordinator elected mid-rebalance knows both who was meant to own what and which generation
    to check offsets against.

    ``complete`` says that every member named answered its StartFetcher under ``generation``:
    the coordinator writes the record once more after the attempt completed. Only such a record
    says who fetches what; one written before the starts says only who was meant to
    (docs/design.md#adoption-after-a-failover).
    """

    group_id: str
    generation: int
    members: tuple[MemberRecord, ...] = attrs.field(converter=_member_tuple)
    assignment: Mapping[TopicPartition, ConsumerThread] = attrs.field(converter=_frozen_assignment)
    complete: bool = False
    #: The incarnation of each topic of ``assignment`` (docs/design.md#topic-ids), and of a
    #: topic deleted or created again whose old incarnation a process may still fetch: a
    #: successor that finds another id in force stops every holder of the old one before it
    #: starts the new. Empty in a record written before topics had ids: read as made under the
    #: ids in force when it is read.
    topic_ids: Mapping[str, TopicId] = attrs.field(factory=dict, converter=_frozen_ids)
