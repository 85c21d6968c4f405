"""What the ZooKeeper store promises beyond the contract suite: one office among many sessions,
fencing of a coordinator whose session ended, watches across sessions, a layout that other tools can
read, and bounded calls when the ensemble fails. Real ZooKeeper, real clock.
"""

from __future__ import annotations

import contextlib
import json
from typing import Any

import pytest
import trio
import trio.testing
from kazoo.client import KazooClient  # type: ignore[import-untyped]
from kazoo.exceptions import NoNodeError  # type: ignore[import-untyped]

from coordinator.store import (
    EpochFenced,
    GroupRecord,
    MemberRecord,
    OffsetBatch,
    StoreUnavailable,
    TopicPlacement,
)
from coordinator.store.zookeeper import ZooKeeperStore, open_zookeeper_store
from protocol import Subscription, TopicStreams
from protocol.types import BrokerInfo, ConsumerThread, TopicPartition
from tests.store.test_contract import sample_group
from tests.support.cluster import eventually
from tests.support.zookeeper import Ensemble

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


async def read_raw(hosts: str, path: str) -> bytes:
    def read() -> bytes:
        client = _raw_client(hosts)
        try:
            data, _stat = client.get(path)
            return bytes(data)
        finally:
            client.stop()
            client.close()

    return await trio.to_thread.run_sync(read)


async def hold_office(
    hosts: str, broker_id: int, release: trio.Event, *, task_status: trio.TaskStatus[int]
) -> None:
    """Be the coordinator on a store of its own until ``release``, then close that store."""
    async with open_zookeeper_store(hosts) as store:
        task_status.started(await store.take_office(broker_id))
        await release.wait()


async def test_one_office_at_a_time_and_the_next_epoch_is_larger(zookeeper_hosts: str) -> None:
    async with open_zookeeper_store(zookeeper_hosts) as second, trio.open_nursery() as nursery:
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
        open_zookeeper_store(zookeeper_hosts) as first,
        open_zookeeper_store(zookeeper_hosts) as second,
    ):
        await first.register_broker(BrokerInfo(broker_id=1, host="127.0.0.1", port=9092))
        old = await first.take_office(1)
        await first.commit_offsets(
            old, [OffsetBatch(group_id="g", generation=1, offsets={tp("t", 0): 5})]
        )

        await expire_session(zookeeper_hosts, first)

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
            except EpochFenced:
                return True
            except StoreUnavailable:
                return False  # still reconnecting
            raise AssertionError("a deposed coordinator wrote offsets")

        await eventually(fenced, deadline=DEADLINE)
        with pytest.raises(EpochFenced):
            await first.write_group(old, sample_group("g"))
        assert await second.fetch_offsets("g") == {tp("t", 0): 5}
        with trio.fail_after(DEADLINE):
            await first.wait_office_lost(suspended_grace=1.0)

        # Its broker registration came back with the new session.
        async def registered_again() -> bool:
            return [b.broker_id for b in await second.brokers()] == [1]

        await eventually(registered_again, deadline=DEADLINE)


async def test_a_topic_created_by_another_broker_reaches_the_watch(zookeeper_hosts: str) -> None:
    async with (
        open_zookeeper_store(zookeeper_hosts) as watcher,
        open_zookeeper_store(zookeeper_hosts) as creator,
        contextlib.aclosing(watcher.topic_updates()) as updates,
    ):
        with trio.fail_after(DEADLINE):
            assert await anext(updates) == {}
            await creator.create_topic("orders", (1, 2))
            assert await anext(updates) == {
                "orders": TopicPlacement(topic="orders", brokers=(1, 2))
            }
            await creator.add_partitions("orders", (3,))
            assert (await anext(updates))["orders"].brokers == (1, 2, 3)


async def test_the_layout_is_readable_by_other_tools(zookeeper_hosts: str) -> None:
    async with open_zookeeper_store(zookeeper_hosts) as store:
        await store.register_broker(BrokerInfo(broker_id=7, host="10.0.0.7", port=9093))
        await store.create_topic("orders", (7, 7, 8))
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
                "/consumers/coordinator",
                "/consumers/billing/offsets/orders/2",
                "/consumers/billing/owners/orders/2",
                "/consumers/billing/owners/logs.web/0",
            )
        }
    assert json.loads(raw["/brokers/ids/7"]) == {"host": "10.0.0.7", "port": 9093}
    assert json.loads(raw["/brokers/topics/orders"]) == {"0": 7, "1": 7, "2": 8}
    assert json.loads(raw["/consumers/coordinator"]) == {"broker_id": 7}
    assert json.loads(raw["/consumers/billing/offsets/orders/2"]) == {
        "offset": 17,
        "generation": 3,
    }
    assert raw["/consumers/billing/owners/orders/2"] == b"m3-0"
    assert raw["/consumers/billing/owners/logs.web/0"] == b"m2-2"


async def test_owners_follow_the_latest_assignment(zookeeper_hosts: str) -> None:
    async with open_zookeeper_store(zookeeper_hosts) as store:
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
    async with open_zookeeper_store(hosts, session_timeout=6.0, call_bound=2.0) as store:
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
    async with open_zookeeper_store(hosts, session_timeout=6.0, call_bound=1.0) as store:
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
        with pytest.raises(EpochFenced):
            await store.commit_offsets(epoch, [])


async def test_names_that_are_not_znode_names_round_trip(zookeeper_hosts: str) -> None:
    odd = ["coordinator", "a/b", "100%", ".", "..", ""]
    async with open_zookeeper_store(zookeeper_hosts) as store:
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


@pytest.mark.xfail(
    strict=True,
    reason="known limit: write_group is one transaction, and ZooKeeper drops a request over its "
    "1 MB jute.maxbuffer (README). Remove this mark once a group is written in chunks.",
)
async def test_a_group_of_1000_members_over_10000_partitions_is_written(
    zookeeper_hosts: str,
) -> None:
    subscription = Subscription(topics=(TopicStreams(topic="t", streams=1),))
    members = tuple(
        MemberRecord(
            member_id=f"m{i:04d}",
            client_id="c",
            subscription=subscription,
            session_timeout_ms=10_000,
            auto_commit=True,
            auto_offset_reset="smallest",
        )
        for i in range(1000)
    )
    assignment = {
        tp("t", p): ConsumerThread(member_id=f"m{p % 1000:04d}", index=0) for p in range(10_000)
    }
    group = GroupRecord(group_id="g", generation=1, members=members, assignment=assignment)
    async with open_zookeeper_store(zookeeper_hosts, call_bound=DEADLINE) as store:
        epoch = await store.take_office(1)
        await store.write_group(epoch, group)  # today: StoreUnavailable (ConnectionLoss)
        assert (await store.groups())["g"] == group
