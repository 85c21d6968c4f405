"""The metadata store contract, which every kind of store passes (see ``conftest.STORE_KINDS``).

Nothing here depends on how a store keeps its data: only on the interface and on what survives
closing a store and opening it again on the same backing state.
"""

from __future__ import annotations

import itertools
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import AbstractAsyncContextManager, aclosing, asynccontextmanager
from typing import Any

import attrs
import pytest
import trio

from protocol.topic_configs import InvalidTopicConfig
from protocol.types import (
    NO_TOPIC_ID,
    BrokerInfo,
    ConsumerThread,
    Subscription,
    TopicId,
    TopicPartition,
    TopicStreams,
)
from statemachine.partition_state import (
    IsrEntry,
    PartitionKey,
    PartitionState,
    StateWrite,
    sole_replica_state,
)
from store import (
    Deposed,
    GroupRecord,
    InvalidPartitions,
    InvalidReplicationFactor,
    MemberRecord,
    MetadataStore,
    OffsetBatch,
    StoreUnavailable,
    TopicExists,
    TopicPlacement,
    UnknownTopic,
    codec,
)

StoreOpener = Callable[[], AbstractAsyncContextManager[MetadataStore]]

# A guard against a watch that never fires; real-clock stores (ZooKeeper) need some slack.
WATCH_DEADLINE = 10


def tp(topic: str, partition: int) -> TopicPartition:
    return TopicPartition(topic=topic, partition=partition)


def member(member_id: str, subscription: Subscription) -> MemberRecord:
    return MemberRecord(
        member_id=member_id,
        client_id=f"client-{member_id}",
        subscription=subscription,
        session_timeout_ms=6000,
        auto_commit=True,
        auto_offset_reset="smallest",
    )


def sample_group(group_id: str = "billing", generation: int = 3) -> GroupRecord:
    """Members on a named topic, a whitelist and a blacklist; an assignment over two topics."""
    named = Subscription(topics=(TopicStreams(topic="orders", streams=2),))
    whitelist = Subscription(pattern=r"logs\..*", pattern_streams=3)
    blacklist = Subscription(
        topics=(TopicStreams(topic="orders", streams=1),),
        pattern=r"internal\..*",
        pattern_is_blacklist=True,
        pattern_streams=2,
    )
    return GroupRecord(
        group_id=group_id,
        generation=generation,
        members=(member("m1", named), member("m2", whitelist), member("m3", blacklist)),
        assignment={
            tp("orders", 0): ConsumerThread(member_id="m1", index=0),
            tp("orders", 1): ConsumerThread(member_id="m1", index=1),
            tp("orders", 2): ConsumerThread(member_id="m3", index=0),
            tp("logs.web", 0): ConsumerThread(member_id="m2", index=2),
        },
    )


def batch(group_id: str, generation: int, **offsets: int) -> OffsetBatch:
    """Offsets given as ``topic_partition=offset``, e.g. ``orders_0=17``."""
    parsed = {}
    for key, offset in offsets.items():
        topic, _, partition = key.rpartition("_")
        parsed[tp(topic, int(partition))] = offset
    return OffsetBatch(group_id=group_id, generation=generation, offsets=parsed)


async def everything(store: MetadataStore, *group_ids: str) -> dict[str, Any]:
    """The store's persistent state as plain comparable values."""
    return {
        "topics": dict(await store.topics()),
        "groups": dict(await store.groups()),
        "offsets": {g: dict(await store.fetch_offsets(g)) for g in group_ids},
    }


# Brokers


async def test_brokers_are_listed_by_id(store: MetadataStore) -> None:
    for broker_id in (3, 1, 2):
        await store.register_broker(BrokerInfo(broker_id=broker_id, host="127.0.0.1", port=9090))
    assert [b.broker_id for b in await store.brokers()] == [1, 2, 3]


async def test_registering_a_broker_again_replaces_it(store: MetadataStore) -> None:
    await store.register_broker(BrokerInfo(broker_id=1, host="127.0.0.1", port=9092))
    await store.register_broker(BrokerInfo(broker_id=1, host="127.0.0.1", port=9093))
    assert await store.brokers() == (BrokerInfo(broker_id=1, host="127.0.0.1", port=9093),)


async def test_broker_registrations_end_with_the_store(store_factory: StoreOpener) -> None:
    async with store_factory() as store:
        await store.register_broker(BrokerInfo(broker_id=1, host="127.0.0.1", port=9092))
    async with store_factory() as store:
        assert await store.brokers() == ()


# Topics


async def test_create_topic_places_its_partitions(store: MetadataStore) -> None:
    placement = await store.create_topic("orders", (1, 2, 1))
    assert placement == TopicPlacement(
        topic="orders", brokers=(1, 2, 1), topic_id=placement.topic_id
    )
    assert placement.topic_id.version == 4  # a random uuid, never NO_TOPIC_ID
    assert placement.partition_count == 3
    assert await store.topics() == {"orders": placement}


async def test_creating_an_existing_topic_changes_nothing(store: MetadataStore) -> None:
    placement = await store.create_topic("orders", (1,))
    with pytest.raises(TopicExists):
        await store.create_topic("orders", (2, 2))
    assert await store.topics() == {"orders": placement}


async def test_a_topic_needs_a_partition(store: MetadataStore) -> None:
    with pytest.raises(InvalidPartitions):
        await store.create_topic("orders", ())
    assert await store.topics() == {}


async def test_add_partitions_appends_them(store: MetadataStore) -> None:
    created = await store.create_topic("orders", (1, 2))
    placement = await store.add_partitions("orders", (3, 1))
    assert placement == TopicPlacement(
        topic="orders", brokers=(1, 2, 3, 1), topic_id=created.topic_id
    )
    assert (await store.topics())["orders"] == placement


async def test_add_partitions_to_an_unknown_topic(store: MetadataStore) -> None:
    with pytest.raises(UnknownTopic):
        await store.add_partitions("orders", (1,))
    assert await store.topics() == {}


async def test_adding_no_partitions_changes_nothing(store: MetadataStore) -> None:
    await store.create_topic("orders", (1,))
    with pytest.raises(InvalidPartitions):
        await store.add_partitions("orders", ())
    assert (await store.topics())["orders"].partition_count == 1


async def test_topics_survive_a_reopen(store_factory: StoreOpener) -> None:
    async with store_factory() as store:
        orders = await store.create_topic("orders", (1, 2))
        await store.add_partitions("orders", (3,))
        logs = await store.create_topic("logs.web", (2,))
    async with store_factory() as store:
        assert await store.topics() == {
            "orders": TopicPlacement(topic="orders", brokers=(1, 2, 3), topic_id=orders.topic_id),
            "logs.web": logs,
        }


async def test_a_topic_keeps_its_settings_across_a_reopen_and_until_deleted(
    store_factory: StoreOpener,
) -> None:
    """The settings are the incarnation's: kept by a reopen and by added partitions, and gone
    with a delete (the name created again has none)."""
    settings = (("retention.ms", "60000"), ("segment.bytes", "1048576"))
    async with store_factory() as store:
        created = await store.create_topic("orders", (1, 2), (settings[1], settings[0]))
        assert created.configs == settings  # sorted by name
        await store.add_partitions("orders", (3,))
        plain = await store.create_topic("logs", (1,))
        assert plain.configs == ()
    async with store_factory() as store:
        topics = await store.topics()
        assert topics["orders"] == attrs.evolve(created, brokers=(1, 2, 3))
        assert topics["logs"] == plain
        await store.delete_topic("orders")
        again = await store.create_topic("orders", (1,), (("retention.bytes", "-1"),))
        assert again.configs == (("retention.bytes", "-1"),)
        await store.delete_topic("orders")
        assert (await store.create_topic("orders", (1,))).configs == ()
    async with store_factory() as store:
        assert (await store.topics())["orders"].configs == ()


async def test_a_topic_with_a_wrong_setting_is_not_created(store: MetadataStore) -> None:
    with pytest.raises(InvalidTopicConfig, match=r"unknown topic setting 'cleanup\.policy'"):
        await store.create_topic("orders", (1,), (("cleanup.policy", "compact"),))
    assert "orders" not in await store.topics()


async def test_deleting_a_topic_drops_it_and_every_groups_offsets_for_it(
    store_factory: StoreOpener,
) -> None:
    async with store_factory() as store:
        epoch = await store.take_office(1)
        await store.create_topic("orders", (1, 2))
        logs = await store.create_topic("logs", (1,))
        await store.write_group(epoch, sample_group("billing"))
        await store.commit_offsets(
            epoch,
            [
                batch("billing", 3, orders_0=17, orders_1=4, logs_0=5),
                batch("standalone", -1, orders_1=8),  # offsets with no group record
            ],
        )
        await store.delete_topic("orders")
        assert await store.topics() == {"logs": logs}
        assert await store.fetch_offsets("billing") == {tp("logs", 0): 5}
        assert await store.fetch_offsets("standalone") == {}
    async with store_factory() as store:
        assert await everything(store, "billing", "standalone") == {
            "topics": {"logs": logs},
            "groups": {"billing": sample_group("billing")},  # records are the coordinator's
            "offsets": {"billing": {tp("logs", 0): 5}, "standalone": {}},
        }
        # Created again under the name, the topic starts with no offsets.
        await store.create_topic("orders", (2,))
        assert await store.fetch_offsets("billing") == {tp("logs", 0): 5}


async def test_deleting_an_unknown_topic(store: MetadataStore) -> None:
    await store.create_topic("logs", (1,))
    with pytest.raises(UnknownTopic):
        await store.delete_topic("orders")
    await store.delete_topic("logs")
    with pytest.raises(UnknownTopic):
        await store.delete_topic("logs")
    assert await store.topics() == {}


async def test_deleting_one_groups_offsets_for_a_topic(store: MetadataStore) -> None:
    epoch = await store.take_office(1)
    await store.commit_offsets(
        epoch,
        [batch("billing", 3, orders_0=17, logs_0=5), batch("audit", 1, orders_0=2)],
    )
    await store.delete_offsets(epoch, "billing", "orders")
    await store.delete_offsets(epoch, "billing", "orders")  # none left: not an error
    await store.delete_offsets(epoch, "never-existed", "orders")
    assert await store.fetch_offsets("billing") == {tp("logs", 0): 5}
    assert await store.fetch_offsets("audit") == {tp("orders", 0): 2}
    # A deposed epoch changes nothing.
    await store.take_office(2)
    with pytest.raises(Deposed):
        await store.delete_offsets(epoch, "audit", "orders")
    assert await store.fetch_offsets("audit") == {tp("orders", 0): 2}
    # The group commits for the topic again (a topic created again under the name).
    await store.delete_offsets(epoch := await store.take_office(3), "billing", "logs")
    await store.commit_offsets(epoch, [batch("billing", 4, orders_0=1)])
    assert await store.fetch_offsets("billing") == {tp("orders", 0): 1}


# Topic ids (docs/design.md#topic-ids)


def by_id(group_id: str, generation: int, topic_id: TopicId, **offsets: int) -> OffsetBatch:
    """``batch``, its offsets read from the incarnation ``topic_id`` of every topic named."""
    plain = batch(group_id, generation, **offsets)
    return attrs.evolve(
        plain, topic_ids=dict.fromkeys({tp.topic for tp in plain.offsets}, topic_id)
    )


async def test_each_creation_gets_an_id_of_its_own_which_the_topic_keeps(
    store_factory: StoreOpener,
) -> None:
    async with store_factory() as store:
        orders = await store.create_topic("orders", (1,))
        logs = await store.create_topic("logs", (1,))
        assert orders.topic_id.version == logs.topic_id.version == 4
        assert orders.topic_id != logs.topic_id
        assert (await store.add_partitions("orders", (2,))).topic_id == orders.topic_id
    async with store_factory() as store:
        topics = await store.topics()
        assert topics["orders"].topic_id == orders.topic_id
        assert topics["logs"].topic_id == logs.topic_id
        await store.delete_topic("orders")
        again = await store.create_topic("orders", (1,))
        assert again.topic_id not in (orders.topic_id, logs.topic_id, NO_TOPIC_ID)
        assert (await store.topics())["orders"] == again


async def test_a_topic_created_again_sees_no_offset_of_the_one_deleted(
    store_factory: StoreOpener,
) -> None:
    """Not the offsets committed before the delete, nor those committed by name between the
    delete and the re-create, nor those its coordinator commits afterwards for the incarnation it
    read them from; those committed for the new incarnation, or by name, are the new one's."""
    async with store_factory() as store:
        epoch = await store.take_office(1)
        old = await store.create_topic("orders", (1, 1))
        await store.commit_offsets(epoch, [by_id("billing", 1, old.topic_id, orders_0=10)])
        assert await store.fetch_offsets("billing") == {tp("orders", 0): 10}
        await store.delete_topic("orders")
        # By name while no topic has the name: kept, and read back, until one is created.
        await store.commit_offsets(epoch, [batch("standalone", -1, orders_1=7)])
        assert await store.fetch_offsets("standalone") == {tp("orders", 1): 7}
        assert await store.offset_only_groups() == {"standalone"}
        # For the deleted incarnation: dropped.
        await store.commit_offsets(epoch, [by_id("billing", 1, old.topic_id, orders_0=11)])
        assert await store.fetch_offsets("billing") == {}

        new = await store.create_topic("orders", (1, 1))
        assert await store.fetch_offsets("standalone") == {}
        assert await store.offset_only_groups() == frozenset()
        await store.commit_offsets(
            epoch,
            [
                by_id("billing", 1, old.topic_id, orders_0=12, orders_1=12),  # a late commit
                by_id("audit", 2, new.topic_id, orders_0=1),
                batch("reset", -1, orders_1=3),  # by name: the incarnation in force
            ],
        )
        assert await store.fetch_offsets("billing") == {}
        assert await store.fetch_offsets("audit") == {tp("orders", 0): 1}
        assert await store.fetch_offsets("reset") == {tp("orders", 1): 3}
        assert await store.offset_only_groups() == {"audit", "reset"}
        # A group's offsets of the old incarnation give way to the new one's.
        await store.commit_offsets(epoch, [by_id("standalone", -1, new.topic_id, orders_0=2)])
        assert await store.fetch_offsets("standalone") == {tp("orders", 0): 2}
    async with store_factory() as store:
        assert await store.fetch_offsets("billing") == {}
        assert await store.fetch_offsets("audit") == {tp("orders", 0): 1}
        assert await store.fetch_offsets("standalone") == {tp("orders", 0): 2}
        assert await store.offset_only_groups() == {"audit", "reset", "standalone"}


async def test_offsets_named_for_a_topic_that_does_not_exist_are_dropped(
    store: MetadataStore,
) -> None:
    epoch = await store.take_office(1)
    orders = await store.create_topic("orders", (1,))
    await store.commit_offsets(
        epoch,
        [
            by_id("billing", 1, orders.topic_id, logs_0=4),
            by_id("billing", 1, NO_TOPIC_ID, logs_1=5),
        ],
    )
    # NO_TOPIC_ID names no incarnation: "any", as by name.
    assert await store.fetch_offsets("billing") == {tp("logs", 1): 5}


@asynccontextmanager
async def two_handles(store_factory: StoreOpener) -> AsyncIterator[tuple[MetadataStore, ...]]:
    """Two handles on one backing state (ZooKeeper: two sessions); a store that holds its state
    alone (the embedded one, which locks its directory) is raced through one handle."""
    async with store_factory() as first:
        try:
            async with store_factory() as second:
                yield first, second
                return
        except StoreUnavailable:
            pass
        yield first, first


async def outcome(call: Awaitable[object]) -> str:
    try:
        await call
    except (TopicExists, UnknownTopic) as exc:
        return type(exc).__name__
    return "ok"


def sequential(order: Sequence[str], exists: bool) -> tuple[dict[str, str], bool]:
    """What ``order`` of deletes and creates answers, one after another, from ``exists``."""
    answers = {}
    for call in order:
        if call.startswith("delete"):
            answers[call] = "ok" if exists else "UnknownTopic"
            exists = False
        else:
            answers[call] = "TopicExists" if exists else "ok"
            exists = True
    return answers, exists


async def test_racing_deletes_and_a_create_of_one_name_are_linearizable(
    store_factory: StoreOpener,
) -> None:
    """A delete, a create and a delete of one name at once, from two handles: their answers and
    the topic left are those of some order of the three, so two deletes never both succeed on one
    incarnation, and a topic left has an id, the one its creation answered."""
    seen = set()
    async with two_handles(store_factory) as (first, second):
        for _round in range(12):
            before = await first.create_topic("orders", (1,))
            answers, created = await race(first, second)
            left = await first.topics()
            possible = [sequential(order, True) for order in itertools.permutations(answers)]
            assert (answers, "orders" in left) in possible, answers
            if "orders" in left:
                expected = created[0] if created else before
                assert left["orders"] == expected
                assert (await second.topics())["orders"] == expected
                await first.delete_topic("orders")
            seen.add(tuple(sorted(answers.items())))
    print(f"outcomes seen: {sorted(seen)}")


async def race(
    first: MetadataStore, second: MetadataStore
) -> tuple[dict[str, str], list[TopicPlacement]]:
    """A delete of "orders" on each handle and a create on the second, at once: their answers,
    and what the create returned if it succeeded."""
    answers: dict[str, str] = {}
    created: list[TopicPlacement] = []

    async def run(name: str, call: Callable[[], Awaitable[object]]) -> None:
        answers[name] = await outcome(call())

    async def create() -> None:
        created.append(await second.create_topic("orders", (2,)))

    with trio.fail_after(WATCH_DEADLINE):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(run, "delete-1", lambda: first.delete_topic("orders"))
            nursery.start_soon(run, "create", create)
            nursery.start_soon(run, "delete-2", lambda: second.delete_topic("orders"))
    return answers, created


# Replication (docs/design.md#metadata-layout): what both stores agree on; the ZooKeeper store's
# replicated partitions are in tests/zookeeper/test_partition_states.py, the embedded store's
# refusal of them in tests/store/test_embedded.py.


async def test_a_broker_registers_its_log_directory(store: MetadataStore) -> None:
    """A broker's log directory is its registration's: a new one (a wiped disk) replaces it,
    one registered without names none."""
    first, wiped, other = uuid.uuid4(), uuid.uuid4(), uuid.uuid4()
    await store.register_broker(BrokerInfo(broker_id=1, host="127.0.0.1", port=9092), log_dir=first)
    await store.register_broker(BrokerInfo(broker_id=2, host="127.0.0.1", port=9093))
    await store.register_broker(BrokerInfo(broker_id=3, host="127.0.0.1", port=9094), log_dir=other)
    assert await store.broker_dirs() == {1: first, 3: other}
    await store.register_broker(BrokerInfo(broker_id=1, host="127.0.0.1", port=9092), log_dir=wiped)
    await store.register_broker(BrokerInfo(broker_id=3, host="127.0.0.1", port=9094))
    assert await store.broker_dirs() == {1: wiped}
    assert [b.broker_id for b in await store.brokers()] == [1, 2, 3]


async def test_a_topic_of_one_replica_is_placed_as_it_always_was(store: MetadataStore) -> None:
    placement = await store.create_topic("orders", (1, 2, 1))
    assert placement.replicas == ((1,), (2,), (1,))
    assert placement.replication_factor == 1
    # One-replica lists are the same placement as bare brokers.
    assert await store.create_topic("logs", ((2,), (1,))) == TopicPlacement(
        topic="logs", brokers=(2, 1), topic_id=(await store.topics())["logs"].topic_id
    )
    added = await store.add_partitions("orders", ((2,),))
    assert added.brokers == (1, 2, 1, 2)
    assert added.replicas == ((1,), (2,), (1,), (2,))


async def test_partitions_are_added_with_the_topics_replication_factor(
    store: MetadataStore,
) -> None:
    placement = await store.create_topic("orders", (1, 2))
    with pytest.raises(InvalidReplicationFactor, match="has replication factor 1"):
        await store.add_partitions("orders", ((1, 2),))
    assert await store.topics() == {"orders": placement}


async def test_a_partition_of_one_replica_is_led_by_its_broker(store: MetadataStore) -> None:
    """Nobody elects or writes it: a store holds no state for it, or the one that says so."""
    log_dir = uuid.uuid4()
    broker = BrokerInfo(broker_id=2, host="127.0.0.1", port=9092)
    await store.register_broker(broker, log_dir=log_dir)
    placement = await store.create_topic("orders", (2, 2))
    keys = [PartitionKey(topic_id=placement.topic_id, partition=p) for p in (0, 1)]
    for states in (await store.partition_states(), await store.read_partition_states(keys)):
        assert states.keys() <= set(keys)
        for state in states.values():
            assert state == sole_replica_state(2, log_dir)


async def test_states_of_partitions_nobody_wrote_are_absent(store: MetadataStore) -> None:
    nobody = PartitionKey(topic_id=uuid.uuid4(), partition=0)
    assert await store.read_partition_states([nobody]) == {}
    assert nobody not in await store.partition_states()


def a_state_write(expected_version: int = -1) -> StateWrite:
    return StateWrite(
        key=PartitionKey(topic_id=uuid.uuid4(), partition=0),
        state=PartitionState(
            leader=1,
            leader_epoch=0,
            isr=(IsrEntry(broker_id=1, log_dir=uuid.uuid4()),),
        ),
        expected_version=expected_version,
    )


async def test_a_controllers_state_writes_are_fenced_by_its_epoch(store: MetadataStore) -> None:
    """A controller writes under its slot's epoch, as a coordinator writes groups: one that
    holds no office, or a deposed one, writes nothing."""
    write = a_state_write()
    for epoch in (0, 1, -1):
        with pytest.raises(Deposed):
            await store.write_partition_states(epoch, [write])
    old = await store.take_office(1)
    assert await store.write_partition_states(old, []) == ()
    new = await store.take_office(2)
    with pytest.raises(Deposed):
        await store.write_partition_states(old, [write])
    with pytest.raises(Deposed):
        await store.write_partition_states(new + 1, [write])
    assert await store.read_partition_states([write.key]) == {}
    assert await store.write_partition_states(new, []) == ()


async def test_a_closed_store_ends_its_partition_state_watch(store_factory: StoreOpener) -> None:
    async with store_factory() as store:
        updates = store.partition_state_updates()
        with trio.fail_after(WATCH_DEADLINE):
            assert await anext(updates) == {}
    with trio.fail_after(WATCH_DEADLINE), pytest.raises(StoreUnavailable):
        await anext(updates)
    await updates.aclose()


async def test_replication_settings_are_checked_against_the_replication_factor(
    store: MetadataStore,
) -> None:
    with pytest.raises(InvalidTopicConfig, match=r"between 1 and the replication factor 1"):
        await store.create_topic("orders", (1,), (("min.insync.replicas", "2"),))
    with pytest.raises(InvalidTopicConfig, match=r"must be true or false"):
        await store.create_topic("orders", (1,), (("unclean.leader.election.enable", "yes"),))
    assert await store.topics() == {}
    created = await store.create_topic(
        "orders", (1,), (("unclean.leader.election.enable", "TRUE"), ("min.insync.replicas", "1"))
    )
    assert created.configs == (
        ("min.insync.replicas", "1"),
        ("unclean.leader.election.enable", "true"),
    )
    assert (await store.topics())["orders"].configs == created.configs


# Topic watch


async def test_topic_updates_yield_the_current_topics_at_once(store: MetadataStore) -> None:
    placement = await store.create_topic("orders", (1,))
    with trio.fail_after(WATCH_DEADLINE):
        async with aclosing(store.topic_updates()) as updates:
            assert await anext(updates) == {"orders": placement}


async def test_topic_updates_wake_a_waiting_reader(store: MetadataStore) -> None:
    seen: list[dict[str, TopicPlacement]] = []

    async def watch(task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        async with aclosing(store.topic_updates()) as updates:
            async for topics in updates:
                seen.append(dict(topics))
                if not topics:
                    task_status.started()
                if "orders" in topics:
                    return

    with trio.fail_after(WATCH_DEADLINE):
        async with trio.open_nursery() as nursery:
            await nursery.start(watch)
            placement = await store.create_topic("orders", (1,))
    assert seen == [{}, {"orders": placement}]


async def test_topic_updates_coalesce_a_burst_to_the_latest(store: MetadataStore) -> None:
    with trio.fail_after(WATCH_DEADLINE):
        async with aclosing(store.topic_updates()) as updates:
            assert await anext(updates) == {}
            await store.create_topic("a", (1,))
            await store.create_topic("b", (1,))
            await store.add_partitions("a", (2,))
            latest = await store.topics()
            # A slow reader may see an intermediate value first, but never an older one after a
            # newer, and it reaches the latest without reading every change.
            seen = [await anext(updates)]
            while seen[-1] != latest:
                seen.append(await anext(updates))
            assert len(seen) <= 3
            assert seen[-1] == latest


async def test_topic_updates_see_a_deleted_topic(store: MetadataStore) -> None:
    await store.create_topic("orders", (1,))
    await store.create_topic("logs", (1,))
    with trio.fail_after(WATCH_DEADLINE):
        async with aclosing(store.topic_updates()) as updates:
            assert set(await anext(updates)) == {"orders", "logs"}
            await store.delete_topic("orders")
            assert set(await anext(updates)) == {"logs"}


async def test_topic_updates_see_added_partitions(store: MetadataStore) -> None:
    await store.create_topic("orders", (1,))
    with trio.fail_after(WATCH_DEADLINE):
        async with aclosing(store.topic_updates()) as updates:
            await anext(updates)
            await store.add_partitions("orders", (2,))
            assert (await anext(updates))["orders"].brokers == (1, 2)


# Coordinator epoch


async def test_epochs_increase_strictly_across_reopens(store_factory: StoreOpener) -> None:
    epochs = []
    for _ in range(3):
        async with store_factory() as store:
            epochs.append(await store.take_office(1))
            epochs.append(await store.take_office(2))
    assert epochs == sorted(set(epochs))


async def test_the_coordinator_is_whoever_took_office(store: MetadataStore) -> None:
    assert await store.coordinator_id() is None
    await store.take_office(2)
    assert await store.coordinator_id() == 2
    await store.take_office(3)
    assert await store.coordinator_id() == 3


async def test_only_a_handle_in_office_is_in_contact(store_factory: StoreOpener) -> None:
    """A coordinator asks ``in_contact_until`` before every lease-renewing request: a handle that
    holds no office, or is closed, must never say yes."""
    async with store_factory() as store:
        assert store.in_contact_until() <= trio.current_time()
        await store.take_office(1)
        assert store.in_contact_until() > trio.current_time()
        assert store.in_contact_until() == store.in_contact_until()  # a query: nothing moves
    assert store.in_contact_until() <= trio.current_time()


async def test_writes_before_taking_office_are_fenced(store: MetadataStore) -> None:
    for epoch in (0, 1, -1):
        with pytest.raises(Deposed):
            await store.write_group(epoch, sample_group())
        with pytest.raises(Deposed):
            await store.commit_offsets(epoch, [batch("billing", 1, orders_0=5)])
        with pytest.raises(Deposed):
            await store.delete_group(epoch, "billing")
    assert await everything(store, "billing") == {
        "topics": {},
        "groups": {},
        "offsets": {"billing": {}},
    }


async def test_a_deposed_epoch_is_fenced_and_changes_nothing(store: MetadataStore) -> None:
    old = await store.take_office(1)
    await store.write_group(old, sample_group(generation=3))
    await store.commit_offsets(old, [batch("billing", 3, orders_0=5)])
    before = await everything(store, "billing")

    new = await store.take_office(2)
    with pytest.raises(Deposed):
        await store.write_group(old, sample_group(generation=4))
    with pytest.raises(Deposed):
        await store.commit_offsets(
            old, [batch("billing", 4, orders_0=9), batch("other", 4, orders_1=9)]
        )
    with pytest.raises(Deposed):
        await store.delete_group(old, "billing")
    with pytest.raises(Deposed):
        await store.write_group(new + 1, sample_group(generation=4))
    assert await everything(store, "billing", "other") == {
        **before,
        "offsets": {**before["offsets"], "other": {}},
    }

    await store.commit_offsets(new, [batch("billing", 4, orders_0=9)])
    assert await store.fetch_offsets("billing") == {tp("orders", 0): 9}


async def test_an_epoch_from_before_a_reopen_is_fenced(store_factory: StoreOpener) -> None:
    async with store_factory() as store:
        old = await store.take_office(1)
        await store.write_group(old, sample_group())
    async with store_factory() as store:
        with pytest.raises(Deposed):
            await store.commit_offsets(old, [batch("billing", 3, orders_0=1)])
        new = await store.take_office(1)
        with pytest.raises(Deposed):
            await store.delete_group(old, "billing")
        await store.delete_group(new, "billing")
        assert await store.groups() == {}


# Groups


async def test_a_group_round_trips_and_survives_a_reopen(store_factory: StoreOpener) -> None:
    group = sample_group()
    async with store_factory() as store:
        epoch = await store.take_office(1)
        await store.write_group(epoch, group)
        await store.write_group(
            epoch, GroupRecord(group_id="empty", generation=0, members=(), assignment={})
        )
        stored = (await store.groups())["billing"]
        assert stored == group
        assert stored.assignment == group.assignment
        assert stored.members[1].subscription.streams_for("logs.web") == 3
        assert stored.members[2].subscription.streams_for("internal.audit") == 0
        assert stored.members[2].subscription.streams_for("payments") == 2
    async with store_factory() as store:
        groups = await store.groups()
        assert groups["billing"] == group
        assert groups["empty"] == GroupRecord(
            group_id="empty", generation=0, members=(), assignment={}
        )


async def test_a_static_member_keeps_its_instance_id_through_updates_and_a_reopen(
    store_factory: StoreOpener,
) -> None:
    """A successor coordinator must know which members are static (docs/design.md#static-members):
    the instance id survives a whole record, an update that adds a static member, and a reopen."""
    named = Subscription(topics=(TopicStreams(topic="orders", streams=1),))
    static = attrs.evolve(member("s1", named), instance_id="s1")
    first = GroupRecord(
        group_id="billing",
        generation=1,
        members=(static,),
        assignment={tp("orders", 0): ConsumerThread(member_id="s1", index=0)},
    )
    second = GroupRecord(
        group_id="billing",
        generation=2,
        members=(static, attrs.evolve(member("s2", named), instance_id="s2"), member("d", named)),
        assignment={
            tp("orders", 0): ConsumerThread(member_id="s1", index=0),
            tp("orders", 1): ConsumerThread(member_id="s2", index=0),
        },
    )
    async with store_factory() as store:
        epoch = await store.take_office(1)
        await store.write_group(epoch, first)
        await store.write_group(epoch, second)
        assert (await store.groups())["billing"] == second
    async with store_factory() as store:
        stored = (await store.groups())["billing"]
        assert stored == second
        assert [m.instance_id for m in stored.members] == ["s1", "s2", None]


async def test_each_members_own_generation_round_trips(store_factory: StoreOpener) -> None:
    """Under the incremental protocol members of one group hold different generations; the
    record keeps each one (docs/design.md#adoption-after-a-failover)."""
    group = sample_group(generation=5)
    own = (5, 2, 4)
    group = attrs.evolve(
        group,
        members=tuple(
            attrs.evolve(m, generation=g) for m, g in zip(group.members, own, strict=True)
        ),
    )
    async with store_factory() as store:
        epoch = await store.take_office(1)
        await store.write_group(epoch, group)
        assert (await store.groups())["billing"] == group
    async with store_factory() as store:
        stored = (await store.groups())["billing"]
        assert tuple(m.generation for m in stored.members) == own


def test_a_member_record_written_before_members_had_their_own_generation_loads() -> None:
    encoded = codec.encode_member(sample_group().members[0])
    del encoded["generation"]
    assert codec.decode_member(encoded) == sample_group().members[0]
    assert codec.decode_member(encoded).generation == -1


async def test_writing_a_group_replaces_its_record(store: MetadataStore) -> None:
    epoch = await store.take_office(1)
    await store.write_group(epoch, sample_group(generation=3))
    smaller = GroupRecord(
        group_id="billing",
        generation=4,
        members=(sample_group().members[0],),
        assignment={tp("orders", 0): ConsumerThread(member_id="m1", index=0)},
    )
    await store.write_group(epoch, smaller)
    assert await store.groups() == {"billing": smaller}


def rebalances() -> list[GroupRecord]:
    """One group's records over a run of rebalances: members join, leave, come back with another
    subscription, change order; partitions move, leave the assignment, and a topic appears."""
    named = Subscription(topics=(TopicStreams(topic="orders", streams=1),))
    other = Subscription(topics=(TopicStreams(topic="orders", streams=2),))
    m1, m2, m3 = member("m1", named), member("m2", named), member("m3", named)
    m2_again = member("m2", other)

    def owners(*owners: tuple[str, int, str, int]) -> dict[TopicPartition, ConsumerThread]:
        return {tp(t, p): ConsumerThread(member_id=m, index=i) for t, p, m, i in owners}

    def record(generation: int, members: tuple[MemberRecord, ...], *rows: Any) -> GroupRecord:
        return GroupRecord(
            group_id="billing", generation=generation, members=members, assignment=owners(*rows)
        )

    return [
        record(1, (m1,), ("orders", 0, "m1", 0), ("orders", 1, "m1", 0)),
        record(2, (m1, m2), ("orders", 0, "m1", 0), ("orders", 1, "m2", 0)),
        record(3, (m1, m2, m3), ("orders", 0, "m1", 0), ("orders", 1, "m2", 0)),
        # m2 left and came back with two streams; a topic appeared; orders-1 moved
        record(
            4,
            (m1, m3, m2_again),
            ("orders", 0, "m1", 0),
            ("orders", 1, "m2", 1),
            ("logs", 0, "m3", 0),
        ),
        record(5, (m3, m2_again), ("orders", 1, "m2", 1), ("logs", 0, "m3", 0)),  # m1 left
        record(6, (m2_again, m3), ("logs", 0, "m2", 0)),  # reordered; orders unassigned
        record(6, (m2_again, m3), ("logs", 0, "m2", 0)),  # written again unchanged
        record(
            7,
            (),
        ),  # everyone left
        record(8, (m1,), ("orders", 0, "m1", 0)),
    ]


async def test_a_run_of_rebalances_reads_back_after_each_write_and_a_reopen(
    store_factory: StoreOpener,
) -> None:
    records = rebalances()
    async with store_factory() as store:
        epoch = await store.take_office(1)
        for record in records[:5]:
            await store.write_group(epoch, record)
            assert await store.groups() == {"billing": record}
    async with store_factory() as store:
        assert await store.groups() == {"billing": records[4]}
        epoch = await store.take_office(1)
        for record in records[5:]:
            await store.write_group(epoch, record)
            assert await store.groups() == {"billing": record}
        await store.delete_group(epoch, "billing")
        await store.write_group(epoch, records[3])  # after a delete: no previous record
    async with store_factory() as store:
        assert await store.groups() == {"billing": records[3]}


async def test_deleting_a_group(store: MetadataStore) -> None:
    epoch = await store.take_office(1)
    await store.write_group(epoch, sample_group("billing"))
    await store.write_group(epoch, sample_group("audit"))
    await store.delete_group(epoch, "billing")
    assert set(await store.groups()) == {"audit"}
    await store.delete_group(epoch, "billing")  # already gone: not an error
    await store.delete_group(epoch, "never-existed")
    assert set(await store.groups()) == {"audit"}


# Offsets


async def test_offsets_round_trip(store: MetadataStore) -> None:
    epoch = await store.take_office(1)
    assert await store.fetch_offsets("billing") == {}
    await store.commit_offsets(epoch, [batch("billing", 3, orders_0=17, orders_1=0, logs_2=5)])
    assert await store.fetch_offsets("billing") == {
        tp("orders", 0): 17,
        tp("orders", 1): 0,
        tp("logs", 2): 5,
    }
    await store.commit_offsets(epoch, [batch("billing", 4, orders_1=40)])
    assert await store.fetch_offsets("billing") == {
        tp("orders", 0): 17,
        tp("orders", 1): 40,
        tp("logs", 2): 5,
    }


async def test_offsets_of_many_groups_commit_together(store: MetadataStore) -> None:
    epoch = await store.take_office(1)
    await store.commit_offsets(
        epoch,
        [
            batch("billing", 3, orders_0=1),
            batch("audit", 7, orders_0=2, orders_1=3),
            batch("search", -1, logs_0=4),
            batch("billing", 3, orders_0=5, orders_1=6),  # later batches win
        ],
    )
    assert await store.fetch_offsets("billing") == {tp("orders", 0): 5, tp("orders", 1): 6}
    assert await store.fetch_offsets("audit") == {tp("orders", 0): 2, tp("orders", 1): 3}
    assert await store.fetch_offsets("search") == {tp("logs", 0): 4}


async def test_committing_nothing_is_fine(store: MetadataStore) -> None:
    epoch = await store.take_office(1)
    await store.commit_offsets(epoch, [])
    await store.commit_offsets(epoch, [OffsetBatch(group_id="billing", generation=1, offsets={})])
    assert await store.fetch_offsets("billing") == {}


async def test_offsets_survive_a_reopen(store_factory: StoreOpener) -> None:
    async with store_factory() as store:
        epoch = await store.take_office(1)
        await store.commit_offsets(
            epoch, [batch("billing", 3, orders_0=17), batch("audit", 1, orders_0=2)]
        )
        await store.commit_offsets(epoch, [batch("billing", 4, orders_0=18, orders_1=1)])
    async with store_factory() as store:
        assert await store.fetch_offsets("billing") == {tp("orders", 0): 18, tp("orders", 1): 1}
        assert await store.fetch_offsets("audit") == {tp("orders", 0): 2}


async def test_deleting_a_group_drops_its_offsets(store_factory: StoreOpener) -> None:
    async with store_factory() as store:
        epoch = await store.take_office(1)
        await store.write_group(epoch, sample_group("billing"))
        await store.commit_offsets(
            epoch,
            [
                batch("billing", 3, orders_0=17),
                batch("standalone", -1, orders_0=4),  # offsets with no group record
                batch("audit", 1, orders_0=2),
            ],
        )
        await store.delete_group(epoch, "billing")
        await store.delete_group(epoch, "standalone")
        assert await store.fetch_offsets("billing") == {}
        assert await store.fetch_offsets("standalone") == {}
    async with store_factory() as store:
        assert await everything(store, "billing", "standalone", "audit") == {
            "topics": {},
            "groups": {},
            "offsets": {"billing": {}, "standalone": {}, "audit": {tp("orders", 0): 2}},
        }


async def test_groups_with_offsets_but_no_record_are_named(store_factory: StoreOpener) -> None:
    """A standalone committer's groups: ``groups`` leaves them out, ``offset_only_groups``
    names them, across a reopen; a group with a record, or with no offsets left, is not one."""
    async with store_factory() as store:
        epoch = await store.take_office(1)
        await store.create_topic("orders", (1,))
        await store.create_topic("logs", (1,))
        assert await store.offset_only_groups() == frozenset()
        await store.write_group(epoch, sample_group("billing"))
        await store.commit_offsets(
            epoch,
            [
                batch("billing", 3, orders_0=17),
                batch("reset", -1, orders_0=4, logs_0=1),
                batch("sink", -1, orders_0=9),
                batch("gone", -1, logs_0=2),
                batch("emptied", -1, orders_0=3),
            ],
        )
        await store.delete_group(epoch, "gone")
        await store.delete_offsets(epoch, "emptied", "orders")
        assert await store.offset_only_groups() == {"reset", "sink"}
        assert set(await store.groups()) == {"billing"}
    async with store_factory() as store:
        assert await store.offset_only_groups() == {"reset", "sink"}
        await store.delete_topic("orders")
        assert await store.offset_only_groups() == {"reset"}
        epoch = await store.take_office(1)
        await store.write_group(epoch, sample_group("reset", generation=1))
        assert await store.offset_only_groups() == frozenset()
