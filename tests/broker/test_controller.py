"""A slot's controller of replicated partitions (broker/controller.py) against a store that
answers as told: a write that lost its race is read again and decided again, never retried
blind; a store that fails is tried again on the next change or a second later. And what
CreateTopic and ClusterMetadata make of replication (broker/dispatch.py), on the embedded
store. Virtual time."""

from __future__ import annotations

import random
import uuid
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import cast

import attrs
import pytest
import trio
import trio.testing

from broker import dispatch
from broker.controller import RETRY_INTERVAL, ControlInputs, control_slot
from coordinator.limits import RequestLimits
from protocol import ClusterMetadataRequest, CreateTopicRequest, ErrorCode
from protocol.types import BrokerInfo
from statemachine.partition_control import controlled_by
from statemachine.partition_state import (
    NO_EPOCH,
    NO_LEADER,
    IsrEntry,
    PartitionKey,
    PartitionState,
    StateWrite,
)
from store import StoreUnavailable, TopicPlacement, open_embedded_store
from store.interface import ReplicationStore

DIRS = {b: uuid.uuid4() for b in (1, 2, 3)}
TOPIC = TopicPlacement.of(topic="orders", assignment=((1, 2, 3),), topic_id=uuid.uuid4())
KEY = PartitionKey(topic_id=TOPIC.topic_id, partition=0)


def state(leader: int, epoch: int, isr: Sequence[int], version: int) -> PartitionState:
    entries = tuple(IsrEntry(broker_id=b, log_dir=DIRS[b]) for b in isr)
    return PartitionState(leader=leader, leader_epoch=epoch, isr=entries, version=version)


@attrs.define
class Store:
    """States by key, written only at the version named; ``fail`` writes raise first."""

    states: dict[PartitionKey, PartitionState] = attrs.Factory(dict)
    writes: list[tuple[int | None, tuple[StateWrite, ...]]] = attrs.Factory(list)
    fail: int = 0

    async def write_partition_states(
        self, epoch: int | None, writes: Sequence[StateWrite]
    ) -> tuple[PartitionKey, ...]:
        self.writes.append((epoch, tuple(writes)))
        if self.fail:
            self.fail -= 1
            raise StoreUnavailable("connection lost")
        lost = []
        for write in writes:
            held = self.states.get(write.key)
            if (-1 if held is None else held.version) != write.expected_version:
                lost.append(write.key)
            else:
                self.states[write.key] = write.state
        return tuple(lost)

    async def read_partition_states(
        self, keys: Iterable[PartitionKey]
    ) -> Mapping[PartitionKey, PartitionState]:
        return {key: self.states[key] for key in keys if key in self.states}


def inputs_of(states: Mapping[PartitionKey, PartitionState], *live: int) -> ControlInputs:
    inputs = ControlInputs(slots=1)
    inputs.set_topics({"orders": TOPIC})
    inputs.set_live({b: DIRS[b] for b in live})
    inputs.learn(states)
    return inputs


async def run_until(store: Store, inputs: ControlInputs, done: object) -> None:
    async with trio.open_nursery() as nursery:
        nursery.start_soon(
            lambda: control_slot(cast(ReplicationStore, store), inputs, slot=0, epoch=7)
        )
        with trio.fail_after(10):
            await inputs.changes.wait_value(lambda _: inputs.states.get(KEY) == done)
        await trio.testing.wait_all_tasks_blocked()
        nursery.cancel_scope.cancel()


async def test_a_lost_race_is_read_again_and_decided_again() -> None:
    # The controller read the state at version 0 (broker 1 leading); another writer has since
    # taken broker 3 out of the ISR (version 1). Broker 1 goes: the election decided on
    # version 0 loses, the controller reads version 1 and elects from it.
    store = Store(states={KEY: state(2, 0, (2, 1), 1)})
    inputs = inputs_of({KEY: state(1, 0, (1, 2, 3), 0)}, 2, 3)
    await run_until(store, inputs, state(2, 0, (2,), 2))
    assert [[(w.expected_version, w.state) for w in ws] for _, ws in store.writes] == [
        [(0, state(2, 1, (2, 3), 1))],
        [(1, state(2, 0, (2,), 2))],  # broker 2 leads already: broker 1 leaves its ISR
    ]
    assert {epoch for epoch, _ in store.writes} == {7}
    assert store.states[KEY] == inputs.states[KEY]


async def test_a_failed_store_is_tried_again_a_second_later(
    autojump_clock: trio.testing.MockClock,
) -> None:
    store = Store(fail=2)
    inputs = inputs_of({}, 1, 2, 3)
    start = trio.current_time()
    await run_until(store, inputs, state(1, 0, (1, 2, 3), 0))
    assert trio.current_time() - start == pytest.approx(2 * RETRY_INTERVAL)
    assert len(store.writes) == 3


async def test_each_slot_controls_its_share_and_factor_1_topics_nobody() -> None:
    inputs = ControlInputs(slots=50)
    single = TopicPlacement(topic="t", brokers=(1, 2), topic_id=uuid.uuid4())
    many = TopicPlacement.of(
        topic="m", assignment=tuple((1, 2) for _ in range(200)), topic_id=uuid.uuid4()
    )
    inputs.set_topics({"t": single, "orders": TOPIC, "m": many})
    shares = {slot: set(keys) for slot, keys in inputs.by_slot.items()}
    assert sum(len(keys) for keys in shares.values()) == 201
    assert set().union(*shares.values()) == {
        KEY,
        *(PartitionKey(topic_id=many.topic_id, partition=p) for p in range(200)),
    }
    for slot, keys in shares.items():
        assert all(controlled_by(key, slot, 50) for key in keys)


async def test_create_topic_counts_replicas_against_the_per_broker_limit(
    tmp_path: Path,
) -> None:
    limits = RequestLimits(max_partitions_per_broker=3)
    async with open_embedded_store(tmp_path) as store:
        for broker_id in (1, 2, 3):
            await store.register_broker(BrokerInfo(broker_id=broker_id, host="h", port=broker_id))
        # Four partitions: at most two a broker at factor 1, four replicas each at factor 3.
        request = CreateTopicRequest(topic="t", partitions=4, replication_factor=3)
        error = await dispatch.create_topic(store, request, limits, random.Random(0))
        assert error is ErrorCode.POLICY_VIOLATION
        # Within the limit, the embedded store refuses what it cannot replicate.
        request = CreateTopicRequest(topic="t", partitions=3, replication_factor=3)
        error = await dispatch.create_topic(store, request, limits, random.Random(0))
        assert error is ErrorCode.INVALID_REPLICATION_FACTOR
        single = CreateTopicRequest(topic="t", partitions=4, replication_factor=1)
        assert await dispatch.create_topic(store, single, limits) is ErrorCode.NONE


async def test_a_replicated_partition_without_a_state_has_no_leader() -> None:
    other = PartitionKey(topic_id=TOPIC.topic_id, partition=1)
    topic = TOPIC.with_partitions(((2, 3, 1),))
    answer = await dispatch.cluster_metadata(
        ClusterMetadataRequest(topics=("orders",), group_id=None),
        topics={"orders": topic},
        brokers=(),
        coordinator_id=-1,
        coordinator_epoch=-1,
        limits=RequestLimits(),
        states={other: state(3, 4, (3, 1), 9)},
    )
    [described], [replicas] = answer.topics, answer.replicas
    assert [(p.partition, p.broker_id) for p in described.partitions] == [(0, NO_LEADER), (1, 3)]
    assert [(r.leader_epoch, r.replicas, r.isr) for r in replicas.partitions] == [
        (NO_EPOCH, (1, 2, 3), ()),
        (4, (2, 3, 1), (3, 1)),
    ]
