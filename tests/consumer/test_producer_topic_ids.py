"""The producer writes to the incarnation of a topic it learned (SPEC.md §11.12): its records
waiting for a topic deleted and created again meanwhile fail with ``TopicRecreated``, and are
written neither to the new topic nor to the deleted one; the records sent after go to the new
one."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio
import trio.testing

from consumer import ProducerConfig, TopicRecreated, open_producer
from coordinator.config import CoordinatorConfig
from protocol import ErrorCode
from protocol.types import TopicPartition
from simulation import open_simulated_cluster

CONFIG = CoordinatorConfig(initial_rebalance_delay=1.0)
#: Long enough that the records wait in their batch while the test re-creates the topic.
LINGER = 60.0


async def test_records_waiting_for_a_recreated_topic_fail_and_the_next_go_to_the_new_one(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with open_simulated_cluster(tmp_path, CONFIG) as cluster:
        await cluster.create_topic("t", partitions=2)
        old = (await cluster.store.topics())["t"].topic_id
        config = ProducerConfig(linger=LINGER, delivery_timeout=120.0)
        async with open_producer("b:1", connect=cluster.connect_to, config=config) as producer:
            await producer.partitions_for("t")
            assert producer.topic_ids == {"t": old}
            waiting = [producer.enqueue_nowait("t", value) for value in (b"x", b"y")]
            assert sorted(d.partition for d in waiting) == [0, 1]
            enqueued = trio.current_time()
            new = await cluster.recreate_topic("t", partitions=2)
            for delivery in waiting:
                with pytest.raises(TopicRecreated) as failed:
                    await delivery.wait()
                assert (failed.value.topic, failed.value.old, failed.value.new) == ("t", old, new)
                assert failed.value.error_code is ErrorCode.UNKNOWN_TOPIC_ID
            # failed when the broker answered the batch, sent after its linger: not retried
            assert trio.current_time() == enqueued + LINGER
            assert [cluster.log.records("t", p) for p in (0, 1)] == [[], []]
            sent = producer.enqueue_nowait("t", b"z", b"k")
            assert producer.topic_ids == {"t": new}
            assert await sent.wait() == (sent.partition, 0)
        assert [r.value for r in cluster.log.records("t", sent.partition)] == [b"z"]
        stored = cluster.log.partitions[TopicPartition(topic="t", partition=sent.partition)]
        assert stored.topic_id == new


async def test_a_record_sent_after_the_producer_learned_the_new_id_joins_no_batch_of_the_old(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    """Metadata read for any reason that shows the topic's new id seals the batches of the old
    one: a record sent after is written to the new topic, those before fail."""
    async with open_simulated_cluster(tmp_path, CONFIG) as cluster:
        await cluster.create_topic("t", partitions=1)
        config = ProducerConfig(linger=LINGER)
        async with open_producer("b:1", connect=cluster.connect_to, config=config) as producer:
            await producer.partitions_for("t")
            before = producer.enqueue_nowait("t", b"x")
            new = await cluster.recreate_topic("t", partitions=1)
            await producer.refresh_metadata("t")
            after = producer.enqueue_nowait("t", b"y")
            with pytest.raises(TopicRecreated):
                await before.wait()
            assert await after.wait() == (0, 0)
        assert [r.value for r in cluster.log.records("t", 0)] == [b"y"]
        assert cluster.log.partitions[TopicPartition(topic="t", partition=0)].topic_id == new
