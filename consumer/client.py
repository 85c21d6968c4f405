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
  connection can never reach the machine (both in :mod:`consumer.session`);
* the **fetchers** (:mod:`consumer.fetchers`; each one's task is :mod:`consumer.fetcher`), one
  task per assigned partition with a cancel scope of its own, feeding the streams
  (:mod:`consumer.streams`, which also defines when a record counts as consumed). A revocation
  stops only the fetchers it names and an incremental start only adds fetchers (SPEC.md §11.5,
  §11.6), so the partitions a rebalance does not move are fetched and delivered on without a gap.

The :class:`Consumer`'s fields are in :mod:`consumer.core`, its commits in :mod:`consumer.offsets`,
its settings and errors in :mod:`consumer.settings`; this module keeps the application's API, the
driver, and :func:`open_consumer`.
"""

from __future__ import annotations

import copy
import logging
import math
import random
import uuid
from collections.abc import AsyncIterator, Generator, Iterable, Mapping, Sequence
from contextlib import asynccontextmanager

import attrs
import trio
from trio_util import AsyncValue

from protocol import (
    ErrorCode,
    PingResponse,
    StartFetcherResponse,
    StopFetcherResponse,
)
from protocol.types import BrokerInfo, Subscription, TopicPartition, TopicStreams
from statemachine import consumer as sm
from transport.connect import Connector, parse_bootstrap
from transport.security import ClientSecurity

from .admin import OffsetAndTimestamp, open_admin
from .core import _DiscoveryRun, _Session, _Source, log
from .discovery import Discovery
from .fetcher import BrokerConnections, metadata_asker
from .fetchers import FetcherControl
from .leaders import Leaders
from .runtime import require_trio, unwrap_single
from .session import CoordinatorSession
from .settings import (
    CommitFailed,
    ConsumerSettings,
    CoordinatorUnavailable,
    PartitionNotAssigned,
    RebalanceCallback,
    RebalanceListener,
)
from .streams import ConsumerRecord, InstanceFenced, PartitionClaim, RecordStream

__all__ = [
    "CommitFailed",
    "Consumer",
    "ConsumerSettings",
    "CoordinatorUnavailable",
    "InstanceFenced",
    "PartitionNotAssigned",
    "RebalanceCallback",
    "RebalanceListener",
    "open_consumer",
]


class Done:
    """What a call that is done when it returns gives back, so that aiokafka's ``await`` of it
    (a coroutine there) works too; forgetting the ``await`` loses nothing."""

    __slots__ = ()

    def __await__(self) -> Generator[None, None, None]:
        return
        yield  # a generator: awaiting it returns at once, without a checkpoint

    def __repr__(self) -> str:
        return "<done>"


DONE = Done()

#: Chooses each discovery's jitter (``statemachine.consumer.Discover``): its only job is to keep a
#: group's consumers from looking all at once, so one generator for the process serves.
_JITTER = random.Random()


@attrs.define(eq=False, repr=False)
class Consumer(CoordinatorSession, FetcherControl):
    """A member of a consumer group. Create it with :func:`open_consumer`."""

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

    def seek_to_beginning(self, *partitions: TopicPartition) -> Done:
        """Go on from the log start of ``partitions`` (default: all assigned). Done at once;
        ``await consumer.seek_to_beginning()`` (aiokafka's form, a coroutine there) works too."""
        for tp in self._targets(partitions):
            self._reposition(tp, -1, "earliest")
        return DONE

    def seek_to_end(self, *partitions: TopicPartition) -> Done:
        """Go on from the end of ``partitions`` (default: all assigned): only new records. Done
        at once; ``await consumer.seek_to_end()`` works too."""
        for tp in self._targets(partitions):
            self._reposition(tp, -1, "latest")
        return DONE

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

    async def offsets_for_times(
        self, timestamps: Mapping[TopicPartition, int]
    ) -> dict[TopicPartition, OffsetAndTimestamp | None]:
        """For each partition (assigned or not), the earliest offset whose record's timestamp
        (ms) is at least the one given, and that timestamp; None where no record is that late,
        as aiokafka's. ``seek(tp, found.offset)`` goes on from there. Asked over connections of
        its own, made as the consumer's are (``consumer.admin.Admin.offsets_for_times``)."""
        with unwrap_single():
            async with open_admin(self._discovery.addresses, connect=self._connect) as admin:
                return await admin.offsets_for_times(timestamps)

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
                if self._failure is not None:
                    # Refused: asking again would get the same answer. Stop, close cleanly.
                    log.info("%s: %s", self.member_id, self._failure)
                    await self._perform(self._machine.handle(sm.Close()))
                    return
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
        """A discovery pass failed: warn (what went wrong, once per reason), and give up (True) once
        a consumer that never registered has looked for ``discovery_timeout``."""
        problem = self._discovery.last_problem or "no broker named a coordinator"
        busy = self._discovery.last_code is ErrorCode.BROKER_BUSY
        if self._registered_once or busy or trio.current_time() < give_up:
            # Said once per reason while it lasts, not at every pass.
            level = logging.DEBUG if problem == self._discovery.said else logging.WARNING
            self._discovery.said = problem
            log.log(
                level, "%s: no coordinator for %s yet: %s", self.member_id, self.group_id, problem
            )
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
        return copy.copy(self._failure)  # a fresh one for each stream that raises it

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
                case sm.StartFetchers(
                    generation=generation, streams=streams, kept=kept, topic_ids=topic_ids
                ):
                    await self._start_fetchers(generation, streams, kept, topic_ids)
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
    ``on_assigned``. A ``commit()`` never awaited makes the block's end raise
    :class:`~consumer.runtime.NotAwaited`.
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
            busy_jitter=settings.busy_jitter,
            instance_id=settings.instance_id,
        )
    )
    send, receive = trio.open_memory_channel[tuple[_Source, sm.Input]](64)
    with unwrap_single():
        async with trio.open_nursery() as nursery:
            brokers = BrokerConnections(
                nursery=nursery,
                connect=connect,
                client_id=settings.client_id,
                max_frame_size=settings.max_frame_size,
            )
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
                brokers=brokers,
                leaders=Leaders(ask=metadata_asker(brokers, settings.request_timeout)),
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
    consumer._not_awaited.check()
