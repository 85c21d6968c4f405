"""What the ZooKeeper store promises beyond the contract suite: one office among many sessions,
fencing of a coordinator whose session ended, watches across sessions, a layout that other tools can
read, and bounded calls when the ensemble fails. Real ZooKeeper, real clock.
"""

from __future__ import annotations

import contextlib
import json
import math
import time
import uuid
from collections.abc import Callable, Sequence
from typing import Any

import pytest
import trio
import trio.testing
from kazoo.client import KazooClient  # type: ignore[import-untyped]
from kazoo.exceptions import NoNodeError  # type: ignore[import-untyped]

from launch.cluster import eventually
from launch.zookeeper import Ensemble
from protocol import Subscription
from protocol.types import NO_TOPIC_ID, BrokerInfo, ConsumerThread, TopicId, TopicPartition
from store import (
    Deposed,
    GroupRecord,
    MemberRecord,
    MetadataStore,
    OffsetBatch,
    StoreUnavailable,
)
from store.codec import encode_group
from store.zookeeper import CONTACT_MARGIN_FRACTION, ZooKeeperStore
from tests.store.test_contract import sample_group
from tests.support.zookeeper_fixtures import open_office

pytestmark = pytest.mark.realtime

DEADLINE = 30  # generous: CI has two busy cores and a JVM on them


def tp(topic: str, partition: int) -> TopicPartition:
    return TopicPartition(topic=topic, partition=partition)


def _raw_client(hosts: str, **kwargs: Any) -> Any:
    client = KazooClient(hosts=hosts, **kwargs)
    client.start(timeout=DEADLINE)
    return client


async def expire_session(hosts: str, store: ZooKeeperStore) -> None:
    """End the store's session on the server, as a long pause or a partition would: a second
    client joins the same session and closes it (the classic ZooKeeper test trick). The store's
    own client notices only when it next talks to the server."""
    session_id, password = store._client.client_id

    def close_it() -> None:
        other = _raw_client(hosts.partition("/")[0], client_id=(session_id, password))
        other.stop()
        other.close()

    await trio.to_thread.run_sync(close_it)


async def raw(hosts: str, act: Callable[[Any], Any]) -> Any:
    """``act`` on a plain kazoo client of its own: another tool, or a broker of layout 2."""

    def run() -> Any:
        client = _raw_client(hosts)
        try:
            return act(client)
        finally:
            client.stop()
            client.close()

    return await trio.to_thread.run_sync(run)


async def read_raw(hosts: str, path: str) -> bytes:
    return bytes(await raw(hosts, lambda client: client.get(path)[0]))


async def hold_office(
    hosts: str, broker_id: int, release: trio.Event, *, task_status: trio.TaskStatus[int]
) -> None:
    """Be the coordinator on a store of its own until ``release``, then close that store."""
    async with open_office(hosts) as store:
        task_status.started(await store.take_office(broker_id))
        await release.wait()


async def test_one_office_at_a_time_and_the_next_epoch_is_larger(zookeeper_hosts: str) -> None:
    async with open_office(zookeeper_hosts) as second, trio.open_nursery() as nursery:
        release = trio.Event()
        first_epoch = await nursery.start(hold_office, zookeeper_hosts, 1, release)
        assert await second.coordinator_id() == 1

        with trio.move_on_after(0.5) as waited:
            await second.take_office(2)
        assert waited.cancelled_caught, "took office while broker 1 held it"

        released_at = trio.current_time()
        release.set()  # broker 1 closes its session: the election node goes at once
        with trio.fail_after(DEADLINE):
            second_epoch = await second.take_office(2)
        print(f"election after the coordinator closed: {trio.current_time() - released_at:.3f}s")
        assert second_epoch > first_epoch
        assert await second.coordinator_id() == 2


async def test_a_coordinator_whose_session_expired_cannot_write(zookeeper_hosts: str) -> None:
    async with (
        open_office(zookeeper_hosts) as first,
        open_office(zookeeper_hosts) as second,
    ):
        await first.register_broker(BrokerInfo(broker_id=1, host="127.0.0.1", port=9092))
        old = await first.take_office(1)
        await first.commit_offsets(
            old, [OffsetBatch(group_id="g", generation=1, offsets={tp("t", 0): 5})]
        )

        await expire_session(zookeeper_hosts, first.inner)

        async def vacant() -> bool:
            return await second.coordinator_id() is None

        await eventually(vacant, deadline=DEADLINE)
        new = await second.take_office(2)
        assert new > old

        # The deposed coordinator still believes in its epoch; the server refuses it, through
        # whatever session kazoo has by now.
        async def fenced() -> bool:
            try:
                await first.commit_offsets(
                    old, [OffsetBatch(group_id="g", generation=1, offsets={tp("t", 0): 99})]
                )
            except Deposed:
                return True
            except StoreUnavailable:
                return False  # still reconnecting
            raise AssertionError("a deposed coordinator wrote offsets")

        await eventually(fenced, deadline=DEADLINE)
        with pytest.raises(Deposed):
            await first.write_group(old, sample_group("g"))
        assert await second.fetch_offsets("g") == {tp("t", 0): 5}
        with trio.fail_after(DEADLINE):
            await first.wait_office_lost(suspended_grace=1.0)

        # Its broker registration came back with the new session.
        async def registered_again() -> bool:
            return [b.broker_id for b in await second.brokers()] == [1]

        await eventually(registered_again, deadline=DEADLINE)


async def test_a_coordinator_stays_in_contact_while_its_session_lives(
    zookeeper_hosts: str,
) -> None:
    """Its own reads keep the contact ahead for sessions on end, and never further ahead than
    the session could outlive the latest of them (less the margin)."""
    session = 3.0  # contact is renewed every 1 s and lasts 2.5 s: CI's busy cores have slack
    ahead = session * (1 - CONTACT_MARGIN_FRACTION)
    async with open_office(zookeeper_hosts, session_timeout=session) as store:
        await store.take_office(1)
        end = trio.current_time() + 2 * session
        lowest = math.inf
        while (now := trio.current_time()) < end:
            until = store.in_contact_until()
            assert until <= now + ahead
            lowest = min(lowest, until - now)
            await trio.sleep(0.05)
        print(f"contact reached at least {lowest:.3f}s ahead over {2 * session}s")
        assert lowest > 0


async def test_a_coordinator_whose_loop_is_behind_stays_in_contact_with_a_store_that_answers(
    zookeeper_hosts: str,
) -> None:
    """The broker's event loop is busy for longer than contact lasts (here one stretch of
    CPU-bound work that never yields, the worst case of a loop behind its timers); the ensemble
    answers all along, so the coordinator is still in contact the moment the loop is free
    again: contact is judged from the session's own heartbeats, not from a task that waits its
    turn behind other work (issue 36: 121 rebalances refused "out of contact" at load 8-11).
    With a task reading the node, contact ran out 2.5 s into the 3.6 s stretch."""
    session = 3.0  # contact lasts 2.5 s past each answer, renewed every 1 s
    async with open_office(zookeeper_hosts, session_timeout=session) as store:
        await store.take_office(1)
        busy_until = time.perf_counter() + 1.2 * session
        while time.perf_counter() < busy_until:
            sum(range(1000))  # holds the loop, as a busy broker's work does, not the GIL
        assert store.in_contact_until() > trio.current_time()


async def test_a_coordinator_whose_session_ended_falls_out_of_contact(
    zookeeper_hosts: str,
) -> None:
    """The server ends the session (as it would after a pause): whatever the store's memory
    says of its office, contact runs out at most the session less the margin after the last
    answer the old session could have had."""
    session = 2.0
    async with open_office(zookeeper_hosts, session_timeout=session) as store:
        await store.take_office(1)
        await expire_session(zookeeper_hosts, store.inner)
        ended_at = trio.current_time()
        assert store.in_contact_until() <= ended_at + session * (1 - CONTACT_MARGIN_FRACTION)

        async def out_of_contact() -> bool:
            return trio.current_time() >= store.in_contact_until()

        await eventually(out_of_contact, deadline=DEADLINE)
        # A new session answers the store's reads; it holds no office, so proves nothing.
        assert store.in_contact_until() <= ended_at + session * (1 - CONTACT_MARGIN_FRACTION)


async def test_a_topic_created_by_another_broker_reaches_the_watch(zookeeper_hosts: str) -> None:
    async with (
        open_office(zookeeper_hosts) as watcher,
        open_office(zookeeper_hosts) as creator,
        contextlib.aclosing(watcher.topic_updates()) as updates,
    ):
        with trio.fail_after(DEADLINE):
            assert await anext(updates) == {}
            placement = await creator.create_topic("orders", (1, 2))
            assert await anext(updates) == {"orders": placement}
            await creator.add_partitions("orders", (3,))
            assert (await anext(updates))["orders"].brokers == (1, 2, 3)


async def test_the_layout_is_readable_by_other_tools(zookeeper_hosts: str) -> None:
    async with open_office(zookeeper_hosts) as store:
        await store.register_broker(BrokerInfo(broker_id=7, host="10.0.0.7", port=9093))
        placement = await store.create_topic("orders", (7, 7, 8))
        epoch = await store.take_office(7)
        group = sample_group("billing", generation=3)
        await store.write_group(epoch, group)
        await store.commit_offsets(
            epoch, [OffsetBatch(group_id="billing", generation=3, offsets={tp("orders", 2): 17})]
        )
        raw = {
            path: await read_raw(zookeeper_hosts, path)
            for path in (
                "/brokers/ids/7",
                "/brokers/topics/orders",
                "/brokers/topic_ids/orders",
                "/coordinator_slots/0",
                "/consumers/billing/offsets/orders/2",
                "/consumers/billing/owners/orders/2",
                "/consumers/billing/owners/logs.web/0",
            )
        }
    assert json.loads(raw["/brokers/ids/7"]) == {"host": "10.0.0.7", "port": 9093, "layout": 4}
    assert json.loads(raw["/brokers/topics/orders"]) == {"0": 7, "1": 7, "2": 8}
    assert json.loads(raw["/brokers/topic_ids/orders"]) == {"topic_id": str(placement.topic_id)}
    assert json.loads(raw["/coordinator_slots/0"]) == {"broker_id": 7}
    assert json.loads(raw["/consumers/billing/offsets/orders/2"]) == {
        "offset": 17,
        "generation": 3,
        "topic_id": str(placement.topic_id),
    }
    assert raw["/consumers/billing/owners/orders/2"] == b"m3-0"
    assert raw["/consumers/billing/owners/logs.web/0"] == b"m2-2"


async def test_owners_follow_the_latest_assignment(zookeeper_hosts: str) -> None:
    async with open_office(zookeeper_hosts) as store:
        epoch = await store.take_office(1)
        await store.write_group(epoch, sample_group("billing", generation=3))
        moved = sample_group("billing", generation=4)
        moved = type(moved)(
            group_id="billing",
            generation=4,
            members=moved.members,
            assignment={tp("orders", 0): ConsumerThread(member_id="m2", index=0)},
        )
        await store.write_group(epoch, moved)
        assert (await store.groups())["billing"] == moved
    assert await read_raw(zookeeper_hosts, "/consumers/billing/owners/orders/0") == b"m2-0"
    with pytest.raises(NoNodeError):
        await read_raw(zookeeper_hosts, "/consumers/billing/owners/orders/1")


async def test_killing_the_ensemble_leader_interrupts_writes_briefly(
    zookeeper_ensemble: Ensemble,
) -> None:
    hosts = zookeeper_ensemble.hosts + "/failover"
    async with open_office(hosts, session_timeout=6.0, call_bound=2.0) as store:
        epoch = await store.take_office(1)
        leader = zookeeper_ensemble.leader()
        assert leader is not None
        offset = 0

        async def commit() -> bool:
            nonlocal offset
            offset += 1
            try:
                await store.commit_offsets(
                    epoch, [OffsetBatch(group_id="g", generation=1, offsets={tp("t", 0): offset})]
                )
            except StoreUnavailable:
                return False
            return True

        assert await commit()
        killed_at = trio.current_time()
        await trio.to_thread.run_sync(leader.kill)
        await eventually(commit, deadline=DEADLINE)
        print(
            f"write gap after killing the ZooKeeper leader: {trio.current_time() - killed_at:.3f}s"
        )
        assert await store.fetch_offsets("g") == {tp("t", 0): offset}
        # The session survived: the office is still ours.
        assert await store.coordinator_id() == 1


async def test_a_lost_quorum_bounds_every_call_and_ends_the_office(
    zookeeper_ensemble: Ensemble,
) -> None:
    hosts = zookeeper_ensemble.hosts + "/quorum"
    async with open_office(hosts, session_timeout=6.0, call_bound=1.0) as store:
        epoch = await store.take_office(1)
        for node in zookeeper_ensemble.nodes[:2]:
            await trio.to_thread.run_sync(node.kill)
        lost_at = trio.current_time()
        with trio.fail_after(DEADLINE):
            with pytest.raises(StoreUnavailable):
                await store.commit_offsets(
                    epoch, [OffsetBatch(group_id="g", generation=1, offsets={tp("t", 0): 1})]
                )
            await store.wait_office_lost(suspended_grace=2.0)
        print(f"office given up after losing quorum: {trio.current_time() - lost_at:.3f}s")
        with pytest.raises(Deposed):
            await store.commit_offsets(epoch, [])


async def test_names_that_are_not_znode_names_round_trip(zookeeper_hosts: str) -> None:
    odd = ["coordinator", "a/b", "100%", ".", "..", ""]
    async with open_office(zookeeper_hosts) as store:
        epoch = await store.take_office(1)
        for group_id in odd:
            await store.write_group(epoch, sample_group(group_id))
            await store.commit_offsets(
                epoch, [OffsetBatch(group_id=group_id, generation=3, offsets={tp("x/y", 0): 4})]
            )
        assert set(await store.groups()) == set(odd)
        for group_id in odd:
            assert await store.fetch_offsets(group_id) == {tp("x/y", 0): 4}
        assert await store.coordinator_id() == 1  # the group "coordinator" left the office alone
        await store.delete_group(epoch, "a/b")
        assert set(await store.groups()) == set(odd) - {"a/b"}


# Topic ids (docs/design.md#topic-ids)


async def test_a_delete_that_read_one_incarnation_leaves_no_offset_of_the_next(
    zookeeper_hosts: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A delete reads the incarnation, deletes its offsets, then deletes it. If meanwhile it was
    deleted and created again, and the new one got offsets, the delete's last transaction finds
    the name's ids node changed, reads again, and deletes the new incarnation with its offsets.
    Without that check it would delete the new topic node (same version) and leave its offsets
    behind."""
    async with (
        open_office(zookeeper_hosts) as first,
        open_office(zookeeper_hosts) as second,
    ):
        epoch = await first.take_office(1)
        await first.create_topic("orders", (1,))
        listed, resume = trio.Event(), trio.Event()
        list_offsets = second.inner._topic_offset_ops

        async def list_then_wait(groups: Sequence[str], topic: str) -> list[Any]:
            ops = await list_offsets(groups, topic)
            listed.set()
            await resume.wait()
            return ops

        monkeypatch.setattr(second.inner, "_topic_offset_ops", list_then_wait)
        with trio.fail_after(DEADLINE):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(second.delete_topic, "orders")
                await listed.wait()
                await first.delete_topic("orders")
                again = await first.create_topic("orders", (1,))
                await first.commit_offsets(
                    epoch,
                    [
                        OffsetBatch(
                            group_id="billing",
                            generation=1,
                            offsets={tp("orders", 0): 5},
                            topic_ids={"orders": again.topic_id},
                        )
                    ],
                )
                resume.set()
        assert await first.topics() == {}
        assert not await raw(
            zookeeper_hosts, lambda client: client.exists("/consumers/billing/offsets/orders")
        )
        assert json.loads(await read_raw(zookeeper_hosts, "/brokers/topic_ids/orders")) == {
            "topic_id": None
        }


async def test_topics_of_a_layout_2_broker_get_ids_on_sight(zookeeper_hosts: str) -> None:
    """During a rolling upgrade a broker of layout 2 creates, deletes and re-creates topic nodes
    without ids: each broker of layout 3 that reads such a topic gives it an id or reads the one
    another gave, so they agree; a topic node created after its name's id was written is another
    incarnation; offsets written without an id are the current incarnation's."""
    async with (
        open_office(zookeeper_hosts) as first,
        open_office(zookeeper_hosts) as second,
        contextlib.aclosing(second.topic_updates()) as updates,
    ):
        with trio.fail_after(DEADLINE):
            assert await anext(updates) == {}

            def old_create(client: Any) -> None:
                client.create("/brokers/topics/orders", b'{"0":1,"1":2}')
                client.create(
                    "/consumers/billing/offsets/orders/0",
                    b'{"offset":9,"generation":1}',
                    makepath=True,
                )

            await raw(zookeeper_hosts, old_create)
            seen, read = await anext(updates), await first.topics()
            assert seen == read
            given = read["orders"]
            assert given.brokers == (1, 2)
            assert given.topic_id.version == 4
            assert await first.fetch_offsets("billing") == {tp("orders", 0): 9}

            def old_recreate(client: Any) -> None:
                client.delete("/brokers/topics/orders")
                client.create("/brokers/topics/orders", b'{"0":3}')

            await raw(zookeeper_hosts, old_recreate)
            latest = await anext(updates)
            while "orders" not in latest or latest["orders"].brokers != (3,):
                latest = await anext(updates)  # perhaps one without it first
            assert latest["orders"].topic_id not in (given.topic_id, NO_TOPIC_ID)
            assert (await first.topics())["orders"] == latest["orders"]

            # Only the ids node changes (another tool): the watch sees it too.
            other = uuid.uuid4()
            await raw(
                zookeeper_hosts,
                lambda client: client.set(
                    "/brokers/topic_ids/orders", json.dumps({"topic_id": str(other)}).encode()
                ),
            )
            while (await anext(updates))["orders"].topic_id != other:
                pass


async def test_a_topics_settings_are_kafkas_node_and_a_deleted_incarnations_count_for_none(
    zookeeper_hosts: str,
) -> None:
    """``/config/topics/<topic>`` in Kafka's shape, written with the topic and deleted with it;
    one a broker that knows no settings nodes left behind (it deleted the topic node alone) is
    older than the next topic node of the name, and gives that topic no settings."""
    settings = (("retention.ms", "60000"),)
    async with open_office(zookeeper_hosts) as store:
        await store.create_topic("orders", (1,), settings)
        assert json.loads(await read_raw(zookeeper_hosts, "/config/topics/orders")) == {
            "version": 1,
            "config": {"retention.ms": "60000"},
        }
        await store.delete_topic("orders")
        with pytest.raises(NoNodeError):
            await read_raw(zookeeper_hosts, "/config/topics/orders")

        await store.create_topic("orders", (1,), settings)

        def old_delete_and_create(client: Any) -> None:  # a broker of layout 3, before settings
            client.delete("/brokers/topics/orders")
            client.create("/brokers/topics/orders", b'{"0":2}')

        await raw(zookeeper_hosts, old_delete_and_create)
        with trio.fail_after(DEADLINE):
            while (found := (await store.topics())["orders"]).brokers != (2,):
                await trio.sleep(0.05)
        assert found.configs == ()
        await store.delete_topic("orders")  # the stale node stays: nobody wrote it for this one
        again = await store.create_topic("orders", (1,), (("segment.bytes", "1024"),))
        assert (await store.topics())["orders"].configs == again.configs


async def test_brokers_that_see_a_topic_without_an_id_at_once_agree_on_the_one_given(
    zookeeper_hosts: str,
) -> None:
    """A topic a broker of layout 2 created over a name whose id a delete set to null reaches the
    topic watches of four sessions at once: one id is given, and every session publishes it."""

    def old_create(client: Any) -> None:
        client.create("/brokers/topics/orders", b'{"0":1}')
        client.set("/brokers/topic_ids/orders", b'{"topic_id":null}')

    seen: list[TopicId] = []

    async def watch(store: MetadataStore, task_status: trio.TaskStatus[None]) -> None:
        async with contextlib.aclosing(store.topic_updates()) as updates:
            while await anext(updates):
                pass  # the watch has yet to see the delete
            task_status.started()
            async for topics in updates:
                if "orders" in topics:
                    seen.append(topics["orders"].topic_id)
                    return

    async with contextlib.AsyncExitStack() as stack:
        stores = [await stack.enter_async_context(open_office(zookeeper_hosts)) for _ in range(4)]
        await stores[0].create_topic("orders", (1,))
        await stores[0].delete_topic("orders")
        with trio.fail_after(DEADLINE):
            async with trio.open_nursery() as nursery:
                for store in stores:
                    await nursery.start(watch, store)
                await raw(zookeeper_hosts, old_create)
        assert len(seen) == 4
        assert len(set(seen)) == 1, seen
        assert seen[0] != NO_TOPIC_ID
        for store in stores:
            assert (await store.topics())["orders"].topic_id == seen[0]


def big_group(members: int, partitions: int, generation: int) -> GroupRecord:
    """``members`` members over ``partitions`` partitions of 100 topics; each generation moves
    every partition to another member."""
    subscription = Subscription(pattern=r"topic-.*", pattern_streams=1)
    return GroupRecord(
        group_id="big",
        generation=generation,
        members=tuple(
            MemberRecord(
                member_id=f"consumer-{i:05d}-2f1c9e7a",
                client_id=f"client-{i:05d}",
                subscription=subscription,
                session_timeout_ms=10_000,
                auto_commit=True,
                auto_offset_reset="smallest",
            )
            for i in range(members)
        ),
        assignment={
            tp(f"topic-{p % 100:03d}", p // 100): ConsumerThread(
                member_id=f"consumer-{(p + generation) % members:05d}-2f1c9e7a", index=0
            )
            for p in range(partitions)
        },
    )


def owner_nodes(hosts: str, group_id: str) -> dict[str, bytes]:
    """Every owner node of the group as another tool would read it: path -> data."""
    client = _raw_client(hosts)
    try:
        base = f"/consumers/{group_id}/owners"
        paths = [
            f"{base}/{topic}/{partition}"
            for topic in client.get_children(base)
            for partition in client.get_children(f"{base}/{topic}")
        ]
        pending = [(path, client.get_async(path)) for path in paths]  # one round trip, not 10,000
        return {path: bytes(result.get(timeout=DEADLINE)[0]) for path, result in pending}
    finally:
        client.stop()
        client.close()


def expected_owners(group: GroupRecord) -> dict[str, bytes]:
    return {
        f"/consumers/{group.group_id}/owners/{tp.topic}/{tp.partition}": (
            f"{thread.member_id}-{thread.index}".encode()
        )
        for tp, thread in group.assignment.items()
    }


async def test_a_group_of_5000_members_over_10000_partitions_is_written_committed_and_deleted(
    zookeeper_hosts: str,
) -> None:
    """The seeds' biggest group takes more than ZooKeeper's 1 MiB request limit to write (its
    record alone is 1.5 MB, its owner nodes and its offsets about 1 MB each): one transaction
    each would be dropped with ConnectionLoss, so such a group could never finish a rebalance
    nor keep an offset under ``--zookeeper``."""
    first, second = big_group(5000, 10_000, 1), big_group(5000, 10_000, 2)
    assert len(json.dumps(encode_group(first))) > 1_048_576
    offsets = {tp: tp.partition + 1 for tp in first.assignment}
    timings = {}
    async with open_office(zookeeper_hosts, call_bound=DEADLINE) as store:
        epoch = await store.take_office(1)
        started = trio.current_time()
        await store.write_group(epoch, first)
        timings["first write"] = trio.current_time() - started
        assert (await store.groups())["big"] == first
        started = trio.current_time()
        await store.write_group(epoch, second)  # every owner node changes
        timings["second write"] = trio.current_time() - started
        assert (await store.groups())["big"] == second
        assert await trio.to_thread.run_sync(owner_nodes, zookeeper_hosts, "big") == (
            expected_owners(second)
        )
        started = trio.current_time()
        await store.commit_offsets(
            epoch, [OffsetBatch(group_id="big", generation=2, offsets=offsets)]
        )
        timings["first offset commit"] = trio.current_time() - started
        offsets = {tp: offset + 100 for tp, offset in offsets.items()}
        started = trio.current_time()
        await store.commit_offsets(
            epoch, [OffsetBatch(group_id="big", generation=2, offsets=offsets)]
        )
        timings["next offset commit"] = trio.current_time() - started
        started = trio.current_time()
        assert await store.fetch_offsets("big") == offsets
        timings["offset fetch"] = trio.current_time() - started
        started = trio.current_time()
        await store.delete_group(epoch, "big")
        timings["delete"] = trio.current_time() - started
        assert "big" not in await store.groups()
        assert await store.fetch_offsets("big") == {}
    print(", ".join(f"{step} {seconds:.2f}s" for step, seconds in timings.items()))


async def test_a_write_cut_short_leaves_a_whole_record_and_the_next_write_repairs_the_owners(
    zookeeper_hosts: str,
) -> None:
    """What a coordinator that died part-way through a write leaves behind, made with a plain
    ZooKeeper client (a real crash cannot be timed to fall between two transactions): chunks
    of a record that was never committed, and owner nodes half moved after a committed one."""
    billing = sample_group("billing", generation=3)
    moved = GroupRecord(
        group_id="billing",
        generation=4,
        members=billing.members,
        assignment={
            tp("orders", 1): ConsumerThread(member_id="m3", index=0),
            tp("orders", 2): ConsumerThread(member_id="m1", index=0),
        },
    )
    async with open_office(zookeeper_hosts) as store:
        epoch = await store.take_office(1)
        await store.write_group(epoch, billing)

        def crash_before_the_commit_point() -> None:
            client = _raw_client(zookeeper_hosts)
            try:
                client.create("/consumers/billing/records/99-0", b'{"group_id": "bill')
            finally:
                client.stop()
                client.close()

        await trio.to_thread.run_sync(crash_before_the_commit_point)
        assert (await store.groups())["billing"] == billing

        def crash_after_the_commit_point() -> None:
            client = _raw_client(zookeeper_hosts)
            try:
                client.create(
                    "/consumers/billing/records/98-0", json.dumps(encode_group(moved)).encode()
                )
                client.set(
                    "/consumers/billing/registry", b'{"generation": 4, "record": "98", "chunks": 1}'
                )
                client.delete("/consumers/billing/owners/orders/0")
                client.set("/consumers/billing/owners/orders/1", b"m3-0")
                client.create("/consumers/billing/owners/stale/5", b"m9-0", makepath=True)
            finally:
                client.stop()
                client.close()

        await trio.to_thread.run_sync(crash_after_the_commit_point)
        assert (await store.groups())["billing"] == moved

        # This handle wrote every owner node of the first record and remembers them: it must
        # not trust that memory now that the registry names another record.
        await store.write_group(epoch, billing)
        assert (await store.groups())["billing"] == billing
    owners = await trio.to_thread.run_sync(owner_nodes, zookeeper_hosts, "billing")
    assert owners == expected_owners(billing)
    registry = json.loads(await read_raw(zookeeper_hosts, "/consumers/billing/registry"))
    assert registry["generation"] == 3
    assert (
        await read_raw(zookeeper_hosts, "/consumers/billing/owners") == registry["record"].encode()
    )

    def records() -> list[str]:
        client = _raw_client(zookeeper_hosts)
        try:
            return sorted(client.get_children("/consumers/billing/records"))
        finally:
            client.stop()
            client.close()

    # The uncommitted chunks and the replaced record are gone; only the registry's remain.
    assert await trio.to_thread.run_sync(records) == [f"{registry['record']}-0"]
