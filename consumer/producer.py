"""The producer: ``await producer.send(topic, value, key)`` hands the record to its partition's
batch and returns its :class:`Delivery`, as aiokafka's ``send`` returns a future; ``await`` that
(or call ``send_and_wait``) for ``(partition, offset)`` once the broker holding the partition has
the record durable under its fsync policy.

Records wait per partition for at most ``linger`` seconds (or until a batch is full) so that many
concurrent sends share one ProduceRequest and one fsync. A send appends its record straight to
its partition's open record batch (``protocol.batches``, compressed as ``compression`` says when
sealed), and its :class:`Delivery` is that batch's answer plus the record's place in it: no
object per record beyond the Delivery, no event per record. One batch per partition is in flight
at a time, so records of one partition are stored in the order they were sent. A batch that fails
in a way a retry can fix (broker unreachable, partition moved, its leader elsewhere:
:data:`~consumer.leaders.LEADER_CODES`) is retried against fresh metadata until
``delivery_timeout``; one its leader could not get enough in-sync replicas for (19, 20) or in time
(7) is retried at the same leader. A retry after a lost connection, a 20 or a 7 may store the
batch twice (at-least-once), never zero times once acknowledged.

Each batch names the incarnation of its topic the producer knew when the batch was opened (its
id, from ClusterMetadata v2; SPEC.md §11.12), and only that one may store it: a batch of an
incarnation a broker says is gone (UNKNOWN_TOPIC_ID: the topic was deleted, and perhaps created
again) fails with :class:`TopicRecreated` instead of being written to the new one or into the
deleted one's log, to vanish with it (docs/producer.md).

Partitioning: a keyed record goes to ``crc32(key) % partitions`` (zlib's CRC-32: stable across
processes and languages, unlike ``hash()``; not Kafka's murmur2, so a key lands on a different
partition than Java Kafka would pick); a record without a key goes round robin.
"""

from __future__ import annotations

import collections
import contextlib
import itertools
import logging
import sys
import warnings
import zlib
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Generator, Sequence
from contextlib import asynccontextmanager
from typing import Any, Literal

import attrs
import trio

from consumer.fetcher import BrokerConnections, BrokerUnavailable, metadata_asker
from protocol import (
    ClusterMetadataRequest,
    ClusterMetadataResponse,
    ErrorCode,
    ProduceRequest,
    ProduceResponse,
)
from protocol.batches import BatchBuilder, Compression, Header
from protocol.types import NO_TOPIC_ID, TopicId, TopicPartition
from transport.channel import ChannelClosed
from transport.connect import connect_any, open_channel, parse_bootstrap
from transport.refusals import Refused, final_refusal, refusal
from transport.security import ClientSecurity

from .leaders import LEADER_CODES, Leaders
from .runtime import NotAwaited, Unawaited, busy_wait, require_trio, unwrap_single

__all__ = [
    "Compression",
    "Delivery",
    "NotAwaited",
    "ProduceError",
    "Producer",
    "ProducerConfig",
    "SendDoesNotWait",
    "Serializer",
    "TopicRecreated",
    "open_producer",
]

log = logging.getLogger(__name__)

Address = tuple[str, int]
Connect = Callable[[str, int], Awaitable[trio.abc.Stream]]
Serializer = Callable[[Any], bytes]


#: Refusals retried at the same broker: the leader is right, its in-sync replicas were too few
#: (NOT_ENOUGH_REPLICAS: nothing written) or too slow (NOT_ENOUGH_REPLICAS_AFTER_APPEND,
#: REQUEST_TIMED_OUT: written on the leader, so the retry may store the batch twice).
_RETRIED_IN_PLACE = frozenset(
    {
        ErrorCode.NOT_ENOUGH_REPLICAS,
        ErrorCode.NOT_ENOUGH_REPLICAS_AFTER_APPEND,
        ErrorCode.REQUEST_TIMED_OUT,
    }
)
#: The longest acks=all wait a request names: the longest a broker takes (MAX_PRODUCE_TIMEOUT_MS
#: in broker/data_plane.py; a longer one is refused INVALID_REQUEST).
MAX_ACKS_WAIT_MS = 300_000


class ProduceError(Exception):
    def __init__(self, message: str, error_code: ErrorCode) -> None:
        super().__init__(message)
        self.error_code = error_code


class TopicRecreated(ProduceError):
    """The incarnation of the topic a record was sent to is gone: the topic was deleted (and
    perhaps created again under its name) before a broker stored the record. The record is not
    written, neither to the deleted topic nor to the new one, which is another topic; send it
    again to write it to the new one. ``new``: the id the topic has now (None: none known)."""

    def __init__(self, topic: str, old: TopicId, new: TopicId | None) -> None:
        now = "no other incarnation is known" if new is None else f"it was created again, id {new}"
        super().__init__(
            f"topic {topic!r} (id {old}) was deleted before this record was stored, and {now}:"
            " the record was not written",
            ErrorCode.UNKNOWN_TOPIC_ID,
        )
        self.topic = topic
        self.old = old
        self.new = new


class SendDoesNotWait(FutureWarning):
    """Records were sent with ``await producer.send(...)`` and their :class:`Delivery` was never
    looked at. ``send`` used to wait for the broker's acknowledgement; it now returns once the
    record is in its batch, as aiokafka's does, so code that relied on the old meaning (read the
    record back, stop a broker, count it as stored) now races: such code calls
    ``send_and_wait``. Said at ``flush`` and at the end of the ``open_producer`` block, for the
    releases of the deprecation period (docs/producer.md#send-and-send_and_wait); code that means
    fire-and-forget silences it with ``warnings.filterwarnings("ignore",
    category=SendDoesNotWait)``."""


_OLD_SEND = (
    "`await producer.send(...)` returns the record's Delivery, as aiokafka's send returns a "
    "future, not (partition, offset): write `await producer.send_and_wait(...)` for the "
    "acknowledged (partition, offset), or `await delivery` / `await delivery.wait()`"
)


def _as_bytes(data: object, what: str) -> bytes:
    """A key or value the batch can hold, or a TypeError saying how to send it: without a
    serializer the record's key and value are bytes (aiokafka and kafka-python say the same)."""
    if isinstance(data, bytearray | memoryview):
        return bytes(data)
    hint = (
        f"pass {what}_serializer=str.encode to open_producer, or send {what}.encode()"
        if isinstance(data, str)
        else f"pass a {what}_serializer (e.g. lambda v: json.dumps(v).encode()) to open_producer"
    )
    raise TypeError(f"a record's {what} is bytes (or None), not {type(data).__name__}: {hint}")


def _checked_headers(headers: object) -> Sequence[Header]:
    """``headers`` as the batch encodes them, or a TypeError naming the form: a list of
    ``(name: str, value: bytes | None)`` pairs (aiokafka's), not a dict or bare strings."""
    form = "headers are a list of (name: str, value: bytes | None) pairs, e.g. [('trace', b'1')]"
    if isinstance(headers, dict):
        raise TypeError(f"{form}, not a dict: pass list(headers.items())")
    if isinstance(headers, str | bytes) or not isinstance(headers, Sequence):
        raise TypeError(f"{form}, not {type(headers).__name__}")
    for header in headers:
        if not isinstance(header, tuple | list) or len(header) != 2:
            raise TypeError(f"{form}; got {header!r}")
        name, value = header
        if not isinstance(name, str):
            raise TypeError(f"{form}; the name {name!r} is {type(name).__name__}")
        if value is not None and not isinstance(value, bytes | bytearray | memoryview):
            hint = ": encode it (value.encode())" if isinstance(value, str) else ""
            raise TypeError(f"{form}; the value of {name!r} is {type(value).__name__}{hint}")
    return headers


@attrs.frozen(kw_only=True)
class ProducerConfig:
    client_id: str = "producer"
    #: How long a record may wait for others to share its batch.
    linger: float = 0.005
    max_batch_records: int = 10_000
    #: A record batch's size before compression (the broker refuses one over 1 MiB by default).
    max_batch_bytes: int = 1024 * 1024
    compression: Compression = Compression.NONE
    #: Records accepted but not yet acknowledged; ``send`` waits beyond this (backpressure).
    max_pending_records: int = 100_000
    request_timeout: float = 30.0
    retry_backoff: float = 0.1
    #: A record not acknowledged this long after it was sent fails with the last error.
    delivery_timeout: float = 120.0
    max_frame_size: int = 64 * 1024 * 1024
    #: ``"all"``: acknowledged once every in-sync replica has the batch (refused, and retried,
    #: while fewer than the topic's ``min.insync.replicas`` are in sync); ``1``: once the leader
    #: wrote it. A topic of one replica treats both alike (docs/producer.md#acks).
    acks: Literal["all", 1] = attrs.field(default="all", validator=attrs.validators.in_(("all", 1)))


@attrs.define(eq=False)
class _Batch:
    """One record batch of one partition: filled by sends, then sent whole and answered once."""

    builder: BatchBuilder
    #: The incarnation the batch is for (NO_TOPIC_ID: whichever the name has; a broker that
    #: gives no ids).
    topic_id: TopicId = NO_TOPIC_ID
    base_offset: int = -1
    error: BaseException | None = None
    done: trio.Event = attrs.field(factory=trio.Event)

    def resolve(self, base_offset: int, error: BaseException | None = None) -> None:
        self.base_offset = base_offset
        self.error = error
        self.done.set()


class Delivery:
    """One record's fate, aiokafka's future of ``send``: ``await delivery`` (or ``await
    delivery.wait()``) -> ``(partition, offset)`` once acknowledged, or raises.

    Code written for a ``send`` that returned ``(partition, offset)`` gets a TypeError naming
    ``send_and_wait`` from unpacking, indexing or comparing it with a tuple."""

    __slots__ = ("_batch", "_index", "_unread", "partition", "topic")

    def __init__(self, topic: str, partition: int, batch: _Batch, index: int) -> None:
        self.topic = topic
        self.partition = partition
        self._batch = batch
        self._index = index
        # send's count of deliveries nobody looked at, while this one is in it
        self._unread: _Unread | None = None

    def _read(self) -> None:
        unread = self._unread
        if unread is not None:
            self._unread = None
            unread.count -= 1

    @property
    def done(self) -> bool:
        self._read()
        return self._batch.done.is_set()

    @property
    def error(self) -> BaseException | None:
        self._read()
        return self._batch.error

    @property
    def offset(self) -> int:
        self._read()
        base = self._batch.base_offset
        return -1 if base < 0 else base + self._index

    async def wait(self) -> tuple[int, int]:
        self._read()
        await self._batch.done.wait()
        if self._batch.error is not None:
            raise self._batch.error
        return self.partition, self.offset

    def __await__(self) -> Generator[Any, None, tuple[int, int]]:
        return self.wait().__await__()

    def __repr__(self) -> str:
        state = "pending" if not self._batch.done.is_set() else f"offset {self.offset}"
        return f"<Delivery {self.topic}-{self.partition}: {state}>"

    # What code written for a send that returned (partition, offset) would do with it.
    def __iter__(self) -> Generator[int, None, None]:
        self._read()  # told here: no SendDoesNotWait for it as well
        raise TypeError(_OLD_SEND)

    def __getitem__(self, index: object) -> int:
        self._read()
        raise TypeError(_OLD_SEND)

    def __len__(self) -> int:
        self._read()
        raise TypeError(_OLD_SEND)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, tuple):
            self._read()
            raise TypeError(_OLD_SEND)
        return self is other

    __hash__ = object.__hash__


@attrs.define(eq=False)
class _Unread:
    """Deliveries ``send`` returned that nobody awaited or looked at (:class:`SendDoesNotWait`)."""

    count: int = 0
    first: str = ""
    """Where the first of them was sent (file:line), for the warning."""


@attrs.define(eq=False)
class _Batcher:
    """A partition's batches waiting to be sent, oldest first; ``open``, the last one, may
    still fill (None: every waiting batch is sealed)."""

    batches: collections.deque[_Batch] = attrs.field(factory=collections.deque)
    open: _Batch | None = None
    ready: trio.Event = attrs.field(factory=trio.Event)
    """Set while ``batches`` is not empty."""
    full: trio.Event = attrs.field(factory=trio.Event)
    """Set while a sealed batch waits: no reason to linger."""

    def seal(self) -> None:
        if self.open is not None:
            self.open = None
            self.full.set()


@attrs.define(eq=False)
class Producer:
    bootstrap: Sequence[Address]
    config: ProducerConfig
    nursery: trio.Nursery
    connections: BrokerConnections
    connect: Connect
    #: Each partition's leader and its epoch, as the newest answer that named it said.
    leaders: Leaders
    #: topic -> broker id of each partition's leader
    placement: dict[str, tuple[int, ...]] = attrs.field(factory=dict)
    #: topic -> the id of the incarnation ``placement`` is of (none: a broker that gives none)
    topic_ids: dict[str, TopicId] = attrs.field(factory=dict)
    #: Ids a broker answered UNKNOWN_TOPIC_ID for: gone for good (an id is never given twice).
    _gone: set[TopicId] = attrs.field(factory=set)
    #: keyed by (topic, partition): a tuple hashes faster than a TopicPartition, once per record
    _batchers: dict[tuple[str, int], _Batcher] = attrs.field(factory=dict)
    _round_robin: dict[str, itertools.count[int]] = attrs.field(factory=dict)
    _unacknowledged: set[_Batch] = attrs.field(factory=set)
    #: Records accepted and not yet answered; ``send`` waits on ``_room`` past the limit.
    _pending: int = 0
    _room: trio.Event = attrs.field(factory=trio.Event)
    _metadata_lock: trio.Lock = attrs.field(factory=trio.Lock)
    _first_lookup: trio.Lock = attrs.field(factory=trio.Lock)
    _bootstrap_start: int = 0
    _not_awaited: Unawaited = attrs.field(factory=lambda: Unawaited("producer"))
    """A forgotten ``await`` of ``send`` / ``send_and_wait`` / ``enqueue`` is an error at
    ``flush`` and at the end of the ``open_producer`` block, not a record lost with only a
    "never awaited" warning."""
    _unread: _Unread = attrs.field(factory=_Unread)
    key_serializer: Serializer | None = None
    """Turns each key (not None) into bytes, e.g. ``str.encode``."""
    value_serializer: Serializer | None = None
    """Turns each value (not None) into bytes, e.g. ``lambda v: json.dumps(v).encode()``."""

    def send(
        self,
        topic: str,
        value: Any,
        key: Any = None,
        *,
        timestamp_ms: int = -1,
        headers: Sequence[Header] = (),
        partition: int | None = None,
    ) -> Coroutine[Any, Any, Delivery]:
        """``await producer.send(...)``, as in aiokafka: hand one record to its partition's batch
        and return its :class:`Delivery`, to await for ``(partition, offset)`` once the broker
        acknowledged it (:meth:`send_and_wait` does both). ``headers``: ``(name, value)`` pairs
        the consumer gets as ``record.headers``; ``partition`` as :meth:`enqueue`. Waits only
        for room, as :meth:`enqueue`. Not
        awaiting it is an error (:class:`NotAwaited`); never looking at the Delivery is a
        :class:`SendDoesNotWait` warning in the deprecation period, since ``send`` used to wait."""
        caller = sys._getframe(1)
        where = (caller.f_code.co_filename, caller.f_lineno)
        return self._not_awaited.track(
            "send",
            f"send to {topic!r}",
            self._sent,
            where,
            topic,
            value,
            key,
            timestamp_ms,
            headers,
            partition,
        )

    async def _sent(
        self,
        where: tuple[str, int],
        topic: str,
        value: Any,
        key: Any,
        timestamp_ms: int,
        headers: Sequence[Header],
        partition: int | None,
    ) -> Delivery:
        delivery = await self._enqueue(topic, value, key, timestamp_ms, headers, partition)
        unread = delivery._unread = self._unread
        if unread.count == 0:
            unread.first = f"{where[0]}:{where[1]}"
        unread.count += 1
        return delivery

    def send_and_wait(
        self,
        topic: str,
        value: Any,
        key: Any = None,
        *,
        timestamp_ms: int = -1,
        headers: Sequence[Header] = (),
        partition: int | None = None,
    ) -> Coroutine[Any, Any, tuple[int, int]]:
        """``await producer.send_and_wait(...)``: send one record and wait until the broker
        acknowledged it: ``(partition, offset)``, or raises (aiokafka's ``send_and_wait``)."""
        return self._not_awaited.track(
            "send_and_wait",
            f"send_and_wait to {topic!r}",
            self._send_and_wait,
            topic,
            value,
            key,
            timestamp_ms,
            headers,
            partition,
        )

    async def _send_and_wait(
        self,
        topic: str,
        value: Any,
        key: Any,
        timestamp_ms: int,
        headers: Sequence[Header],
        partition: int | None,
    ) -> tuple[int, int]:
        delivery = await self._enqueue(topic, value, key, timestamp_ms, headers, partition)
        return await delivery.wait()

    def enqueue(
        self,
        topic: str,
        value: Any,
        key: Any = None,
        *,
        timestamp_ms: int = -1,
        headers: Sequence[Header] = (),
        partition: int | None = None,
    ) -> Coroutine[Any, Any, Delivery]:
        """``await producer.enqueue(...)``: :meth:`send` under the name that never meant waiting
        for the acknowledgement (no :class:`SendDoesNotWait` for its deliveries); the
        :class:`Delivery` says when it is.

        Waits only while ``max_pending_records`` are unacknowledged, and otherwise does not even
        yield to the scheduler (a checkpoint per record would cost more than the record), so a loop
        of enqueues should await something now and then. ``timestamp_ms`` -1: the broker stamps
        its own time. ``partition``: this one, not the key's hash or the round robin
        (ValueError if the topic has no such partition). Not awaiting it is an error
        (:class:`NotAwaited`).
        """
        return self._not_awaited.track(
            "enqueue",
            f"enqueue to {topic!r}",
            self._enqueue,
            topic,
            value,
            key,
            timestamp_ms,
            headers,
            partition,
        )

    async def _enqueue(
        self,
        topic: str,
        value: Any,
        key: Any,
        timestamp_ms: int,
        headers: Sequence[Header],
        partition: int | None = None,
    ) -> Delivery:
        if topic not in self.placement:
            await self._placement(topic)
        while self._pending >= self.config.max_pending_records:
            await self._room.wait()
        return self.enqueue_nowait(
            topic, value, key, timestamp_ms=timestamp_ms, headers=headers, partition=partition
        )

    def enqueue_nowait(
        self,
        topic: str,
        value: Any,
        key: Any = None,
        *,
        timestamp_ms: int = -1,
        headers: Sequence[Header] = (),
        partition: int | None = None,
    ) -> Delivery:
        """:meth:`enqueue` without awaiting anything: the fast path of a loop that sends many
        records (no coroutine, no checkpoint per record). Raises ``trio.WouldBlock`` when
        ``max_pending_records`` are unacknowledged or the topic's partitions are not known yet
        (await :meth:`enqueue` or :meth:`partitions_for` once first)."""
        partitions = self.placement.get(topic)
        if not partitions or self._pending >= self.config.max_pending_records:
            raise trio.WouldBlock
        if key is not None:
            if self.key_serializer is not None:
                key = self.key_serializer(key)
            if type(key) is not bytes:
                key = _as_bytes(key, "key")
        if value is not None:
            if self.value_serializer is not None:
                value = self.value_serializer(value)
            if type(value) is not bytes:
                value = _as_bytes(value, "value")
        if headers:
            headers = _checked_headers(headers)
        if partition is not None:
            if not 0 <= partition < len(partitions):
                raise ValueError(f"topic {topic} has no partition {partition}")
        elif key is not None:
            partition = zlib.crc32(key) % len(partitions)
        else:
            counter = self._round_robin.get(topic)
            if counter is None:
                counter = self._round_robin[topic] = itertools.count()
            partition = next(counter) % len(partitions)
        self._pending += 1
        batcher = self._batchers.get((topic, partition))
        if batcher is None:
            batcher = self._batchers[topic, partition] = _Batcher()
            tp = TopicPartition(topic=topic, partition=partition)
            self.nursery.start_soon(self._drain, tp, batcher)
        batch = batcher.open
        if batch is None or not batch.builder.append(value, key, timestamp_ms, headers):
            batch = self._open_batch(batcher, self.topic_ids.get(topic, NO_TOPIC_ID))
            batch.builder.append(value, key, timestamp_ms, headers)
        builder = batch.builder
        if builder.full:
            batcher.seal()
        return Delivery(topic, partition, batch, builder.count - 1)

    def _open_batch(self, batcher: _Batcher, topic_id: TopicId) -> _Batch:
        """Seal the partition's open batch (if any) and open the next one, of the topic's
        incarnation ``topic_id``."""
        batcher.seal()
        config = self.config
        batch = _Batch(
            builder=BatchBuilder(
                compression=config.compression,
                max_bytes=config.max_batch_bytes,
                max_records=config.max_batch_records,
            ),
            topic_id=topic_id,
        )
        batcher.open = batch
        batcher.batches.append(batch)
        batcher.ready.set()
        self._unacknowledged.add(batch)
        return batch

    async def flush(self) -> None:
        """Wait until every record sent so far is acknowledged or failed; raises
        :class:`NotAwaited` if a ``send``/``enqueue`` was never awaited (its record was never
        sent)."""
        self._check_awaited()
        await self._acknowledged()
        self._warn_unread(stacklevel=3)

    async def _acknowledged(self) -> None:
        for batch in list(self._unacknowledged):
            await batch.done.wait()

    def _check_awaited(self) -> None:
        self._not_awaited.check()

    def _warn_unread(self, stacklevel: int) -> None:
        unread = self._unread
        if unread.count > 0:
            warnings.warn(
                f"{unread.count} record(s) were sent with `await producer.send(...)` (the first "
                f"at {unread.first}) and their delivery never awaited: send no longer waits for "
                "the broker's acknowledgement (aiokafka's meaning); where the code relied on it, "
                "write `await producer.send_and_wait(...)` (docs/producer.md)",
                SendDoesNotWait,
                stacklevel=stacklevel,
            )
            # one warning per batch of them
            self._unread = _Unread()

    async def partitions_for(self, topic: str) -> int:
        return len(await self._placement(topic))

    async def _placement(self, topic: str) -> tuple[int, ...]:
        found = self.placement.get(topic)
        if found is None:
            async with self._first_lookup:
                # many sends for a new topic wait here for one lookup, not one lookup each
                found = self.placement.get(topic)
                if found is None:
                    await self.refresh_metadata(topic)
                    found = self.placement.get(topic)
        if not found:
            raise ProduceError(
                f"topic {topic!r} does not exist", ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
            )
        return found

    async def refresh_metadata(self, topic: str) -> None:
        """Ask a bootstrap broker where ``topic``'s partitions live (one pass over the list): a
        broker that dies before it answers (its connection closes under the request) is like
        one that refuses the connection, and the next one is asked. A busy one (BROKER_BUSY) is
        asked again after its hint, with jitter, for up to ``delivery_timeout``."""
        async with self._metadata_lock:
            give_up = trio.current_time() + self.config.delivery_timeout
            backoff = self.config.retry_backoff
            while True:
                response = await self._ask_metadata(topic)
                if response.error_code is not ErrorCode.BROKER_BUSY:
                    break
                wait = busy_wait(response.throttle_time_ms, backoff)
                if trio.current_time() + wait >= give_up:
                    raise ProduceError(
                        f"topic {topic!r}: every broker asked was too busy", response.error_code
                    )
                log.info("topic %r: the broker is busy; asking again in %.1f s", topic, wait)
                await trio.sleep(wait)
                backoff *= 2
            self.connections.update(response.brokers)
            ids = {identity.topic: identity.topic_id for identity in response.topic_ids}
            # An answer from a broker that has not heard of an election yet names a leader of
            # an older epoch than one already known: the newer one stands.
            self.leaders.learn(response)
            for metadata in response.topics:
                refused = refusal(
                    metadata.error_code, f"topic {metadata.topic!r}", name=metadata.topic
                )
                if refused is not None:
                    raise refused
                if metadata.error_code is ErrorCode.NONE:
                    self._learn_id(metadata.topic, ids.get(metadata.topic, NO_TOPIC_ID))
                    self.placement[metadata.topic] = tuple(
                        self._leader_of(metadata.topic, p.partition)
                        for p in sorted(metadata.partitions, key=lambda p: p.partition)
                    )
                else:
                    self.placement.pop(metadata.topic, None)
                    self.topic_ids.pop(metadata.topic, None)
                    self.leaders.forget(metadata.topic)

    def _leader_of(self, topic: str, partition: int) -> int:
        leader = self.leaders.of(TopicPartition(topic=topic, partition=partition))
        assert leader is not None  # learned from the answer that names the partition
        return leader.broker_id

    async def _ask_metadata(self, topic: str) -> ClusterMetadataResponse:
        """One pass over the bootstrap brokers: the first answer."""
        response = None
        for _ in self.bootstrap:
            stream, _address = await connect_any(
                self.bootstrap, connect=self.connect, start=self._bootstrap_start
            )
            self._bootstrap_start += 1
            try:
                async with open_channel(
                    stream,
                    client_id=self.config.client_id,
                    max_frame_size=self.config.max_frame_size,
                ) as channel:
                    with trio.fail_after(self.config.request_timeout):
                        response = await channel.request(
                            ClusterMetadataRequest(group_id=None, topics=(topic,))
                        )
                break
            except BaseExceptionGroup as group:
                closed, rest = group.split(ChannelClosed)
                if closed is None or rest is not None:
                    raise
                refused = final_refusal(closed)
                if refused is not None:  # the cluster's answer, not one broker's absence
                    raise refused from None
        if response is None:
            raise BrokerUnavailable("every bootstrap broker closed the connection unanswered")
        assert isinstance(response, ClusterMetadataResponse)
        return response

    def _learn_id(self, topic: str, topic_id: TopicId) -> None:
        """``topic``'s incarnation is ``topic_id`` now: a record sent from here on joins no batch
        of another one (its open batches are sealed, and fail as that one's, if it is gone)."""
        known = self.topic_ids.get(topic, NO_TOPIC_ID)
        if topic_id == NO_TOPIC_ID:
            self.topic_ids.pop(topic, None)
        else:
            self.topic_ids[topic] = topic_id
        if known not in (NO_TOPIC_ID, topic_id):
            for (name, _), batcher in self._batchers.items():
                if name == topic:
                    batcher.seal()

    async def _drain(self, tp: TopicPartition, batcher: _Batcher) -> None:
        """This partition's sender: one batch in flight, in the order records were sent."""
        while True:
            await batcher.ready.wait()
            if batcher.batches[0] is batcher.open:
                with trio.move_on_after(self.config.linger):
                    await batcher.full.wait()
            batch = batcher.batches.popleft()
            if batch is batcher.open:
                batcher.open = None
            if not batcher.batches:
                batcher.ready = trio.Event()
            if not batcher.batches or batcher.batches[0] is batcher.open:
                batcher.full = trio.Event()
            try:
                await self._send_batch(tp, batch)
            finally:
                if not batch.done.is_set():  # cancelled: the producer is closing
                    batch.resolve(-1, ProduceError("producer closed", ErrorCode.NONE))
                self._unacknowledged.discard(batch)
                self._pending -= batch.builder.count
                self._room.set()
                self._room = trio.Event()

    async def _send_batch(self, tp: TopicPartition, batch: _Batch) -> None:
        config = self.config
        request = ProduceRequest(
            topic=tp.topic,
            partition=tp.partition,
            records=(),
            batches=batch.builder.build(),
            topic_id=batch.topic_id,
            acks=-1 if config.acks == "all" else 1,
            timeout_ms=min(round(config.request_timeout * 1000), MAX_ACKS_WAIT_MS),
        )
        give_up = trio.current_time() + config.delivery_timeout
        while True:
            error: Exception
            refresh = True
            if batch.topic_id in self._gone:
                error = self._recreated(tp.topic, batch.topic_id)
                break
            try:
                broker_id = (await self._placement(tp.topic))[tp.partition]
                with trio.fail_after(config.request_timeout):
                    response = await self.connections.request(broker_id, request)
            except Refused as exc:
                if final_refusal(exc) is not None:
                    error = exc
                    break
                error = ProduceError(f"{tp}: {exc}", ErrorCode.NONE)
            except (BrokerUnavailable, trio.TooSlowError, OSError, IndexError) as exc:
                error = ProduceError(f"{tp}: {exc or type(exc).__name__}", ErrorCode.NONE)
            except ProduceError as exc:
                error = exc
            else:
                assert isinstance(response, ProduceResponse)
                if response.error_code is ErrorCode.NONE:
                    batch.resolve(response.base_offset)
                    return
                code = response.error_code
                if code is ErrorCode.UNKNOWN_TOPIC_ID:
                    # The broker read the store: the incarnation is gone, its batches with it;
                    # the next records learn the new one.
                    self._gone.add(batch.topic_id)
                    self.placement.pop(tp.topic, None)
                    with contextlib.suppress(
                        ProduceError, Refused, BrokerUnavailable, OSError, trio.TooSlowError
                    ):  # the next send asks again
                        await self._placement(tp.topic)
                    error = self._recreated(tp.topic, batch.topic_id)
                    break
                error = refusal(
                    code, f"topic {tp.topic!r}", operation="write", name=tp.topic
                ) or ProduceError(f"{tp}: {code.name}", code)
                if code in _RETRIED_IN_PLACE:
                    refresh = False
                elif code not in LEADER_CODES:
                    break  # the broker refused these records; retrying changes nothing
            if trio.current_time() + config.retry_backoff >= give_up:
                break
            log.info("%s; retrying", error)
            await trio.sleep(config.retry_backoff)
            if refresh:
                self.placement.pop(tp.topic, None)  # where the leader is, before the next attempt
        batch.resolve(-1, error)

    def _recreated(self, topic: str, gone: TopicId) -> TopicRecreated:
        """The error of a batch of ``topic``'s incarnation ``gone``."""
        now = self.topic_ids.get(topic)
        return TopicRecreated(topic, gone, None if now in (None, gone) else now)


async def _tcp(host: str, port: int) -> trio.abc.Stream:
    return await trio.open_tcp_stream(host, port)


@asynccontextmanager
async def open_producer(
    bootstrap: str | Sequence[Address],
    *,
    config: ProducerConfig | None = None,
    connect: Connect | None = None,
    security: ClientSecurity | None = None,
    key_serializer: Serializer | None = None,
    value_serializer: Serializer | None = None,
) -> AsyncIterator[Producer]:
    """A producer for the block's span; on a normal exit it first waits for every record sent.

    ``bootstrap`` is ``"host:port[,host:port...]"`` or a list of ``(host, port)``. It connects as
    ``security`` says (default: plaintext, no authentication). A ``send``/``enqueue`` that was
    never awaited makes the block's end raise :class:`NotAwaited`; a ``send`` whose delivery
    nobody awaited, a :class:`SendDoesNotWait` warning. ``key_serializer`` and
    ``value_serializer`` turn what is sent into bytes (without them keys and values are
    bytes)."""
    require_trio("open_producer")
    addresses = parse_bootstrap(bootstrap) if isinstance(bootstrap, str) else list(bootstrap)
    config = config or ProducerConfig()
    connect = connect or (security or ClientSecurity()).connector(_tcp)
    with unwrap_single():
        async with trio.open_nursery() as nursery:
            connections = BrokerConnections(
                nursery=nursery,
                connect=connect,
                client_id=config.client_id,
                max_frame_size=config.max_frame_size,
            )
            producer = Producer(
                bootstrap=addresses,
                config=config,
                nursery=nursery,
                connections=connections,
                leaders=Leaders(ask=metadata_asker(connections, config.request_timeout)),
                connect=connect,
                key_serializer=key_serializer,
                value_serializer=value_serializer,
            )
            try:
                yield producer
                await producer._acknowledged()
            finally:
                nursery.cancel_scope.cancel()
    producer._check_awaited()
    producer._warn_unread(stacklevel=4)
