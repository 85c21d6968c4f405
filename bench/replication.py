"""What replication costs, with real processes: three brokers (``coordinator serve
--zookeeper``) on a standalone ZooKeeper, the ``consumer`` library's producer (in this process,
acks=all) writing at a steady rate into a topic of replication factor 3 (min.insync.replicas 2)
and, in the same run, into a topic of factor 1: the bare baseline, one append per record where
factor 3 makes three (the floor of the issue's target).

Per run, the two topics (PARTITIONS partitions each) are written one after the other, round
robin, RECORD_BYTES per record, for ``--seconds`` each: at ``--rate`` records/s, then as fast
as it goes:

* ``cpu_per_record``: CPU seconds of the three broker processes together (utime + stime, from
  /proc) from the first record sent to the last acknowledged, per acknowledged record, at factor
  3 against factor 1. The issue's target: a ratio of at most 3.5.
* ``throughput``: acknowledged records per second over the same span (the producer asks for
  ``--rate``: a figure below it did not keep up).
* ``produce_latency_p50`` / ``produce_latency_p99``: a record due to be sent to its
  acknowledgement (the producer's linger included), factor 3 against factor 1.
* ``max_throughput``: the same, as fast as the producer takes records (its backpressure at
  ``max_pending_records``) for ``--seconds``: acknowledged records per second at factor 3
  against factor 1, with the CPU per record and the latency p99 of that run beside it.

And ``follower_catch_up``: a topic of one partition at factor 3, a follower of it stopped
(SIGSTOP) for ``--stop`` seconds while a producer at acks=1 sends as fast as it can (the
leader's accept rate: records it appended per second), then continued (SIGCONT) as the writes
stop: the records the follower appended per second until its log ends where the leader's does,
read from its segment files (it appends the leader's batches as they are). The target: at least
the leader's accept rate (ratio >= 1). The stop is shorter than the brokers' ZooKeeper session
and the leader's replica lag (10 s), so the follower stays registered and in sync: what is
measured is its fetching, not its return to the cluster.

    python -m bench.replication [--quick] [--work-dir DIR] [--runs N] [--rate R] [--seconds S]
        [--stop S]
"""

from __future__ import annotations

import contextlib
import math
import shutil
import signal
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import attrs
import trio

from bench import failover
from bench.harness import ServerProcess, bench_arguments, run, work_area
from bench.measure import figure, micros_per, percentile, reporting_errors, rounded
from broker.data_plane import log_directory
from consumer import Delivery, ProduceError, Producer, ProducerConfig, open_producer
from consumer.admin import AdminError, open_admin
from consumer.leaders import Leader
from launch.cluster import eventually
from launch.zookeeper import open_ensemble
from protocol import RemoteProtocolError
from protocol.batches import walk_batches
from protocol.types import TopicPartition

BENCHMARK = "replication"
DEADLINE = 90.0
BROKERS = failover.BROKERS
PARTITIONS = 3
RECORD_BYTES = 100
#: Longer than any stop of a follower here, so that a stopped follower stays registered.
ZK_SESSION = 10.0
#: How often the producer is handed the records due (a sleep per record would cost more CPU
#: than the record).
TICK = 0.005
#: As fast as it goes: records handed to the producer between two checkpoints.
FLOOD_STEP = 200
CATCH_UP_TOPIC = "catch-up"
TARGET_CPU_RATIO = 3.5


@attrs.frozen(kw_only=True)
class Broker:
    broker_id: int
    server: ServerProcess
    data_dir: Path

    @property
    def address(self) -> tuple[str, int]:
        return (self.server.host, self.server.port)


@contextlib.asynccontextmanager
async def open_brokers(hosts: str, work_dir: Path) -> AsyncIterator[list[Broker]]:
    async with failover.open_brokers(hosts, work_dir, session=ZK_SESSION) as started:
        yield [
            Broker(broker_id=b, server=server, data_dir=work_dir / f"broker{b}")
            for b, server in started
        ]


async def leaders(brokers: Sequence[Broker], topic: str) -> dict[TopicPartition, Leader]:
    """The topic's leaders as the first broker that answers reports them."""
    for broker in brokers:
        found: list[dict[TopicPartition, Leader]] = []
        try:
            with trio.fail_after(5):
                async with open_admin([broker.address]) as admin:
                    found.append(dict((await admin.listing([topic])).leaders))
        except* (OSError, AdminError, trio.TooSlowError):
            pass
        if found:
            return found[0]
    return {}


async def create_in_sync(
    brokers: Sequence[Broker], topic: str, partitions: int, factor: int
) -> None:
    """Create ``topic`` and wait until every partition has a leader and all its replicas in
    sync, as every broker sees it (each learns of it through ZooKeeper)."""
    configs = {"min.insync.replicas": "2"} if factor > 1 else {}
    async with open_admin([b.address for b in brokers]) as admin:
        await admin.create_topic(topic, partitions, configs=configs, replication_factor=factor)

    async def in_sync() -> bool:
        for broker in brokers:
            found = await leaders([broker], topic)
            if len(found) != partitions or not all(
                leader.broker_id >= 0 and len(leader.isr) == factor for leader in found.values()
            ):
                return False
        return True

    await eventually(in_sync, deadline=DEADLINE)


def cpu_seconds(brokers: Sequence[Broker]) -> float:
    return sum(b.server.cpu_seconds() for b in brokers)


@attrs.frozen(kw_only=True)
class Written:
    factor: int
    acknowledged: int
    failed: int
    wall: float
    cpu: float
    latencies: list[float]

    @property
    def throughput(self) -> float:
        return self.acknowledged / self.wall if self.wall > 0 else math.nan


async def watch(
    deliveries: trio.MemoryReceiveChannel[tuple[float, Delivery]],
    latencies: list[float],
    failed: list[BaseException],
) -> None:
    """One partition's deliveries in the order they were sent (which is the order a partition
    acknowledges them), each timed from its hand-over to its acknowledgement."""
    async for sent, delivery in deliveries:
        try:
            await delivery.wait()
        except ProduceError as exc:
            failed.append(exc)
        else:
            latencies.append(trio.current_time() - sent)


async def write(
    producer: Producer,
    brokers: Sequence[Broker],
    topic: str,
    factor: int,
    rate: float | None,
    seconds: float,
) -> Written:
    """``rate`` records/s (None: as fast as the producer takes them) for ``seconds``, round
    robin over the topic's partitions, until every one is acknowledged; the brokers' CPU over
    that span. A record's latency runs from when it was due (at a steady rate) or handed over (as
    fast as it goes) to its acknowledgement."""
    value = b"x" * RECORD_BYTES
    for partition in range(PARTITIONS):  # metadata, connections and leaders known first
        await producer.send_and_wait(topic, value, partition=partition)
    latencies: list[float] = []
    failed: list[BaseException] = []
    cpu0 = cpu_seconds(brokers)
    start = trio.current_time()
    async with trio.open_nursery() as nursery:
        senders = []
        for _ in range(PARTITIONS):
            send, receive = trio.open_memory_channel[tuple[float, Delivery]](math.inf)
            senders.append(send)
            nursery.start_soon(watch, receive, latencies, failed)
        sent = 0
        tick = start
        while tick < start + seconds:
            if rate is None:
                due = sent + FLOOD_STEP
            else:
                due = min(round((tick - start) * rate), round(seconds * rate))
            while sent < due:
                partition = sent % PARTITIONS
                delivery = await producer.enqueue(topic, value, partition=partition)
                senders[partition].send_nowait((tick, delivery))
                sent += 1
            if rate is None:
                await trio.sleep(0)
                tick = trio.current_time()
            else:
                tick += TICK
                await trio.sleep_until(tick)
        for send in senders:
            send.close()
    wall = trio.current_time() - start
    return Written(
        factor=factor,
        acknowledged=len(latencies),
        failed=len(failed),
        wall=wall,
        cpu=cpu_seconds(brokers) - cpu0,
        latencies=latencies,
    )


@attrs.define
class LogEnd:
    """A replica's log end, read from its segment files as it grows: each read walks only the
    bytes appended since the last (a torn last batch is read again next time)."""

    directory: Path
    segment: str = ""
    position: int = 0
    end: int = 0

    def read(self) -> int:
        for path in sorted(self.directory.glob("*.log")):
            if path.name < self.segment:
                continue
            if path.name > self.segment:
                self.segment, self.position = path.name, 0
            with path.open("rb") as file:
                file.seek(self.position)
                data = file.read()
            try:
                for _, size, base, count, _ in walk_batches(data, check_crc=False):
                    self.position += size
                    self.end = base + count
            except RemoteProtocolError:
                pass  # a batch still being written
        return self.end


@attrs.frozen(kw_only=True)
class CatchUp:
    accepted: int
    accept_wall: float
    behind: int
    catch_up_wall: float

    @property
    def accept_rate(self) -> float:
        return self.accepted / self.accept_wall

    @property
    def catch_up_rate(self) -> float:
        return self.behind / self.catch_up_wall if self.catch_up_wall > 0 else math.inf


async def catch_up(brokers: Sequence[Broker], stop_seconds: float) -> CatchUp:
    await create_in_sync(brokers, CATCH_UP_TOPIC, 1, 3)
    tp = TopicPartition(topic=CATCH_UP_TOPIC, partition=0)
    leader = (await leaders(brokers, CATCH_UP_TOPIC))[tp]
    follower = next(b for b in brokers if b.broker_id != leader.broker_id)
    follower_log = LogEnd(directory=log_directory(follower.data_dir) / f"{tp.topic}-{tp.partition}")
    value = b"x" * RECORD_BYTES
    config = ProducerConfig(acks=1)
    async with open_producer([b.address for b in brokers], config=config) as producer:
        await producer.send_and_wait(CATCH_UP_TOPIC, value, partition=0)

        async def followed() -> bool:
            return follower_log.read() >= 1

        await eventually(followed, deadline=DEADLINE)
        follower.server.process.send_signal(signal.SIGSTOP)
        try:
            stopped_at = follower_log.read()
            start = trio.current_time()
            deliveries: list[Delivery] = []
            while trio.current_time() < start + stop_seconds:
                deliveries.append(await producer.enqueue(CATCH_UP_TOPIC, value, partition=0))
                if len(deliveries) % 100 == 0:
                    await trio.sleep(0)
            await producer.flush()
            accept_wall = trio.current_time() - start
            acknowledged = [d for d in deliveries if d.error is None]
            leader_end = max(d.offset for d in acknowledged) + 1
        finally:
            follower.server.process.send_signal(signal.SIGCONT)
        resumed = trio.current_time()

        with trio.fail_after(DEADLINE):
            while follower_log.read() < leader_end:
                await trio.sleep(0.005)  # the catch-up takes a fraction of a second: look often
        return CatchUp(
            accepted=len(acknowledged),
            accept_wall=accept_wall,
            behind=leader_end - stopped_at,
            catch_up_wall=trio.current_time() - resumed,
        )


def ms(seconds: float) -> float:
    return seconds * 1000


def report(replicated: Written, bare: Written, run_: int, rate: float) -> None:
    extra: dict[str, Any] = {
        "run": run_,
        "brokers": BROKERS,
        "partitions": PARTITIONS,
        "record_bytes": RECORD_BYTES,
        "rate_asked": rate,
        "acks": "all",
        "min_insync_replicas": 2,
        "baseline_is": "factor 1",
        "acknowledged": replicated.acknowledged,
        "acknowledged_baseline": bare.acknowledged,
        "failed": replicated.failed + bare.failed,
    }
    cpu = micros_per(replicated.cpu, replicated.acknowledged)
    figure(
        BENCHMARK,
        "cpu_per_record",
        cpu,
        "us",
        micros_per(bare.cpu, bare.acknowledged),
        target_ratio=TARGET_CPU_RATIO,
        cpu_s=round(replicated.cpu, 3),
        cpu_s_baseline=round(bare.cpu, 3),
        **extra,
    )
    figure(BENCHMARK, "throughput", replicated.throughput, "records/s", bare.throughput, **extra)
    for q in (50, 99):
        figure(
            BENCHMARK,
            f"produce_latency_p{q}",
            ms(percentile(replicated.latencies, q)),
            "ms",
            ms(percentile(bare.latencies, q)),
            **extra,
        )


def report_flood(replicated: Written, bare: Written, run_: int) -> None:
    figure(
        BENCHMARK,
        "max_throughput",
        replicated.throughput,
        "records/s",
        bare.throughput,
        baseline_is="factor 1",
        cpu_per_record_us=rounded(micros_per(replicated.cpu, replicated.acknowledged)),
        cpu_per_record_us_baseline=rounded(micros_per(bare.cpu, bare.acknowledged)),
        produce_latency_p99_ms=rounded(ms(percentile(replicated.latencies, 99))),
        produce_latency_p99_ms_baseline=rounded(ms(percentile(bare.latencies, 99))),
        acknowledged=replicated.acknowledged,
        acknowledged_baseline=bare.acknowledged,
        failed=replicated.failed + bare.failed,
        run=run_,
        brokers=BROKERS,
        partitions=PARTITIONS,
        record_bytes=RECORD_BYTES,
        acks="all",
    )


def report_catch_up(result: CatchUp, run_: int, stop_seconds: float) -> None:
    figure(
        BENCHMARK,
        "follower_catch_up",
        result.catch_up_rate,
        "records/s",
        result.accept_rate,
        baseline_is="the leader's accept rate while the follower was stopped",
        target_ratio_at_least=1.0,
        stopped_s=stop_seconds,
        behind=result.behind,
        catch_up_ms=round(ms(result.catch_up_wall), 1),
        accepted=result.accepted,
        record_bytes=RECORD_BYTES,
        acks=1,
        run=run_,
    )


async def bench(
    runs: int, rate: float, seconds: float, stop_seconds: float, work_dir: Path
) -> None:
    shutil.rmtree(work_dir / "zookeeper", ignore_errors=True)
    with open_ensemble(1, base_dir=work_dir / "zookeeper") as ensemble:
        for run_ in range(runs):
            hosts = f"{ensemble.hosts}/replication-{run_}"
            async with open_brokers(hosts, work_dir / f"run{run_}") as brokers:
                with reporting_errors(BENCHMARK, "cpu_per_record", run=run_):
                    await create_in_sync(brokers, "factor-1", PARTITIONS, 1)
                    await create_in_sync(brokers, "factor-3", PARTITIONS, 3)
                    async with open_producer([b.address for b in brokers]) as producer:
                        written: dict[tuple[float | None, int], Written] = {}
                        for pace in (rate, None):
                            for factor in (1, 3):
                                topic = f"factor-{factor}"
                                written[(pace, factor)] = await write(
                                    producer, brokers, topic, factor, pace, seconds
                                )
                    report(written[(rate, 3)], written[(rate, 1)], run_, rate)
                    report_flood(written[(None, 3)], written[(None, 1)], run_)
                with reporting_errors(BENCHMARK, "follower_catch_up", run=run_):
                    report_catch_up(await catch_up(brokers, stop_seconds), run_, stop_seconds)


def main() -> None:
    parser = bench_arguments(__doc__.splitlines()[0])
    parser.sized("--runs", quick=1, full=3, kind=int, help="runs, each on fresh brokers")
    parser.sized("--rate", quick=300.0, full=2000.0, help="records/s the producer asks")
    parser.sized("--seconds", quick=2.0, full=10.0, help="seconds of writing per topic")
    parser.sized("--stop", quick=1.0, full=3.0, help="seconds the follower is stopped")
    args = parser.parse()
    with work_area(args.work_dir) as work_dir:
        run(lambda: bench(args.runs, args.rate, args.seconds, args.stop, work_dir))


if __name__ == "__main__":
    main()
