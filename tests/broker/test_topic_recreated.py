"""A topic deleted and created again under its name is another topic (docs/design.md#topic-ids),
tried as issue 33 found it broken, against a real broker process on the embedded store
(tests/zookeeper/test_topic_recreated_cluster.py runs the same rounds on two brokers on ZooKeeper):

* a DeleteTopic and a CreateTopic of the name sent at once from two connections: the topic that
  exists afterwards never serves a record of the deleted one;
* a delete and a create on one connection: the group's committed offset of the deleted topic is
  gone from ``groups describe``, and the group's consumer reads every record of the new one.

Every record's value names the incarnation it was produced to, so a record of another one is
seen for what it is. Each round repeats the race, which the old code lost within a few rounds.
The client produces and fetches naming the id ClusterMetadata gave it, as the library's producer
and consumer do; a client naming topics by name only is served whatever incarnation the broker's
own view has, which may lag the store for as long as its topic watch takes (SPEC.md §11.12).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Sequence
from functools import partial
from pathlib import Path

import pytest
import trio

from consumer import ConsumerSettings, open_consumer
from consumer.admin import open_admin
from launch.cluster import eventually
from launch.processes import run_broker
from protocol import ErrorCode
from tests.support.topic_client import TopicClient, at_once, open_topic_client
from transport.connect import Address

pytestmark = pytest.mark.realtime

TOPIC = "t"
GROUP = "g"
#: Bounds each wait on a consumer, a commit becoming durable, or a broker's watch.
DEADLINE = 60.0
#: How long a consumer may take to hand over records that are all there, beyond which the
#: ones still missing were skipped (the group started past them).
READ_WITHIN = 20.0
BROKER_OPTIONS = ("--initial-rebalance-delay=0", "--commit-interval=0.2")


def tagged(incarnation: int, partition: int, count: int, start: int = 0) -> list[bytes]:
    return [f"{TOPIC}:{incarnation}:{partition}:{n}".encode() for n in range(start, start + count)]


def incarnation_of(value: bytes) -> int:
    return int(value.decode().split(":")[1])


async def produce_tagged(
    client: TopicClient, incarnation: int, count: int, *, start: int = 0
) -> dict[int, list[bytes]]:
    """``count`` records to each partition, tagged with ``incarnation`` and numbered from
    ``start``; what was acknowledged."""
    seen = await client.incarnation(TOPIC)
    assert seen is not None, "the topic was created"
    placement, topic_id = seen
    acknowledged = {}
    for partition, at in sorted(placement.items()):
        values = tagged(incarnation, partition, count, start)
        produced = await client.produce(TOPIC, partition, values, at, topic_id)
        assert produced.error_code is ErrorCode.NONE, (incarnation, partition)
        acknowledged[partition] = values
    return acknowledged


async def served(client: TopicClient) -> dict[int, list[bytes]]:
    """Every record of every partition, from offset 0, as the partition's broker serves it."""
    seen = await client.incarnation(TOPIC)
    assert seen is not None
    placement, topic_id = seen
    return {
        partition: [r.value or b"" for r in await client.read(TOPIC, partition, at, topic_id)]
        for partition, at in sorted(placement.items())
    }


async def race_delete_and_create(
    addresses: Sequence[Address], *, rounds: int, partitions: int
) -> None:
    """Each round: the topic holds records of incarnation k-1; a DeleteTopic (from a connection
    to the first broker) and a CreateTopic (to the last) leave at once; the create is repeated if
    it came too early (TOPIC_ALREADY_EXISTS); records of incarnation k are produced. Then every
    partition serves exactly those, none of an earlier incarnation."""
    async with (
        open_topic_client(addresses[0]) as deleter,
        open_topic_client(addresses[-1]) as creator,
    ):
        assert await creator.create_topic(TOPIC, partitions) is ErrorCode.NONE
        await produce_tagged(creator, 0, 3)
        both_acknowledged = 0
        for incarnation in range(1, rounds + 1):
            deleted, created = await at_once(
                partial(deleter.delete_topic, TOPIC),
                partial(creator.create_topic, TOPIC, partitions),
            )
            assert deleted is ErrorCode.NONE
            if created is ErrorCode.TOPIC_ALREADY_EXISTS:
                assert await creator.create_topic(TOPIC, partitions) is ErrorCode.NONE
            else:
                assert created is ErrorCode.NONE
                both_acknowledged += 1
            acknowledged = await produce_tagged(creator, incarnation, 3)
            seen = await served(creator)
            stale = {
                partition: [v for v in values if incarnation_of(v) != incarnation]
                for partition, values in seen.items()
            }
            assert not any(stale.values()), (
                f"round {incarnation} ({both_acknowledged} races both answered NONE so far): "
                f"records of deleted incarnations served: {stale}"
            )
            assert seen == acknowledged, f"round {incarnation}"


async def committed(admin_addresses: Sequence[Address]) -> dict[int, int]:
    """The group's committed offsets for the topic (partition: offset), as ``groups describe``
    shows them."""
    async with open_admin(admin_addresses) as admin:
        report = await admin.describe_group(GROUP)
    return {p.partition: p.committed for p in report.partitions if p.topic == TOPIC}


@contextlib.asynccontextmanager
async def reading(addresses: Sequence[Address]) -> AsyncIterator[list[bytes]]:
    """A consumer of the group for the block's span, finishing every record it is handed (so
    that it gets committed); the values it was handed, in order. It closes at the block's end,
    committing them."""
    seen: list[bytes] = []
    settings = ConsumerSettings(
        auto_offset_reset="earliest", session_timeout=2.0, client_id="reader", max_retry_backoff=1.0
    )
    async with (
        open_consumer(addresses, GROUP, topics={TOPIC: 1}, settings=settings) as consumer,
        trio.open_nursery() as nursery,
    ):

        async def read() -> None:
            (stream,) = consumer.streams_for(TOPIC)
            async for record in stream:
                seen.append(record.value)
                consumer.mark(record)

        nursery.start_soon(read)
        yield seen
        nursery.cancel_scope.cancel()


async def read_all(addresses: Sequence[Address], expected: list[bytes]) -> list[bytes]:
    """What a new consumer of the group reads: once it has as many records as expected, or
    once ``READ_WITHIN`` passes without (those missing were skipped), it closes."""
    with trio.fail_after(DEADLINE):
        async with reading(addresses) as seen:
            with trio.move_on_after(READ_WITHIN):
                await eventually(partial(_at_least, seen, len(expected)), deadline=DEADLINE)
    return seen


async def _at_least(seen: list[bytes], count: int) -> bool:
    return len(seen) >= count


async def commit_durably(addresses: Sequence[Address], offset: int, what: str) -> None:
    """Wait until the group's committed offset is ``offset``; fail saying what it is if it
    does not get there within ``DEADLINE``."""
    seen: list[dict[int, int]] = [{}]

    async def durable() -> bool:
        seen[0] = await committed(addresses)
        return seen[0] == {0: offset}

    with trio.move_on_after(DEADLINE):
        await eventually(durable, deadline=DEADLINE)
    assert seen[0] == {0: offset}, f"{what}: committed {seen[0]}, not {offset}"


async def delete_and_create_again(
    addresses: Sequence[Address], *, rounds: int, through: Address
) -> None:
    """Each round: a consumer of the group reads the topic's 10 newest records and its offset
    is committed; the topic is deleted and created again on one connection while it still
    consumes; it closes. Then the group has no committed offset of the deleted topic, and a
    new consumer of the group reads all 20 records produced to the new one, none skipped (a
    kept offset would start it past them). The topic is deleted and created through the broker
    at ``through``."""
    async with open_topic_client(through) as client:
        assert await client.create_topic(TOPIC, 1) is ErrorCode.NONE
        end = 0
        for incarnation in range(rounds):
            (old,) = (await produce_tagged(client, incarnation, 10, start=end)).values()
            end += len(old)
            async with reading(addresses) as seen:
                await eventually(partial(_at_least, seen, len(old)), deadline=DEADLINE)
                assert seen[-len(old) :] == old
                await commit_durably(addresses, end, f"round {incarnation + 1}, before the delete")
                assert await client.delete_topic(TOPIC) is ErrorCode.NONE
                assert await client.create_topic(TOPIC, 1) is ErrorCode.NONE
            # The new topic holds no record yet: any offset above 0 is the deleted one's.
            kept = {p: o for p, o in (await committed(addresses)).items() if o > 0}
            assert not kept, f"round {incarnation + 1}: the deleted topic's offsets kept: {kept}"
            (new,) = (await produce_tagged(client, incarnation + 1, 20)).values()
            read = await read_all(addresses, new)
            skipped = [v for v in new if v not in read]
            foreign = [v for v in read if v not in new]
            assert read == new, f"round {incarnation + 1}: skipped {skipped}, read {foreign}"
            end = len(new)
            await commit_durably(addresses, end, f"round {incarnation + 1}, after reading")


@contextlib.asynccontextmanager
async def one_broker(tmp_path: Path) -> AsyncIterator[list[Address]]:
    async with run_broker(tmp_path / "data", *BROKER_OPTIONS) as broker:
        yield [broker.address]


async def test_a_topic_created_while_deleted_never_serves_the_deleted_records(
    tmp_path: Path,
) -> None:
    async with one_broker(tmp_path) as addresses:
        await race_delete_and_create(addresses, rounds=25, partitions=2)


async def test_a_topic_created_again_has_no_offsets_of_the_deleted_one(tmp_path: Path) -> None:
    async with one_broker(tmp_path) as addresses:
        await delete_and_create_again(addresses, rounds=25, through=addresses[0])
