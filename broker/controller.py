"""The controllers of replicated partitions (docs/design.md#replication): the holder of a
coordinator slot controls the partitions whose ``slot_key`` hashes onto that slot, under the
slot's epoch, so a controller is fenced exactly as the slot's coordinator is (a deposed one writes
nothing: ``Deposed``).

Each slot held here runs :func:`control_slot` beside its coordinator (broker/election.py). Every
controller of the broker decides from one shared :class:`ControlInputs`: the topics, the states
(from the store's change notes, and the controller's own writes as soon as they are done) and
the live brokers with their registered log directories. It decides again
(``statemachine.partition_control.decide``) whenever any of them changes, writes the result
conditionally on the versions it read, and for a write that lost its race reads that state again
before deciding again: never a blind retry. Partitions of factor 1 have no state and are never
decided.
"""

from __future__ import annotations

import logging
import types
import uuid
from collections.abc import Mapping, Sequence

import attrs
import trio
import trio_util

from protocol.topic_configs import unclean_leader_election
from protocol.types import TopicId
from statemachine.partition_control import ControlView, decide
from statemachine.partition_state import PartitionKey, PartitionState, slot_key
from statemachine.slots import slot_of
from store import StoreUnavailable, TopicPlacement
from store.interface import ReplicationStore

__all__ = ["ControlInputs", "control_slot"]

log = logging.getLogger(__name__)

#: After the store failed a controller's read or write, it tries again on the next change of its
#: inputs or after this long, whichever comes first.
RETRY_INTERVAL = 1.0


@attrs.define(eq=False)
class ControlInputs:
    """What this broker knows of the replicated partitions, shared by its controllers and its
    ClusterMetadata answers: every state at its newest version seen, each replicated partition's
    replicas, and the live brokers' log directories. ``changes`` moves on with each change."""

    #: The cluster's coordinator slots.
    slots: int
    states: dict[PartitionKey, PartitionState] = attrs.Factory(dict)
    #: Broker id -> the log directory it registered (a live broker that named none is absent).
    live: Mapping[int, uuid.UUID] = types.MappingProxyType({})
    #: Slot -> each partition of a topic of factor above 1 that its holder controls, with its
    #: replicas, the preferred leader first: each controller decides over its own share only
    #: (at 10,000 partitions a broker, a few hundred a slot).
    by_slot: Mapping[int, Mapping[PartitionKey, Sequence[int]]] = types.MappingProxyType({})
    unclean: frozenset[TopicId] = frozenset()
    changes: trio_util.AsyncValue[int] = attrs.Factory(lambda: trio_util.AsyncValue(0))

    def set_topics(self, topics: Mapping[str, TopicPlacement]) -> None:
        by_slot: dict[int, dict[PartitionKey, Sequence[int]]] = {}
        unclean = set()
        for placement in topics.values():
            if placement.replication_factor == 1:
                continue
            for partition, listed in enumerate(placement.replicas):
                key = PartitionKey(topic_id=placement.topic_id, partition=partition)
                by_slot.setdefault(slot_of(slot_key(key), self.slots), {})[key] = listed
            if unclean_leader_election(placement.configs):
                unclean.add(placement.topic_id)
        self.by_slot = types.MappingProxyType(by_slot)
        self.unclean = frozenset(unclean)
        self.changes.value += 1

    def set_live(self, live: Mapping[int, uuid.UUID]) -> None:
        if live != self.live:
            self.live = types.MappingProxyType(dict(live))
            self.changes.value += 1

    def learn(self, states: Mapping[PartitionKey, PartitionState]) -> bool:
        """Keep the states newer than those known (a change note may come after the write it
        tells of was learned from the writer); whether any was."""
        newer = {
            key: state
            for key, state in states.items()
            if (known := self.states.get(key)) is None or known.version < state.version
        }
        if newer:
            self.states.update(newer)
            self.changes.value += 1
        return bool(newer)

    async def wait_states(self, keys: Sequence[PartitionKey]) -> None:
        """Return once every one of ``keys`` has a state."""
        await self.changes.wait_value(lambda _: all(key in self.states for key in keys))


async def control_slot(
    store: ReplicationStore, inputs: ControlInputs, *, slot: int, epoch: int
) -> None:
    """Control the partitions of ``slot`` under its office of ``epoch`` until cancelled or
    ``Deposed``."""
    while True:
        seen = inputs.changes.value
        view = ControlView(
            slot=slot,
            slots=inputs.slots,
            replicas=inputs.by_slot.get(slot, {}),
            states=inputs.states,
            live=inputs.live,
            unclean=inputs.unclean,
        )
        writes = decide(view)
        # Partitions without a leader first (Kafka's controller elects the offline partitions
        # before it shrinks the others' ISRs): at a broker's death every partition it held
        # changes, and those it led are unavailable until their write is done. The rest are
        # decided again at once, once these are learned.
        electing = tuple(w for w in writes if _elects(inputs.states.get(w.key), w.state))
        if electing:
            writes = electing
        if writes:
            try:
                lost = await store.write_partition_states(epoch, writes)
                inputs.learn({w.key: w.state for w in writes if w.key not in lost})
                if lost:
                    log.info("slot %d lost the race for %d partition states", slot, len(lost))
                    inputs.learn(await store.read_partition_states(lost))
            except StoreUnavailable as exc:
                log.warning("slot %d cannot write partition states: %s", slot, exc)
                with trio.move_on_after(RETRY_INTERVAL):
                    await inputs.changes.wait_value(lambda value, seen=seen: value != seen)
                continue
            log.info("slot %d wrote %d partition states", slot, len(writes) - len(lost))
            for write in writes:
                if write.key not in lost:
                    _tell(slot, write.key, write.state)
        # What was written or re-read is learned (a change): decided again at once. A re-read
        # that found nothing newer waits for the next change rather than losing the same race.
        await inputs.changes.wait_value(lambda value, seen=seen: value != seen)


def _elects(current: PartitionState | None, decided: PartitionState) -> bool:
    """Whether a write gives its partition a leader it has not had under ``current``."""
    return current is None or current.leader != decided.leader


def _tell(slot: int, key: PartitionKey, state: PartitionState) -> None:
    isr = [entry.broker_id for entry in state.isr]
    log.debug(
        "slot %d: partition %s/%d leader %d epoch %d isr %s",
        slot,
        key.topic_id,
        key.partition,
        state.leader,
        state.leader_epoch,
        isr,
    )
