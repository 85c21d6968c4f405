"""What a partition's controller writes (DESIGN37 §2.1, §2.4): the holder of the coordinator slot
of a partition's ``slot_key`` initializes the partition's state, elects its leader when the
leader is gone, and takes dead followers out of its in-sync replicas.

Pure, like ``statemachine.slots.plan_slots``: given what the controller knows (the states it
read, each with the store version it was read at, the replica assignment, the live brokers with
the log directory each registered, the topics' unclean-election settings) it returns the
conditional writes to make, and does nothing itself. A write names the version it read, so a
write decided on a stale read fails in the store; the controller then re-reads those keys and
decides again, never retrying blind. Deciding again on the same view gives the same writes, and
on the view those writes make, none: the rules are a fixed point, so a controller can re-decide on
every change it sees.

The rules, which keep a record the high watermark covered on every replica that may lead:

* **Eligible** replicas may lead: live, and registered with the log directory their ISR entry
  names. A broker back with a new or wiped directory (a new directory id) is not the replica the
  entry vouched for, so it is never elected from the ISR (KIP-966): its leader joins it to the
  ISR again once it has caught up.
* **Election** (the leader is dead, registered with another directory, or there is none): the
  first eligible ISR member in assignment order (the first replica is the preferred leader), a new
  leader epoch, and the ISR less its ineligible members. With none eligible, the partition gets
  no leader under a new epoch and **keeps its ISR**, so the last members to have every record are
  electable when they come back on the same disk; the last ISR member is never removed. Only with
  the topic's ``unclean.leader.election.enable`` may a live replica outside the ISR lead, and its
  ISR is then itself alone: records may be lost, which is why it is off by default.
* **A dead follower** leaves the ISR under the same leader epoch, so that acks=all produces stop
  waiting for it when its session ends rather than after the leader's ``replica_lag``.
* **A new partition** starts with its live replicas in sync, the first live one leading, epoch 0.
"""

from __future__ import annotations

import uuid
from collections.abc import Collection, Mapping, Sequence

import attrs

from protocol.errors import IllegalInput
from protocol.types import TopicId
from statemachine.partition_state import (
    NO_LEADER,
    IsrEntry,
    PartitionKey,
    PartitionState,
    StateWrite,
    slot_key,
)
from statemachine.slots import slot_of

__all__ = ["ControlView", "controlled_by", "decide", "decide_partition", "eligible"]


@attrs.frozen(kw_only=True)
class ControlView:
    """What a controller knows when it decides: every partition of its slot it should control
    with its replica assignment (a partition of another slot is ignored), the states it read, the
    live brokers with their registered log directories, and the topics whose unclean election is
    enabled."""

    slot: int
    slots: int
    #: Each partition's replicas, the preferred leader first.
    replicas: Mapping[PartitionKey, Sequence[int]]
    #: Absent: the partition has no state yet.
    states: Mapping[PartitionKey, PartitionState]
    #: Broker id -> the log directory it registered.
    live: Mapping[int, uuid.UUID]
    unclean: Collection[TopicId] = frozenset()


def controlled_by(key: PartitionKey, slot: int, slots: int) -> bool:
    """Whether the holder of ``slot`` controls the partition."""
    return slot_of(slot_key(key), slots) == slot


def eligible(state: PartitionState, broker_id: int, live: Mapping[int, uuid.UUID]) -> bool:
    """Whether ``broker_id`` may be elected from ``state``'s ISR: a member, live, registered with
    the log directory its entry names."""
    registered = live.get(broker_id)
    return registered is not None and IsrEntry(broker_id=broker_id, log_dir=registered) in state.isr


def decide(view: ControlView) -> tuple[StateWrite, ...]:
    """The writes the controller of ``view.slot`` makes, by partition key; a partition of another
    slot gets none. Raises :class:`IllegalInput` (nothing decided) for an assignment that is
    empty or names a broker twice."""
    writes: list[StateWrite] = []
    for key in sorted(view.replicas):
        if not controlled_by(key, view.slot, view.slots):
            continue
        write = decide_partition(
            key,
            view.replicas[key],
            view.states.get(key),
            view.live,
            unclean=key.topic_id in view.unclean,
        )
        if write is not None:
            writes.append(write)
    return tuple(writes)


def decide_partition(
    key: PartitionKey,
    replicas: Sequence[int],
    state: PartitionState | None,
    live: Mapping[int, uuid.UUID],
    *,
    unclean: bool = False,
) -> StateWrite | None:
    """The write one partition needs, or None. Raises :class:`IllegalInput` for an assignment
    that is empty or names a broker twice."""
    if not replicas or len(set(replicas)) != len(replicas):
        raise IllegalInput(f"{key}: a replica assignment names each broker once: {replicas!r}")
    if state is None:
        return _first_state(key, replicas, live)
    leader = state.leader
    if leader != NO_LEADER and eligible(state, leader, live):
        return _without_dead_followers(key, state, live)
    return _election(key, replicas, state, live, unclean=unclean)


def _first_state(
    key: PartitionKey, replicas: Sequence[int], live: Mapping[int, uuid.UUID]
) -> StateWrite | None:
    """A new partition: its live replicas in sync, the first leading. With none live it waits,
    since an empty ISR could never elect anybody."""
    isr = tuple(IsrEntry(broker_id=b, log_dir=live[b]) for b in replicas if b in live)
    if not isr:
        return None
    first = PartitionState(leader=isr[0].broker_id, leader_epoch=0, isr=isr, version=0)
    return StateWrite(key=key, state=first, expected_version=-1)


def _without_dead_followers(
    key: PartitionKey, state: PartitionState, live: Mapping[int, uuid.UUID]
) -> StateWrite | None:
    """A live leader keeps its epoch; followers that are dead or registered with another
    directory leave the ISR (the leader is eligible, so it stays: never the last one out)."""
    isr = tuple(entry for entry in state.isr if eligible(state, entry.broker_id, live))
    if isr == state.isr:
        return None
    return _write(key, state, leader=state.leader, epoch=state.leader_epoch, isr=isr)


def _election(
    key: PartitionKey,
    replicas: Sequence[int],
    state: PartitionState,
    live: Mapping[int, uuid.UUID],
    *,
    unclean: bool,
) -> StateWrite | None:
    """A new leader under a new epoch: the first eligible ISR member in assignment order; failing
    that, with ``unclean``, the first live replica with an ISR of itself alone; failing that, no
    leader, the ISR kept for the members' return (no write if that is the state already)."""
    epoch = state.leader_epoch + 1
    for broker in replicas:
        if eligible(state, broker, live):
            isr = tuple(entry for entry in state.isr if eligible(state, entry.broker_id, live))
            return _write(key, state, leader=broker, epoch=epoch, isr=isr)
    if unclean:
        for broker in replicas:
            if broker in live:
                alone = (IsrEntry(broker_id=broker, log_dir=live[broker]),)
                return _write(key, state, leader=broker, epoch=epoch, isr=alone)
    if state.leader == NO_LEADER:
        return None
    return _write(key, state, leader=NO_LEADER, epoch=epoch, isr=state.isr)


def _write(
    key: PartitionKey,
    read: PartitionState,
    *,
    leader: int,
    epoch: int,
    isr: tuple[IsrEntry, ...],
) -> StateWrite:
    """The write of a new state over ``read``, done only if the node is still at ``read``'s
    version; the state carries the version it will have."""
    state = PartitionState(leader=leader, leader_epoch=epoch, isr=isr, version=read.version + 1)
    return StateWrite(key=key, state=state, expected_version=read.version)
