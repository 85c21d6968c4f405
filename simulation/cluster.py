"""A deterministic driver: the real coordinator, the embedded store, in-memory connections, and
the library's consumers, each in a simulated process — all on trio's clock, so under
``MockClock`` a test runs minutes of failures in milliseconds and asserts exact instants.

Faults are chosen by the test. On a consumer: :meth:`SimulatedConsumer.kill` (the process dies and
its connection closes), :meth:`~SimulatedConsumer.freeze` (a GC pause: silent, then it resumes and
its lease runs out on time), :meth:`~SimulatedConsumer.answer_slowly`,
:meth:`~SimulatedConsumer.drop_connection` (the connections break, the process lives on: it
fetches on under its lease, finds its coordinator again and re-registers),
:meth:`~SimulatedConsumer.cut_network` (neither side gets a byte for a while) and
:meth:`~SimulatedConsumer.delay_delivery` (bytes one way or both stay in flight for a while, then
arrive in order). On the cluster: :meth:`SimulatedCluster.create_topic`,
:meth:`~SimulatedCluster.add_partitions`, :meth:`~SimulatedCluster.restart_coordinator`,
:meth:`~SimulatedCluster.lose_store_contact` (the coordinator stops hearing from its store, as a
deposed ZooKeeper coordinator would) and :meth:`~SimulatedCluster.pause_coordinator` (a GC pause
or SIGSTOP of the broker).

:meth:`SimulatedCluster.check_invariants` is the invariant checker: no two members were ever
permitted to fetch one partition at once, nor did a member's process fetch what it was not
permitted, as the frames on the simulated wire show (the :class:`OwnershipLedger`, which
observes every connection :meth:`SimulatedCluster.open_link` makes); no committed offset went
backwards (in the store or in the coordinator's memory); generations only increased; and — after
a quiet period, ``settled=True`` — every subscribed partition has exactly one owner among the
live members.
``docs/testing.md`` has a walk-through; ``tests/simulation/test_example.py`` is its example.
"""

from __future__ import annotations

import itertools
import logging
from collections import defaultdict
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import aclosing, asynccontextmanager
from functools import partial
from pathlib import Path
from typing import Any, Literal

import attrs
import trio
import trio.testing
from trio_util import AsyncValue

from broker.dispatch import handle_connection
from broker.door import Door
from coordinator.config import CoordinatorConfig
from coordinator.group_coordinator import GroupCoordinator, open_group_coordinator
from protocol import (
    DeleteTopicRequest,
    DeleteTopicResponse,
    ErrorCode,
    Request,
    Role,
)
from protocol.batches import batches_from_records
from protocol.records import Record
from protocol.types import BrokerInfo, Subscription, TopicId, TopicPartition, TopicStreams
from statemachine.group import GroupState
from store import (
    MetadataStore,
    StoreError,
    open_embedded_store,
)
from transport.channel import Channel, ReadBounds
from transport.limits import ConnectionLimits

from .consumer import ClusterMember, SimulatedConsumer
from .invariants import InvariantViolation, OwnershipLedger, StoreHistory
from .log import MemoryLog
from .network import Link, LinkEnd, NetworkUnreachable, SimulatedHost
from .process import SimulatedProcess
from .store_faults import ContactStore, RecordingStore, SlowStore, StoreContact, StoreLatency

log = logging.getLogger(__name__)

#: :meth:`SimulatedCluster.wait_settled` looks again at least this often, in (virtual) seconds.
SETTLE_POLL = 1.0


@attrs.define(eq=False)
class SimulatedCluster:
    """One broker on the embedded store, serving in-memory connections, and its consumers.

    ``store`` and ``coordinator`` are replaced by :meth:`restart_coordinator`; read them anew
    after one.
    """

    config: CoordinatorConfig
    data_dir: Path
    broker: BrokerInfo
    nursery: trio.Nursery
    store: MetadataStore = attrs.field(init=False)
    coordinator: GroupCoordinator = attrs.field(init=False)
    ledger: OwnershipLedger = attrs.field(factory=OwnershipLedger)
    history: StoreHistory = attrs.field(factory=StoreHistory)
    contact: StoreContact = attrs.field(factory=StoreContact)
    latency: StoreLatency = attrs.field(factory=StoreLatency)
    generations: dict[str, list[int]] = attrs.field(factory=lambda: defaultdict(list))
    consumers: dict[str, Any] = attrs.field(factory=dict)
    #: What :meth:`start_consumer` starts unless told otherwise.
    member_type: Callable[..., ClusterMember] = SimulatedConsumer
    processes: dict[str, SimulatedProcess] = attrs.field(factory=dict)
    log: MemoryLog = attrs.field(init=False)
    """The partitions' records: what the broker serves Produce, Fetch and ListOffsets from."""
    #: How many times a coordinator took office in this cluster (1 before any restart) and
    #: loaded its groups.
    incarnation: AsyncValue[int] = attrs.field(factory=lambda: AsyncValue(0))
    #: How many times a coordinator took office and accepted connections, loaded or not.
    accepting: AsyncValue[int] = attrs.field(factory=lambda: AsyncValue(0))
    #: The limits on reading that connections are served under: a real broker's defaults, so
    #: what a test sees is what a deployment would (None: none); every frame is decoded on the
    #: loop, since virtual time would jump ahead while a thread decodes.
    bounds: ReadBounds | None = attrs.field(
        factory=lambda: ReadBounds.of(ConnectionLimits(), threads=False)
    )
    #: What puts new work off while the broker's loop is behind (None: nothing, the default: a
    #: test that sheds sets one with the lag figure it means the broker to see).
    door: Door | None = None
    _connections: trio.Nursery | None = None
    _stop_requested: trio.Event = attrs.field(factory=trio.Event)
    _down_for: float = 0.0
    _accepted: dict[tuple[str, TopicPartition], int] = attrs.field(factory=dict)
    _generations_seen: dict[tuple[int, str, int], int] = attrs.field(factory=dict)

    def __attrs_post_init__(self) -> None:
        self.log = MemoryLog()

    # --- topics -------------------------------------------------------------------------------

    async def create_topic(self, name: str, *, partitions: int) -> None:
        """Create a topic and return once the coordinator's topic watch has seen it."""
        await self.store.create_topic(name, (self.broker.broker_id,) * partitions)
        await self._topics_seen(name, partitions)

    async def add_partitions(self, name: str, *, added: int) -> None:
        placement = await self.store.add_partitions(name, (self.broker.broker_id,) * added)
        await self._topics_seen(name, placement.partition_count)

    async def delete_topic(self, name: str) -> ErrorCode:
        """Send DeleteTopic, and once it succeeded return when the coordinator's topic watch,
        and the log's, have seen the topic gone."""
        async with self.open_client() as client:
            response = await client.request(DeleteTopicRequest(topic=name))
        assert isinstance(response, DeleteTopicResponse)
        if response.error_code is not ErrorCode.NONE:
            return response.error_code
        for attempt in itertools.count():
            if name not in self.coordinator.topics and name not in self.log.placement:
                break
            await trio.sleep(0 if attempt < 100 else SETTLE_POLL / 10)
        return ErrorCode.NONE

    async def recreate_topic(self, name: str, *, partitions: int) -> TopicId:
        """Delete the topic and create it again under its name with ``partitions``, both before
        the coordinator's topic watch hears of either, so that it sees them as one change, as a
        slow watch or a broker down through both would (docs/design.md#topic-ids). Returns the
        new incarnation's id once the watch has seen it."""
        old = self.coordinator.topics[name].topic_id
        self.latency.topics_held.value = True
        try:
            await self.store.delete_topic(name)
            placement = await self.store.create_topic(name, (self.broker.broker_id,) * partitions)
        finally:
            self.latency.topics_held.value = False
        assert placement.topic_id != old
        for attempt in itertools.count():
            seen = (self.coordinator.topics.get(name), self.log.placement.get(name))
            if all(p is not None and p.topic_id == placement.topic_id for p in seen):
                return placement.topic_id
            await trio.sleep(0 if attempt < 100 else SETTLE_POLL / 10)
        raise AssertionError("unreachable")

    async def _topics_seen(self, name: str, partitions: int) -> None:
        # The watch normally catches up within the same instant; after that, let virtual time
        # run, so that a caller's deadline can fire if it never does.
        for attempt in itertools.count():
            seen = (self.coordinator.topics.get(name), self.log.placement.get(name))
            if all(p is not None and p.partition_count >= partitions for p in seen):
                return
            await trio.sleep(0 if attempt < 100 else SETTLE_POLL / 10)

    def produce(self, topic: str, *, records: int = 1, value: bytes = b"") -> None:
        """Append ``records`` records (each of ``value``) to each partition of ``topic`` now, as
        a producer the test does not watch would: what the consumers then fetch, finish and
        commit."""
        now_ms = round(trio.current_time() * 1000)
        record = Record(offset=0, timestamp_ms=now_ms, key=None, value=value)
        payload = batches_from_records([record] * records)
        for p in range(self.coordinator.topics[topic].partition_count):
            self.log.produce_now(TopicPartition(topic=topic, partition=p), payload)

    async def feed(self, topic: str, *, every: float, records: int = 1) -> None:
        """:meth:`produce` ``records`` records now and every ``every`` seconds, for ever (start
        it in a nursery)."""
        while True:
            self.produce(topic, records=records)
            await trio.sleep(every)

    # --- the broker ---------------------------------------------------------------------------

    async def restart_coordinator(self, *, down_for: float = 0.0, loaded: bool = True) -> None:
        """Stop the coordinator and all its connections, stay down ``down_for`` seconds (new
        connections are refused), then reopen the store on the same data dir and take office
        again. Returns once the new coordinator has loaded its groups and serves, or with
        ``loaded=False`` once it accepts connections, while it may still be loading."""
        before = (self.incarnation if loaded else self.accepting).value
        self._down_for = down_for
        self._stop_requested.set()
        await (self.incarnation if loaded else self.accepting).wait_value(lambda n: n > before)

    def slow_group_reads(self, seconds: float) -> None:
        """From now on every read of the groups' records takes ``seconds``: a coordinator taking
        office, or rebuilding a group, loads for that long."""
        self.latency.group_reads = seconds

    def lose_store_contact(self, seconds: float) -> None:
        """The coordinator hears nothing from its store for ``seconds`` from now, and must act
        as one that may have been deposed: renew no lease."""
        self.contact.lose_contact(seconds)

    def pause_coordinator(self, seconds: float) -> None:
        """Pause the broker process for ``seconds`` (a GC pause, SIGSTOP), under trio's
        ``MockClock``: the clock jumps at once, so every timer of the broker fires late, at the
        instant it resumes, and nothing it would have done meanwhile happens.

        The consumers are other processes, but share the clock: their timers fire late too, at
        the same instant. They record what they did at the instant they should have (a lease's
        end), but the broker may see it (a close) before or after it acts on its own timers, as
        a real broker may; cut their network across the pause for one order."""
        clock = trio.lowlevel.current_clock()
        if not isinstance(clock, trio.testing.MockClock):
            raise TypeError("pause_coordinator needs trio.testing.MockClock")
        clock.jump(seconds)

    async def _serve(
        self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        while True:
            self._stop_requested = trio.Event()
            async with open_embedded_store(self.data_dir) as embedded:
                slow = SlowStore(inner=embedded, latency=self.latency)
                recording = RecordingStore(inner=slow, history=self.history)
                store = ContactStore(inner=recording, contact=self.contact)
                await store.register_broker(self.broker)
                async with (
                    open_group_coordinator(store, self.config, self.broker) as coordinator,
                    trio.open_nursery() as connections,
                ):
                    self.store, self.coordinator = store, coordinator
                    self._connections = connections
                    connections.start_soon(self._follow_topics, embedded)
                    self.accepting.value += 1
                    await coordinator.loaded.wait()
                    self.incarnation.value += 1
                    if self.incarnation.value == 1:
                        task_status.started()
                    await self._stop_requested.wait()
                    log.info("coordinator stopping for a restart")
                    self._connections = None
                    connections.cancel_scope.cancel()
            await trio.sleep(self._down_for)

    async def _follow_topics(self, store: MetadataStore) -> None:
        """Feed the log the store's topic watch, as a broker's data plane watches it."""
        async with aclosing(store.topic_updates()) as updates:
            async for placement in updates:
                self.log.follow(placement)

    def open_link(
        self,
        host: SimulatedHost | None = None,
        *,
        hold: Callable[[], Awaitable[None]] | None = None,
    ) -> tuple[trio.abc.Stream, Link]:
        """A new in-memory connection from ``host`` to the broker, served like a TCP one.

        Raises ConnectionRefusedError while the coordinator is down and NetworkUnreachable while
        the host's network is cut.
        """
        if self._connections is None:
            raise ConnectionRefusedError("the coordinator is down")
        if host is not None and not host.reachable:
            raise NetworkUnreachable("the network is cut")
        link = Link(host=host, observer=self.ledger)
        if host is not None:
            host.links = [
                existing for existing in host.links if not existing.to_client.reader_closed
            ]
            host.links.append(link)
        client = LinkEnd(link=link, outgoing=link.to_server, incoming=link.to_client, hold=hold)
        server = LinkEnd(link=link, outgoing=link.to_client, incoming=link.to_server)
        self._connections.start_soon(
            partial(handle_connection, data_plane=self.log, bounds=self.bounds, door=self.door),
            self.coordinator,
            server,
        )
        return client, link

    async def connect(self) -> trio.abc.Stream:
        """A new in-memory connection to the broker from a host that no fault touches."""
        await trio.lowlevel.checkpoint()
        stream, _ = self.open_link()
        return stream

    async def connect_to(self, host: str, port: int) -> trio.abc.Stream:
        """A ``connect=`` for ``open_consumer`` / ``open_producer`` that no fault touches."""
        return await self.connect()

    def start_process(
        self, name: str, main: Callable[..., Awaitable[object]], *args: object
    ) -> SimulatedProcess:
        """Run ``await main(*args, connect=process.connect)`` as a process of its own: the
        user's code, with the library's real consumer and producer, whose faults the test
        injects through the returned :class:`SimulatedProcess`. An exception it raises (not
        being killed) ends the cluster's block with it."""
        if name in self.processes and not self.processes[name].done.is_set():
            raise ValueError(f"process {name} is running")
        process = self.processes[name] = SimulatedProcess(name=name, cluster=self)
        self.nursery.start_soon(process.run, main, *args)
        return process

    @asynccontextmanager
    async def open_client(self) -> AsyncIterator[Channel]:
        """A plain client connection (an admin tool, a standalone committer)."""
        channel = Channel.open(
            await self.connect(), Role.CONSUMER, max_frame_size=self.config.max_frame_size
        )
        async with trio.open_nursery() as nursery:

            async def refuse(request: Request) -> None:
                raise AssertionError(f"a plain client got {request}")

            nursery.start_soon(channel.run, refuse)
            try:
                yield channel
            finally:
                nursery.cancel_scope.cancel()
                with trio.CancelScope(shield=True):
                    await channel.aclose()

    # --- consumers ----------------------------------------------------------------------------

    async def start_consumer(
        self,
        consumer_id: str,
        *,
        group: str,
        topics: Mapping[str, int] | None = None,
        subscription: Subscription | None = None,
        session_timeout_ms: int = 6000,
        member: Callable[..., ClusterMember] | None = None,
        **options: object,
    ) -> Any:
        """Start a consumer process and return once it has registered (or, with
        ``rejoin=False``, been refused). ``consumers`` maps each id to its latest process: a
        killed consumer's id may start again as a new process. ``member`` makes a test's own
        member instead of a :class:`SimulatedConsumer` (default: ``member_type``)."""
        if subscription is None:
            entries = tuple(TopicStreams(topic=t, streams=n) for t, n in (topics or {}).items())
            subscription = Subscription(topics=entries)
        make = member or self.member_type
        consumer = make(
            cluster=self,
            consumer_id=consumer_id,
            group_id=group,
            subscription=subscription,
            session_timeout_ms=session_timeout_ms,
            **options,
        )
        self.consumers[consumer_id] = consumer
        await self.nursery.start(consumer.run)
        return consumer

    async def restart_consumer(
        self,
        consumer: ClusterMember,
        consumer_id: str,
        *,
        end: Literal["stop", "kill", "reset", "keep"] = "stop",
        down_for: float = 0.0,
    ) -> Any:
        """Start a new process under ``consumer_id`` with ``consumer``'s settings (its instance
        id too: a static member's restart, docs/design.md#static-members), after ending the old
        one: ``stop`` (a clean stop without LeaveGroup), ``kill`` (its connection ends),
        ``reset`` (killed, its connection reset) or ``keep`` (it runs on: the new process is a
        second live one under the same instance id, which fences it), then ``down_for``
        seconds. Returns once the new process has registered."""
        if end == "stop":
            await consumer.stop()
        elif end in ("kill", "reset"):
            await consumer.kill(reset=end == "reset")
        await trio.sleep(down_for)
        return await self.start_consumer(
            consumer_id, member=type(consumer), **consumer.restart_options()
        )

    # --- waiting ------------------------------------------------------------------------------

    async def wait_stable(self, group_id: str, *, members: int) -> int:
        """Wait until the group is Stable with ``members`` live members; returns its generation."""
        group = self.coordinator.group(group_id)

        def stable(status: tuple[GroupState, int]) -> bool:
            return status[0] is GroupState.STABLE and len(group.members) == members

        await group.status.wait_value(stable)
        return group.machine.generation

    async def wait_settled(self) -> None:
        """Wait until every group with a live consumer is Stable with exactly its live consumers
        as members, none of them frozen, cut off or delayed, each fetching under the group's
        generation.

        It looks again whenever a group's state or a consumer's fetching changes (so it returns
        at the exact instant), and every SETTLE_POLL seconds besides. Waits forever if that
        never happens: put a deadline around it."""
        while not self._settled():
            async with trio.open_nursery() as nursery:

                async def woken(transition: Callable[[], Awaitable[object]]) -> None:
                    await transition()
                    nursery.cancel_scope.cancel()

                nursery.start_soon(woken, self.incarnation.wait_transition)
                for group in self.coordinator.groups.values():
                    nursery.start_soon(woken, group.status.wait_transition)
                for consumer in self.consumers.values():
                    nursery.start_soon(woken, consumer.fetching_state.wait_transition)
                nursery.start_soon(woken, partial(trio.sleep, SETTLE_POLL))

    def _settled(self) -> bool:
        if not self.up:
            return False
        now = trio.current_time()
        by_group: dict[str, dict[str, ClusterMember]] = defaultdict(dict)
        for consumer in self.consumers.values():
            if consumer.alive:
                if consumer.member_id in by_group[consumer.group_id]:
                    return False  # two processes of one static member: one is not fenced yet
                by_group[consumer.group_id][consumer.member_id] = consumer
        for group_id, live in by_group.items():
            group = self.coordinator.groups.get(group_id)
            if (
                group is None
                or group.machine.state is not GroupState.STABLE
                or group.next_attempt_at.value is not None
                or group.members.keys() != live.keys()
                # A static member away holds its partitions unowned until it is back or gone.
                or group.away
            ):
                return False
            for consumer in live.values():
                # Under the incremental protocol each member has its own generation, that of the
                # last start it was given (SPEC.md §11.4).
                member = group.members[consumer.member_id]
                if member.consumer_id != consumer.consumer_id:
                    return False
                if (
                    consumer.frozen_until > now
                    or not consumer.host.reachable
                    or consumer.host.delayed
                    or not consumer.fetching
                    or consumer.generation != group.ownership.holding(member.incarnation).generation
                ):
                    return False
        return True

    # --- invariants ---------------------------------------------------------------------------

    async def check_invariants(self, *, settled: bool = False) -> None:
        """Raise InvariantViolation unless everything the system promises held so far:

        * no two members of a group were permitted to fetch one partition at the same instant,
          and no member's process fetched a partition it was not permitted, as the wire shows
          (:class:`OwnershipLedger`);
        * no committed offset went backwards: not in any store write (offsets a standalone
          committer sets on an empty group excepted), and not in the coordinator's memory
          between two calls of this method;
        * generations only increased: each persisted group record's, each consumer's sequence of
          StartFetcher generations, and each coordinator's group generation between two calls;
        * with ``settled=True`` (call it after :meth:`wait_settled`): every partition of every
          topic a live consumer subscribes to has exactly one owner among its group's live
          consumers, and the coordinator agrees on who.
        """
        self.ledger.check()
        if self.history.violations:
            raise InvariantViolation("; ".join(self.history.violations))
        for consumer in self.consumers.values():
            gens = consumer.started_generations
            if any(b <= a for a, b in itertools.pairwise(gens)):
                raise InvariantViolation(
                    f"{consumer.consumer_id} started under generations {gens}: not increasing"
                )
        if self.up:
            await self._check_coordinator_memory()
        elif settled:
            raise InvariantViolation("settled=True while the coordinator is down")
        if settled:
            self._check_owners()

    @property
    def up(self) -> bool:
        """Whether a coordinator serves now (False while :meth:`restart_coordinator` has it
        down)."""
        return self._connections is not None

    async def _check_coordinator_memory(self) -> None:
        coordinator = self.coordinator
        incarnation = self.incarnation.value
        for group_id, group in coordinator.groups.items():
            key = (incarnation, group_id, self.history.deletions.get(group_id, 0))
            before = self._generations_seen.get(key, -1)
            if group.machine.generation < before:
                raise InvariantViolation(
                    f"group {group_id}: generation went from {before} to {group.machine.generation}"
                )
            self._generations_seen[key] = group.machine.generation
        group_ids = set(coordinator.groups) | {g for g, _ in self.history.durable_offsets}
        for group_id in sorted(group_ids):
            try:
                committed = await coordinator.offsets.committed(group_id)
            except StoreError:
                return  # the coordinator stopped meanwhile: its memory is gone
            for tp, offset in committed.items():
                before = self._accepted.get((group_id, tp), -1)
                if offset < before:
                    raise InvariantViolation(
                        f"group {group_id} {tp}: accepted offset went from {before} to {offset}"
                    )
                self._accepted[(group_id, tp)] = offset

    def _check_owners(self) -> None:
        topics = self.coordinator.topics
        by_group: dict[str, list[ClusterMember]] = defaultdict(list)
        for consumer in self.consumers.values():
            if consumer.alive:
                by_group[consumer.group_id].append(consumer)
        for group_id, live in sorted(by_group.items()):
            subscribed = {
                TopicPartition(topic=topic, partition=p)
                for topic, placement in topics.items()
                if any(c.subscription.streams_for(topic) > 0 for c in live)
                for p in range(placement.partition_count)
            }
            owners: dict[TopicPartition, list[str]] = defaultdict(list)
            for consumer in live:
                for tp in consumer.owned:
                    owners[tp].append(consumer.consumer_id)
            for tp in sorted(subscribed | owners.keys()):
                if tp not in subscribed:
                    raise InvariantViolation(
                        f"group {group_id}: {owners[tp]} fetch unsubscribed {tp}"
                    )
                if len(owners[tp]) != 1:
                    raise InvariantViolation(
                        f"group {group_id}: {tp} has owners {sorted(owners[tp])}, not exactly one"
                    )
            group = self.coordinator.groups.get(group_id)
            members = group.members if group is not None else {}
            for consumer in live:
                member = members.get(consumer.member_id)
                owned = (
                    None
                    if member is None or group is None or member.consumer_id != consumer.consumer_id
                    else group.ownership.holding(member.incarnation).partitions
                )
                if owned != consumer.owned:
                    raise InvariantViolation(
                        f"group {group_id}: the coordinator thinks {consumer.consumer_id} owns "
                        f"{None if owned is None else sorted(owned)}, "
                        f"it fetches {sorted(consumer.owned)}"
                    )


@asynccontextmanager
async def open_simulated_cluster(
    data_dir: Path,
    config: CoordinatorConfig | None = None,
    *,
    broker_id: int = 1,
    member_type: Callable[..., ClusterMember] = SimulatedConsumer,
) -> AsyncIterator[SimulatedCluster]:
    """Run a broker with its coordinator on the embedded store under ``data_dir`` for the block.

    Leaving the block stops every consumer and then the coordinator (which flushes its offsets).
    """
    config = config or CoordinatorConfig()
    broker = BrokerInfo(broker_id=broker_id, host="simulated", port=9092)
    async with trio.open_nursery() as nursery:
        cluster = SimulatedCluster(
            config=config,
            data_dir=data_dir,
            broker=broker,
            nursery=nursery,
            member_type=member_type,
        )
        await nursery.start(cluster._serve)
        try:
            yield cluster
        finally:
            nursery.cancel_scope.cancel()
