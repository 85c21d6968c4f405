"""What the cluster agrees on about a replicated partition (docs/design.md#replication): who
leads it, under which leader epoch, and which replicas are in sync, each named with the log
directory it was in sync in, so that a wiped disk (a new directory) is not taken for the replica
that held the data.

These values are shared by the store (which keeps them, one node per partition, its version the
partition epoch every conditional write checks), the controller (which decides them) and the
brokers (which serve by them); here so that none of them imports another.
"""

from __future__ import annotations

import enum
import uuid
from collections.abc import Sequence

import attrs

from protocol.types import TopicId

__all__ = [
    "NO_EPOCH",
    "NO_LEADER",
    "EpochStart",
    "IsrEntry",
    "PartitionKey",
    "PartitionState",
    "ReplicationCode",
    "StateWrite",
    "assign_epoch",
    "epoch_end",
    "slot_key",
    "truncate_epochs",
]

#: A partition with no leader now (an election under way, or every eligible replica down).
NO_LEADER = -1

#: No epoch: an empty log has no last epoch, and an epoch cache may know none at or below one.
NO_EPOCH = -1


class ReplicationCode(enum.IntEnum):
    """The error codes of replication (Kafka's numbers, DESIGN37 §2.3) that the sans-IO decisions
    answer with, until ``protocol.errors.ErrorCode`` has them: the values are the wire's, so
    ``ErrorCode(code)`` reads one once it does."""

    LEADER_NOT_AVAILABLE = 5
    NOT_LEADER_OR_FOLLOWER = 6
    NOT_ENOUGH_REPLICAS = 19
    """acks=all refused before appending: the ISR is below ``min.insync.replicas``."""
    NOT_ENOUGH_REPLICAS_AFTER_APPEND = 20
    """Appended, but the ISR fell below ``min.insync.replicas`` before the high watermark covered
    the records: not acknowledged, and a retry may store them twice."""
    INVALID_REPLICATION_FACTOR = 38
    FENCED_LEADER_EPOCH = 74
    UNKNOWN_LEADER_EPOCH = 75


@attrs.frozen(kw_only=True, order=True)
class PartitionKey:
    """A partition of one incarnation of a topic: a name deleted and created again is another
    topic id, so another partition, with a state of its own."""

    topic_id: TopicId
    partition: int


def slot_key(key: PartitionKey) -> str:
    """The key whose coordinator slot controls the partition (``statemachine.slots.slot_of``): a
    key space of its own, never passed where a group id is expected."""
    return f"{key.topic_id}/{key.partition}"


@attrs.frozen(kw_only=True, order=True)
class IsrEntry:
    """A replica in sync: the broker and the log directory (its identity, new when the directory
    is new or wiped) in which it had every record the high watermark covers."""

    broker_id: int
    log_dir: uuid.UUID


@attrs.frozen(kw_only=True)
class PartitionState:
    """A partition's leader, leader epoch and in-sync replicas, as the store holds them.
    ``version`` is the store node's version when read (the partition epoch); a write names it and
    fails if another writer came first."""

    leader: int
    leader_epoch: int
    isr: tuple[IsrEntry, ...]
    version: int = 0

    def in_sync(self, broker_id: int) -> bool:
        return any(entry.broker_id == broker_id for entry in self.isr)


@attrs.frozen(kw_only=True)
class StateWrite:
    """A conditional write of one partition's state: done only if the node's version is still
    ``expected_version`` (-1: the node must not exist yet, a new partition)."""

    key: PartitionKey
    state: PartitionState
    expected_version: int


@attrs.frozen(kw_only=True, order=True)
class EpochStart:
    """The first offset a leader wrote under ``epoch`` (KIP-101's epoch cache entry): a follower
    truncates to the end of the epoch it shares with the leader, never to its high watermark."""

    epoch: int
    start_offset: int


def epoch_end(cache: Sequence[EpochStart], log_end: int, epoch: int) -> tuple[int, int]:
    """Kafka's ``endOffsetFor``: (the largest epoch of ``cache`` at or below ``epoch``, the offset
    where it ends) in a log ending at ``log_end``, the cache sorted by epoch. The latest epoch
    ends at the log end, any other where the next one starts. An ``epoch`` older than every entry
    ends where the first one starts (nothing of it is here); with no entry above ``epoch``
    either (an empty cache, or a newer epoch than any), ``(NO_EPOCH, -1)``: the epoch is unknown.
    """
    if not cache or epoch == NO_EPOCH:
        return NO_EPOCH, -1
    if epoch == cache[-1].epoch:
        return epoch, log_end
    floor: EpochStart | None = None
    for entry in cache:
        if entry.epoch > epoch:
            return (epoch if floor is None else floor.epoch), entry.start_offset
        floor = entry
    return NO_EPOCH, -1


def assign_epoch(
    cache: Sequence[EpochStart], epoch: int, start_offset: int
) -> tuple[EpochStart, ...]:
    """``cache`` once records of ``epoch`` start at ``start_offset`` (a leader elected there, or a
    follower appending the leader's records): entries of that epoch or later, or starting there
    or later, describe records that are not there (a leader elected that wrote nothing), so they
    go; an epoch already last stays as it started (Kafka's ``assign``)."""
    if cache and cache[-1].epoch == epoch and cache[-1].start_offset <= start_offset:
        return tuple(cache)
    kept = tuple(e for e in cache if e.epoch < epoch and e.start_offset < start_offset)
    return (*kept, EpochStart(epoch=epoch, start_offset=start_offset))


def truncate_epochs(cache: Sequence[EpochStart], log_end: int) -> tuple[EpochStart, ...]:
    """``cache`` for a log cut to end at ``log_end`` (a truncation, or a restart that recovered
    less than the cache names): epochs starting there or later have no record left."""
    return tuple(e for e in cache if e.start_offset < log_end)
