"""In-process brokers for the replica runtime's tests: each a real ``BrokerLog`` in its own
directory with a ``ReplicaManager``, sharing a stand-in store (:class:`FakeClusterStore`, an in
memory implementation of the ``TopicStore`` reads and the ``ReplicationStore`` that the broker
uses; the contract tests hold the real stores to the same behaviour). A follower reaches its
leader over a channel on a memory stream, the wire's encoding and all; the controller is the
test, which writes the states (:meth:`FakeClusterStore.elect`)."""

from __future__ import annotations

import uuid
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Iterable, Mapping, Sequence
from contextlib import asynccontextmanager
from pathlib import Path

import attrs
import trio
import trio.testing

from broker.data_plane import BrokerLog, open_broker_log
from broker.log import FsyncPolicy, LogConfig
from broker.replica_fetcher import fetch_from
from broker.replica_serve import answer_replica_fetch
from broker.replicas import ReplicaManager
from protocol import (
    FetchRequest,
    FetchResponse,
    ProduceRequest,
    ReplicaFetchRequest,
    Request,
)
from protocol.batches import build_batch, records_from_batches
from protocol.connection import Role
from protocol.types import TopicId, TopicPartition
from statemachine.partition_state import IsrEntry, PartitionKey, PartitionState, StateWrite
from store import TopicPlacement
from transport.channel import Channel
from transport.connect import DEFAULT_MAX_FRAME_SIZE, open_channel

TOPIC = "r"
TOPIC_ID = TopicId(int=37)
KEY = PartitionKey(topic_id=TOPIC_ID, partition=0)
TP = TopicPartition(topic=TOPIC, partition=0)
#: Every wait on a condition in these tests is bounded by this (real time: the logs use threads).
DEADLINE = 10.0


@attrs.define(eq=False)
class FakeClusterStore:
    """A stand-in for the store: one topic's placement, the partition states with versions and
    conditional writes, and each broker's registered log directory."""

    placement: dict[str, TopicPlacement] = attrs.field(factory=dict)
    states: dict[PartitionKey, PartitionState] = attrs.field(factory=dict)
    dirs: dict[int, uuid.UUID] = attrs.field(factory=dict)
    _changed: trio.Event = attrs.field(factory=trio.Event)

    async def topics(self) -> Mapping[str, TopicPlacement]:
        await trio.lowlevel.checkpoint()
        return dict(self.placement)

    async def topic_updates(self) -> AsyncGenerator[Mapping[str, TopicPlacement], None]:
        yield dict(self.placement)
        await trio.sleep_forever()

    async def partition_states(self) -> Mapping[PartitionKey, PartitionState]:
        await trio.lowlevel.checkpoint()
        return dict(self.states)

    async def partition_state_updates(
        self,
    ) -> AsyncGenerator[Mapping[PartitionKey, PartitionState], None]:
        held = dict(self.states)
        yield held
        while True:
            await self._changed.wait()
            changed = {k: s for k, s in self.states.items() if held.get(k) != s}
            held = dict(self.states)
            if changed:
                yield changed

    async def read_partition_states(
        self, keys: Iterable[PartitionKey]
    ) -> Mapping[PartitionKey, PartitionState]:
        await trio.lowlevel.checkpoint()
        return {k: self.states[k] for k in keys if k in self.states}

    async def write_partition_states(
        self, epoch: int | None, writes: Sequence[StateWrite]
    ) -> tuple[PartitionKey, ...]:
        await trio.lowlevel.checkpoint()
        lost = []
        for write in writes:
            old = self.states.get(write.key)
            if (-1 if old is None else old.version) != write.expected_version:
                lost.append(write.key)
                continue
            self.states[write.key] = attrs.evolve(write.state, version=write.expected_version + 1)
        self._notify()
        return tuple(lost)

    async def broker_dirs(self) -> Mapping[int, uuid.UUID]:
        await trio.lowlevel.checkpoint()
        return dict(self.dirs)

    def _notify(self) -> None:
        self._changed.set()
        self._changed = trio.Event()

    # --- the controller's part, played by the test --------------------------------------------

    def elect(self, leader: int, epoch: int, isr: Sequence[int]) -> None:
        """Write the state as a controller would: ``leader`` under ``epoch``, in sync ``isr``."""
        old = self.states.get(KEY)
        self.states[KEY] = PartitionState(
            leader=leader,
            leader_epoch=epoch,
            isr=tuple(IsrEntry(broker_id=b, log_dir=self.dirs[b]) for b in isr),
            version=0 if old is None else old.version + 1,
        )
        self._notify()

    def isr(self) -> list[int]:
        return [entry.broker_id for entry in self.states[KEY].isr]


def placement(replicas: Sequence[int], configs: tuple[tuple[str, str], ...] = ()) -> TopicPlacement:
    return TopicPlacement.of(
        topic=TOPIC, assignment=(tuple(replicas),), topic_id=TOPIC_ID, configs=configs
    )


@attrs.define(eq=False)
class Node:
    """One broker: its log while it is open, and its manager while it runs (None: stopped)."""

    broker_id: int
    log: BrokerLog = attrs.field(init=False)
    #: Closes the log (:meth:`Cluster.reopen`), and set once it is closed.
    log_scope: trio.CancelScope = attrs.field(factory=trio.CancelScope)
    log_closed: trio.Event = attrs.field(factory=trio.Event)
    manager: ReplicaManager | None = None
    scope: trio.CancelScope | None = None
    #: Set once the manager stopped (its high watermarks written).
    stopped: trio.Event = attrs.field(factory=trio.Event)

    async def produce(
        self, value: bytes, acks: int = -1, timeout_ms: int = 5_000
    ) -> tuple[int, int]:
        """(error code, base offset) of a Produce 3 of one record."""
        answer = await self.log.produce(
            ProduceRequest(
                topic=TOPIC,
                partition=0,
                records=(),
                batches=build_batch([value]),
                acks=acks,
                timeout_ms=timeout_ms,
            ),
            3,
        )
        return answer.error_code, answer.base_offset

    async def fetch(self, offset: int, api_version: int = 3, epoch: int = -1) -> FetchResponse:
        request = FetchRequest(
            topic=TOPIC,
            partition=0,
            offset=offset,
            max_bytes=1 << 20,
            current_leader_epoch=epoch,
        )
        return await self.log.fetch(request, api_version)

    async def values(self) -> list[bytes]:
        """Every record value in this broker's replica, past any high watermark."""
        partition = self.log.partitions[TP]
        data = await partition.read(partition.log_start_offset, 1 << 20, limit=1 << 62)
        return [record.value or b"" for record in records_from_batches(data)]

    def end(self) -> int:
        return self.log.partitions[TP].log_end_offset


@attrs.define(eq=False)
class Cluster:
    store: FakeClusterStore
    nodes: dict[int, Node]
    nursery: trio.Nursery
    #: Where each broker's data directory is (``broker-<id>``), and how its log is opened.
    directory: Path
    config: LogConfig

    async def start(self, broker_id: int, replica_lag: float = 10.0) -> None:
        """Start (again) ``broker_id``'s replica manager, its log as it is."""
        node = self.nodes[broker_id]
        manager = ReplicaManager(
            broker_id=broker_id,
            log_dir=self.store.dirs[broker_id],
            store=self.store,
            logs=node.log,
            connect=self._connect,
            fetch_from=fetch_from,
            serve=answer_replica_fetch,
            replica_lag=replica_lag,
        )
        node.log.replication = manager
        node.manager = manager
        node.scope = trio.CancelScope()

        stopped = node.stopped = trio.Event()

        async def run(task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
            assert node.scope is not None
            try:
                with node.scope:
                    await manager.run(task_status=task_status)
            finally:
                stopped.set()

        await self.nursery.start(run)

    async def open_log(self, broker_id: int) -> None:
        """Open ``broker_id``'s log from its directory (``broker-<id>``), held by a task of the
        cluster's nursery until :meth:`reopen` or the end."""
        node = self.nodes.setdefault(broker_id, Node(broker_id=broker_id))
        await self.nursery.start(self._hold_log, node)

    async def _hold_log(self, node: Node, task_status: trio.TaskStatus[None]) -> None:
        node.log_scope = scope = trio.CancelScope()
        node.log_closed = closed = trio.Event()
        try:
            with scope:
                async with open_broker_log(
                    self.store,  # type: ignore[arg-type]
                    node.broker_id,
                    self.directory / f"broker-{node.broker_id}",
                    self.config,
                ) as log:
                    node.log = log
                    task_status.started()
                    await trio.sleep_forever()
        finally:
            closed.set()

    async def reopen(self, broker_id: int) -> None:
        """Close ``broker_id``'s log and open it again from its directory, as a restarted
        broker does (its manager stopped first: it writes its high watermarks as it stops)."""
        node = self.nodes[broker_id]
        if node.scope is not None:  # started once: stopped, or stopping now
            node.scope.cancel()
            node.manager = None
            await node.stopped.wait()
        node.log_scope.cancel()
        await node.log_closed.wait()
        await self.open_log(broker_id)

    def stop(self, broker_id: int) -> None:
        """Stop ``broker_id``'s manager (its fetchers and leaders with it): as dead to the
        others, whose fetches to it fail."""
        node = self.nodes[broker_id]
        assert node.scope is not None
        node.scope.cancel()
        node.manager = None

    @asynccontextmanager
    async def _connect(self, broker_id: int) -> AsyncIterator[Channel]:
        """A channel to ``broker_id`` over a memory stream, answered by its manager as
        ``broker.dispatch`` hands it a REPLICA_FETCH; refused while it is stopped."""
        node = self.nodes.get(broker_id)
        if node is None or node.manager is None:
            raise ConnectionRefusedError(f"broker {broker_id} is not running")
        client, server = trio.testing.memory_stream_pair()
        served = Channel.open(server, Role.BROKER, max_frame_size=DEFAULT_MAX_FRAME_SIZE)

        async def answer(request: Request) -> None:
            manager = node.manager
            assert isinstance(request.message, ReplicaFetchRequest)
            if manager is None:  # stopped: the connection goes with it
                await served.aclose()
                return
            await served.respond(request, await manager.replica_fetch(request.message))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(served.run, answer)
            async with open_channel(client, client_id=f"replica-of-{broker_id}") as channel:
                yield channel
            nursery.cancel_scope.cancel()


@asynccontextmanager
async def open_cluster(
    tmp_path: Path, replicas: Sequence[int], configs: tuple[tuple[str, str], ...] = ()
) -> AsyncIterator[Cluster]:
    """Brokers ``replicas`` holding one partition of factor ``len(replicas)``, none of their
    managers started."""
    store = FakeClusterStore()
    store.placement[TOPIC] = placement(replicas, configs)
    store.dirs = {b: uuid.uuid4() for b in replicas}
    config = LogConfig(fsync=FsyncPolicy.NEVER)
    async with trio.open_nursery() as nursery:
        cluster = Cluster(store=store, nodes={}, nursery=nursery, directory=tmp_path, config=config)
        for b in replicas:
            await cluster.open_log(b)
        yield cluster
        nursery.cancel_scope.cancel()


async def until(condition: Callable[[], bool]) -> None:
    """Wait (bounded) until ``condition()`` holds."""
    with trio.fail_after(DEADLINE):
        while not condition():
            await trio.sleep(0.01)
