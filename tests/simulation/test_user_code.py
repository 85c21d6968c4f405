"""A user's own consumer and producer (the real library) against the simulated cluster, which
serves the data plane too: a kill and a freeze on the mock clock, with exact virtual times.
docs/testing.md shows this test."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import attrs
import pytest
import trio
import trio.testing

from consumer import CommitFailed, Consumer, ConsumerSettings, open_consumer, open_producer
from coordinator.config import CoordinatorConfig
from protocol.types import TopicPartition
from simulation import SimulatedCluster, open_simulated_cluster
from transport.connect import Connector

# --- the application under test ------------------------------------------------------------


@attrs.define
class Tally:
    """What one process of the application counted, and what a test looks at."""

    counts: Counter[bytes | None] = attrs.field(factory=Counter)
    seen: set[tuple[TopicPartition, int]] = attrs.field(factory=set)
    assigned: list[tuple[float, int]] = attrs.field(factory=list)
    """(when, how many partitions it then held)"""
    failed_commits: list[tuple[float, str]] = attrs.field(factory=list)


async def count_per_key(tally: Tally, *, connect: Connector) -> None:
    """Count the records per key; commit every 50 records and whenever partitions are taken
    away, so that their next owner goes on from there."""
    settings = ConsumerSettings(
        auto_offset_reset="earliest", session_timeout=6.0, auto_commit=False
    )
    consumer: Consumer

    async def commit() -> None:
        try:
            await consumer.commit()
        except CommitFailed as exc:  # no longer ours: the next owner starts at the last commit
            tally.failed_commits.append((trio.current_time(), str(exc)))

    async def commit_on_revoke(revoked: frozenset[TopicPartition]) -> None:
        await commit()

    async def note_assignment(added: frozenset[TopicPartition]) -> None:
        tally.assigned.append((trio.current_time(), len(consumer.assignment.value)))

    async with open_consumer(
        "simulated:9092",
        "counters",
        topics=["events"],
        settings=settings,
        on_revoked=commit_on_revoke,
        on_assigned=note_assignment,
        connect=connect,
    ) as consumer:
        async for record in consumer:
            tally.counts[record.key] += 1
            tally.seen.add((record.topic_partition, record.offset))
            if len(tally.seen) % 50 == 0:
                consumer.mark(record)
                await commit()


# --- the test ---------------------------------------------------------------------------------


async def produce(cluster: SimulatedCluster, *, until: float) -> None:
    """20 records every half second, keys user-0 to user-9."""
    async with open_producer("simulated:9092", connect=cluster.connect_to) as producer:
        i = 0
        while trio.current_time() < until:
            for _ in range(20):
                await producer.enqueue("events", f"{i}".encode(), f"user-{i % 10}".encode())
                i += 1
            await trio.sleep(0.5)


async def test_a_users_consumer_loses_nothing_through_a_kill_and_a_freeze(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    config = CoordinatorConfig(initial_rebalance_delay=1.0)
    async with open_simulated_cluster(tmp_path, config) as cluster:
        await cluster.create_topic("events", partitions=4)
        a, b, b2 = Tally(), Tally(), Tally()
        process_a = cluster.start_process("a", count_per_key, a)
        process_b = cluster.start_process("b", count_per_key, b)
        cluster.nursery.start_soon(lambda: produce(cluster, until=30.0))

        await trio.sleep(5.0)
        await process_b.kill()  # at 5 s: a takes b's partitions
        await trio.sleep(5.0)
        cluster.start_process("b", count_per_key, b2)  # at 10 s: a new b joins
        await trio.sleep(5.0)
        process_a.freeze(10.0)  # from 15 s to 25 s: longer than the session timeout
        await trio.sleep(20.0)

        # b died at 5 s: the coordinator read its end of stream and gave a everything at once;
        # the new b joined at 10 s and got half; a froze at 15 s, its lease ran out at 18.1 s
        # (T after the last answer the coordinator had acknowledged), so its commit from
        # on_revoked went unanswered (5 s request timeout); the coordinator gave its partitions
        # to b at 22.5 s, and a, thawed at 25 s, joined again at once.
        assert a.assigned == [(1.0, 2), (5.0, 4), (25.0, 2)]
        assert b.assigned == [(1.0, 2)]
        assert b2.assigned == [(10.0, 2), (22.5, 4)]
        ((failed_at, why),) = a.failed_commits
        assert failed_at == pytest.approx(23.1)
        assert why == "no answer in time"

        stored = {
            (TopicPartition(topic="events", partition=p), r.offset)
            for p in range(4)
            for r in cluster.log.records("events", p)
        }
        assert len(stored) == 20 * 60  # 30 s of production
        assert a.seen | b.seen | b2.seen == stored  # nothing lost
        # and here nothing twice: each process had committed all it counted when it lost
        # its partitions (at least once allows repeats; this schedule happens to have none)
        total = a.counts + b.counts + b2.counts
        assert total == {f"user-{k}".encode(): 120 for k in range(10)}
        await process_a.kill()
        await cluster.processes["b"].kill()
