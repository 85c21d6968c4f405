"""Which broker each new partition of a topic lives on (docs/design.md#placement).

Round robin over the brokers sorted by id, as Kafka places partitions: a new topic starts at a
broker drawn at random, so many small topics do not all put their partition 0 on the lowest id;
added partitions go on after the broker of the topic's last partition, so a topic grown a few
partitions at a time stays even.
"""

from __future__ import annotations

import random
from collections.abc import Collection, Sequence

from protocol import ErrorCode


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
