"""``enqueue(..., partition=P)`` (the CLI's ``produce --partition``) sends to P whatever the key
says; a partition the topic does not have is refused before anything is sent."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio
import trio.testing

from consumer import open_producer
from coordinator.config import CoordinatorConfig
from simulation import open_simulated_cluster


async def test_a_record_goes_to_the_partition_named(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with open_simulated_cluster(
        tmp_path, CoordinatorConfig(initial_rebalance_delay=1.0)
    ) as cluster:
        await cluster.create_topic("a", partitions=3)
        async with open_producer("simulated:9092", connect=cluster.connect_to) as producer:
            deliveries = [
                await producer.enqueue("a", b"v%d" % i, b"k%d" % i, partition=1) for i in range(5)
            ]
            deliveries.append(await producer.enqueue("a", b"no key", partition=2))
            with pytest.raises(ValueError, match="topic a has no partition 3"):
                producer.enqueue_nowait("a", b"x", partition=3)
            placed = [await d.wait() for d in deliveries]
        assert placed == [(1, i) for i in range(5)] + [(2, 0)]
        assert [r.value for r in cluster.log.records("a", 1)] == [b"v%d" % i for i in range(5)]
        assert cluster.log.records("a", 0) == []
