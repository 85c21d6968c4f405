"""Groups sharded over coordinators, with real processes (issue 18's "done when"): three brokers
(``coordinator serve --zookeeper``) on a three-node ZooKeeper ensemble share the coordinator
slots, groups whose slots fall on each broker are coordinated there (ClusterMetadata names the
slot's holder, as ``coordinator cluster`` shows it), and ``kill -9`` of one broker moves only its
slots: the members of every other group hear nothing but Pings, while the dead broker's groups
are taken over by the survivors with their offsets and without two consumers ever fetching one
partition (docs/design.md#coordinator-slots).

Consumers are the client library's, in this process. Each counts, on the wire, the requests its
coordinators send it (a tap on its connections reads each frame's header), so a StopFetcher or
StartFetcher is counted whether or not it moved a partition; and each checks, at the one moment
a consumer's set of fetched partitions grows (``on_assigned`` runs right after its fetchers were
started, before any other task runs), that no other member of its group fetches any of them.
"""

from __future__ import annotations

import contextlib
import socket
import struct
import zlib
from collections import Counter
from collections.abc import AsyncIterator, Mapping
from pathlib import Path

import attrs
import pytest
import trio

from consumer import Consumer, ConsumerSettings, RebalanceListener, open_consumer, open_producer
from consumer.admin import AdminError, ClusterReport, open_admin
from launch.cluster import coordinator_seen_by, eventually
from launch.zookeeper import Ensemble
from protocol.framing import SIZE_AND_HEADER, FrameKind
from protocol.messages import ApiKey
from protocol.types import TopicPartition
from statemachine.slots import DEFAULT_SLOTS, slot_of
from tests.cli.cli_process import cli_json
from tests.zookeeper.test_failover import Broker, broker_processes
from transport.channel import ChannelClosed
from transport.connect import Address

pytestmark = pytest.mark.realtime

DEADLINE = 90  # generous: CI has two busy cores, with three JVMs and three brokers on them
#: T of every consumer: Pings every T/3, and a failover (the brokers' 2 s ZooKeeper session, a
#: tick, the load, the discovery) fits in the T/3 of lease a member is sure to have left, with
#: room on two busy cores (docs/design.md#defaults-that-fit-a-failover).
CONSUMER_SESSION = 12.0
GROUPS_PER_BROKER = 3
MEMBERS = 2
TOPIC = "orders"
PARTITIONS = 6
EVERYTHING = frozenset(TopicPartition(topic=TOPIC, partition=p) for p in range(PARTITIONS))
#: Pings every member of a surviving group must answer after the failover before the test
#: concludes that they heard nothing else: they were coordinated all along, not forgotten.
PINGS_AFTER = 2
_UNKNOWN = (OSError, AdminError, ChannelClosed, trio.TooSlowError)


# --- what each consumer hears -------------------------------------------------------------------


@attrs.define(eq=False)
class TappedStream(trio.abc.Stream):
    """A broker connection that counts the requests the broker sends on it, by api key, from
    each frame's header (protocol/SPEC.md §3), and passes every byte on untouched."""

    inner: trio.SocketStream
    requests: Counter[ApiKey]
    _pending: bytearray = attrs.field(factory=bytearray)
    _skip: int = 0

    @property
    def socket(self) -> trio.socket.SocketType:
        return self.inner.socket

    def _count(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            if self._skip:
                taken = min(self._skip, len(view))
                self._skip -= taken
                view = view[taken:]
                continue
            wanted = SIZE_AND_HEADER.size - len(self._pending)
            self._pending += view[:wanted]
            view = view[wanted:]
            if len(self._pending) < SIZE_AND_HEADER.size:
                return
            size, kind, api_key, _version, _correlation = SIZE_AND_HEADER.unpack(self._pending)
            self._pending.clear()
            self._skip = size - (SIZE_AND_HEADER.size - 4)  # the size field counts the rest
            if kind == FrameKind.REQUEST:
                self.requests[ApiKey(api_key)] += 1

    async def receive_some(self, max_bytes: int | None = None) -> bytes:
        data = await self.inner.receive_some(max_bytes)
        self._count(data)
        return bytes(data)

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        await self.inner.send_all(data)

    async def wait_send_all_might_not_block(self) -> None:
        await self.inner.wait_send_all_might_not_block()

    async def aclose(self) -> None:
        await self.inner.aclose()

    def abort(self) -> None:
        """A reset, as the channel makes one on a plain TCP stream (transport/channel.py)."""
        with contextlib.suppress(OSError):
            self.inner.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))


@attrs.define(eq=False)
class Member(RebalanceListener):
    """One consumer of a group, with what its coordinators sent it and whether a partition it
    started fetching was still fetched by another member of its group."""

    group: str
    requests: Counter[ApiKey] = attrs.field(factory=Counter)
    consumer: Consumer | None = None
    #: The members of its group, itself included.
    peers: list[Member] = attrs.field(factory=list)
    #: (member index, partitions fetched by it and another member at once), shared by the group.
    overlaps: list[tuple[int, frozenset[TopicPartition]]] = attrs.field(factory=list)
    #: How many times it checked its group for overlaps (once per start of its fetchers).
    checks: int = 0
    #: What it had heard when the test took its baseline: (StopFetcher + StartFetcher, Ping,
    #: coordinator epoch).
    _baseline: tuple[int, int, int] = (0, 0, -1)

    async def connect(self, host: str, port: int) -> trio.abc.Stream:
        return TappedStream(inner=await trio.open_tcp_stream(host, port), requests=self.requests)

    def _stops_and_starts(self) -> int:
        return self.requests[ApiKey.STOP_FETCHER] + self.requests[ApiKey.START_FETCHER]

    def note_baseline(self) -> None:
        assert self.consumer is not None
        self._baseline = (
            self._stops_and_starts(),
            self.requests[ApiKey.PING],
            self.consumer.coordinator_epoch,
        )

    @property
    def stops_and_starts_since(self) -> int:
        return self._stops_and_starts() - self._baseline[0]

    @property
    def pings_since(self) -> int:
        return self.requests[ApiKey.PING] - self._baseline[1]

    @property
    def epoch_grew(self) -> bool:
        assert self.consumer is not None
        return self.consumer.coordinator_epoch > self._baseline[2]

    @property
    def fetching(self) -> frozenset[TopicPartition]:
        return frozenset() if self.consumer is None else self.consumer.assignment.value

    async def on_partitions_assigned(self, assigned: frozenset[TopicPartition]) -> None:
        self.checks += 1
        for index, other in enumerate(self.peers):
            if other is not self and (both := self.fetching & other.fetching):
                self.overlaps.append((index, both))


@attrs.define(eq=False)
class Group:
    group_id: str
    members: list[Member]

    @property
    def overlaps(self) -> list[tuple[int, frozenset[TopicPartition]]]:
        return self.members[0].overlaps

    def whole(self) -> bool:
        """Every partition fetched, every member fetching some."""
        owned = [m.fetching for m in self.members]
        return frozenset().union(*owned) == EVERYTHING and all(owned)

    def coordinators(self) -> set[int | None]:
        return {
            None if m.consumer is None or m.consumer.coordinator is None
            else m.consumer.coordinator.broker_id
            for m in self.members
        }  # fmt: skip


@contextlib.asynccontextmanager
async def open_group(group_id: str, bootstrap: list[Address]) -> AsyncIterator[Group]:
    # Consumers look for a new coordinator at least every second (by default their backoff
    # grows to 5 s while the dead one is still named).
    settings = ConsumerSettings(
        auto_offset_reset="earliest",
        session_timeout=CONSUMER_SESSION,
        client_id=group_id,
        max_retry_backoff=1.0,
    )
    peers: list[Member] = []
    overlaps: list[tuple[int, frozenset[TopicPartition]]] = []
    members = [Member(group=group_id, peers=peers, overlaps=overlaps) for _ in range(MEMBERS)]
    peers.extend(members)
    applications = [trio.CancelScope() for _ in members]
    async with trio.open_nursery() as nursery, contextlib.AsyncExitStack() as stack:
        for member, application in zip(members, applications, strict=True):
            member.consumer = await stack.enter_async_context(
                open_consumer(
                    bootstrap,
                    group_id,
                    topics={TOPIC: 1},
                    settings=settings,
                    listener=member,
                    connect=member.connect,
                )
            )
            nursery.start_soon(consume, member.consumer, application)
        yield Group(group_id=group_id, members=members)
        for application in applications:  # then the consumers close cleanly
            application.cancel()


async def consume(consumer: Consumer, scope: trio.CancelScope) -> None:
    """The application: finish every record as soon as it arrives, so that it gets committed."""
    with scope:
        async for record in consumer:
            consumer.mark(record)


# --- what the cluster says ----------------------------------------------------------------------


async def cluster_seen_by(address: Address) -> ClusterReport | None:
    found: list[ClusterReport] = []
    try:
        with trio.fail_after(5):
            async with open_admin([address]) as admin:
                found.append(await admin.cluster())
    except* _UNKNOWN:
        pass
    return found[0] if found else None


def holders_of(report: ClusterReport) -> dict[int, int]:
    return {slot: b.broker_id for b in report.brokers for slot in b.slots}


async def balanced_holders(brokers: list[Broker]) -> dict[int, int]:
    """Slot -> holder, once every broker of ``brokers`` reports the same view: those brokers up,
    every slot held by one of them, and their slot counts within one of each other."""
    agreed: list[dict[int, int]] = []
    wanted = {b.broker_id for b in brokers}

    async def balanced() -> bool:
        views = [await cluster_seen_by(b.address) for b in brokers]
        if any(v is None for v in views):
            return False
        holders = [holders_of(v) for v in views if v is not None]
        first = views[0]
        assert first is not None
        counts = Counter(holders[0].values())
        if (
            all(h == holders[0] for h in holders)
            and {b.broker_id for b in first.brokers if b.address is not None} == wanted
            and len(holders[0]) == first.slots
            and set(counts) == wanted
            and max(counts.values()) - min(counts.values()) <= 1
        ):
            agreed.append(holders[0])
            return True
        return False

    await eventually(balanced, deadline=DEADLINE)
    return agreed[0]


async def committed(address: Address, group_id: str) -> dict[int, int] | None:
    """The durable committed offset of each partition of ``orders`` (-1: none) and the group's
    generation (key -1), while the group is Stable; None while it cannot say."""
    found: list[dict[int, int]] = []
    try:
        with trio.fail_after(5):
            async with open_admin([address]) as admin:
                report = await admin.describe_group(group_id)
        if report.state == "Stable":
            offsets = {r.partition: r.committed for r in report.partitions if r.topic == TOPIC}
            found.append({**offsets, -1: report.generation})
    except* _UNKNOWN:
        pass
    return found[0] if found else None


def groups_on(holders: Mapping[int, int], broker_id: int) -> list[str]:
    """The first GROUPS_PER_BROKER group ids whose slot ``broker_id`` holds."""
    names = (f"group-{i}" for i in range(10_000))
    mine = (g for g in names if holders[slot_of(g, DEFAULT_SLOTS)] == broker_id)
    return [next(mine) for _ in range(GROUPS_PER_BROKER)]


async def settled(group: Group, address: Address, ends: Mapping[int, int]) -> dict[int, int]:
    """Once the group is whole and Stable with each partition's offset committed up to
    ``ends``: its committed offsets and generation (as :func:`committed`)."""
    found: list[dict[int, int]] = []

    async def check() -> bool:
        if group.whole() and (offsets := await committed(address, group.group_id)) is not None:
            found[:] = [offsets]
            return all(offsets.get(p) == end for p, end in ends.items())
        return False

    await eventually(check, deadline=DEADLINE)
    return found[0]


async def named_by_all(addresses: list[Address], group_id: str, holder_id: int) -> None:
    """Wait until ClusterMetadata(group_id) names ``holder_id`` at every one of ``addresses``."""

    async def named() -> bool:
        return all([await coordinator_seen_by(a, group_id) == holder_id for a in addresses])

    await eventually(named, deadline=DEADLINE)


async def placement_of(addresses: list[Address]) -> dict[int, int]:
    """Each partition of ``orders`` and its broker."""
    found: dict[int, int] = {}

    async def placed() -> bool:
        with contextlib.suppress(*_UNKNOWN):
            async with open_admin(addresses) as admin:
                (topic,) = await admin.topics([TOPIC])
            found.update({p.partition: p.broker_id for p in topic.partitions})
        return len(found) == PARTITIONS

    await eventually(placed, deadline=DEADLINE)
    return found


async def produce(addresses: list[Address], count: int, partitions: set[int]) -> Counter[int]:
    """``count`` records (keyed, so spread by the producer's hash) to those of ``partitions``
    they fall on; how many went to each partition."""
    sent: Counter[int] = Counter()
    async with open_producer(addresses) as producer:
        key = 0
        while sent.total() < count:
            key += 1
            if zlib.crc32(b"%d" % key) % PARTITIONS in partitions:
                partition, _offset = await producer.send_and_wait(TOPIC, b"record", key=b"%d" % key)
                sent[partition] += 1
    return sent


def by_id(brokers: list[Broker], broker_id: int) -> Broker:
    return next(b for b in brokers if b.broker_id == broker_id)


async def test_a_broker_kill_fails_over_only_the_groups_of_its_slots(
    zookeeper_ensemble: Ensemble, tmp_path: Path
) -> None:
    hosts = zookeeper_ensemble.hosts + "/sharing"
    async with broker_processes(hosts, tmp_path, 3) as brokers:
        holders = await balanced_holders(brokers)
        addresses = [b.address for b in brokers]

        # `coordinator cluster` shows a user the same share, through any broker.
        view = await cli_json(brokers[2].running, "cluster")
        assert view["slots"] == DEFAULT_SLOTS
        assert {s: b["broker"] for b in view["brokers"] for s in b["slots"]} == holders

        # Groups coordinated by each broker: ClusterMetadata(group) names its slot's holder,
        # whichever broker is asked.
        coordinator_of = {
            group_id: b.broker_id for b in brokers for group_id in groups_on(holders, b.broker_id)
        }
        for group_id, holder_id in coordinator_of.items():
            await named_by_all(addresses, group_id, holder_id)

        async with open_admin(addresses) as admin:
            await admin.create_topic(TOPIC, PARTITIONS, replication_factor=1)
        placement = await placement_of(addresses)
        assert Counter(placement.values()) == {b.broker_id: 2 for b in brokers}
        ends = await produce(addresses, 60, set(placement))
        assert set(ends) == set(placement)

        async with contextlib.AsyncExitStack() as stack:
            groups = [
                await stack.enter_async_context(open_group(group_id, addresses))
                for group_id in sorted(coordinator_of)
            ]
            before: dict[str, dict[int, int]] = {}
            for group in groups:
                holder = by_id(brokers, coordinator_of[group.group_id])
                before[group.group_id] = await settled(group, holder.address, ends)
                assert group.coordinators() == {holder.broker_id}
            for group in groups:
                for member in group.members:
                    member.note_baseline()

            victim = brokers[0]  # the first to start, which held every slot until others joined
            survivors = [b for b in brokers if b is not victim]
            killed_at = trio.current_time()
            await victim.running.kill()

            after = await balanced_holders(survivors)
            balanced_at = trio.current_time()
            # Only the dead broker's slots moved.
            assert {s for s, b in after.items() if holders[s] != b} == {
                s for s, b in holders.items() if b == victim.broker_id
            }
            failed_over = [g for g in groups if coordinator_of[g.group_id] == victim.broker_id]
            stayed = [g for g in groups if g not in failed_over]
            assert failed_over and stayed

            # The dead broker's groups are taken over by their slots' new holders, and consume
            # again: records produced now to the surviving brokers' partitions are committed.
            live = {p for p, b in placement.items() if b != victim.broker_id}
            ends += await produce([b.address for b in survivors], 30, live)
            for group in failed_over:
                holder = by_id(survivors, after[slot_of(group.group_id, DEFAULT_SLOTS)])
                await named_by_all([b.address for b in survivors], group.group_id, holder.broker_id)
                now, then = await settled(group, holder.address, ends), before[group.group_id]
                assert group.coordinators() == {holder.broker_id}
                assert all(m.epoch_grew for m in group.members)
                assert all(now[p] >= offset for p, offset in then.items() if p >= 0), (now, then)
            stable_at = trio.current_time()

            # The other groups were coordinated all along by the same broker, in the same
            # epoch and generation: Pings, and nothing else. (A group that moves and whose members
            # all come back holding what they held hears no StopFetcher or StartFetcher either,
            # docs/design.md#adoption-after-a-failover: the coordinator and its epoch are what
            # tell a group that moved from one that stayed.)
            async def pinged_again() -> bool:
                return all(m.pings_since >= PINGS_AFTER for g in stayed for m in g.members)

            await eventually(pinged_again, deadline=DEADLINE)
            for group in stayed:
                assert [m.stops_and_starts_since for m in group.members] == [0] * MEMBERS
                assert group.coordinators() == {coordinator_of[group.group_id]}
                assert not any(m.epoch_grew for m in group.members)
                holder = by_id(survivors, coordinator_of[group.group_id])
                now, then = await settled(group, holder.address, ends), before[group.group_id]
                assert now[-1] == then[-1]  # the generation
            for group in groups:
                assert group.overlaps == [], group.group_id
                assert all(m.checks > 0 for m in group.members)
            print(
                f"kill -9 of broker {victim.broker_id}: slots balanced over the survivors "
                f"{balanced_at - killed_at:.3f}s later, its {len(failed_over)} groups whole and "
                f"consuming {stable_at - killed_at:.3f}s later; StopFetcher+StartFetcher heard "
                f"since the kill by the members of its groups: "
                f"{[m.stops_and_starts_since for g in failed_over for m in g.members]}, "
                f"of the other {len(stayed)} groups: "
                f"{[m.stops_and_starts_since for g in stayed for m in g.members]}"
            )
