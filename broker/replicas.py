"""This broker's part in replication (DESIGN37 §2.4): for each partition of a topic created with
a replication factor above 1 that has a replica here, whether this broker leads it (under which
leader epoch) or follows its leader, as the store's partition states say; and, for those it
leads, the leader's machine (statemachine/replica_leader.py) with the acks=all produces waiting
on it.

Partitions of factor 1 are not this module's: their one broker leads them at epoch 0, the data
plane's path of before replication (broker/data_plane.py).

A role changes under the partition's lock, which the fetcher holds while it appends or truncates,
so a log is never written by a leader and a follower at once. Becoming leader writes the epoch's
start to the partition's leader-epoch cache before anything is served under it; becoming
follower answers the waiting produces NOT_LEADER_OR_FOLLOWER (the machine's ``Resigned``) and
hands the partition to the fetcher of its new leader (broker/replica_fetcher.py), one task per
leader broker, owned by this manager's nursery and cancelled once it follows nothing there.
"""

from __future__ import annotations

import itertools
import logging
import uuid
from collections.abc import Awaitable, Callable, Mapping
from contextlib import AbstractAsyncContextManager, aclosing
from typing import Protocol

import attrs
import trio

from broker.data_plane import BrokerLog
from broker.log import (
    CorruptCheckpoint,
    CorruptSegment,
    EpochRefused,
    FsyncPolicy,
    LogFailed,
    PartitionLog,
    read_high_watermarks,
    write_high_watermarks,
)
from broker.log.checkpoints import HIGH_WATERMARKS
from broker.offices import topic_reads
from protocol import ReplicaFetchRequest, ReplicaFetchResponse, ResponseMessage
from protocol.errors import ErrorCode, IllegalInput
from protocol.topic_configs import min_insync_replicas
from protocol.types import TopicId, TopicPartition
from statemachine import replica_leader as rl
from statemachine.partition_state import NO_LEADER, PartitionKey, PartitionState, StateWrite
from store import StoreError, TopicPlacement
from store.interface import ReplicationStore

log = logging.getLogger(__name__)

#: How long an in-sync follower may go without catching up with the log end before its leader
#: takes it out of the ISR (Kafka's ``replica.lag.time.max.ms``).
REPLICA_LAG = 10.0
#: How often the leaders look for followers that fell behind.
TICK_INTERVAL = 1.0
#: How often the high watermarks are written down (and at a clean stop).
CHECKPOINT_INTERVAL = 5.0
#: How long the state watch waits before it starts over after the store failed it.
STORE_RETRY = 1.0
#: The least time between two reads of the brokers' registered log directories.
DIRS_REREAD = 1.0
#: Role changes a broker runs at once (each opens a log and may write its epoch file).
ROLE_CHANGES_AT_ONCE = 32

#: Opens a channel to a broker by id (its first listener): what a fetcher sends REPLICA_FETCH on.
Connect = Callable[[int], AbstractAsyncContextManager["Requester"]]
#: Fetches from a leader broker for as long as it runs (``broker.replica_fetcher.fetch_from``).
FetchFrom = Callable[["ReplicaManager", int], Awaitable[None]]
#: Answers a follower's REPLICA_FETCH (``broker.replica_serve.answer_replica_fetch``).
Serve = Callable[["ReplicaManager", ReplicaFetchRequest], Awaitable[ReplicaFetchResponse]]


class Requester(Protocol):
    """What a fetcher needs of a channel (``transport.channel.Channel.request``)."""

    async def request(self, message: ReplicaFetchRequest) -> ResponseMessage: ...


@attrs.define(eq=False)
class Following:
    """A partition followed here: its leader (NO_LEADER: none now) under ``epoch``."""

    tp: TopicPartition
    log: PartitionLog
    leader: int
    epoch: int


@attrs.define(eq=False)
class Led:
    """A partition led here for one leader epoch: its machine and the produces waiting on it
    (the data plane's ``ReplicaLeading``)."""

    manager: ReplicaManager
    key: PartitionKey
    tp: TopicPartition
    log: PartitionLog
    machine: rl.ReplicaLeader
    codes: dict[int, ErrorCode] = attrs.field(factory=dict)
    done: dict[int, trio.Event] = attrs.field(factory=dict)

    @property
    def epoch(self) -> int:
        return self.machine.epoch

    @property
    def high_watermark(self) -> int:
        return self.machine.hw

    @property
    def in_force(self) -> bool:
        return self.manager.current(self)

    async def read(self, offset: int, max_bytes: int) -> bytes:
        """A consumer's read: up to the high watermark only."""
        return await self.log.read(offset, max_bytes, limit=self.machine.hw)

    def ask(self, acks_all: bool) -> tuple[int, ErrorCode]:
        """A produce's ticket, before anything is appended; NOT_ENOUGH_REPLICAS: append nothing."""
        request = next(self.manager.requests)
        self.manager.feed(self, rl.ProduceAsked(request=request, acks_all=acks_all))
        return request, self.codes.pop(request, ErrorCode.NONE)

    async def appended(self, request: int, acks_all: bool, timeout_ms: int) -> ErrorCode:
        """The answer to a produce whose records were appended: at once for acks=1; for acks=all
        once the high watermark covers them, or NOT_ENOUGH_REPLICAS_AFTER_APPEND,
        NOT_LEADER_OR_FOLLOWER (this broker stopped leading), REQUEST_TIMED_OUT."""
        if not self.manager.current(self):
            return ErrorCode.NOT_LEADER_OR_FOLLOWER
        done = self.done[request] = trio.Event()
        end = self.log.log_end_offset
        durable = self.log.flushed_offset if self.log.config.fsync is FsyncPolicy.ALWAYS else end
        appended = rl.Appended(
            request=request, acks_all=acks_all, end=end, durable_end=min(durable, end)
        )
        self.manager.feed(self, appended)
        try:
            if request not in self.codes:
                with trio.move_on_after(timeout_ms / 1000):
                    await done.wait()
        finally:
            if request not in self.codes:  # timed out, or cancelled: the machine forgets it
                self.manager.feed(self, rl.ProduceExpired(request=request))
            self.done.pop(request, None)
            code = self.codes.pop(request, ErrorCode.REQUEST_TIMED_OUT)
        return code

    def answer(self, request: int, code: ErrorCode) -> None:
        self.codes[request] = code
        waiting = self.done.get(request)
        if waiting is not None:
            waiting.set()

    def end(self) -> None:
        """This broker no longer leads under this epoch: every produce still waiting is told."""
        for request in list(self.done):
            if request not in self.codes:
                self.answer(request, ErrorCode.NOT_LEADER_OR_FOLLOWER)


@attrs.define(eq=False)
class ReplicaManager:
    """The roles of this broker's replicas of replicated partitions, from the store's states and
    the topics' placements (``logs.placement``). Run it with ``nursery.start(manager.run)``.
    The fetchers' and the REPLICA_FETCH answers' modules, which use it, are handed in
    (``fetch_from``, ``serve``)."""

    broker_id: int
    log_dir: uuid.UUID
    store: ReplicationStore
    logs: BrokerLog
    connect: Connect
    fetch_from: FetchFrom
    serve: Serve
    replica_lag: float = REPLICA_LAG
    states: dict[PartitionKey, PartitionState] = attrs.field(factory=dict)
    led: dict[PartitionKey, Led] = attrs.field(factory=dict)
    following: dict[PartitionKey, Following] = attrs.field(factory=dict)
    #: A follower's high watermark (the leader's, as far as its log reaches): where it starts
    #: counting if it is elected.
    follower_hw: dict[PartitionKey, int] = attrs.field(factory=dict)
    requests: itertools.count[int] = attrs.field(factory=itertools.count)
    #: Set (and replaced) whenever a led partition's log end or high watermark moves: what a
    #: REPLICA_FETCH held for news waits on.
    changed: trio.Event = attrs.field(factory=trio.Event)
    #: Set (and replaced) whenever a partition is followed at a leader anew: a fetcher's request
    #: in flight, which does not name it, is cut short and asked again with it.
    followed_more: trio.Event = attrs.field(factory=trio.Event)
    _locks: dict[PartitionKey, trio.Lock] = attrs.field(factory=dict)
    _fetchers: dict[int, trio.CancelScope] = attrs.field(factory=dict)
    _registered: Mapping[int, uuid.UUID] = attrs.field(factory=dict)
    _registered_at: float = float("-inf")
    _dirs_lock: trio.Lock = attrs.field(factory=trio.Lock)
    _nursery: trio.Nursery | None = None

    # --- what the data plane asks (its ``Replication``) -------------------------------------

    def placement_of(self, tp: TopicPartition) -> TopicPlacement | None:
        placement = self.logs.placement.get(tp.topic)
        if placement is None or not 0 <= tp.partition < placement.partition_count:
            return None
        return placement

    def replicated(self, tp: TopicPartition) -> bool:
        placement = self.placement_of(tp)
        return placement is not None and placement.replication_factor > 1

    def leading(self, tp: TopicPartition) -> Led | None:
        placement = self.placement_of(tp)
        if placement is None:
            return None
        led = self.led.get(PartitionKey(topic_id=placement.topic_id, partition=tp.partition))
        return led if led is not None and self.current(led) else None

    def leader_hint(self, tp: TopicPartition) -> tuple[int, int]:
        """(leader, leader epoch) of a replicated partition as the state view has them."""
        placement = self.placement_of(tp)
        if placement is not None:
            key = PartitionKey(topic_id=placement.topic_id, partition=tp.partition)
            state = self.states.get(key)
            if state is not None:
                return state.leader, state.leader_epoch
        return NO_LEADER, -1

    async def replica_fetch(self, message: ReplicaFetchRequest) -> ReplicaFetchResponse:
        return await self.serve(self, message)

    # --- the leader machines' effects -------------------------------------------------------

    def current(self, led: Led) -> bool:
        return self.led.get(led.key) is led and led.machine.phase is not rl.LeaderPhase.RESIGNED

    def feed(self, led: Led, event: rl.Event) -> list[rl.Effect]:
        """Give ``event`` to ``led``'s machine and perform its effects (none once it no longer
        leads: an event of an old epoch is moot)."""
        if not self.current(led):
            return []
        before = (led.machine.leo, led.machine.hw)
        try:
            effects = led.machine.handle(event)
        except IllegalInput:
            log.exception("%s: %s refused", led.tp, type(event).__name__)
            return []
        for effect in effects:
            match effect:
                case rl.Answered(request=request, code=code):
                    led.answer(request, code)
                case rl.WriteIsr(write=write):
                    self._spawn(self._write_isr, led, write)
                case rl.ReadState():
                    self._spawn(self._read_state, led)
                case rl.Resigned(state=state):
                    led.end()
                    self._spawn(self._reapply, {led.key: state})
        if (led.machine.leo, led.machine.hw) != before:
            self.poke()
        return effects

    def poke(self) -> None:
        self.changed.set()
        self.changed = trio.Event()

    def _spawn(self, fn: Callable[..., object], *args: object) -> None:
        assert self._nursery is not None, "the manager is not running"
        self._nursery.start_soon(fn, *args)  # type: ignore[arg-type]

    async def _write_isr(self, led: Led, write: StateWrite) -> None:
        try:
            lost = await self.store.write_partition_states(None, [write])
        except StoreError as exc:
            log.warning("%s: writing the ISR failed (%s); reading it again", led.tp, exc)
            lost = (write.key,)
        if lost:
            self.feed(led, rl.IsrWriteLost())
        else:
            log.info("%s: ISR now %s", led.tp, [e.broker_id for e in write.state.isr])
            self.feed(led, rl.IsrWritten())

    async def _read_state(self, led: Led) -> None:
        while self.current(led):
            try:
                found = await self.store.read_partition_states([led.key])
            except StoreError as exc:
                log.warning("%s: reading the state failed (%s); again in 1 s", led.tp, exc)
                await trio.sleep(1)
                continue
            state = found.get(led.key)
            if state is not None:
                self.feed(led, rl.StateRead(state=state))
            return

    async def registered_dirs(self, broker_id: int, log_dir: uuid.UUID) -> Mapping[int, uuid.UUID]:
        """The brokers' registered log directories, read again (at most once a second) when
        ``broker_id`` fetches with another one than this manager knew."""
        now = trio.current_time()
        if self._registered.get(broker_id) != log_dir and now - self._registered_at >= DIRS_REREAD:
            self._registered_at = now
            try:
                self._registered = await self.store.broker_dirs()
            except StoreError as exc:
                log.warning("reading the brokers' log directories failed: %s", exc)
            for led in list(self.led.values()):
                self.feed(led, rl.BrokersSeen(registered=self._registered))
        return self._registered

    # --- roles ------------------------------------------------------------------------------

    def lock(self, key: PartitionKey) -> trio.Lock:
        return self._locks.setdefault(key, trio.Lock())

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Follow the state view until cancelled; started once the first view is applied."""
        directory = self.logs.directory
        if await trio.to_thread.run_sync(directory.joinpath(HIGH_WATERMARKS).exists):
            marks = await trio.to_thread.run_sync(read_high_watermarks, directory)
            self.follower_hw.update(marks)
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                nursery.start_soon(self._tick_loop)
                nursery.start_soon(self._checkpoint_loop)
                started = False
                while True:
                    try:
                        async with aclosing(self.store.partition_state_updates()) as updates:
                            async for states in updates:
                                await self._apply(states)
                                if not started:
                                    started = True
                                    task_status.started()
                    except StoreError as exc:
                        # the watch starts over with every state: nothing is missed
                        log.warning("partition states: %s; again in %g s", exc, STORE_RETRY)
                        await trio.sleep(STORE_RETRY)
        finally:
            with trio.CancelScope(shield=True):
                await self.checkpoint()

    def high_watermarks(self) -> dict[PartitionKey, int]:
        """Each replicated partition's high watermark here: the leader's, or as a follower
        learned it (at most the leader's)."""
        marks = dict(self.follower_hw)
        marks.update((key, led.high_watermark) for key, led in self.led.items())
        return marks

    async def checkpoint(self) -> None:
        """Write the high watermarks (``replication-offset-checkpoint``), so that a broker
        restarted and elected starts from one at most the true one; none while nothing is
        replicated here."""
        marks = self.high_watermarks()
        if marks:
            directory = self.logs.directory
            await trio.to_thread.run_sync(write_high_watermarks, directory, marks)

    async def _checkpoint_loop(self) -> None:
        while True:
            await trio.sleep(CHECKPOINT_INTERVAL)
            try:
                await self.checkpoint()
            except OSError as exc:
                log.warning("writing the high watermarks failed: %s", exc)

    async def _tick_loop(self) -> None:
        while True:
            await trio.sleep(TICK_INTERVAL)
            for led in list(self.led.values()):
                self.feed(led, rl.Tick(now=trio.current_time()))

    async def _apply(self, states: Mapping[PartitionKey, PartitionState]) -> None:
        by_id = self.by_topic_id()
        if any(key.topic_id not in by_id for key in states):
            # a state may come before this broker's topic watch shows its topic
            self.logs.placement = await topic_reads(self.logs.store).since(trio.current_time())
            by_id = self.by_topic_id()
        changes: list[tuple[PartitionKey, TopicPlacement]] = []
        for key, state in states.items():
            placement = by_id.get(key.topic_id)
            if placement is None or placement.replication_factor <= 1:
                continue  # a deleted topic's, or one nobody writes (factor 1)
            known = self.states.get(key)
            if known is None or state.version >= known.version:
                self.states[key] = state
            led = self.led.get(key)
            if led is not None:
                self.feed(led, rl.StateSeen(state=self.states[key]))
            changes.append((key, placement))
        # Side by side, the partitions elected here first: at a topic's creation or a failover a
        # broker takes up thousands of roles, each opening a log and writing an epoch file, and
        # one after another they took tens of seconds while the partitions led here had no
        # leader serving them.
        changes.sort(key=lambda change: self.states[change[0]].leader != self.broker_id)
        failed: list[StoreError] = []
        limiter = trio.CapacityLimiter(ROLE_CHANGES_AT_ONCE)

        async def change_role(key: PartitionKey, placement: TopicPlacement) -> None:
            async with limiter:
                try:
                    await self._change_role(key, placement)
                except StoreError as exc:
                    failed.append(exc)

        async with trio.open_nursery() as nursery:
            for key, placement in changes:
                nursery.start_soon(change_role, key, placement)
        if failed:
            raise failed[0]

    async def _reapply(self, states: Mapping[PartitionKey, PartitionState]) -> None:
        try:
            await self._apply(states)
        except StoreError as exc:  # no role here until the state changes again
            log.warning("partition states: %s", exc)

    def by_topic_id(self) -> dict[TopicId, TopicPlacement]:
        return {p.topic_id: p for p in self.logs.placement.values()}

    async def _change_role(self, key: PartitionKey, placement: TopicPlacement) -> None:
        async with self.lock(key):
            state = self.states[key]
            tp = TopicPartition(topic=placement.topic, partition=key.partition)
            here = self.broker_id in placement.replicas[key.partition]
            led = self.led.get(key)
            followed = self.following.get(key)
            if led is not None and self.current(led) and state.leader_epoch == led.epoch:
                return  # the same election: the machine took the state
            if (
                followed is not None
                and (followed.leader, followed.epoch) == (state.leader, state.leader_epoch)
                and here
            ):
                return
            if led is not None:
                led.end()
                del self.led[key]
                self.follower_hw[key] = led.high_watermark
                log.info("%s: no longer led here (epoch %d)", tp, led.epoch)
            if followed is not None:
                self._unfollow(key, followed)
            if not here:
                return
            try:
                if state.leader == self.broker_id:
                    await self._start_leading(key, tp, state, placement)
                else:
                    await self._follow(key, tp, state)
            except (OSError, LogFailed, CorruptSegment, CorruptCheckpoint) as exc:
                # this copy cannot be opened or its epochs read: no role here until the state
                # changes again; the broker's other partitions go on (as the fetcher's do)
                log.error("%s: no role under epoch %d: %s", tp, state.leader_epoch, exc)

    async def _start_leading(
        self,
        key: PartitionKey,
        tp: TopicPartition,
        state: PartitionState,
        placement: TopicPlacement,
    ) -> None:
        partition_log = await self.logs.partition(tp.topic, tp.partition, key.topic_id)
        if partition_log is None:
            return
        async with self._dirs_lock:  # role changes run side by side: one read for all
            if trio.current_time() - self._registered_at >= DIRS_REREAD:
                # one read serves the many partitions a failover elects here at once; a
                # follower that fetches with a directory this map does not name has it read
                # again
                self._registered = await self.store.broker_dirs()
                self._registered_at = trio.current_time()
                for other in list(self.led.values()):
                    # a follower whose directory changed fetches with what this map says now:
                    # the other leaders learn it here or never (``registered_dirs`` reads on a
                    # change)
                    self.feed(other, rl.BrokersSeen(registered=self._registered))
        end = partition_log.log_end_offset
        fsync_always = partition_log.config.fsync is FsyncPolicy.ALWAYS
        durable = min(partition_log.flushed_offset, end) if fsync_always else end
        settings = rl.LeaderSettings(
            min_insync=min_insync_replicas(placement.configs, placement.replication_factor),
            replica_lag=self.replica_lag,
        )
        try:
            machine = rl.ReplicaLeader.elected(
                key=key,
                broker_id=self.broker_id,
                log_dir=self.log_dir,
                replicas=placement.replicas[key.partition],
                state=state,
                settings=settings,
                leo=end,
                durable_end=durable,
                hw=min(self.follower_hw.get(key, 0), durable),
                registered=self._registered,
                now=trio.current_time(),
            )
        except IllegalInput as exc:
            # e.g. the ISR vouched for this broker's previous log directory (a wiped disk):
            # the log is left as it is, with no epoch of a leadership never taken up, so that
            # it can follow the next leader from its first epoch on
            log.error("%s: cannot lead: %s", tp, exc)
            return
        epochs = await partition_log.leader_epochs()
        latest = epochs.latest
        try:
            if latest is None or latest.epoch < state.leader_epoch:
                await partition_log.assign_epoch(state.leader_epoch)
            elif latest.epoch > state.leader_epoch:
                raise EpochRefused(f"this log has epoch {latest.epoch} already")
        except EpochRefused as exc:
            log.error("%s: cannot lead under epoch %d: %s", tp, state.leader_epoch, exc)
            return
        self.led[key] = Led(manager=self, key=key, tp=tp, log=partition_log, machine=machine)
        log.info("%s: led here from offset %d, epoch %d", tp, end, state.leader_epoch)
        self.poke()

    async def _follow(self, key: PartitionKey, tp: TopicPartition, state: PartitionState) -> None:
        partition_log = await self.logs.partition(tp.topic, tp.partition, key.topic_id)
        if partition_log is None:
            return
        self.following[key] = Following(
            tp=tp, log=partition_log, leader=state.leader, epoch=state.leader_epoch
        )
        log.info("%s: follows broker %d, epoch %d", tp, state.leader, state.leader_epoch)
        self.followed_more.set()
        self.followed_more = trio.Event()
        if state.leader != NO_LEADER and state.leader not in self._fetchers:
            self._fetchers[state.leader] = trio.CancelScope()
            self._spawn(self._fetch_from, state.leader, self._fetchers[state.leader])

    def _unfollow(self, key: PartitionKey, followed: Following) -> None:
        del self.following[key]
        if not self.followed_at(followed.leader) and followed.leader in self._fetchers:
            self._fetchers.pop(followed.leader).cancel()

    def followed_at(self, leader: int) -> dict[PartitionKey, Following]:
        """The partitions followed at ``leader`` whose logs are still open (a deleted topic's
        state stays, its log does not)."""
        open_logs = self.logs.partitions
        return {
            k: f
            for k, f in self.following.items()
            if f.leader == leader and open_logs.get(f.tp) is f.log
        }

    async def _fetch_from(self, leader: int, scope: trio.CancelScope) -> None:
        with scope:
            await self.fetch_from(self, leader)
        if self._fetchers.get(leader) is scope:
            del self._fetchers[leader]
