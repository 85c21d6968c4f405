"""The consumer an application embeds (seed 03), performing the effects of the consumer machine.

:class:`statemachine.consumer.ConsumerMachine` decides everything: when to discover, register,
stop, start, answer and close, and when the ownership lease runs out. This module owns the tasks
that do it, in the manner of a trio driver around a sans-IO core:

* one **driver** task feeds the machine one input at a time and performs the effects in order.
  It waits for the next input no later than the machine's ``lease_deadline()`` and then calls
  ``check_lease`` (the lease timer); the fetchers also check the lease themselves before every
  request, so they stop at the deadline even if the driver is busy;
* a **discovery** task per :class:`~statemachine.consumer.Discover` effect (one round-robin pass);
* a **session** per :class:`~statemachine.consumer.Register` effect: the coordinator connection,
  its reader and the registration. Every input carries the session or discovery it came from, and
  inputs from one that the machine has since closed are dropped, so a late answer from an old
  connection can never reach the machine;
* the **fetchers** (:mod:`consumer.fetcher`), one task per assigned partition with a cancel scope
  of its own, feeding the streams (:mod:`consumer.streams`, which also defines when a record
  counts as consumed). A revocation stops only the fetchers it names and an incremental start
  only adds fetchers (SPEC.md §11.5, §11.6), so the partitions a rebalance does not move are
  fetched and delivered on without a gap.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import math
import random
import uuid
import warnings
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import TypeAlias

import attrs
import trio
from trio_util import AsyncValue

from protocol import (
    AssignedStream,
    ErrorCode,
    LeaveGroupRequest,
    LeaveGroupResponse,
    OffsetCommitRequest,
    OffsetCommitResponse,
    OffsetFetchRequest,
    OffsetFetchResponse,
    PingRequest,
    PingResponse,
    RegisterConsumerRequest,
    RegisterConsumerResponse,
    RemoteProtocolError,
    Request,
    ResponseMessage,
    Role,
    StartFetcherRequest,
    StartFetcherResponse,
    StopFetcherRequest,
    StopFetcherResponse,
)
from protocol.types import BrokerInfo, PartitionOffset, Subscription, TopicPartition, TopicStreams
from statemachine import consumer as sm
from transport.channel import Channel, ChannelClosed, acknowledged_frames
from transport.connect import Connector, parse_bootstrap
from transport.security import ClientSecurity

from .discovery import Discovery
from .fetcher import BrokerConnections, FetchSettings, run_fetcher
from .runtime import require_trio, unwrap_single
from .streams import ConsumerRecord, Deserializer, InstanceFenced, PartitionClaim, RecordStream

__all__ = [
    "CommitFailed",
    "Consumer",
    "ConsumerSettings",
    "CoordinatorUnavailable",
    "InstanceFenced",
    "RebalanceCallback",
    "RebalanceListener",
    "open_consumer",
]

log = logging.getLogger(__name__)

#: Chooses each discovery's jitter (``statemachine.consumer.Discover``): its only job is to keep a
#: group's consumers from looking all at once, so one generator for the process serves.
_JITTER = random.Random()

RebalanceCallback = Callable[[frozenset[TopicPartition]], Awaitable[None]]
"""Called with the partitions revoked (their fetchers already stopped, before the coordinator is
told, so a commit from it still counts for them) or added (their fetchers started); partitions a
rebalance leaves where they are appear in neither. Awaited by the driver: the coordinator expects
the answer within 2/3 of the session timeout, so keep it short."""

OFFSET_RESETS = ("earliest", "latest")
#: The names the seeds used, still accepted (with a DeprecationWarning), and what RegisterConsumer
#: carries on the wire (SPEC.md: ``smallest`` / ``largest``).
_OLD_OFFSET_RESETS = {"smallest": "earliest", "largest": "latest"}
_WIRE_OFFSET_RESETS = {"earliest": "smallest", "latest": "largest"}


def _offset_reset(value: str) -> str:
    if value in _OLD_OFFSET_RESETS:
        new = _OLD_OFFSET_RESETS[value]
        warnings.warn(
            f"auto_offset_reset={value!r} is deprecated: say {new!r}",
            DeprecationWarning,
            stacklevel=3,
        )
        return new
    if value not in OFFSET_RESETS:
        raise ValueError(f"auto_offset_reset must be 'earliest' or 'latest', not {value!r}")
    return value


class RebalanceListener:
    """aiokafka's ConsumerRebalanceListener, for ``open_consumer(listener=...)``: override
    either method. Same contract as ``on_revoked`` / ``on_assigned`` (:data:`RebalanceCallback`):
    revoked partitions are stopped and can still be committed; only what moves is named."""

    async def on_partitions_revoked(self, revoked: frozenset[TopicPartition]) -> None:
        """Called with the partitions taken away, before the coordinator is told."""

    async def on_partitions_assigned(self, assigned: frozenset[TopicPartition]) -> None:
        """Called with the partitions added, their fetchers started."""


@attrs.frozen(kw_only=True)
class ConsumerSettings:
    session_timeout: float = attrs.field(default=45.0, validator=attrs.validators.gt(0))
    """T, in seconds: the coordinator declares us dead after missed pings, and we stop fetching
    T after we queued the frame its latest request names as received (the ownership lease,
    docs/design.md#ownership-lease). Kafka's default; with the brokers' default ZooKeeper session
    a coordinator failover fits in the T/3 of lease a consumer is sure to have left
    (docs/design.md#defaults-that-fit-a-failover). A larger T detects a frozen member later."""
    auto_commit: bool = True
    """Report consumed offsets in Ping and StopFetcher responses, and commit on close."""
    auto_offset_reset: str = attrs.field(default="earliest", converter=_offset_reset)
    """Where to start a partition with no committed offset, or whose offset is out of range:
    ``earliest`` (the log start) or ``latest`` (the end: only records produced from now on).
    The seeds' ``smallest`` / ``largest`` are accepted with a DeprecationWarning."""
    client_id: str = "consumer"
    retry_backoff: float = 0.1
    max_retry_backoff: float = 5.0
    failover_retry: float = 0.05
    """Delay before looking for the coordinator again after NOT_COORDINATOR or
    COORDINATOR_LOAD_IN_PROGRESS: a failover is under way and the new coordinator is about to
    answer (docs/design.md#loading). The backoff applies after 250 of them in a row (12.5 s,
    beyond the brokers' default ZooKeeper session and a tick). While the consumer fetches under
    its lease it looks at least this often whatever it is answered, with jitter, and less often
    the larger its group (docs/design.md#finding-the-coordinator-again)."""
    failover_jitter: float = 0.5
    """While fetching under its lease, each look for the coordinator comes at the failover pace
    moved at random by up to this share of it either way, so a group's consumers do not look all
    at once (0: exactly at the pace)."""
    request_timeout: float = 5.0
    """Bound on each discovery, registration, commit and LeaveGroup round trip."""
    fetch_max_bytes: int = 1024 * 1024
    fetch_idle_interval: float = 0.1
    max_buffered_records: int = 1000
    """Per stream: fetchers wait while this many records wait for the application."""
    max_frame_size: int = 4 * 1024 * 1024
    discovery_timeout: float | None = 60.0
    """How long a new consumer looks for its coordinator before giving up: its streams then
    raise :class:`CoordinatorUnavailable` (a wrong bootstrap address or a cluster that is down).
    None: look forever. Once registered, a consumer looks for a lost coordinator forever."""
    key_deserializer: Deserializer | None = None
    """Turns each record's key (not None) into what ``async for`` and ``getmany`` hand over, as
    kafka-python's ``key_deserializer`` does: ``bytes.decode``; None: the bytes. The batch API
    always hands over bytes."""
    value_deserializer: Deserializer | None = None
    """As ``key_deserializer``, for values: ``json.loads``."""
    instance_id: str | None = None
    """Static membership (SPEC.md §11.11): the name of this member, which outlives its processes.
    A process that starts again under it within ``session_timeout`` gets its partitions back with
    nobody else disturbed; closing sends no LeaveGroup. A newer process under the same instance id
    fences this one (:class:`InstanceFenced`). The consumer id stays fresh per process."""

    def __attrs_post_init__(self) -> None:
        if self.discovery_timeout is not None and self.discovery_timeout <= 0:
            raise ValueError("discovery_timeout must be positive (or None: look forever)")


class CoordinatorUnavailable(Exception):
    """No broker of the bootstrap list named the group's coordinator within
    ``discovery_timeout``; the message says what the latest attempt ran into."""


class CommitFailed(Exception):
    def __init__(self, error_code: ErrorCode, message: str = "") -> None:
        self.error_code = error_code
        super().__init__(message or error_code.name)


# --- what the driver's inputs come from ---------------------------------------------------------


@attrs.define(eq=False)
class _Session:
    """One coordinator connection, from Register to CloseConnection."""

    coordinator: BrokerInfo
    scope: trio.CancelScope = attrs.field(factory=trio.CancelScope)
    channel: Channel | None = None
    registered: trio.Event = attrs.field(factory=trio.Event)
    requests: dict[int, Request] = attrs.field(factory=dict)


@attrs.define(eq=False)
class _DiscoveryRun:
    scope: trio.CancelScope = attrs.field(factory=trio.CancelScope)


@attrs.define(eq=False)
class _Fetcher:
    """One partition's fetcher task, stopped on its own."""

    claim: PartitionClaim
    stream: RecordStream
    scope: trio.CancelScope = attrs.field(factory=trio.CancelScope)
    done: trio.Event = attrs.field(factory=trio.Event)


_Source: TypeAlias = _Session | _DiscoveryRun | None
"""None: the application (Close)."""


@attrs.define(eq=False, repr=False)
class Consumer:
    """A member of a consumer group. Create it with :func:`open_consumer`."""

    group_id: str
    member_id: str
    subscription: Subscription
    settings: ConsumerSettings
    streams: tuple[RecordStream, ...]
    """Named topics: ``streams_for(topic)``; a wildcard: every stream takes every matching topic."""
    _machine: sm.ConsumerMachine
    assignment: AsyncValue[frozenset[TopicPartition]]
    """The partitions being fetched now (empty while stopped); wait on it with ``wait_value``."""
    _nursery: trio.Nursery
    _connect: Connector
    _discovery: Discovery
    _brokers: BrokerConnections
    _on_revoked: RebalanceCallback | None
    _on_assigned: RebalanceCallback | None
    _send: trio.MemorySendChannel[tuple[_Source, sm.Input]]
    _receive: trio.MemoryReceiveChannel[tuple[_Source, sm.Input]]
    _session: _Session | None = None
    _discovery_run: _DiscoveryRun | None = None
    _fetchers: dict[TopicPartition, _Fetcher] = attrs.field(factory=dict)
    _claims: dict[TopicPartition, PartitionClaim] = attrs.field(factory=dict)
    """Every claim since the last start: running ones, and stopped ones whose final offsets a
    StopFetcher answer or the final commit still reports."""
    _revoking: dict[TopicPartition, PartitionClaim] = attrs.field(factory=dict)
    """Stopped by the effects being performed, not yet answered: the coordinator still counts
    their offsets, so ``commit()`` from ``on_revoked`` includes them."""
    _accepted_by_epoch: collections.Counter[int] = attrs.field(factory=collections.Counter)
    """Coordinator requests (Ping, StopFetcher, StartFetcher) that passed the machine's epoch
    guard and were acted on, by coordinator epoch: what a failover test checks fencing with."""
    _accepted_span: dict[int, tuple[int, int]] = attrs.field(factory=dict)
    """Per epoch, the positions (1-based, over all accepted requests) of its first and last
    accepted request: a deposed coordinator's last must come before its successor's first."""
    _close_requested: bool = False
    _stopped: trio.Event = attrs.field(factory=trio.Event)
    _registered_once: bool = False
    _failure: Exception | None = None
    """Why the consumer gave up on its own (no coordinator found in time): iteration raises it."""
    _changed: trio.Event = attrs.field(factory=trio.Event)
    """Set when any stream changes: what iterating the consumer itself waits on."""
    _handed: dict[TopicPartition, ConsumerRecord] = attrs.field(factory=dict)
    """The last record of each partition handed out by iterating the consumer or ``getmany``:
    finished when the application asks for more."""
    _next_stream: int = 0
    observer: Callable[[Consumer, list[sm.Effect]], None] | None = None
    """Called with the effects of each input the machine took, once performed: what a test harness
    (the simulation's consumer) reads the machine's state and requests through, in the instant
    they changed."""

    def __attrs_post_init__(self) -> None:
        for stream in self.streams:
            stream._on_change = self._wake

    def _wake(self) -> None:
        self._changed.set()
        self._changed = trio.Event()

    def __repr__(self) -> str:
        return f"<Consumer {self.member_id} of {self.group_id}: {self._machine.state.value}>"

    # --- the application's API ------------------------------------------------------------------

    @property
    def state(self) -> sm.ConsumerState:
        return self._machine.state

    @property
    def generation(self) -> int:
        return self._machine.generation

    @property
    def last_heard(self) -> float | None:
        """Where the lease runs T from (trio time): when this consumer queued the latest frame a
        coordinator request said had arrived (docs/design.md#ownership-lease)."""
        return self._machine.last_heard

    @property
    def last_error(self) -> ErrorCode | None:
        """The latest registration or coordinator error, kept across retries (FENCED_INSTANCE_ID
        once fenced, in state FENCED)."""
        return self._machine.last_error

    @property
    def instance_id(self) -> str | None:
        return self.settings.instance_id

    @property
    def coordinator(self) -> BrokerInfo | None:
        """The broker this consumer registers with (None until one is found)."""
        return self._machine.coordinator

    @property
    def coordinator_epoch(self) -> int:
        """The highest coordinator epoch heard: it grows with every coordinator failover."""
        return self._machine.epoch

    def streams_for(self, topic: str) -> tuple[RecordStream, ...]:
        return tuple(s for s in self.streams if s.topic == topic)

    def mark(self, record: ConsumerRecord) -> None:
        """The application has finished ``record`` and every earlier record of its partition."""
        record.finish()

    def consumed_offsets(self) -> dict[TopicPartition, int]:
        """The next offset to read of each partition fetched now, as the application finished
        them: what a commit would send."""
        return {
            tp: claim.consumed
            for tp, claim in self._claims.items()
            if claim.active and claim.consumed is not None
        }

    async def commit(self, offsets: Mapping[TopicPartition, int] | None = None) -> None:
        """OffsetCommit the consumed offsets now (or exactly ``offsets``, ``{partition: the next
        offset to read}``), answered once durable at the coordinator.

        A no-op when nothing is assigned (and no ``offsets`` are given). With ``auto_commit``
        the consumer goes on reporting its consumed offsets, which may overwrite ``offsets``:
        commit explicit offsets with ``auto_commit=False``.

        Raises CommitFailed when not registered, or when the coordinator refuses
        (ILLEGAL_GENERATION / UNKNOWN_MEMBER_ID after a rebalance moved on; NOT_COORDINATOR,
        which also sends the consumer looking for the coordinator), and InstanceFenced when a
        newer process took this consumer's instance id (which ends it)."""
        if self._machine.state is sm.ConsumerState.FENCED:
            raise InstanceFenced(self.instance_id)
        if offsets is None:
            held = [tp for tp, claim in self._claims.items() if claim.active]
            listed = self._offsets([*held, *self._revoking])
        else:
            listed = tuple(
                PartitionOffset(topic=tp.topic, partition=tp.partition, offset=offset)
                for tp, offset in sorted(offsets.items())
            )
        if not listed:
            return
        session = self._registered_session()
        assert session.channel is not None
        request = OffsetCommitRequest(
            group_id=self.group_id,
            consumer_id=self.member_id,
            generation=self._machine.generation,
            offsets=listed,
        )
        response: ResponseMessage | None = None
        with trio.move_on_after(self.settings.request_timeout):
            try:
                response = await session.channel.request(request)
            except ChannelClosed as exc:
                raise CommitFailed(ErrorCode.COORDINATOR_NOT_AVAILABLE, str(exc)) from exc
        if response is None:
            raise CommitFailed(ErrorCode.COORDINATOR_NOT_AVAILABLE, "no answer in time")
        assert isinstance(response, OffsetCommitResponse)
        code = response.error_code
        if code in (ErrorCode.NOT_COORDINATOR, ErrorCode.COORDINATOR_LOAD_IN_PROGRESS):
            moved = sm.CoordinatorMoved(now=trio.current_time(), error_code=code)
            await self._send.send((session, moved))
        if code is ErrorCode.FENCED_INSTANCE_ID:
            await self._send.send((session, sm.Fenced(now=trio.current_time())))
            raise InstanceFenced(self.instance_id)
        if code is not ErrorCode.NONE:
            raise CommitFailed(code)

    # --- one iterator over everything, positions, pauses -----------------------------------------

    def __aiter__(self) -> Consumer:
        return self

    async def __anext__(self) -> ConsumerRecord:
        """``async for record in consumer``: the records of every partition this consumer owns,
        whichever stream they are in (streams take turns). Asking for the next record finishes
        the previous one, as with a stream. Ends when the consumer closes."""
        self._finish_handed()
        while True:
            for _ in range(len(self.streams)):
                stream = self.streams[self._next_stream]
                self._next_stream = (self._next_stream + 1) % len(self.streams)
                record = stream._ready_record()
                if record is not None:
                    stream._held = None  # the consumer finishes it, with the others it handed
                    self._handed[record.topic_partition] = record
                    return record
            if all([stream._ended() for stream in self.streams]):
                raise StopAsyncIteration
            await self._changed.wait()

    async def getmany(
        self, *, max_records: int | None = None
    ) -> dict[TopicPartition, list[ConsumerRecord]]:
        """The records buffered now, by partition, at most ``max_records``; waits until there is
        at least one (``pause`` the partitions not wanted now). Bound the wait with a trio
        cancel scope (``with trio.move_on_after(1): batch = await consumer.getmany()``).
        Asking again finishes every record handed out before. Empty once the consumer closed."""
        self._finish_handed()
        got: dict[TopicPartition, list[ConsumerRecord]] = {}
        count = 0
        while not got:
            for stream in self.streams:
                while max_records is None or count < max_records:
                    record = stream._ready_record()
                    if record is None:
                        break
                    stream._held = None
                    got.setdefault(record.topic_partition, []).append(record)
                    self._handed[record.topic_partition] = record
                    count += 1
            if not got:
                if all([stream._ended() for stream in self.streams]):
                    return {}
                await self._changed.wait()
        return got

    def _finish_handed(self) -> None:
        handed, self._handed = self._handed, {}
        for record in handed.values():
            record.finish()

    def _claim(self, tp: TopicPartition) -> tuple[PartitionClaim, RecordStream]:
        fetcher = self._fetchers.get(tp)
        if fetcher is None:
            raise ValueError(f"{tp} is not assigned to this consumer")
        return fetcher.claim, fetcher.stream

    def _targets(self, partitions: Iterable[TopicPartition]) -> list[TopicPartition]:
        return list(partitions) or sorted(self._fetchers)

    def position(self, tp: TopicPartition) -> int | None:
        """The offset of the next record of ``tp`` the application will be handed; None while
        it is being resolved (no committed offset yet, or after ``seek_to_beginning/end``)."""
        return self._claim(tp)[0].next_offset

    def seek(self, tp: TopicPartition, offset: int) -> None:
        """Go on from ``offset``: the next record of ``tp`` handed out is the one there, and
        a commit now commits ``offset``. What was buffered of ``tp`` is dropped."""
        if offset < 0:
            raise ValueError("seek to an offset >= 0 (seek_to_beginning / seek_to_end otherwise)")
        self._reposition(tp, offset, None)

    def seek_to_beginning(self, *partitions: TopicPartition) -> None:
        """Go on from the log start of ``partitions`` (default: all assigned)."""
        for tp in self._targets(partitions):
            self._reposition(tp, -1, "earliest")

    def seek_to_end(self, *partitions: TopicPartition) -> None:
        """Go on from the end of ``partitions`` (default: all assigned): only new records."""
        for tp in self._targets(partitions):
            self._reposition(tp, -1, "latest")

    def _reposition(self, tp: TopicPartition, offset: int, reset: str | None) -> None:
        claim, stream = self._claim(tp)
        failed = claim.failed
        if failed is not None:
            claim.failed = None
            if offset > failed.offset:
                log.warning("%s; the application skipped it, to offset %d", failed, offset)
        claim.sought.set()  # a fetcher stopped at a corrupt batch goes on
        claim.sought = trio.Event()
        claim.seeks += 1  # a fetch in flight answers the old position: its fetcher drops it
        claim.position = offset
        claim.reset = reset
        claim.consumed = offset if offset >= 0 else None
        claim.delivered = None
        self._handed.pop(tp, None)
        stream.reposition(claim)

    def pause(self, *partitions: TopicPartition) -> None:
        """Stop handing out and fetching records of ``partitions`` (default: all assigned) until
        :meth:`resume`; they stay assigned, and what was buffered is fetched again on resume.
        A rebalance that moves a partition ends its pause."""
        for tp in self._targets(partitions):
            claim, _ = self._claim(tp)
            if not claim.paused:
                next_offset = claim.next_offset
                self._reposition(tp, -1 if next_offset is None else next_offset, claim.reset)
                claim.consumed = next_offset
                claim.paused = True
                claim.unpaused = trio.Event()

    def resume(self, *partitions: TopicPartition) -> None:
        """Hand out and fetch ``partitions`` (default: all paused) again."""
        for tp in self._targets(partitions):
            claim, _ = self._claim(tp)
            if claim.paused:
                claim.paused = False
                claim.unpaused.set()

    def paused(self) -> frozenset[TopicPartition]:
        return frozenset(tp for tp, f in self._fetchers.items() if f.claim.paused)

    async def committed(self, tp: TopicPartition) -> int | None:
        """The group's committed offset of ``tp`` (the next offset to read), None if it has
        none; asked of the coordinator. Raises CommitFailed when not registered or refused."""
        session = self._registered_session()
        response: ResponseMessage | None = None
        with trio.move_on_after(self.settings.request_timeout):
            try:
                response = await session.channel.request(  # type: ignore[union-attr]
                    OffsetFetchRequest(group_id=self.group_id, partitions=(tp,))
                )
            except ChannelClosed as exc:
                raise CommitFailed(ErrorCode.COORDINATOR_NOT_AVAILABLE, str(exc)) from exc
        if response is None:
            raise CommitFailed(ErrorCode.COORDINATOR_NOT_AVAILABLE, "no answer in time")
        assert isinstance(response, OffsetFetchResponse)
        if response.error_code is not ErrorCode.NONE:
            raise CommitFailed(response.error_code)
        found = [po.offset for po in response.offsets if po.topic_partition == tp]
        return found[0] if found and found[0] >= 0 else None

    def _registered_session(self) -> _Session:
        session = self._session
        if session is None or session.channel is None or not session.registered.is_set():
            raise CommitFailed(ErrorCode.COORDINATOR_NOT_AVAILABLE, "not registered")
        return session

    async def aclose(self) -> None:
        """Stop the fetchers, commit (with auto_commit), LeaveGroup, close. Idempotent."""
        if not self._close_requested and not self._stopped.is_set():
            await self._send.send((None, sm.Close()))
            self._close_requested = True  # only once sent: a cancelled send must not count
        await self._stopped.wait()

    # --- the driver -----------------------------------------------------------------------------

    async def _drive(self) -> None:
        timeout = self.settings.discovery_timeout
        give_up = math.inf if timeout is None else trio.current_time() + timeout
        try:
            await self._perform(self._machine.handle(sm.Start()))
            while self._machine.state not in (sm.ConsumerState.CLOSED, sm.ConsumerState.FENCED):
                deadline = self._machine.lease_deadline()
                item: tuple[_Source, sm.Input] | None = None
                with trio.move_on_at(math.inf if deadline is None else deadline):
                    item = await self._receive.receive()
                if item is None:
                    await self._perform(self._machine.check_lease(trio.current_time()))
                    continue
                source, event = item
                if not self._is_current(source):
                    continue
                if isinstance(event, sm.Registered):
                    self._registered_once = True
                if source is self._discovery_run:
                    self._discovery_run = None  # its one result is in
                    if isinstance(event, sm.DiscoveryFailed) and self._no_coordinator(give_up):
                        return
                if isinstance(event, sm.CoordinatorMoved | sm.Fenced) and not sm.TABLE.allows(
                    self._machine.state, type(event)
                ):
                    continue  # a commit answered after the machine had moved on
                effects = self._machine.handle(event)
                self._count_accepted(event, effects)
                await self._perform(effects)
        finally:
            fenced = self._machine.state is sm.ConsumerState.FENCED
            if fenced:
                log.warning("%s: fenced: a newer process has its instance id", self.member_id)
            error = self._fenced_error if fenced else None
            if self._failure is not None:
                error = self._failed_error
            for stream in self.streams:
                stream.close(error)
            self._stopped.set()

    def _no_coordinator(self, give_up: float) -> bool:
        """A discovery pass failed: warn (what went wrong, every pass), and give up (True) once
        a consumer that never registered has looked for ``discovery_timeout``."""
        problem = self._discovery.last_problem or "no broker named a coordinator"
        if self._registered_once or trio.current_time() < give_up:
            log.warning("%s: no coordinator for %s yet: %s", self.member_id, self.group_id, problem)
            return False
        self._failure = CoordinatorUnavailable(
            f"no coordinator for group {self.group_id!r} found in "
            f"{self.settings.discovery_timeout:g} s: {problem}"
        )
        log.error("%s", self._failure)
        return True

    def _fenced_error(self) -> Exception:
        return InstanceFenced(self.instance_id)

    def _failed_error(self) -> Exception:
        assert self._failure is not None
        return CoordinatorUnavailable(*self._failure.args)

    def _count_accepted(self, event: sm.Input, effects: list[sm.Effect]) -> None:
        requests = (sm.PingReceived, sm.StopFetcherReceived, sm.StartFetcherReceived)
        if not isinstance(event, requests):
            return
        if any(isinstance(e, sm.Ignored) and e.event is event for e in effects):
            return
        self._accepted_by_epoch[event.epoch] += 1
        position = self._accepted_by_epoch.total()
        first, _ = self._accepted_span.get(event.epoch, (position, position))
        self._accepted_span[event.epoch] = (first, position)

    def _is_current(self, source: _Source) -> bool:
        if source is None:
            return True
        if isinstance(source, _Session):
            return source is self._session
        return source is self._discovery_run

    async def _perform(self, effects: list[sm.Effect]) -> None:
        try:
            await self._perform_each(effects)
            if self.observer is not None:
                self.observer(self, effects)
        finally:
            self._revoking.clear()  # their stop is answered, or was no StopFetcher's

    async def _perform_each(self, effects: list[sm.Effect]) -> None:
        for effect in effects:
            match effect:
                case sm.Discover(delay=delay, jitter=jitter):
                    run = self._discovery_run = _DiscoveryRun()
                    delay = max(0.0, delay + _JITTER.uniform(-jitter, jitter)) if jitter else delay
                    self._nursery.start_soon(self._discover, run, delay)
                case sm.Register() as register:
                    session = self._session = _Session(coordinator=register.coordinator)
                    self._nursery.start_soon(self._run_session, session, register)
                case sm.StopFetchers(partitions=partitions):
                    await self._stop_fetchers(partitions)
                case sm.StartFetchers(generation=generation, streams=streams, kept=kept):
                    await self._start_fetchers(generation, streams, kept)
                case sm.RespondPing(correlation_id=cid, partitions=partitions):
                    await self._respond(
                        cid,
                        PingResponse(
                            error_code=ErrorCode.NONE,
                            consumer_id=self.member_id,
                            offsets=self._reported(partitions),
                        ),
                    )
                case sm.RespondStop(correlation_id=cid, partitions=partitions):
                    await self._respond(
                        cid,
                        StopFetcherResponse(
                            error_code=ErrorCode.NONE,
                            consumer_id=self.member_id,
                            offsets=self._reported(partitions),
                        ),
                    )
                    self._revoking.clear()  # answered: commits no longer count for them
                case sm.RespondStart(correlation_id=cid):
                    await self._respond(
                        cid,
                        StartFetcherResponse(error_code=ErrorCode.NONE, consumer_id=self.member_id),
                    )
                case sm.CommitAndLeave(generation=generation, partitions=partitions, leave=leave):
                    await self._commit_and_leave(generation, partitions, leave=leave)
                case sm.CloseConnection(reset=reset):
                    await self._close_session(reset=reset)
                case sm.Ignored(event=event, reason=reason):
                    log.debug("%s: ignored %s: %s", self.member_id, type(event).__name__, reason)

    # --- discovery and the coordinator session --------------------------------------------------

    async def _discover(self, run: _DiscoveryRun, delay: float) -> None:
        with run.scope:
            await trio.sleep(delay)
            found = await self._discovery.find()
            now = trio.current_time()
            if found is None:
                failed = sm.DiscoveryFailed(now=now, error_code=self._discovery.last_code)
                await self._send.send((run, failed))
                return
            self._brokers.update(found.brokers)
            event = sm.CoordinatorFound(now=now, coordinator=found.coordinator, epoch=found.epoch)
            await self._send.send((run, event))

    async def _run_session(self, session: _Session, register: sm.Register) -> None:
        with session.scope:
            async with trio.open_nursery() as nursery:
                event = await self._register(session, register, nursery)
                await self._send.send((session, event))
                session.registered.set()  # lets the reader pass on coordinator requests

    async def _register(
        self, session: _Session, register: sm.Register, nursery: trio.Nursery
    ) -> sm.Input:
        coordinator = register.coordinator
        with trio.move_on_after(self.settings.request_timeout):
            try:
                stream = await self._connect(coordinator.host, coordinator.port)
            except OSError as exc:
                log.info("%s: cannot reach the coordinator: %s", self.member_id, exc)
                return sm.ConnectionLost(now=trio.current_time())
            channel = session.channel = Channel.open(
                stream,
                Role.CONSUMER,
                client_id=self.settings.client_id,
                max_frame_size=self.settings.max_frame_size,
            )
            nursery.start_soon(self._read, session, channel)
            request = RegisterConsumerRequest(
                group_id=self.group_id,
                consumer_id=self.member_id,
                subscription=self.subscription,
                auto_commit=self.settings.auto_commit,
                auto_offset_reset=_WIRE_OFFSET_RESETS[self.settings.auto_offset_reset],
                session_timeout_ms=round(self.settings.session_timeout * 1000),
                generation=register.generation,
                owned_partitions=register.owned,
                instance_id=register.instance_id,
            )
            # The request is queued before request() first yields: this is its queue time.
            queued = trio.current_time()
            try:
                response = await channel.request(request)
            except ChannelClosed:
                return sm.ConnectionLost(now=trio.current_time())
            assert isinstance(response, RegisterConsumerResponse)
            now = trio.current_time()
            if response.error_code is ErrorCode.NONE:
                log.info("%s: registered with broker %d", self.member_id, coordinator.broker_id)
                return sm.Registered(
                    now=now,
                    anchor=queued,
                    generation=response.generation,
                    epoch=response.coordinator_epoch,
                )
            log.info("%s: registration refused: %s", self.member_id, response.error_code.name)
            return sm.RegistrationRejected(now=now, error_code=response.error_code)
        log.info("%s: no registration answer in time", self.member_id)
        return sm.ConnectionLost(now=trio.current_time())

    async def _read(self, session: _Session, channel: Channel) -> None:
        async def on_request(request: Request) -> None:
            now = trio.current_time()
            # Looked up as the request is read: a later one forgets the frames before its own.
            anchor = channel.sent_at(acknowledged_frames(request.message))
            await session.registered.wait()
            session.requests[request.correlation_id] = request
            await self._send.send((session, self._coordinator_input(request, now, anchor)))

        try:
            await channel.run(on_request)
        except RemoteProtocolError as exc:
            log.warning("%s: the coordinator broke the protocol: %s", self.member_id, exc)
        await self._send.send((session, sm.ConnectionLost(now=trio.current_time())))

    def _coordinator_input(self, request: Request, now: float, anchor: float | None) -> sm.Input:
        cid = request.correlation_id
        match request.message:
            case PingRequest() as ping:
                return sm.PingReceived(
                    now=now,
                    anchor=anchor,
                    correlation_id=cid,
                    epoch=ping.coordinator_epoch,
                    generation=ping.generation,
                )
            case StopFetcherRequest() as stop:
                return sm.StopFetcherReceived(
                    now=now,
                    anchor=anchor,
                    correlation_id=cid,
                    epoch=stop.coordinator_epoch,
                    generation=stop.generation,
                    partitions=stop.partitions,
                    reason=stop.reason,
                )
            case StartFetcherRequest() as start:
                self._brokers.update(start.brokers)
                return sm.StartFetcherReceived(
                    now=now,
                    anchor=anchor,
                    correlation_id=cid,
                    epoch=start.coordinator_epoch,
                    generation=start.generation,
                    streams=start.streams,
                    incremental=start.incremental,
                    topic_partitions=self._topic_partitions(start.streams),
                )
        raise AssertionError(f"the protocol let {request.message!r} through to a consumer")

    async def _respond(self, correlation_id: int, message: ResponseMessage) -> None:
        session = self._session
        assert session is not None and session.channel is not None
        request = session.requests.pop(correlation_id)
        with contextlib.suppress(ChannelClosed):  # the reader reports the lost connection
            await session.channel.respond(request, message)

    async def _close_session(self, *, reset: bool = False) -> None:
        """``reset``: the fetchers run on, so the coordinator must not read an end of stream,
        its proof that the member stopped (docs/design.md#ownership-lease)."""
        session, self._session = self._session, None
        if session is None:
            return
        if session.channel is not None and not reset:
            # An answer just given (a fenced member's StopFetcher answer) leaves first, while the
            # writer still runs: cancelled in the middle of a write, it would lose the frame.
            await session.channel.flush()
        session.scope.cancel()
        if session.channel is not None:
            with trio.CancelScope(shield=True):
                if reset:
                    await session.channel.abort()
                else:
                    await session.channel.aclose()

    async def _commit_and_leave(
        self, generation: int, partitions: tuple[TopicPartition, ...], *, leave: bool
    ) -> None:
        """The final commit, then LeaveGroup unless a static member's (``leave`` False), whose
        clean close after stopping frees its partitions just as well (SPEC.md §11.9)."""
        session = self._session
        if session is None or session.channel is None:
            return
        channel = session.channel
        offsets = self._reported(partitions)
        with trio.move_on_after(self.settings.request_timeout):
            try:
                if offsets:
                    commit = OffsetCommitRequest(
                        group_id=self.group_id,
                        consumer_id=self.member_id,
                        generation=generation,
                        offsets=offsets,
                    )
                    response = await channel.request(commit)
                    assert isinstance(response, OffsetCommitResponse)
                    if response.error_code is not ErrorCode.NONE:
                        log.warning(
                            "%s: final commit refused: %s",
                            self.member_id,
                            response.error_code.name,
                        )
                if not leave:
                    return
                request = LeaveGroupRequest(
                    group_id=self.group_id, consumer_id=self.member_id, generation=generation
                )
                answer = await channel.request(request)
                assert isinstance(answer, LeaveGroupResponse)
                if answer.error_code is not ErrorCode.NONE:
                    log.warning("%s: LeaveGroup: %s", self.member_id, answer.error_code.name)
            except ChannelClosed:
                log.info("%s: the coordinator connection closed while leaving", self.member_id)

    # --- fetchers -------------------------------------------------------------------------------

    async def _start_fetchers(
        self,
        generation: int,
        assigned: tuple[AssignedStream, ...],
        kept: tuple[TopicPartition, ...],
    ) -> None:
        """Fetch exactly ``assigned``: the fetchers of ``kept`` go on where they are (moved with
        their buffered records if their stream changed), every other partition starts at its
        offset, and ``on_assigned`` hears only those others."""
        going_on = {tp: self._fetchers[tp] for tp in kept if tp in self._fetchers}
        claims: dict[TopicPartition, PartitionClaim] = {}
        by_stream: dict[int, list[PartitionClaim]] = {id(s): [] for s in self.streams}
        added: list[_Fetcher] = []
        for assigned_stream in assigned:
            for p in assigned_stream.partitions:
                tp = TopicPartition(topic=p.topic, partition=p.partition)
                stream = self._route(assigned_stream.stream_id, p.topic)
                if stream is None:
                    log.error(
                        "%s: no stream %s for %s", self.member_id, assigned_stream.stream_id, tp
                    )
                    continue
                fetcher = going_on.pop(tp, None)
                if fetcher is None:
                    claim = PartitionClaim(
                        partition=tp,
                        generation=generation,
                        broker_id=p.broker_id,
                        position=p.offset,
                        consumed=p.offset if p.offset >= 0 else None,
                    )
                    fetcher = _Fetcher(claim=claim, stream=stream)
                    added.append(fetcher)
                elif fetcher.stream is not stream:
                    fetcher = await self._move(fetcher, stream)
                claims[tp] = fetcher.claim
                by_stream[id(stream)].append(fetcher.claim)
        for tp, orphan in going_on.items():  # kept, but in no stream of ours: not ours to fetch
            del self._fetchers[tp]
            await self._halt([orphan])
        for stream in self.streams:
            stream.assign(by_stream[id(stream)])
        self._claims = claims
        for fetcher in added:
            self._fetchers[fetcher.claim.partition] = fetcher
            self._nursery.start_soon(self._fetch, fetcher)
        self.assignment.value = frozenset(self._fetchers)
        log.info(
            "%s: generation %d, fetching %d partitions (%d new)",
            self.member_id,
            generation,
            len(self._fetchers),
            len(added),
        )
        if self._on_assigned is not None:
            await self._on_assigned(frozenset(f.claim.partition for f in added))

    def _route(self, stream_id: str, topic: str) -> RecordStream | None:
        prefix, _, index = stream_id.rpartition("-")
        # A static member's streams are named after its instance id, its member id (§11.11).
        if prefix not in (self.member_id, self.instance_id) or not index.isdigit():
            return None
        wanted = None if self.subscription.is_wildcard else topic
        return next((s for s in self.streams if s.index == int(index) and s.topic == wanted), None)

    async def _fetch(self, fetcher: _Fetcher) -> None:
        settings = FetchSettings(
            auto_offset_reset=self.settings.auto_offset_reset,
            max_bytes=self.settings.fetch_max_bytes,
            idle_interval=self.settings.fetch_idle_interval,
            retry_backoff=self.settings.retry_backoff,
            request_timeout=self.settings.request_timeout,
        )
        try:
            with fetcher.scope:
                await run_fetcher(
                    fetcher.claim,
                    fetcher.stream,
                    self._brokers,
                    settings,
                    self._machine.lease_deadline,
                )
        finally:
            fetcher.done.set()

    async def _move(self, fetcher: _Fetcher, stream: RecordStream) -> _Fetcher:
        """A partition that goes on in another of our streams: its fetcher stops between two
        batches, its buffered records move with it, and it fetches on from where it was, so the
        application misses nothing and sees nothing twice."""
        fetcher.scope.cancel()
        with trio.CancelScope(shield=True):
            await fetcher.done.wait()
        stream.give(fetcher.stream.take(fetcher.claim))
        moved = self._fetchers[fetcher.claim.partition] = _Fetcher(
            claim=fetcher.claim, stream=stream
        )
        self._nursery.start_soon(self._fetch, moved)
        return moved

    async def _stop_fetchers(self, partitions: tuple[TopicPartition, ...] | None) -> None:
        """Stop the fetchers of ``partitions`` (None: all) and only those, then tell
        ``on_revoked``, before the StopFetcher answer leaves."""
        if partitions is None:
            names = list(self._fetchers)
            for claim in self._claims.values():
                claim.active = False
        else:
            names = [tp for tp in partitions if tp in self._fetchers]
        stopped = [self._fetchers.pop(tp) for tp in names]
        await self._halt(stopped)
        self._revoking.update((f.claim.partition, f.claim) for f in stopped)
        revoked = frozenset(f.claim.partition for f in stopped)
        self.assignment.value = frozenset(self._fetchers)
        log.info(
            "%s: stopped fetching %d partitions, %d go on",
            self.member_id,
            len(revoked),
            len(self._fetchers),
        )
        if revoked and self._on_revoked is not None:
            await self._on_revoked(revoked)

    async def _halt(self, fetchers: list[_Fetcher]) -> None:
        """Stop these fetchers and drop what they buffered: once this returns nothing of theirs is
        fetched or handed to the application (their claims are inactive, so a batch in flight is
        refused by its stream)."""
        for fetcher in fetchers:
            fetcher.claim.active = False
            fetcher.scope.cancel()
        for stream in {id(f.stream): f.stream for f in fetchers}.values():
            stream.drop_inactive()
        with trio.CancelScope(shield=True):
            for fetcher in fetchers:
                await fetcher.done.wait()

    # --- offsets --------------------------------------------------------------------------------

    def _offsets(self, partitions: Sequence[TopicPartition]) -> tuple[PartitionOffset, ...]:
        offsets = []
        for tp in sorted(partitions):
            claim = self._claims.get(tp)
            if claim is not None and claim.consumed is not None:
                offsets.append(
                    PartitionOffset(topic=tp.topic, partition=tp.partition, offset=claim.consumed)
                )
        return tuple(offsets)

    def _topic_partitions(self, streams: Sequence[AssignedStream]) -> int:
        """The partitions of the assigned topics as discovery last counted them (a topic it never
        counted contributes what is assigned of it): the machine's estimate of the group's size
        comes from it."""
        counts = self._discovery.partition_counts
        assigned: collections.Counter[str] = collections.Counter(
            p.topic for stream in streams for p in stream.partitions
        )
        return sum(max(counts.get(topic, 0), n) for topic, n in assigned.items())

    def _reported(self, partitions: Sequence[TopicPartition]) -> tuple[PartitionOffset, ...]:
        """What Ping and StopFetcher responses carry: nothing without auto-commit."""
        return self._offsets(partitions) if self.settings.auto_commit else ()


def _subscription(
    topics: Mapping[str, int] | None, pattern: str | None, streams: int, blacklist: bool
) -> Subscription:
    if (topics is None) == (pattern is None):
        raise ValueError("give either topics={topic: streams} or pattern=...")
    if topics is not None:
        if not topics or any(n < 1 for n in topics.values()):
            raise ValueError("every topic needs at least one stream")
        return Subscription(
            topics=tuple(TopicStreams(topic=t, streams=n) for t, n in sorted(topics.items()))
        )
    if streams < 1:
        raise ValueError("a wildcard subscription needs at least one stream")
    return Subscription(pattern=pattern, pattern_is_blacklist=blacklist, pattern_streams=streams)


async def _open_tcp(host: str, port: int) -> trio.abc.Stream:
    return await trio.open_tcp_stream(host, port)


@asynccontextmanager
async def open_consumer(
    bootstrap: str | Sequence[tuple[str, int]],
    group_id: str,
    *,
    topics: Mapping[str, int] | Sequence[str] | str | None = None,
    pattern: str | None = None,
    pattern_streams: int = 1,
    pattern_is_blacklist: bool = False,
    consumer_id: str | None = None,
    settings: ConsumerSettings | None = None,
    on_revoked: RebalanceCallback | None = None,
    on_assigned: RebalanceCallback | None = None,
    listener: RebalanceListener | None = None,
    connect: Connector | None = None,
    security: ClientSecurity | None = None,
) -> AsyncIterator[Consumer]:
    """Join ``group_id`` and fetch what the coordinator assigns, until the block ends.

    ``topics=["a", "b"]`` (or ``"a"``) subscribes to those topics, one stream each:
    ``async for record in consumer`` goes through everything the consumer owns.
    ``topics={"t": 2}`` gives two streams over t's partitions (``consumer.streams_for("t")``);
    ``pattern=`` subscribes to every topic whose whole name matches the regular expression (or,
    with ``pattern_is_blacklist``, does not), with ``pattern_streams`` streams shared by all of
    them. The consumer id is ``f"{client_id}-{12 hex digits}"`` unless given; with
    ``settings.instance_id`` (a static member) a given one must still be new for every process.
    Leaving the block closes gracefully: fetchers stop, offsets are committed (with auto_commit),
    and LeaveGroup lets the group rebalance at once instead of after a failure detection (a static
    member sends none: it closes cleanly, which frees its partitions, and may come back). Every
    connection is made as ``security`` says (default: plaintext, no authentication).
    ``listener`` (a :class:`RebalanceListener`) is the object form of ``on_revoked`` and
    ``on_assigned``.
    """
    require_trio("open_consumer")
    if isinstance(topics, str):
        topics = {topics: 1}
    elif topics is not None and not isinstance(topics, Mapping):
        topics = dict.fromkeys(topics, 1)
    if listener is not None:
        if on_revoked is not None or on_assigned is not None:
            raise ValueError("give a listener or on_revoked/on_assigned, not both")
        on_revoked, on_assigned = listener.on_partitions_revoked, listener.on_partitions_assigned
    settings = settings or ConsumerSettings()
    if settings.instance_id is not None and consumer_id == settings.instance_id:
        raise ValueError("the consumer id names the process and must differ from the instance id")
    subscription = _subscription(topics, pattern, pattern_streams, pattern_is_blacklist)
    member_id = consumer_id or f"{settings.client_id}-{uuid.uuid4().hex[:12]}"
    connect = connect or (security or ClientSecurity()).connector(_open_tcp)

    def stream(index: int, topic: str | None) -> RecordStream:
        return RecordStream(
            index=index,
            topic=topic,
            max_buffered=settings.max_buffered_records,
            key_deserializer=settings.key_deserializer,
            value_deserializer=settings.value_deserializer,
        )

    if topics is not None:
        streams = tuple(stream(i, topic) for topic, n in sorted(topics.items()) for i in range(n))
    else:
        streams = tuple(stream(i, None) for i in range(pattern_streams))
    machine = sm.ConsumerMachine(
        config=sm.ConsumerConfig(
            session_timeout=settings.session_timeout,
            retry_backoff=settings.retry_backoff,
            max_retry_backoff=settings.max_retry_backoff,
            failover_retry=settings.failover_retry,
            failover_jitter=settings.failover_jitter,
            instance_id=settings.instance_id,
        )
    )
    send, receive = trio.open_memory_channel[tuple[_Source, sm.Input]](64)
    with unwrap_single():
        async with trio.open_nursery() as nursery:
            consumer = Consumer(
                group_id=group_id,
                member_id=member_id,
                subscription=subscription,
                settings=settings,
                streams=streams,
                machine=machine,
                assignment=AsyncValue(frozenset()),
                nursery=nursery,
                connect=connect,
                discovery=Discovery(
                    group_id=group_id,
                    addresses=(
                        parse_bootstrap(bootstrap)
                        if isinstance(bootstrap, str)
                        else list(bootstrap)
                    ),
                    connect=connect,
                    client_id=settings.client_id,
                    max_frame_size=settings.max_frame_size,
                    request_timeout=settings.request_timeout,
                    topics=tuple(sorted(topics or ())),
                ),
                brokers=BrokerConnections(
                    nursery=nursery,
                    connect=connect,
                    client_id=settings.client_id,
                    max_frame_size=settings.max_frame_size,
                ),
                on_revoked=on_revoked,
                on_assigned=on_assigned,
                send=send,
                receive=receive,
            )
            nursery.start_soon(consumer._drive)
            try:
                yield consumer
            finally:
                with (
                    trio.CancelScope(shield=True),
                    trio.move_on_after(2 * settings.request_timeout),
                ):
                    await consumer.aclose()
                nursery.cancel_scope.cancel()
