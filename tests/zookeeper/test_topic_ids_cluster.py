"""Issue 33's third case, with real broker processes on ZooKeeper: the broker holding a topic's
partitions is down (killed: its registration outlives it for a session) while the topic is
deleted and created again, under its name and as it was, through the other broker. Started again
on its data dir, that broker serves none of the old records, by name or by the new id, and its
old directories are set aside (docs/design.md#deleting-a-topic)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from broker.log import read_partition_id
from consumer.admin import Admin, open_admin
from launch.processes import BrokerProcess, run_broker
from protocol import ErrorCode, FetchRequest, FetchResponse, ProduceRequest, ProduceResponse
from protocol.batches import build_batch, read_batches
from protocol.types import NO_TOPIC_ID, TopicId

pytestmark = pytest.mark.realtime

#: The brokers' ZooKeeper session timeout: a killed broker stays registered this long, long
#: enough to delete and create the topic again on it (the test server allows up to 10 s).
SESSION = 8.0
PARTITIONS = 2


def _start(
    hosts: str, tmp_path: Path, broker_id: int
) -> contextlib.AbstractAsyncContextManager[BrokerProcess]:
    """Broker ``broker_id`` on its own data dir: called again, it restarts on the same one."""
    return run_broker(
        tmp_path / f"broker{broker_id}",
        f"--broker-id={broker_id}",
        f"--zookeeper={hosts}",
        f"--zookeeper-session-timeout={SESSION}",
    )


@contextlib.asynccontextmanager
async def _admin(broker: BrokerProcess) -> AsyncIterator[Admin]:
    async with open_admin([broker.address]) as admin:
        yield admin


async def _produce(admin: Admin, partition: int, *values: bytes) -> None:
    request = ProduceRequest(
        topic="t", partition=partition, records=(), batches=build_batch(list(values))
    )
    response = await admin.call(request)
    assert isinstance(response, ProduceResponse)
    assert response.error_code is ErrorCode.NONE


async def _fetch(admin: Admin, partition: int, topic_id: TopicId = NO_TOPIC_ID) -> FetchResponse:
    """From the start: by name, or naming ``topic_id`` (the client's newest Fetch, version 2)."""
    request = FetchRequest(
        topic="t", partition=partition, offset=0, max_bytes=1 << 20, topic_id=topic_id
    )
    response = await admin.call(request)
    assert isinstance(response, FetchResponse)
    return response


def _values(fetched: FetchResponse) -> list[bytes | None]:
    return [value for batch in read_batches(fetched.batches) for _, _, _, value in batch]


async def test_a_broker_down_through_a_delete_and_a_recreate_serves_none_of_the_old_records(
    zookeeper_hosts: str, tmp_path: Path
) -> None:
    log_dir = tmp_path / "broker1" / "log"
    async with _start(zookeeper_hosts, tmp_path, 2) as two, _admin(two) as through_two:
        async with _start(zookeeper_hosts, tmp_path, 1) as one:
            await through_two.create_topic("t", PARTITIONS, brokers=[1], replication_factor=1)
            old_id = (await through_two.listing(["t"])).ids["t"]
            async with _admin(one) as through_one:
                for p in range(PARTITIONS):
                    await _produce(through_one, p, b"old-%d-0" % p, b"old-%d-1" % p)
            await one.kill()  # a crash: its registration stays for a session
            await through_two.delete_topic("t")
            await through_two.create_topic("t", PARTITIONS, brokers=[1], replication_factor=1)
            new_id = (await through_two.listing(["t"])).ids["t"]
            assert new_id != old_id

        async with _start(zookeeper_hosts, tmp_path, 1) as one, _admin(one) as through_one:
            for p in range(PARTITIONS):
                (stray,) = log_dir.glob(f"t-{p}.*.stray")
                assert read_partition_id(stray) == old_id
                assert read_partition_id(log_dir / f"t-{p}") == new_id
                for topic_id in (NO_TOPIC_ID, new_id):
                    fetched = await _fetch(through_one, p, topic_id)
                    assert (fetched.error_code, fetched.high_watermark, fetched.batches) == (
                        ErrorCode.NONE,
                        0,
                        b"",
                    )
                refused = await _fetch(through_one, p, old_id)
                assert (refused.error_code, refused.batches) == (ErrorCode.UNKNOWN_TOPIC_ID, b"")
                await _produce(through_one, p, b"new-%d" % p)
                for topic_id in (NO_TOPIC_ID, new_id):
                    assert _values(await _fetch(through_one, p, topic_id)) == [b"new-%d" % p]
