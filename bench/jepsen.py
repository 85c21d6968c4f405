"""Nothing acknowledged is lost (issue 37's Jepsen-style target), with real processes: three
brokers (``coordinator serve --zookeeper``) on a three-node ZooKeeper ensemble, one topic of
factor 3 with ``min.insync.replicas`` 2, and the library's producer at a steady rate with every
value tagged uniquely (``<partition>-<sequence>``), each acknowledged ``(partition, offset)``
kept.

The nemesis, every ``--interval`` seconds, strikes the leader of a random partition, in four kinds
of round taken in turn, the first three killing it (SIGKILL) and restarting it on its data
directory and port:

* *lagging*: the partition's followers are paused (SIGSTOP) first, for a random time up to twice
  their ZooKeeper session (past it they leave the ISR, which keeps its last member), at acks=1
  also until two records sent from then on are acknowledged; only then is the leader killed and
  the followers resumed (SIGCONT). At acks=all nothing can be acknowledged in that window (no
  follower fetches); at acks=1 the leader acknowledges what only it has, and the election of a
  follower (still in sync, or the only live replicas under unclean election) loses it: the proof
  that the check sees loss. The victim restarts once the partition has a new leader (bounded:
  none comes while the victim was its last in-sync replica and unclean election is off);
* *plain*: the leader is killed, and restarts once the partition has a new leader, as above;
* *quick*: the leader restarts at once (a broker starts in about as long as its ZooKeeper
  session takes to expire: sometimes the states still name it, sometimes not). With
  ``--wipe-once``, the first quick round's victim that is not any partition's last in-sync
  replica has its data directory deleted before it restarts: a lost disk back under the same
  broker id, which must never lead the data it no longer has, and must catch up;
* *paused*: the leader is not killed but paused (SIGSTOP) until the partition has a new leader
  (its ZooKeeper session expired), then resumed: a deposed leader that wakes up believing it
  leads, with produces and fetches waiting in its sockets.

Then the nemesis heals (every broker running), the producer's last records are awaited, every
partition is awaited with a leader and all three replicas in sync (bounded), and each partition
is read back from its leader up to its high watermark. The checks:

* ``lost``: acknowledged records not found at the offset they were acknowledged with;
* ``out_of_order``: records read (each value's first place) whose sequence number is below an
  earlier one's in their partition (one batch per partition is in flight, so the log keeps the
  order of sending);
* ``unexpected``: values read that were never sent (one sent but not acknowledged may be there:
  that is allowed, as is a retried batch stored twice, counted as ``duplicates``).

Figures (one JSON line each): ``sent``, ``acknowledged``, ``failed`` (deliveries given up),
``lost``, ``unexpected``, ``out_of_order``, ``duplicates``, ``kills``, ``lagging_rounds``,
``quick_rounds``, ``paused_rounds``, ``wipes``, ``leader_changes`` (the sum of the partitions'
leader epochs), ``nemesis_seconds``, and ``acknowledged_per_s`` during the nemesis against the
same producer's rate in the steady window before it (the baseline). Exits 1 at acks=all on any
loss, disorder or unexpected value, or a cluster that did not heal (a replica never back in
sync).

    python -m bench.jepsen [--minutes M] [--acks all|1] [--unclean] [--wipe-once]
        [--work-dir DIR] [--rate R] [--interval S] [--seed N] [--quick]

``--quick``: 30 s of nemesis (the CI test, tests/zookeeper/test_replication_jepsen.py, runs the
same core with at least two rounds of each kind).
"""

from __future__ import annotations

import contextlib
import math
import random
import shutil
import signal
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

import attrs
import trio

from bench.harness import bench_arguments, run, work_area
from bench.measure import figure
from consumer import Delivery, Producer, ProducerConfig, open_producer
from consumer.admin import Admin, AdminError, open_admin
from consumer.leaders import Leader
from launch.cluster import eventually
from launch.processes import BrokerProcess, run_broker
from launch.zookeeper import open_ensemble
from protocol.errors import RemoteProtocolError
from protocol.types import TopicPartition
from transport.channel import ChannelClosed

BENCHMARK = "jepsen"
TOPIC = "ledger"
REPLICAS = 3
#: The brokers' ZooKeeper session timeout (s).
ZK_SESSION = 2.0
#: How long a lagging round at acks=1 waits at most, after its pause, for two records sent after
#: the pause began to be acknowledged (by a leader alone: moments, unless the machine is loaded).
LAG_WAIT = 10.0
#: Bound on every wait for the cluster (a leader elected, a broker started, all in sync).
DEADLINE = 90.0
#: The nemesis's rounds, in turn (the module's docstring says what each does).
Round = Literal["lagging", "plain", "quick", "paused"]
ROUNDS: tuple[Round, ...] = ("lagging", "plain", "quick", "paused")
#: What a broker that is dead, paused or still starting fails a question with.
_UNREACHABLE = (OSError, AdminError, ChannelClosed, RemoteProtocolError, trio.TooSlowError)


@attrs.frozen(kw_only=True)
class Settings:
    nemesis_seconds: float
    acks: Literal["all", 1] = "all"
    unclean: bool = False
    wipe_once: bool = False
    partitions: int = 3
    #: Records per second, over all partitions.
    rate: float = 100.0
    #: Seconds between the starts of two nemesis rounds.
    interval: float = 4.0
    #: Rounds the nemesis runs at least, however long they take.
    min_rounds: int = 0
    #: Seconds of producing before the nemesis starts (the baseline's window).
    baseline_seconds: float = 5.0
    seed: int = 0


@attrs.frozen(kw_only=True)
class Outcome:
    sent: int
    acknowledged: int
    failed: int
    lost: int
    unexpected: int
    out_of_order: int
    duplicates: int
    kills: int
    lagging_rounds: int
    quick_rounds: int
    paused_rounds: int
    wipes: int
    leader_changes: int
    nemesis_seconds: float
    baseline_per_s: float
    nemesis_per_s: float
    healed: bool
    #: A few lost records, ``(partition, offset, value acknowledged, value found there)``.
    lost_examples: tuple[tuple[int, int, str, str | None], ...] = ()

    @property
    def safe(self) -> bool:
        return self.lost == 0 and self.unexpected == 0 and self.out_of_order == 0


@attrs.define(eq=False)
class Node:
    """One broker, restartable on its data directory and port."""

    broker_id: int
    data_dir: Path
    hosts: str
    port: int = 0
    running: BrokerProcess | None = None
    #: Stopped with SIGSTOP (and not continued since): it answers nobody.
    paused: bool = False
    _stack: contextlib.AsyncExitStack | None = None

    @property
    def address(self) -> tuple[str, int]:
        return ("127.0.0.1", self.port)

    @property
    def up(self) -> bool:
        return self.running is not None and self.running.process.returncode is None

    async def start(self) -> None:
        stack = contextlib.AsyncExitStack()
        args = [
            f"--broker-id={self.broker_id}",
            f"--zookeeper={self.hosts}",
            f"--zookeeper-session-timeout={ZK_SESSION}",
        ]
        if self.port:
            args.append(f"--port={self.port}")
        self.running = await stack.enter_async_context(run_broker(self.data_dir, *args))
        self._stack = stack
        self.port = self.running.port

    async def kill(self) -> None:
        if self.running is not None:
            await self.running.kill()

    def signal(self, signum: int) -> None:
        if self.up:
            assert self.running is not None
            self.running.process.send_signal(signum)
            self.paused = signum == signal.SIGSTOP

    async def stop(self) -> None:
        stack, self._stack, self.running = self._stack, None, None
        if stack is not None:
            await stack.aclose()


@attrs.define(eq=False)
class Record:
    partition: int
    sequence: int
    value: bytes
    #: (partition, offset) once acknowledged.
    acknowledged: tuple[int, int] | None = None


@attrs.define(eq=False)
class Tally:
    """What the producer sent and which of it was acknowledged, where."""

    records: dict[bytes, Record] = attrs.field(factory=dict)
    acknowledged: int = 0
    failed: int = 0
    #: Per partition, the sequence of its last record acknowledged.
    last_acknowledged: dict[int, int] = attrs.field(factory=dict)
    changed: trio.Condition = attrs.field(factory=trio.Condition)


@contextlib.asynccontextmanager
async def open_cluster(hosts: str, work: Path) -> AsyncIterator[list[Node]]:
    nodes = [
        Node(broker_id=b, data_dir=work / f"broker{b}", hosts=hosts) for b in range(1, REPLICAS + 1)
    ]
    try:
        for node in nodes:
            await node.start()
        yield nodes
    finally:
        with trio.CancelScope(shield=True):
            for node in nodes:
                node.signal(signal.SIGCONT)
                await node.stop()


async def leaders(nodes: Sequence[Node], partitions: int) -> dict[int, Leader]:
    """Each partition's leader as the running brokers report it, the latest epoch any of them
    knows winning (one that has not heard of an election yet is outvoted)."""
    found: dict[int, Leader] = {}
    for node in nodes:
        if node.up and not node.paused:
            for partition, leader in (await _listing(node, partitions)).items():
                if partition not in found or leader.epoch > found[partition].epoch:
                    found[partition] = leader
    return found


async def _listing(node: Node, partitions: int) -> dict[int, Leader]:
    """The partitions' leaders as ``node`` reports them; none if it does not answer."""
    listing: list[Mapping[TopicPartition, Leader]] = []
    try:
        with trio.fail_after(5):
            async with open_admin([node.address]) as admin:
                listing.append((await admin.listing([TOPIC])).leaders)
    except* _UNREACHABLE:
        pass
    return {
        p: found
        for known in listing
        for p in range(partitions)
        if (found := known.get(TopicPartition(topic=TOPIC, partition=p))) is not None
    }


async def eventually_true(check: Callable[[], Awaitable[bool]], *, deadline: float) -> bool:
    """Whether ``check()`` came true within ``deadline`` seconds (``launch.cluster.eventually``,
    for waits that end the same either way)."""
    try:
        await eventually(check, deadline=deadline)
    except trio.TooSlowError:
        return False
    return True


async def all_in_sync(nodes: Sequence[Node], partitions: int) -> bool:
    found = await leaders(nodes, partitions)
    return len(found) == partitions and all(
        leader.broker_id >= 0 and len(leader.isr) == REPLICAS for leader in found.values()
    )


async def produce(producer: Producer, settings: Settings, tally: Tally, stop: trio.Event) -> None:
    """Send at ``settings.rate`` round robin over the partitions until ``stop``, handing each
    delivery to its partition's waiter (in order: one batch per partition is in flight)."""
    senders, receivers = zip(
        *(
            trio.open_memory_channel[tuple[Record, Delivery]](math.inf)
            for _ in range(settings.partitions)
        ),
        strict=True,
    )
    async with trio.open_nursery() as nursery:
        for partition, receiver in enumerate(receivers):
            nursery.start_soon(await_deliveries, receiver, tally, partition)
        async with contextlib.AsyncExitStack() as closing:
            for sender in senders:
                closing.push_async_callback(sender.aclose)
            sequence = 0
            next_at = trio.current_time()
            while not stop.is_set():
                partition = sequence % settings.partitions
                value = b"%d-%d" % (partition, sequence)
                record = Record(partition=partition, sequence=sequence, value=value)
                tally.records[value] = record
                delivery = await producer.send(TOPIC, value, partition=partition)
                senders[partition].send_nowait((record, delivery))
                sequence += 1
                # A steady rate: after a stall (backpressure), catch up by at most a second.
                next_at = max(next_at + 1 / settings.rate, trio.current_time() - 1)
                with trio.move_on_at(next_at):
                    await stop.wait()


async def await_deliveries(
    receiver: trio.MemoryReceiveChannel[tuple[Record, Delivery]], tally: Tally, partition: int
) -> None:
    async with receiver:
        async for record, delivery in receiver:
            try:
                record.acknowledged = await delivery
            except Exception:  # the producer gave the record up: not acknowledged
                tally.failed += 1
                continue
            tally.acknowledged += 1
            tally.last_acknowledged[partition] = record.sequence
            async with tally.changed:
                tally.changed.notify_all()


@attrs.define(eq=False)
class Nemesis:
    nodes: list[Node]
    settings: Settings
    tally: Tally
    rng: random.Random
    kills: int = 0
    lagging_rounds: int = 0
    quick_rounds: int = 0
    paused_rounds: int = 0
    wipes: int = 0

    def node(self, broker_id: int) -> Node:
        return next(n for n in self.nodes if n.broker_id == broker_id)

    async def run(self, seconds: float) -> None:
        end = trio.current_time() + seconds
        round_number = 0
        wipe_by = self.settings.min_rounds + 2 * len(ROUNDS)  # rounds it may wait for a wipe
        while (
            trio.current_time() < end
            or round_number < self.settings.min_rounds
            or (self.settings.wipe_once and not self.wipes and round_number < wipe_by)
        ):
            started = trio.current_time()
            await self.one_round(ROUNDS[round_number % len(ROUNDS)])
            round_number += 1
            if trio.current_time() < end:
                await trio.sleep_until(min(end, started + self.settings.interval))

    async def one_round(self, kind: Round) -> None:
        led: dict[int, Leader] = {}

        async def some_led() -> bool:
            found = await leaders(self.nodes, self.settings.partitions)
            led.update((p, leader) for p, leader in found.items() if leader.broker_id >= 0)
            return bool(led)

        await eventually(some_led, deadline=DEADLINE)
        partition = self.rng.choice(sorted(led))
        leader = led[partition]
        victim = self.node(leader.broker_id)
        followers = [self.node(b) for b in leader.replicas if b != victim.broker_id]

        async def moved() -> bool:
            now = (await leaders(self.nodes, self.settings.partitions)).get(partition)
            if now is None:
                return False
            if now.broker_id not in (-1, victim.broker_id):
                return True
            # Its last in-sync replica is the victim: only its return elects anybody.
            return not self.settings.unclean and set(now.isr) <= {victim.broker_id}

        if kind == "paused":
            victim.signal(signal.SIGSTOP)
            self.paused_rounds += 1
            await eventually_true(moved, deadline=DEADLINE)
            victim.signal(signal.SIGCONT)
            return
        if kind == "lagging":
            await self.lag(partition, followers)
            self.lagging_rounds += 1
        await victim.kill()
        self.kills += 1
        for follower in followers:
            follower.signal(signal.SIGCONT)
        if kind == "quick":
            self.quick_rounds += 1
        else:
            await eventually_true(moved, deadline=DEADLINE)
        await victim.stop()
        wipe = kind == "quick" and self.settings.wipe_once and not self.wipes
        if wipe and await self.wipeable(victim):
            shutil.rmtree(victim.data_dir, ignore_errors=True)
            self.wipes += 1
        await victim.start()

    async def lag(self, partition: int, followers: Sequence[Node]) -> None:
        """Pause ``followers`` for a random time up to twice their ZooKeeper session (past it,
        the controller takes them out of the ISR); at acks=1, until two records of
        ``partition`` sent from the pause on are acknowledged too (by the leader alone; bounded
        by ``LAG_WAIT`` more seconds)."""
        tally = self.tally
        for follower in followers:
            follower.signal(signal.SIGSTOP)
        # The second record of the partition sent from now: a fetch the leader answered just
        # before the pause may reach a follower when it resumes, with the first.
        second = len(tally.records) + self.settings.partitions
        await trio.sleep(self.rng.uniform(0.5, 2 * ZK_SESSION))
        if self.settings.acks == 1:
            with trio.move_on_after(LAG_WAIT):
                async with tally.changed:
                    while tally.last_acknowledged.get(partition, -1) < second:
                        await tally.changed.wait()

    async def wipeable(self, victim: Node) -> bool:
        """Whether no partition has ``victim`` as its last in-sync replica (wiping it would
        leave that partition without a replica that may lead: unavailable, not lost)."""
        found = await leaders(self.nodes, self.settings.partitions)
        return len(found) == self.settings.partitions and all(
            set(leader.isr) - {victim.broker_id} for leader in found.values()
        )

    async def heal(self) -> None:
        for node in self.nodes:
            node.signal(signal.SIGCONT)
            if not node.up:
                await node.stop()
                await node.start()


async def read_all(admin: Admin, tp: TopicPartition) -> dict[int, bytes]:
    """Every record of ``tp`` its leader serves (up to its high watermark), by offset."""
    found: dict[int, bytes] = {}
    offset = 0
    while True:
        read = await admin.read(tp, offset)
        for batch in read.batches:
            for at, value in zip(batch.offsets, batch.values(), strict=True):
                if at >= offset and value is not None:
                    found[at] = value
        if not read.batches or offset >= read.high_watermark:
            return found
        offset = max(found, default=offset - 1) + 1
        if offset >= read.high_watermark:
            return found


async def read_back(nodes: Sequence[Node], partitions: int) -> dict[int, dict[int, bytes]]:
    """Every partition as its leader serves it, each through an admin of its own bootstrapped
    at that leader."""
    found = await leaders(nodes, partitions)
    stored: dict[int, dict[int, bytes]] = {}
    for partition in range(partitions):
        leader = found.get(partition)
        if leader is None or leader.broker_id < 0:
            raise RuntimeError(f"partition {partition} has no leader to read from")
        address = next(n.address for n in nodes if n.broker_id == leader.broker_id)
        with trio.fail_after(DEADLINE):
            async with open_admin([address]) as admin:
                tp = TopicPartition(topic=TOPIC, partition=partition)
                stored[partition] = await read_all(admin, tp)
    return stored


def check(
    tally: Tally, stored: Mapping[int, Mapping[int, bytes]]
) -> tuple[int, int, int, int, tuple[tuple[int, int, str, str | None], ...]]:
    """(lost, unexpected, out of order, duplicates, examples of loss) of what was read."""
    lost: list[tuple[int, int, str, str | None]] = []
    for record in tally.records.values():
        if record.acknowledged is None:
            continue
        partition, offset = record.acknowledged
        there = stored.get(partition, {}).get(offset)
        if there != record.value:
            lost.append(
                (
                    partition,
                    offset,
                    record.value.decode(),
                    None if there is None else there.decode(),
                )
            )
    unexpected = out_of_order = duplicates = 0
    for partition, records in stored.items():
        seen: set[bytes] = set()
        highest = -1
        for offset in sorted(records):
            value = records[offset]
            sent = tally.records.get(value)
            if sent is None or sent.partition != partition:
                unexpected += 1
                continue
            if value in seen:
                duplicates += 1
                continue
            seen.add(value)
            if sent.sequence < highest:
                out_of_order += 1
            highest = max(highest, sent.sequence)
    lost.sort()
    return len(lost), unexpected, out_of_order, duplicates, tuple(lost[:5])


async def run_jepsen(settings: Settings, hosts: str, work: Path) -> Outcome:
    """The whole test on ZooKeeper at ``hosts`` (a chroot of its own), brokers under ``work``."""
    rng = random.Random(settings.seed)
    tally = Tally()
    configs = {"min.insync.replicas": "2"}
    if settings.unclean:
        configs["unclean.leader.election.enable"] = "true"
    async with open_cluster(hosts, work) as nodes:
        async with open_admin([n.address for n in nodes]) as admin:
            await admin.create_topic(
                TOPIC, settings.partitions, replication_factor=REPLICAS, configs=configs
            )
        await eventually(lambda: all_in_sync(nodes, settings.partitions), deadline=DEADLINE)
        nemesis = Nemesis(nodes=nodes, settings=settings, tally=tally, rng=rng)
        config = ProducerConfig(acks=settings.acks, delivery_timeout=DEADLINE)
        stop = trio.Event()
        async with (
            open_producer([n.address for n in nodes], config=config) as producer,
            trio.open_nursery() as nursery,
        ):
            nursery.start_soon(produce, producer, settings, tally, stop)
            await trio.sleep(settings.baseline_seconds)
            baseline = tally.acknowledged / settings.baseline_seconds
            before = tally.acknowledged
            started = trio.current_time()
            await nemesis.run(settings.nemesis_seconds)
            nemesis_seconds = trio.current_time() - started
            during = (tally.acknowledged - before) / nemesis_seconds
            await nemesis.heal()
            stop.set()
        healed = await eventually_true(
            lambda: all_in_sync(nodes, settings.partitions), deadline=DEADLINE
        )
        stored = await read_back(nodes, settings.partitions)
        final = await leaders(nodes, settings.partitions)
    lost, unexpected, out_of_order, duplicates, examples = check(tally, stored)
    return Outcome(
        sent=len(tally.records),
        acknowledged=tally.acknowledged,
        failed=tally.failed,
        lost=lost,
        unexpected=unexpected,
        out_of_order=out_of_order,
        duplicates=duplicates,
        kills=nemesis.kills,
        lagging_rounds=nemesis.lagging_rounds,
        quick_rounds=nemesis.quick_rounds,
        paused_rounds=nemesis.paused_rounds,
        wipes=nemesis.wipes,
        leader_changes=sum(max(0, leader.epoch) for leader in final.values()),
        nemesis_seconds=nemesis_seconds,
        baseline_per_s=baseline,
        nemesis_per_s=during,
        healed=healed,
        lost_examples=examples,
    )


def report(settings: Settings, outcome: Outcome) -> None:
    extra: dict[str, Any] = {
        "acks": str(settings.acks),
        "unclean": settings.unclean,
        "wipe_once": settings.wipe_once,
    }
    for name, value, unit in (
        ("sent", outcome.sent, "records"),
        ("acknowledged", outcome.acknowledged, "records"),
        ("failed", outcome.failed, "records"),
        ("lost", outcome.lost, "records"),
        ("unexpected", outcome.unexpected, "records"),
        ("out_of_order", outcome.out_of_order, "records"),
        ("duplicates", outcome.duplicates, "records"),
        ("kills", outcome.kills, "kills"),
        ("lagging_rounds", outcome.lagging_rounds, "rounds"),
        ("quick_rounds", outcome.quick_rounds, "rounds"),
        ("paused_rounds", outcome.paused_rounds, "rounds"),
        ("wipes", outcome.wipes, "wipes"),
        ("leader_changes", outcome.leader_changes, "elections"),
        ("nemesis_seconds", outcome.nemesis_seconds, "s"),
    ):
        figure(BENCHMARK, name, value, unit, **extra)
    figure(
        BENCHMARK,
        "acknowledged_per_s",
        outcome.nemesis_per_s,
        "records/s",
        outcome.baseline_per_s,
        healed=outcome.healed,
        lost_examples=outcome.lost_examples,
        **extra,
    )


def main() -> None:
    parser = bench_arguments(__doc__ or "")
    parser.add_argument("--minutes", type=float, default=2.0, help="of nemesis (default 2)")
    parser.add_argument("--acks", choices=["all", "1"], default="all")
    parser.add_argument("--unclean", action="store_true", help="unclean.leader.election.enable")
    parser.add_argument("--wipe-once", action="store_true", help="wipe one victim's data dir")
    parser.add_argument("--rate", type=float, default=100.0, help="records/s (default 100)")
    parser.add_argument("--interval", type=float, default=4.0, help="s between kills")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    settings = Settings(
        nemesis_seconds=60 * (0.5 if args.quick else args.minutes),
        acks="all" if args.acks == "all" else 1,
        unclean=args.unclean,
        wipe_once=args.wipe_once,
        rate=args.rate,
        interval=args.interval,
        seed=args.seed,
    )
    outcomes: list[Outcome] = []

    async def main_async() -> None:
        with work_area(args.work_dir, BENCHMARK) as work:
            for old in work.iterdir():  # a run before this one's, with --work-dir
                (shutil.rmtree if old.is_dir() else Path.unlink)(old)
            with open_ensemble(3, base_dir=work / "zookeeper") as ensemble:
                outcome = await run_jepsen(settings, f"{ensemble.hosts}/jepsen", work)
            report(settings, outcome)
            outcomes.append(outcome)

    run(main_async)
    if settings.acks == "all" and not (outcomes and outcomes[0].safe and outcomes[0].healed):
        sys.exit(1)


if __name__ == "__main__":
    main()
