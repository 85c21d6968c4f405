"""Which broker each new partition of a topic lives on (docs/design.md#placement).

Round robin over the brokers sorted by id, as Kafka places partitions: a new topic starts at a
broker drawn at random, so many small topics do not all put their partition 0 on the lowest id;
added partitions go on after the broker of the topic's last partition, so a topic grown a few
partitions at a time stays even.

A replicated partition's first replica (its preferred leader) is placed so; the others follow it
at a shift that grows by one each time the partitions go once round the brokers (Kafka's
rack-unaware assignment), so that the followers of one broker's leaders spread over the others
rather than all landing on its neighbour, and a dead broker's leadership spreads likewise.
"""

from __future__ import annotations

import random
from collections.abc import Collection, Iterable, Sequence

from protocol import ErrorCode
from statemachine.partition_state import ReplicationCode

#: Every replica of every partition, the preferred leader first.
Replicas = tuple[tuple[int, ...], ...]


def chosen_brokers(
    asked: Sequence[int] | None, live: Collection[int]
) -> tuple[tuple[int, ...], ErrorCode]:
    """The brokers to place on, sorted: those ``asked`` for (each live, none twice), or every live
    one when None."""
    if asked is None:
        return tuple(sorted(live)), ErrorCode.NONE if live else ErrorCode.INVALID_REPLICA_ASSIGNMENT
    if not asked or len(set(asked)) != len(asked) or not set(asked) <= set(live):
        return (), ErrorCode.INVALID_REPLICA_ASSIGNMENT
    return tuple(sorted(asked)), ErrorCode.NONE


def new_topic(brokers: Sequence[int], partitions: int, rng: random.Random) -> tuple[int, ...]:
    """A new topic's ``partitions``, round robin over ``brokers`` from a random one."""
    start = rng.randrange(len(brokers))
    return tuple(brokers[(start + p) % len(brokers)] for p in range(partitions))


def added(brokers: Sequence[int], placed: Sequence[int], count: int) -> tuple[int, ...]:
    """``count`` partitions more for a topic placed as ``placed``: round robin over ``brokers``,
    from the one after the last partition's broker (or the first, if that one is not among
    them)."""
    last = placed[-1] if placed else None
    start = brokers.index(last) + 1 if last in brokers else 0
    return tuple(brokers[(start + p) % len(brokers)] for p in range(count))


def new_topic_replicas(
    brokers: Sequence[int], partitions: int, factor: int, rng: random.Random
) -> tuple[Replicas, ErrorCode | ReplicationCode]:
    """A new topic's ``partitions`` with ``factor`` replicas each, over ``brokers`` (sorted).
    A factor the brokers cannot hold is refused (INVALID_REPLICATION_FACTOR), never placed with
    fewer replicas. Factor 1 places as :func:`new_topic` does, drawing the same numbers."""
    if not 1 <= factor <= len(brokers):
        return (), ReplicationCode.INVALID_REPLICATION_FACTOR
    start = rng.randrange(len(brokers))
    shift = rng.randrange(len(brokers)) if factor > 1 else 0
    return _replicas(brokers, range(partitions), start, shift, factor), ErrorCode.NONE


def added_replicas(
    brokers: Sequence[int], placed: Replicas, count: int
) -> tuple[Replicas, ErrorCode | ReplicationCode]:
    """``count`` partitions more for a topic placed as ``placed``, with its replication factor:
    the first replicas as :func:`added` places them, the others shifted as a new topic's are,
    from the shift where the topic's partition 0 leads (as Kafka's ``addPartitions``)."""
    factor = len(placed[0]) if placed else 1
    if not 1 <= factor <= len(brokers):
        return (), ReplicationCode.INVALID_REPLICATION_FACTOR
    first = added(brokers, [replicas[0] for replicas in placed], count)
    start = (brokers.index(first[0]) - len(placed)) % len(brokers) if first else 0
    origin = placed[0][0] if placed else None
    shift = brokers.index(origin) if origin in brokers else 0
    numbers = range(len(placed), len(placed) + count)
    return _replicas(brokers, numbers, start, shift, factor), ErrorCode.NONE


def _replicas(
    brokers: Sequence[int], numbers: Iterable[int], start: int, shift: int, factor: int
) -> Replicas:
    """Kafka's ``assignReplicasToBrokersRackUnaware``: partition ``p``'s first replica is the
    broker ``start + p`` round the ring, and its ``j``-th follower comes ``1 + (shift + p // n
    + j) % (n - 1)`` places after it, so no partition has a broker twice."""
    n = len(brokers)
    placed: list[tuple[int, ...]] = []
    for p in numbers:
        first = (start + p) % n
        followers = ((first + 1 + (shift + p // n + j) % (n - 1)) % n for j in range(factor - 1))
        placed.append((brokers[first], *(brokers[i] for i in followers)))
    return tuple(placed)
