"""What an operator scrapes: the broker's Prometheus metrics.

Events are counted as they happen, through the coordinator's one observer
(coordinator/observer.py), the data plane's produce and fetch, the connection handler and the
store wrapper below. What is a state rather than an event (groups by state, members, log ends,
lag) is read when scraped (:meth:`BrokerMetrics.refresh`), so that the hot paths pay for
counting only.

Label cardinality stays bounded: no label names a member or a connection; groups are bounded by
the coordinator's limits (docs/limits.md), causes and states by their enums, and per-partition
lag, which could multiply groups by partitions, is off unless asked for and capped at
``partition_lag_max_series`` series (the series left out are counted).
"""

from __future__ import annotations

import collections
import logging
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from typing import Any, TypeVar

import attrs
import trio
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from broker.offices import distinct
from coordinator.group_coordinator import GroupCoordinator
from coordinator.loop_lag import LoopLag
from protocol.batches import records_from_batches
from protocol.types import BrokerInfo, TopicPartition
from statemachine import group as group_sm
from statemachine.consumer_group import MemberStatistics
from statemachine.member import DeathCause
from store import (
    Assignment,
    ForwardingStore,
    GroupRecord,
    OffsetBatch,
    StoreError,
    TopicPlacement,
    TopicStore,
)

log = logging.getLogger(__name__)

#: How the seeds' failure causes read on a dashboard: a clean close, a silent member (missed
#: Pings or a lapsed lease), a broken connection, and the rarer ones.
DEATH_CAUSES: Mapping[DeathCause, str] = {
    DeathCause.CONNECTION_CLOSED: "closed",
    DeathCause.CONNECTION_BROKEN: "broken",
    DeathCause.MISSED_DEADLINES: "silent",
    DeathCause.LEASE_LAPSED: "silent",
    DeathCause.REFUSED_HANDOVERS: "refused_handover",
    DeathCause.PROTOCOL_ERROR: "protocol_error",
    DeathCause.FENCED: "fenced",
    DeathCause.SHED: "shed",
}

#: What started a rebalance: the first input since the group was last Stable that asked for one.
REBALANCE_CAUSES = ("join", "leave", "death", "topic_change", "recovery")

#: Rebalances kept for the status page.
HISTORY = 20

_PING_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
_REBALANCE_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
_STORE_BUCKETS = (0.0005, 0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 5.0)
_BATCH_BUCKETS = (1, 2, 5, 10, 25, 50, 100, 250, 500, 1000, 5000)
_LAG_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0)

#: How often the store is probed (:func:`probe_store`).
STORE_PROBE_INTERVAL = 1.0


@attrs.frozen(kw_only=True)
class MetricsConfig:
    #: Port of the metrics endpoint and status page; None: none.
    port: int | None = None
    #: The endpoint listens here only: it is unauthenticated, so it stays on the loopback unless
    #: the operator says otherwise (README: Metrics).
    host: str = "127.0.0.1"
    #: One lag series per group and partition, on top of the per-group sum and maximum.
    partition_lag: bool = False
    #: At most this many per-partition lag series per scrape (records and seconds count one).
    partition_lag_max_series: int = 1000


@attrs.frozen(kw_only=True)
class Rebalance:
    """One completed rebalance, for the status page."""

    group_id: str
    cause: str
    generation: int
    duration: float
    #: Wall-clock time it completed (time.time()).
    completed_at: float


@attrs.define
class _Pending:
    cause: str | None = None
    began_at: float | None = None
    generation: int = -1


@attrs.frozen(kw_only=True)
class PartitionLag:
    group_id: str
    tp: TopicPartition
    records: int
    #: The group's offset on the partition, accepted (written or not), and the partition's end:
    #: ``records`` is how far apart they are.
    offset: int
    end: int
    #: The offset the store holds (None: none yet); ``offset`` is ahead of it until written.
    committed: int | None = None
    #: Age of the oldest record not yet consumed; 0 with no lag; None where the record's
    #: timestamp is not readable here (the partition is on another broker).
    seconds: float | None


@attrs.frozen(kw_only=True)
class GroupView:
    group_id: str
    state: str
    generation: int
    #: As the group's one view shows them (``ConsumerGroup.statistics``), live and away.
    members: tuple[MemberStatistics, ...]
    lag: tuple[PartitionLag, ...]

    @property
    def lag_records_sum(self) -> int:
        return sum(p.records for p in self.lag)

    @property
    def lag_records_max(self) -> int:
        return max((p.records for p in self.lag), default=0)

    @property
    def lag_seconds_max(self) -> float:
        return max((p.seconds for p in self.lag if p.seconds is not None), default=0.0)


@attrs.frozen(kw_only=True)
class LogSize:
    """What one partition's log on this broker holds: its segments' bytes, and the records readers
    may see (the offsets from the log's start to its high watermark, which are dense)."""

    bytes: int
    records: int


@attrs.frozen(kw_only=True)
class Snapshot:
    """What the broker knows at one scrape: the page and the gauges render the same one."""

    broker: BrokerInfo
    coordinator_id: int | None
    brokers: tuple[BrokerInfo, ...]
    topics: Mapping[str, TopicPlacement]
    log_ends: Mapping[TopicPartition, int]
    groups: tuple[GroupView, ...]
    rebalances: tuple[Rebalance, ...]
    taken_at: float
    #: The coordinator slots this broker holds (docs/design.md#coordinator-slots).
    slots: tuple[int, ...] = ()
    #: The partitions whose logs are on this broker, by their size.
    log_sizes: Mapping[TopicPartition, LogSize] = attrs.field(factory=dict)
    health: Health | None = None


@attrs.frozen(kw_only=True)
class Health:
    """Whether the broker keeps up (docs/design.md#a-broker-that-falls-behind): its loop's lag,
    how long its store takes to answer, and what it refused or forgave for being behind."""

    loop_lag: float
    """Seconds, the latest measure."""
    worst_loop_lag: float
    """Seconds, the longest in the last minute (0 when never behind)."""
    store_read: float | None
    """Seconds the latest probe of the store took (None: none answered yet)."""
    shed: int
    """Requests refused at the door (BROKER_BUSY) since the broker started."""
    pings_excused: int
    """Ping misses not counted because the broker was behind, since it started."""


#: A partition's record at an offset, read from this broker's log: its timestamp in ms, or None.
ReadTimestamp = Callable[[TopicPartition, int], Any]


@attrs.define(eq=False, slots=False)  # the metrics are attributes made after init
class BrokerMetrics:
    """The broker's registry, and the observer the coordinator calls."""

    config: MetricsConfig = attrs.field(factory=MetricsConfig)
    registry: CollectorRegistry = attrs.field(factory=CollectorRegistry)
    rebalances: collections.deque[Rebalance] = attrs.field(
        factory=lambda: collections.deque(maxlen=HISTORY)
    )
    _pending: dict[str, _Pending] = attrs.field(factory=dict)
    snapshot: Snapshot | None = None
    #: Seconds the latest probe of the store took (``probe_store``).
    store_read: float | None = None
    #: Requests refused at the door, and Ping misses excused, since the broker started.
    shed: int = 0
    excused: int = 0

    def __attrs_post_init__(self) -> None:
        r = self.registry
        self.rebalance_count = Counter(
            "coordinator_rebalances",
            "Completed rebalances, by what started them",
            ["cause"],
            registry=r,
        )
        self.rebalance_seconds = Histogram(
            "coordinator_rebalance_duration_seconds",
            "From a rebalance's first attempt to its completion, by what started it",
            ["cause"],
            buckets=_REBALANCE_BUCKETS,
            registry=r,
        )
        self.attempts_failed = Counter(
            "coordinator_rebalance_attempts_failed",
            "Rebalance attempts abandoned and retried after a backoff",
            registry=r,
        )
        self.deaths = Counter(
            "coordinator_member_deaths", "Members declared dead, by cause", ["cause"], registry=r
        )
        self.leaves = Counter("coordinator_member_leaves", "Members that left", registry=r)
        self.ping_seconds = Histogram(
            "coordinator_ping_round_trip_seconds",
            "From a Ping sent to its answer",
            buckets=_PING_BUCKETS,
            registry=r,
        )
        self.pings_missed = Counter(
            "coordinator_pings_missed", "Pings whose deadline passed unanswered", registry=r
        )
        self.pings_excused = Counter(
            "coordinator_pings_excused",
            "Pings whose deadline passed unanswered while the broker's loop was behind, not "
            "counted against the member",
            registry=r,
        )
        self.loop_lag_seconds = Histogram(
            "broker_loop_lag_seconds",
            "How late the event loop woke a task that slept a tenth of a second",
            buckets=_LAG_BUCKETS,
            registry=r,
        )
        self.loop_lag_latest = Gauge(
            "broker_loop_lag_latest_seconds", "The event loop's latest measured lag", registry=r
        )
        self.store_probe_seconds = Histogram(
            "broker_store_probe_seconds",
            "A small read of the metadata store, made every second whatever the broker does",
            buckets=_STORE_BUCKETS,
            registry=r,
        )
        self.store_probe_errors = Counter(
            "broker_store_probe_errors", "Probes of the metadata store that failed", registry=r
        )
        self.commit_seconds = Histogram(
            "coordinator_offset_commit_seconds",
            "The committer's writes of accepted offsets to the store",
            buckets=_STORE_BUCKETS,
            registry=r,
        )
        self.commit_batch = Histogram(
            "coordinator_offset_commit_batch_offsets",
            "Offsets in one committer write",
            buckets=_BATCH_BUCKETS,
            registry=r,
        )
        self.store_seconds = Histogram(
            "coordinator_store_operation_seconds",
            "Metadata store operations, by operation",
            ["operation"],
            buckets=_STORE_BUCKETS,
            registry=r,
        )
        self.store_errors = Counter(
            "coordinator_store_errors",
            "Failed metadata store operations",
            ["operation"],
            registry=r,
        )
        self.connections = Gauge("broker_connections", "Open client connections", registry=r)
        self.requests_shed = Counter(
            "broker_requests_shed",
            "Requests refused at the door while the broker's loop lagged (BROKER_BUSY)",
            registry=r,
        )
        self.produced_records = Counter(
            "broker_produced_records", "Records appended, by topic", ["topic"], registry=r
        )
        self.produced_bytes = Counter(
            "broker_produced_bytes", "Batch bytes appended, by topic", ["topic"], registry=r
        )
        self.fetched_records = Counter(
            "broker_fetched_records", "Records fetched, by topic", ["topic"], registry=r
        )
        self.fetched_bytes = Counter(
            "broker_fetched_bytes", "Batch bytes fetched, by topic", ["topic"], registry=r
        )
        # Every cause's series exists from the start, so that rate() sees a first increase.
        for cause in REBALANCE_CAUSES:
            self.rebalance_count.labels(cause)
            self.rebalance_seconds.labels(cause)
        for name in set(DEATH_CAUSES.values()):
            self.deaths.labels(name)
        r.register(_SnapshotCollector(self))

    # --- the coordinator's observer (coordinator/observer.py) ------------------------------

    def group_event(
        self, group_id: str, event: object, now: float, death: DeathCause | None = None
    ) -> None:
        pending = self._pending.get(group_id)
        if pending is None:
            pending = self._pending[group_id] = _Pending()
        match event:
            case group_sm.MemberJoined() | group_sm.MemberReplaced():
                pending.cause = pending.cause or "join"
            case group_sm.MemberDeparted(remaining=remaining):
                # None: a static member away too long, which counts as a death.
                cause = "leave" if death is DeathCause.LEFT else "death"
                pending.cause = pending.cause or cause
                if remaining == 0:  # nothing left to rebalance; the group may be forgotten
                    del self._pending[group_id]
            case group_sm.TopicsChanged():
                pending.cause = pending.cause or "topic_change"
            case group_sm.Recovered():
                pending.cause = pending.cause or "recovery"
            case group_sm.AttemptBegan(generation=generation):
                pending.generation = generation
                if pending.began_at is None:
                    pending.began_at = now
            case group_sm.AttemptFailed():
                self.attempts_failed.inc()
            case group_sm.AttemptCompleted():
                cause = pending.cause or "join"
                duration = now - (pending.began_at if pending.began_at is not None else now)
                self.rebalance_count.labels(cause).inc()
                self.rebalance_seconds.labels(cause).observe(duration)
                self.rebalances.append(
                    Rebalance(
                        group_id=group_id,
                        cause=cause,
                        generation=pending.generation,
                        duration=duration,
                        completed_at=time.time(),  # real-clock: shown to a person
                    )
                )
                del self._pending[group_id]
            case group_sm.AttemptNotNeeded() | group_sm.RecordAdopted() | group_sm.Deleted():
                del self._pending[group_id]

    def member_died(self, group_id: str, cause: DeathCause) -> None:
        if cause is DeathCause.LEFT:
            self.leaves.inc()
        else:
            self.deaths.labels(DEATH_CAUSES[cause]).inc()

    def ping_answered(self, round_trip: float) -> None:
        self.ping_seconds.observe(round_trip)

    def ping_missed(self) -> None:
        self.pings_missed.inc()

    def ping_excused(self) -> None:
        self.excused += 1
        self.pings_excused.inc()

    def request_shed(self) -> None:
        """The door refused a request (broker/door.py)."""
        self.shed += 1
        self.requests_shed.inc()

    # --- the broker's own health --------------------------------------------------------------

    def loop_lagged(self, lag: float) -> None:
        """One measure of the loop's lag (coordinator/loop_lag.py)."""
        self.loop_lag_seconds.observe(lag)
        self.loop_lag_latest.set(lag)

    # --- the data plane ---------------------------------------------------------------------

    def produced(self, topic: str, records: int, size: int) -> None:
        self.produced_records.labels(topic).inc(records)
        self.produced_bytes.labels(topic).inc(size)

    def fetched(self, topic: str, records: int, size: int) -> None:
        self.fetched_records.labels(topic).inc(records)
        self.fetched_bytes.labels(topic).inc(size)

    # --- scraping ---------------------------------------------------------------------------

    def exposition(self) -> bytes:
        return generate_latest(self.registry)


class _SnapshotCollector(Collector):
    """The gauges read from the latest snapshot (:func:`take_snapshot`)."""

    def __init__(self, metrics: BrokerMetrics) -> None:
        self.metrics = metrics

    def collect(self) -> Iterator[GaugeMetricFamily]:
        snapshot = self.metrics.snapshot
        if snapshot is None:
            return
        config = self.metrics.config
        by_state = GaugeMetricFamily("coordinator_groups", "Groups by state", labels=["state"])
        counts = collections.Counter(g.state for g in snapshot.groups)
        for state in group_sm.GroupState:
            by_state.add_metric([state.value], counts.get(state.value, 0))
        yield by_state
        members = GaugeMetricFamily("coordinator_members", "Members with a live process")
        members.add_metric([], sum(1 for g in snapshot.groups for m in g.members if not m.away))
        yield members
        away = GaugeMetricFamily(
            "coordinator_members_away", "Static members away, waiting for a restart"
        )
        away.add_metric([], sum(1 for g in snapshot.groups for m in g.members if m.away))
        yield away
        is_coordinator = GaugeMetricFamily(
            "broker_is_coordinator", "1 while this broker coordinates any group"
        )
        is_coordinator.add_metric(
            [], 1 if snapshot.coordinator_id == snapshot.broker.broker_id else 0
        )
        yield is_coordinator
        slots = GaugeMetricFamily(
            "broker_coordinator_slots", "Coordinator slots this broker holds (groups hashed onto)"
        )
        slots.add_metric([], len(snapshot.slots))
        yield slots
        ends = GaugeMetricFamily(
            "broker_log_end_offset",
            "High watermark of each partition whose log is on this broker",
            labels=["topic", "partition"],
        )
        for tp, end in sorted(snapshot.log_ends.items()):
            ends.add_metric([tp.topic, str(tp.partition)], end)
        yield ends
        lag_sum = GaugeMetricFamily(
            "coordinator_group_lag_records_sum",
            "Records not yet consumed, summed over the group's partitions",
            labels=["group"],
        )
        lag_max = GaugeMetricFamily(
            "coordinator_group_lag_records_max",
            "Records not yet consumed, on the group's partition furthest behind",
            labels=["group"],
        )
        secs_max = GaugeMetricFamily(
            "coordinator_group_lag_seconds_max",
            "Age of the oldest record not yet consumed, over the group's partitions",
            labels=["group"],
        )
        secs_sum = GaugeMetricFamily(
            "coordinator_group_lag_seconds_sum",
            "Ages of the oldest records not yet consumed, summed over the group's partitions",
            labels=["group"],
        )
        for group in snapshot.groups:
            if not group.lag:
                continue  # no offset reported yet: its lag is unknown, not zero
            lag_sum.add_metric([group.group_id], group.lag_records_sum)
            lag_max.add_metric([group.group_id], group.lag_records_max)
            secs_max.add_metric([group.group_id], group.lag_seconds_max)
            secs_sum.add_metric(
                [group.group_id], sum(p.seconds for p in group.lag if p.seconds is not None)
            )
        yield from (lag_sum, lag_max, secs_max, secs_sum)
        if not config.partition_lag:
            return
        records = GaugeMetricFamily(
            "coordinator_partition_lag_records",
            "Records not yet consumed, per group and partition",
            labels=["group", "topic", "partition"],
        )
        seconds = GaugeMetricFamily(
            "coordinator_partition_lag_seconds",
            "Age of the oldest record not yet consumed, per group and partition",
            labels=["group", "topic", "partition"],
        )
        series = dropped = 0
        for group in snapshot.groups:
            for lag in group.lag:
                labels = [group.group_id, lag.tp.topic, str(lag.tp.partition)]
                wanted = 1 if lag.seconds is None else 2
                if series + wanted > config.partition_lag_max_series:
                    dropped += wanted
                    continue
                series += wanted
                records.add_metric(labels, lag.records)
                if lag.seconds is not None:
                    seconds.add_metric(labels, lag.seconds)
        left_out = GaugeMetricFamily(
            "coordinator_partition_lag_series_dropped",
            "Per-partition lag series left out at the last scrape by the series cap",
        )
        left_out.add_metric([], dropped)
        yield from (records, seconds, left_out)


async def take_snapshot(
    metrics: BrokerMetrics,
    broker: BrokerInfo,
    by_slot: Mapping[int, GroupCoordinator],
    store: TopicStore,
    log_ends: Mapping[TopicPartition, int],
    read_timestamp: ReadTimestamp,
    log_sizes: Mapping[TopicPartition, LogSize] | None = None,
) -> Snapshot:
    """Read what the gauges and the page show; ``read_timestamp(tp, offset)`` awaits the
    timestamp in ms of the record at ``offset`` of a partition on this broker (None if absent);
    ``by_slot``: the coordinators this broker runs, by the coordinator slot each holds (one
    coordinator may hold every slot)."""
    coordinators = distinct(by_slot)
    now_ms = time.time() * 1000  # real-clock: record timestamps are wall time
    groups: list[GroupView] = []
    if coordinators:
        brokers = coordinators[0].brokers
        topics: Mapping[str, TopicPlacement] = coordinators[0].topics
    else:
        brokers = await store.brokers()
        topics = await store.topics()
    by_group = {g: c for c in coordinators for g in c.groups}
    for group_id in sorted(by_group):
        coordinator = by_group[group_id]
        group = coordinator.groups.get(group_id)
        if group is None:
            continue
        view = await coordinator.offsets.view(group_id)
        statistics = group.statistics()
        members = [m for m in statistics.members if not m.awaiting]
        lags = []
        for tp, offset in sorted(view.accepted.items()):
            end = log_ends.get(tp)
            if end is None:
                end = _log_end(coordinator, tp)
            if end is None:
                continue
            behind = max(0, end - offset)
            seconds: float | None = 0.0
            if behind:
                ts = await read_timestamp(tp, offset) if tp in log_ends else None
                seconds = None if ts is None else max(0.0, (now_ms - ts) / 1000)
            lags.append(
                PartitionLag(
                    group_id=group_id,
                    tp=tp,
                    records=behind,
                    seconds=seconds,
                    offset=offset,
                    end=end,
                    committed=view.durable.get(tp),
                )
            )
        groups.append(
            GroupView(
                group_id=group_id,
                state=statistics.machine_state,
                generation=statistics.generation,
                members=tuple(members),
                lag=tuple(lags),
            )
        )
    # A broker alone on its store always runs its coordinator; one of a cluster that holds no
    # slot knows no single coordinator (each slot has its own).
    coordinator_id = broker.broker_id if coordinators else None
    snapshot = Snapshot(
        broker=broker,
        coordinator_id=coordinator_id,
        slots=tuple(sorted(by_slot)),
        brokers=brokers,
        topics=topics,
        log_ends=log_ends,
        groups=tuple(groups),
        rebalances=tuple(reversed(metrics.rebalances)),
        taken_at=time.time(),  # real-clock: shown to a person
        log_sizes={} if log_sizes is None else log_sizes,
        health=_health(metrics),
    )
    metrics.snapshot = snapshot
    return snapshot


def _health(metrics: BrokerMetrics) -> Health:
    lag = LoopLag.of_run()
    return Health(
        loop_lag=lag.latest,
        worst_loop_lag=lag.worst_since(trio.current_time() - 60),
        store_read=metrics.store_read,
        shed=metrics.shed,
        pings_excused=metrics.excused,
    )


def _log_end(coordinator: GroupCoordinator, tp: TopicPartition) -> int | None:
    return coordinator.log_end(tp) if coordinator.log_end is not None else None


async def first_timestamp(read: Callable[[int], Any], offset: int) -> int | None:
    """The timestamp of the record at ``offset`` in the batches ``await read(offset)`` gives."""
    data = await read(offset)
    for record in records_from_batches(data, offset, max_bytes=1):  # the first record only
        return int(record.timestamp_ms)
    return None


_Result = TypeVar("_Result")


@attrs.define(eq=False)
class TimedStore(ForwardingStore):
    """The metadata store, each operation a coordinator makes while it serves timed and its
    failures counted (the rest are start-up or admin, passed through). The coordinator's view of
    the store, so that the election keeps the store itself."""

    metrics: BrokerMetrics

    async def _timed(self, operation: str, call: Awaitable[_Result]) -> _Result:
        """``call``'s result, its time observed and its failure counted under ``operation``."""
        start = trio.current_time()
        try:
            result = await call
        except StoreError:
            self.metrics.store_errors.labels(operation).inc()
            raise
        self.metrics.store_seconds.labels(operation).observe(trio.current_time() - start)
        return result

    async def write_group(self, epoch: int, group: GroupRecord) -> None:
        await self._timed("write_group", self.inner.write_group(epoch, group))

    async def delete_group(self, epoch: int, group_id: str) -> None:
        await self._timed("delete_group", self.inner.delete_group(epoch, group_id))

    async def commit_offsets(self, epoch: int, batches: Sequence[OffsetBatch]) -> None:
        start = trio.current_time()
        await self._timed("commit_offsets", self.inner.commit_offsets(epoch, batches))
        self.metrics.commit_seconds.observe(trio.current_time() - start)
        self.metrics.commit_batch.observe(sum(len(b.offsets) for b in batches))

    async def fetch_offsets(self, group_id: str) -> Mapping[TopicPartition, int]:
        return await self._timed("fetch_offsets", self.inner.fetch_offsets(group_id))

    async def groups(self) -> Mapping[str, GroupRecord]:
        return await self._timed("groups", self.inner.groups())

    async def create_topic(
        self, topic: str, brokers: Assignment, configs: tuple[tuple[str, str], ...] = ()
    ) -> TopicPlacement:
        return await self._timed("create_topic", self.inner.create_topic(topic, brokers, configs))


async def probe_store(
    store: TopicStore,
    metrics: BrokerMetrics,
    *,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Time one small read of the store every :data:`STORE_PROBE_INTERVAL` until cancelled:
    the store operations a coordinator makes are timed too, but only when it makes them, and
    an operator judging whether the store or the broker is slow needs the figure all the time."""
    task_status.started()
    while True:
        start = trio.current_time()
        try:
            await store.brokers()
        except StoreError:
            metrics.store_probe_errors.inc()
        else:
            metrics.store_read = trio.current_time() - start
            metrics.store_probe_seconds.observe(metrics.store_read)
        await trio.sleep_until(start + STORE_PROBE_INTERVAL)
