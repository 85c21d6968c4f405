"""What the cluster agrees on about a replicated partition (docs/design.md#replication): who
leads it, under which leader epoch, and which replicas are in sync, each named with the log
directory it was in sync in, so that a wiped disk (a new directory) is not taken for the replica
that held the data.

These values are shared by the store (which keeps them, one node per partition, its version the
partition epoch every conditional write checks), the controller (which decides them) and the
brokers (which serve by them); here so that none of them imports another.
"""

from __future__ import annotations

import uuid

import attrs

from protocol.types import TopicId

__all__ = [
    "NO_LEADER",
    "UNKNOWN_LOG_DIR",
    "EpochStart",
    "IsrEntry",
    "PartitionKey",
    "PartitionState",
    "StateWrite",
    "slot_key",
    "sole_replica_state",
]

#: A partition with no leader now (an election under way, or every eligible replica down).
NO_LEADER = -1

#: The log directory of a broker that registered none (one of a release before log directory
#: ids): never equal to a directory's id, so such a replica is never taken for one in sync there.
UNKNOWN_LOG_DIR = uuid.UUID(int=0)


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


def sole_replica_state(broker_id: int, log_dir: uuid.UUID) -> PartitionState:
    """The state of a partition of replication factor 1, which nobody elects or writes: its one
    broker leads it, at leader epoch 0, in sync by itself in ``log_dir``."""
    return PartitionState(
        leader=broker_id,
        leader_epoch=0,
        isr=(IsrEntry(broker_id=broker_id, log_dir=log_dir),),
        version=0,
    )
