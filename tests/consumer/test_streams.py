"""A stream hands out fetched record batches lazily: record by record, or a batch at a time
through ``RecordStream.batches()``, with the same rule for what counts as consumed."""

from __future__ import annotations

from consumer import ConsumerBatch, RecordStream
from consumer.streams import PartitionClaim
from protocol.batches import build_batch, read_batches
from protocol.types import TopicPartition

TP = TopicPartition(topic="t", partition=0)


def batch(claim: PartitionClaim, base: int, count: int, first: int | None = None) -> ConsumerBatch:
    (received,) = read_batches(
        build_batch(
            [b"v%d" % o for o in range(base, base + count)],
            [None if o % 2 else b"k%d" % o for o in range(base, base + count)],
            [1000 + o for o in range(base, base + count)],
            base_offset=base,
        )
    )
    return ConsumerBatch(
        topic="t", partition=0, batch=received, first_offset=first or base, claim=claim
    )


async def test_records_and_batches_come_from_the_same_buffer_and_finish_what_came_before() -> None:
    claim = PartitionClaim(partition=TP, generation=1, broker_id=0, position=3, consumed=3)
    stream = RecordStream(index=0, topic="t")
    # a fetch from offset 3 answers the whole batch holding it: [0, 5), then [5, 10)
    assert await stream._put(claim, [batch(claim, 0, 5, first=3), batch(claim, 5, 5)])

    record = await stream.__anext__()
    assert (record.offset, record.key, record.value, record.timestamp_ms) == (3, None, b"v3", 1003)
    assert claim.consumed == 3  # held, not finished
    rest = await stream.next_batch()
    assert rest is not None
    assert (list(rest.offsets), rest.keys(), rest.values()) == ([4], [b"k4"], [b"v4"])
    assert claim.consumed == 4  # asking for more finished record 3
    second = await stream.next_batch()
    assert second is not None
    assert claim.consumed == 5  # and the batch before
    assert list(second.offsets) == [5, 6, 7, 8, 9]
    assert second.keys() == [None, b"k6", None, b"k8", None]
    assert second.values() == [b"v5", b"v6", b"v7", b"v8", b"v9"]
    assert second.timestamps() == [1005, 1006, 1007, 1008, 1009]
    second.finish(7)
    assert claim.consumed == 8

    stream.close()
    assert await stream.next_batch() is None
    assert claim.consumed == 10  # the last batch handed out is finished by asking again


async def test_a_stopped_partitions_batches_are_not_handed_out() -> None:
    stopped = PartitionClaim(partition=TP, generation=1, broker_id=0, position=0, consumed=0)
    kept = PartitionClaim(
        partition=TopicPartition(topic="t", partition=1),
        generation=1,
        broker_id=0,
        position=0,
        consumed=0,
    )
    stream = RecordStream(index=0, topic="t", max_buffered=100)
    assert await stream._put(stopped, [batch(stopped, 0, 3)])
    assert await stream._put(kept, [batch(kept, 0, 2)])
    stopped.active = False
    stream.drop_inactive()
    got = await stream.next_batch()
    assert got is not None and got.values() == [b"v0", b"v1"] and got._claim is kept
    assert not await stream._put(stopped, [batch(stopped, 3, 1)])
