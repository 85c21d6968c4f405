"""The sweeper of deleted topics' partition states (docs/design.md#replication): the holder of
coordinator slot 0 removes the states of topic ids that no topic has any more, under that slot's
epoch, so that a sweeper whose office is over removes nothing (``Deposed`` ends the slot's hold,
as it does a controller's).

Deleting a topic removes its states after its topic node, best effort (store/zookeeper.py); what
that leaves (a delete cut short, a controller that wrote a state before it saw the topic go) is
the sweeper's. Nothing else removes them, and a topic id is never used again, so they would stay
for ever: a few hundred bytes a partition, and a child more for every full read of the states.

Which ids are held is read before which are in force: a state is written only for a topic in
force as its writer saw it, and one session's reads see the store no older than before, so an
id with a state read first and no topic read after it is a deleted topic's, never one created
between the two reads.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Protocol

import trio

from protocol.types import TopicId
from store import StoreUnavailable, TopicPlacement

__all__ = ["SWEEPER_SLOT", "SweptStore", "sweep", "sweep_states"]

log = logging.getLogger(__name__)

#: The coordinator slot whose holder sweeps.
SWEEPER_SLOT = 0
#: How often the holder of slot 0 sweeps (and once as it takes the slot).
SWEEP_INTERVAL = 60.0


class SweptStore(Protocol):
    """What the sweeper needs of the store (``store.zookeeper.ZooKeeperStore``)."""

    async def topics(self) -> Mapping[str, TopicPlacement]: ...

    async def partition_state_ids(self) -> frozenset[TopicId]: ...

    async def remove_partition_states(self, epoch: int, topic_id: TopicId) -> bool: ...


async def sweep(store: SweptStore, epoch: int) -> tuple[TopicId, ...]:
    """Remove the states of every topic id no topic has, under the office of ``epoch``; the
    ids whose states are all gone now."""
    held = await store.partition_state_ids()
    if not held:
        return ()
    in_force = {placement.topic_id for placement in (await store.topics()).values()}
    removed = []
    for topic_id in sorted(held - in_force):
        if await store.remove_partition_states(epoch, topic_id):
            removed.append(topic_id)
    return tuple(removed)


async def sweep_states(store: SweptStore, *, epoch: int, interval: float = SWEEP_INTERVAL) -> None:
    """Sweep now and every ``interval`` until cancelled, or ``Deposed``; a store that fails a
    sweep is left until the next."""
    while True:
        try:
            removed = await sweep(store, epoch)
        except StoreUnavailable as exc:
            log.warning("cannot sweep the partition states: %s", exc)
        else:
            if removed:
                log.info(
                    "removed the partition states of %d deleted topic(s): %s",
                    len(removed),
                    ", ".join(str(topic_id) for topic_id in removed),
                )
        await trio.sleep(interval)
