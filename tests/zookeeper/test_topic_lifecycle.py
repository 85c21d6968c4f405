"""Randomized topic lifecycles on three broker processes sharing ZooKeeper (issue 33): no record
and no committed offset of a deleted topic is ever served or applied to a topic created again
under its name (docs/design.md#topic-ids), and no acknowledged record of the topic in force is
lost.

Each example runs a drawn program on a topic of its own: create, delete, delete and create again
on one connection (with the same or another partition count), produce records that name the
incarnation they were produced to (``topic:incarnation:partition:n``, the incarnation counted by
the test), consume with a group (its consumer commits what it read as it closes), commit offsets
standalone (as ``groups reset-offsets``), restart a broker (a clean stop, the topic maybe deleted
or created again while it is down, a start), and race a DeleteTopic against a CreateTopic of the
name from connections to two different brokers. The test keeps what must be true: which
incarnation is in force, every record acknowledged to it, and each group's committed offsets.
After every step, once every broker names the same incarnation (the same partitions and, from
brokers that tell ids, the same id), it checks that

* every partition serves exactly the records acknowledged to the incarnation in force, in order:
  none of a deleted one, none lost;
* each group's committed offsets are the ones the test expects of the incarnation in force (none
  for a topic that is not there), never one of a deleted incarnation;
* a consumer of a group reads every record after the group's committed offset, none skipped
  (an offset of a deleted incarnation applied would start it past them).

The race's answers say what must have happened: from a topic in force, a delete answered NONE
and a create answered NONE mean the create came second (a new incarnation), a create refused
with TOPIC_ALREADY_EXISTS that it came first; from no topic, a delete answered NONE means it
came after the create. Anything else is not a history of the two requests one at a time, and
fails. A store without topic ids serves a deleted incarnation's records as the new one's and
applies its offsets; one that wrote a name's id apart from the transaction of its topic node
would give the topic in force a new id when a create of the name is refused, and its records
would be retired (lost).

Examples are programs drawn from a seeded generator, ``TOPIC_LIFECYCLE_EXAMPLES`` of them (20 by
default, under a minute), from seed ``TOPIC_LIFECYCLE_SEED`` (0 by default) on; a failure names
its seed and program, and ``TOPIC_LIFECYCLE_SEED=<seed> TOPIC_LIFECYCLE_EXAMPLES=1`` runs it
again. The brokers and ZooKeeper are shared by the examples (each starts them anew would triple
the time), so every example works on a topic and groups of its own.
"""

from __future__ import annotations

import contextlib
import os
import random
from collections.abc import AsyncIterator, Callable
from functools import partial
from pathlib import Path

import attrs
import pytest
import trio

from consumer import ConsumerSettings, open_consumer
from consumer.admin import AdminError, open_admin
from launch.cluster import eventually
from launch.processes import BrokerProcess
from launch.zookeeper import Ensemble
from protocol import ErrorCode
from protocol.types import TopicPartition
from tests.support.topic_client import TopicClient, at_once, open_topic_client
from tests.zookeeper.test_cluster_clients import every_broker_sees
from tests.zookeeper.test_failover import start_broker
from transport.connect import Address

EXAMPLES = int(os.environ.get("TOPIC_LIFECYCLE_EXAMPLES", "20"))
FIRST_SEED = int(os.environ.get("TOPIC_LIFECYCLE_SEED", "0"))
# A long run is bounded by its examples, not by the suite's per-test timeout.
pytestmark = [pytest.mark.realtime] + (
    [pytest.mark.timeout(0)] if "TOPIC_LIFECYCLE_EXAMPLES" in os.environ else []
)

BROKERS = (1, 2, 3)
#: Bounds each wait: on the brokers agreeing, a consumer, a commit becoming durable.
DEADLINE = 60.0
#: How long a consumer may take to hand over records that are all there; those still missing
#: after it were skipped.
READ_WITHIN = 20.0
GROUP_SETTINGS = ConsumerSettings(
    auto_offset_reset="earliest", session_timeout=2.0, client_id="life", max_retry_backoff=1.0
)


@attrs.define
class Incarnation:
    number: int
    #: Every record acknowledged, per partition, in offset order.
    acknowledged: list[list[bytes]]


@attrs.define
class Model:
    """What must be true of the example's topic."""

    topic: str
    groups: tuple[str, ...]
    created: int = 0
    current: Incarnation | None = None
    #: Per group: the committed offset of each partition of the incarnation in force.
    committed: dict[str, dict[int, int]] = attrs.field(factory=dict)

    def create(self, partitions: int) -> None:
        self.created += 1
        self.current = Incarnation(
            number=self.created, acknowledged=[[] for _ in range(partitions)]
        )
        self.committed = {}

    def delete(self) -> None:
        self.current = None
        self.committed = {}

    def values(self, partition: int, count: int) -> list[bytes]:
        assert self.current is not None
        done = len(self.current.acknowledged[partition])
        return [
            f"{self.topic}:{self.current.number}:{partition}:{n}".encode()
            for n in range(done, done + count)
        ]


@attrs.define(eq=False)
class Cluster:
    """The brokers, each of which a step may stop and start again on its data dir."""

    hosts: str
    tmp_path: Path
    running: dict[int, tuple[contextlib.AsyncExitStack, BrokerProcess]] = attrs.field(factory=dict)
    ports: dict[int, int] = attrs.field(factory=dict)

    @property
    def live(self) -> list[Address]:
        return [process.address for _, (_, process) in sorted(self.running.items())]

    async def start(self, broker_id: int) -> None:
        """Start the broker, on the port it had if it ran before: a broker is restarted where
        its clients and the coordinators' StartFetchers know it."""
        port = self.ports.get(broker_id, 0)
        stack = contextlib.AsyncExitStack()
        process = await stack.enter_async_context(
            start_broker(self.hosts, self.tmp_path, broker_id, f"--port={port}")
        )
        self.running[broker_id] = (stack, process)
        self.ports[broker_id] = process.port
        await self._seen_by_all()

    async def stop(self, broker_id: int) -> None:
        stack, _ = self.running.pop(broker_id)
        await stack.aclose()
        await self._seen_by_all()

    async def _seen_by_all(self) -> None:
        live = self.live
        await eventually(partial(every_broker_sees, live, set(self.running)), deadline=DEADLINE)


@contextlib.asynccontextmanager
async def cluster_of(hosts: str, tmp_path: Path) -> AsyncIterator[Cluster]:
    cluster = Cluster(hosts=hosts, tmp_path=tmp_path)
    try:
        for broker_id in BROKERS:
            await cluster.start(broker_id)
        yield cluster
    finally:
        with trio.CancelScope(shield=True):
            for stack, _ in cluster.running.values():
                await stack.aclose()


# --- the steps --------------------------------------------------------------------------------

Step = tuple[object, ...]


def draw_program(rng: random.Random) -> list[Step]:
    """A program: a create, then 5 to 9 steps drawn with weights."""
    program: list[Step] = [("create", rng.randint(1, 3), rng.randrange(len(BROKERS)))]
    kinds = ["produce", "consume", "reset", "delete", "create", "recreate", "race", "restart"]
    weights = [5, 3, 2, 1, 1, 2, 3, 1]
    for _ in range(rng.randint(5, 9)):
        kind = rng.choices(kinds, weights)[0]
        via = rng.randrange(len(BROKERS))
        if kind == "produce":
            program.append((kind, rng.randint(1, 4)))
        elif kind == "consume":
            program.append((kind, rng.randrange(2)))
        elif kind == "reset":
            program.append((kind, rng.randrange(2), rng.randint(0, 100)))
        elif kind == "delete":
            program.append((kind, via))
        elif kind in ("create", "recreate"):
            program.append((kind, rng.randint(1, 3), via))
        elif kind == "race":
            program.append((kind, rng.randint(1, 3), rng.randint(1, 3), via))
        else:
            program.append(
                (kind, rng.choice(BROKERS), rng.choice(["none", "delete", "recreate"]), via)
            )
    return program


@attrs.define(eq=False)
class Example:
    model: Model
    cluster: Cluster
    client: TopicClient

    def at(self, via: int) -> Address:
        """The ``via``-th live broker (counted round)."""
        live = self.cluster.live
        return live[via % len(live)]

    async def run(self, step: Step) -> None:
        kind, *args = step
        method = getattr(self, f"step_{kind}")
        await method(*args)

    async def step_create(self, partitions: int, via: int) -> None:
        answer = await self.client.create_topic(self.model.topic, partitions, self.at(via))
        if self.model.current is None:
            assert answer is ErrorCode.NONE
            self.model.create(partitions)
        else:
            assert answer is ErrorCode.TOPIC_ALREADY_EXISTS

    async def step_delete(self, via: int) -> None:
        answer = await self.client.delete_topic(self.model.topic, self.at(via))
        if self.model.current is None:
            assert answer is ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
        else:
            assert answer is ErrorCode.NONE
            self.model.delete()

    async def step_recreate(self, partitions: int, via: int) -> None:
        """A delete and a create on one connection, the create sent as the delete is answered."""
        if self.model.current is not None:
            await self.step_delete(via)
        await self.step_create(partitions, via)

    async def step_produce(self, count: int) -> None:
        current = self.model.current
        if current is None:
            return
        await self.settle()
        client = self.client
        seen = await client.incarnation(self.model.topic, self.at(0))
        assert seen is not None
        placement, topic_id = seen
        for partition, at in sorted(placement.items()):
            values = self.model.values(partition, count)
            produced = await client.produce(self.model.topic, partition, values, at, topic_id)
            assert produced.error_code is ErrorCode.NONE, (partition, produced)
            assert produced.base_offset == len(current.acknowledged[partition]), (
                f"partition {partition}: the records went to offset {produced.base_offset}, "
                f"after {len(current.acknowledged[partition])} acknowledged to the incarnation"
            )
            current.acknowledged[partition].extend(values)

    async def step_consume(self, group: int) -> None:
        """A consumer of the group reads every record after the group's committed offsets, and
        closes, committing them."""
        current = self.model.current
        if current is None:
            return
        group_id = self.model.groups[group]
        done = self.model.committed.get(group_id, {})
        expected = {p: values[done.get(p, 0) :] for p, values in enumerate(current.acknowledged)}
        wanted = sum(len(v) for v in expected.values())
        if not wanted:
            return
        await self.settle()
        read: dict[int, list[bytes]] = {p: [] for p in expected}
        with trio.fail_after(DEADLINE):
            async with open_consumer(
                self.cluster.live,
                group_id,
                topics={self.model.topic: 1},
                settings=GROUP_SETTINGS,
            ) as consumer:
                (stream,) = consumer.streams_for(self.model.topic)
                with trio.move_on_after(READ_WITHIN):
                    async for record in stream:
                        read.setdefault(record.partition, []).append(record.value)
                        consumer.mark(record)
                        if sum(len(v) for v in read.values()) >= wanted:
                            break
        assert read == expected, (
            f"group {group_id} from offsets {done}: read {read}, not {expected} (a record of "
            "another incarnation read, or records skipped)"
        )
        self.model.committed[group_id] = done | {
            p: len(current.acknowledged[p]) for p, values in expected.items() if values
        }

    async def step_reset(self, group: int, share: int) -> None:
        """A standalone commit of a share of each partition's records, as ``groups
        reset-offsets`` makes."""
        current = self.model.current
        if current is None:
            return
        await self.settle()
        group_id = self.model.groups[group]
        offsets = {p: len(values) * share // 100 for p, values in enumerate(current.acknowledged)}
        wanted = {
            TopicPartition(topic=self.model.topic, partition=p): o for p, o in offsets.items()
        }

        async def reset() -> bool:
            """Refused while a consumer's lease may still run (after a coordinator failover, the
            group's last members'): asked again, as the refusal says."""
            refused = False
            try:
                async with open_admin(self.cluster.live) as admin:
                    await admin.reset_offsets(group_id, wanted)
            except* AdminError as failed:
                if failed.subgroup(other_than(ErrorCode.REBALANCE_IN_PROGRESS)):
                    raise
                refused = True
            return not refused

        await eventually(reset, deadline=DEADLINE)
        self.model.committed[group_id] = offsets

    async def step_restart(self, broker_id: int, while_down: str, via: int) -> None:
        await self.cluster.stop(broker_id)
        if while_down == "delete" and self.model.current is not None:
            await self.step_delete(via)
        elif while_down == "recreate":
            await self.step_recreate(1 + via % 3, via)
        await self.cluster.start(broker_id)

    async def step_race(self, rounds: int, partitions: int, via: int) -> None:
        """Each round: a DeleteTopic and a CreateTopic of the name at once, from connections to
        two different brokers; then records produced to whatever is in force."""
        for n in range(rounds):
            deleted, created = await at_once(
                partial(self.client.delete_topic, self.model.topic, self.at(via + n)),
                partial(
                    self.client.create_topic, self.model.topic, partitions, self.at(via + n + 1)
                ),
            )
            if self.model.current is not None:
                assert deleted is ErrorCode.NONE, ("a delete of the topic in force", deleted)
                self.model.delete()
                if created is ErrorCode.NONE:
                    self.model.create(partitions)  # the create came second
                else:
                    assert created is ErrorCode.TOPIC_ALREADY_EXISTS, created
            else:
                assert created is ErrorCode.NONE, ("a create of no topic", created)
                self.model.create(partitions)
                if deleted is ErrorCode.NONE:
                    self.model.delete()  # the delete came second
                else:
                    assert deleted is ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, deleted
            await self.step_produce(2)

    # --- the checks -------------------------------------------------------------------------

    async def settle(self) -> None:
        """Wait until every broker names the incarnation the model has in force: its partition
        count and, from brokers that tell ids, one id; or none."""
        current = self.model.current
        wanted = None if current is None else len(current.acknowledged)
        seen: list[object] = []

        async def agreed() -> bool:
            views = [
                await self.client.incarnation(self.model.topic, at) for at in self.cluster.live
            ]
            seen[:] = [None if v is None else (len(v[0]), v[1]) for v in views]
            counts = {None if v is None else len(v[0]) for v in views}
            ids = {v[1] for v in views if v is not None}
            return counts == {wanted} and len(ids) <= 1

        with trio.move_on_after(DEADLINE):
            await eventually(agreed, deadline=DEADLINE)
        assert await agreed(), f"the brokers name {seen}, not {wanted} partitions"

    async def check(self) -> None:
        await self.settle()
        current = self.model.current
        client = self.client
        if current is not None:
            seen = await client.incarnation(self.model.topic, self.at(0))
            assert seen is not None
            placement, topic_id = seen
            for partition, at in sorted(placement.items()):
                values = [
                    r.value or b""
                    for r in await client.read(self.model.topic, partition, at, topic_id)
                ]
                wanted = current.acknowledged[partition]
                stale = [v for v in values if v not in wanted]
                lost = [v for v in wanted if v not in values]
                assert not stale, f"partition {partition} serves a deleted topic's {stale}"
                assert not lost, f"partition {partition} lost acknowledged {lost}"
                assert values == wanted, f"partition {partition}: {values} not {wanted}"
        for group_id in self.model.groups:
            await self.check_committed(group_id)

    async def check_committed(self, group_id: str) -> None:
        """The group's committed offsets of the topic are the model's (none for a partition
        with none): it waits for a commit to become durable and the coordinator to hear of a
        delete, no longer."""
        wanted = self.model.committed.get(group_id, {})
        seen: dict[int, int] = {}

        async def agreed() -> bool:
            seen.clear()
            seen.update(await committed_offsets(self.cluster.live, group_id, self.model.topic))
            return seen == wanted

        with trio.move_on_after(DEADLINE):
            await eventually(agreed, deadline=DEADLINE)
        assert seen == wanted, f"group {group_id} has committed {seen}, not {wanted}"


def other_than(code: ErrorCode) -> Callable[[BaseException], bool]:
    """Picks out of an exception group the admin errors of another code than ``code``."""
    return lambda e: isinstance(e, AdminError) and e.error_code is not code


async def committed_offsets(addresses: list[Address], group_id: str, topic: str) -> dict[int, int]:
    """The group's committed offset of each partition of ``topic`` that has one."""
    reports = []
    unknown = False
    try:
        async with open_admin(addresses) as admin:
            reports.append(await admin.describe_group(group_id))
    except* AdminError as failed:
        if failed.subgroup(other_than(ErrorCode.GROUP_ID_NOT_FOUND)):
            raise
        unknown = True
    if unknown:
        return {}
    return {
        p.partition: p.committed
        for p in reports[0].partitions
        if p.topic == topic and p.committed >= 0
    }


async def run_example(cluster: Cluster, seed: int) -> None:
    program = draw_program(random.Random(seed))
    model = Model(topic=f"life{seed}", groups=(f"members{seed}", f"standalone{seed}"))
    async with open_topic_client(cluster.live[0]) as client:
        example = Example(model=model, cluster=cluster, client=client)
        for index, step in enumerate(program):
            try:
                await example.run(step)
                await example.check()
            except Exception as exc:
                raise AssertionError(
                    f"seed {seed}, step {index} {step} of {program}: {exc!r}"
                ) from exc
        if model.current is not None:  # leave the shared brokers as they were
            deleted = await client.delete_topic(model.topic, example.at(0))
            assert deleted is ErrorCode.NONE


async def test_no_record_or_offset_of_a_deleted_topic_is_served_or_applied(
    zookeeper: Ensemble, tmp_path: Path
) -> None:
    hosts = f"{zookeeper.hosts}/lifecycle-{os.getpid()}-{FIRST_SEED}"
    async with cluster_of(hosts, tmp_path) as cluster:
        for seed in range(FIRST_SEED, FIRST_SEED + EXAMPLES):
            await run_example(cluster, seed)
