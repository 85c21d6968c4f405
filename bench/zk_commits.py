"""Offset commits per second into ZooKeeper through the coordinator's committer, next to raw
kazoo transactions of the same size measured in the same run on the same server.

* committer: ``OffsetKeeper.accept`` of 100 new offsets (one group, 100 partitions of a topic),
  then ``OffsetKeeper.flush``, which writes them as one office-checked transaction through
  ``ZooKeeperStore.commit_offsets`` (100 ``set_data`` plus the two checks that the office still
  holds), awaited from trio.
* raw kazoo: a ``KazooClient`` in a worker thread committing transactions of 100 ``set_data``
  on 100 existing nodes back to back, the fastest a Python client gets with no trio, no office
  check and no bookkeeping.

The two alternate (raw, committer, raw, committer, ...) so that a busy neighbour hurts both; the
figure is the median round's rate. ZooKeeper is a standalone server with fsync on.

    python -m bench.zk_commits [--quick] [--work-dir DIR]
"""

from __future__ import annotations

import shutil
import statistics
import time
from pathlib import Path

import trio

from bench.harness import (
    bench_arguments,
    run,
    work_area,
)
from bench.measure import figure
from coordinator.offsets import OffsetKeeper
from launch.zookeeper import open_ensemble
from protocol.types import TopicPartition
from store.kazoo_bridge import blocking_client
from store.zookeeper import open_zookeeper_store

BENCHMARK = "zk_commits"
BATCH = 100
GROUP = "billing"


async def committer_rate(hosts: str, commits: int) -> float:
    """Offsets per second through ``OffsetKeeper.accept`` + ``flush``, ``commits`` times."""
    async with open_zookeeper_store(hosts) as store:
        epoch = await store.take_slot(1, 0, 1)  # the one slot: the office of every group
        await store.create_topic("orders", (1,) * BATCH)  # offsets name the topic's id
        keeper = OffsetKeeper(store=store, epoch=epoch, commit_interval=1.0, retry_backoff=0.2)
        partitions = [TopicPartition(topic="orders", partition=p) for p in range(BATCH)]

        async def commit(offset: int) -> None:
            await keeper.accept(GROUP, 1, dict.fromkeys(partitions, offset), monotonic=True)
            await keeper.flush()

        await commit(0)  # creates the offset nodes; later commits only set them
        start = trio.current_time()
        for offset in range(1, commits + 1):
            await commit(offset)
        return commits * BATCH / (trio.current_time() - start)


def raw_rate(hosts: str, commits: int) -> float:
    """Offsets per second as raw kazoo transactions of BATCH ``set_data`` (blocking; a thread)."""
    servers, _, chroot = hosts.partition("/")
    with blocking_client(servers, start_timeout=30) as client:
        base = f"/{chroot}/raw" if chroot else "/raw"
        paths = [f"{base}/{p}" for p in range(BATCH)]
        for path in paths:
            client.ensure_path(path)
        start = time.perf_counter()  # real-clock: a blocking loop in a thread, outside trio
        for i in range(commits):
            tx = client.transaction()
            value = b'{"generation":1,"offset":%d}' % i
            for path in paths:
                tx.set_data(path, value)
            results = tx.commit()
            assert not any(isinstance(r, Exception) for r in results), results
        return commits * BATCH / (time.perf_counter() - start)  # real-clock: as above


async def bench(commits: int, rounds: int, work_dir: Path) -> None:
    shutil.rmtree(work_dir / "zookeeper", ignore_errors=True)  # a fresh ensemble, fresh chroots
    with open_ensemble(1, base_dir=work_dir / "zookeeper") as ensemble:
        raw: list[float] = []
        ours: list[float] = []
        limiter = trio.CapacityLimiter(1)
        for round_ in range(rounds):
            raw.append(
                await trio.to_thread.run_sync(
                    raw_rate, f"{ensemble.hosts}/raw{round_}", commits, limiter=limiter
                )
            )
            ours.append(await committer_rate(f"{ensemble.hosts}/committer{round_}", commits))
        ours_rate, raw_median = statistics.median(ours), statistics.median(raw)
        extra = {"batch": BATCH, "commits": commits, "rounds": rounds}
        figure(BENCHMARK, "offsets_per_s", ours_rate, "offsets/s", raw_median, **extra)
        figure(
            BENCHMARK,
            "commits_per_s",
            ours_rate / BATCH,
            "transactions/s",
            raw_median / BATCH,
            **extra,
        )


def main() -> None:
    args = bench_arguments(__doc__.splitlines()[0]).parse_args()
    commits, rounds = (100, 1) if args.quick else (1000, 5)
    with work_area(args.work_dir) as work_dir:
        run(lambda: bench(commits, rounds, work_dir))


if __name__ == "__main__":
    main()
