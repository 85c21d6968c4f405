"""The application's side of the consumer: streams of records, and what counts as consumed.

A stream is the seeds' "consumer thread": ``topics={"t": 2}`` gives two streams for ``t``, each
an async iterator over its own share of t's partitions (the coordinator assigns partitions to the
stream id ``f"{member_id}-{index}"``). A stream outlives rebalances: its partitions change under it
as StartFetcher requests arrive, and its iteration ends only when the consumer closes.

**When a record counts as consumed.** A consumer reports only offsets of records its application
has *finished* with (docs/design.md#offsets). A record is finished when either

* the application asks its stream for the next record (``async for`` moving on means the loop body
  for the previous record completed), or
* the application calls :meth:`Consumer.mark` on it (for work finished out of the loop, or before
  an explicit ``commit()`` from inside the loop body);

and finishing a record finishes every earlier record of its partition too. The consumed offset of a
partition is then ``offset + 1`` of its latest finished record (a committed offset is the *next*
offset to read), or the offset its fetcher started from if none is finished yet. The record the
application holds when a rebalance revokes its partition is therefore *not* reported, and the next
owner reads it again: delivery is at least once, and exactly once while nobody fails or rebalances
in the middle of a record.

**Batches.** Fetchers hand a stream whole record batches as the broker stored them, and a batch's
records are decoded only when the application reaches them: ``async for record in stream`` makes
one :class:`ConsumerRecord` at a time, while ``async for batch in stream.batches()`` hands over a
:class:`ConsumerBatch` whose ``keys()``, ``values()``, ``offsets`` and ``timestamps()`` are parallel
lists, decoded in one pass with no object per record. Asking for the next batch finishes every
record of the previous one, as asking for the next record finishes the previous record.

A partition's :class:`PartitionClaim` lives from the StartFetcher that gives the partition to this
consumer until its fetcher is stopped (an incremental StartFetcher that keeps the partition keeps
its claim, and so its position and consumed offset). Once stopped it is inactive: buffered records
of it are dropped, and finishing a record of it changes nothing (the offsets for it went out with
the StopFetcher response; the partition may already be elsewhere).

A consumer fenced out of its group (a newer process took its instance id, SPEC.md §11.11) closes
its streams with :class:`InstanceFenced`, which iterating them then raises.

**A corrupt batch** (a disk fault on the broker, or a log written before brokers checked what they
acknowledge) is never handed out and never fetched for ever: the records before it are handed
out, then asking the stream for more raises :class:`CorruptBatch`, naming its topic, partition
and offset, again at every ask, until the application seeks past it (``Consumer.seek``, logged) or
an operator moves the group's offset past it (docs/consumer.md#a-corrupt-batch).
"""

from __future__ import annotations

import collections
from collections.abc import AsyncIterator, Callable, Iterable
from typing import Any

import attrs
import trio

from protocol.batches import Header, RecordBatch
from protocol.errors import ErrorCode
from protocol.types import NO_TOPIC_ID, TopicId, TopicPartition

__all__ = [
    "ConsumerBatch",
    "ConsumerRecord",
    "CorruptBatch",
    "InstanceFenced",
    "PartitionClaim",
    "RecordStream",
]


class InstanceFenced(Exception):
    """A newer process registered under this consumer's instance id (FENCED_INSTANCE_ID,
    SPEC.md §11.11): this one stopped, closed and will not register again."""

    error_code = ErrorCode.FENCED_INSTANCE_ID

    def __init__(self, instance_id: str | None) -> None:
        self.instance_id = instance_id
        super().__init__(f"instance id {instance_id!r} was taken over by a newer process")


class CorruptBatch(Exception):
    """The stored batch at ``offset`` of ``topic``-``partition`` cannot be decoded (its CRC does
    not match, or its records do not fit its section) every time it is fetched. Nothing at or
    after it is handed out until the partition is sought elsewhere; ``next_offset`` is the offset
    after it as its header says (None if the broker could not read it at all)."""

    def __init__(
        self, topic: str, partition: int, offset: int, next_offset: int | None, reason: str
    ) -> None:
        self.topic = topic
        self.partition = partition
        self.offset = offset
        self.next_offset = next_offset
        self.reason = reason
        after = "" if next_offset is None else f"; the records after it start at {next_offset}"
        super().__init__(
            f"{topic}-{partition}: the batch at offset {offset} is corrupt ({reason}){after}"
        )


#: Turns a record's key or value bytes into what the application reads (``json.loads``).
Deserializer = Callable[[bytes], Any]


@attrs.define(eq=False)
class PartitionClaim:
    """One partition as one StartFetcher handed it to this consumer."""

    partition: TopicPartition
    generation: int
    broker_id: int
    position: int
    """The next offset to fetch; -1 until resolved through auto_offset_reset."""
    consumed: int | None = None
    """The next offset the application has not finished (see the module docstring); None until
    the start position is known."""
    active: bool = True
    delivered: int | None = None
    """The offset after the last record handed to the application since the start or the latest
    seek; None if none was."""
    seeks: int = 0
    """Counts seeks (and pauses): a fetch asked for before one is answered too late to deliver."""
    reset: str | None = None
    """Where a seek to the beginning or end resolves ``position`` -1 (else auto_offset_reset)."""
    paused: bool = False
    unpaused: trio.Event = attrs.field(factory=trio.Event)
    failed: CorruptBatch | None = None
    """The corrupt batch its fetcher stopped at: no fetching until a seek clears it."""
    sought: trio.Event = attrs.field(factory=trio.Event)
    """Set by a seek (then replaced): what a fetcher stopped at a corrupt batch waits for."""
    topic_id: TopicId = NO_TOPIC_ID
    """The incarnation of the topic it was started on (SPEC.md §11.12): every Fetch names it.
    NO_TOPIC_ID: any (a coordinator that names none)."""
    topic_gone: bool = False
    """A broker answered UNKNOWN_TOPIC_ID: the incarnation is gone, and its fetcher stopped
    until the coordinator's next StartFetcher."""

    @property
    def next_offset(self) -> int | None:
        """The offset of the next record the application is handed (None: not yet resolved)."""
        if self.delivered is not None:
            return self.delivered
        return self.consumed

    def finish(self, offset: int) -> None:
        """The application finished the record at ``offset`` (and so every earlier one)."""
        if self.active and (self.consumed is None or offset + 1 > self.consumed):
            self.consumed = offset + 1


@attrs.frozen(kw_only=True)
class ConsumerRecord:
    topic: str
    partition: int
    offset: int
    timestamp_ms: int
    key: Any
    """``bytes`` (or None), or what the consumer's ``key_deserializer`` made of them."""
    value: Any
    """``bytes`` (or None), or what the consumer's ``value_deserializer`` made of them."""
    _claim: PartitionClaim = attrs.field(eq=False, repr=False)
    headers: tuple[Header, ...] = ()
    """``(name, value)`` pairs the producer attached, in its order."""

    @property
    def topic_partition(self) -> TopicPartition:
        return TopicPartition(topic=self.topic, partition=self.partition)

    def finish(self) -> None:
        self._claim.finish(self.offset)


@attrs.define(eq=False)
class ConsumerBatch:
    """The records of one stored batch from ``first_offset`` on, decoded on first use.

    ``offsets``, ``timestamps()``, ``keys()`` and ``values()`` are parallel; ``batch`` is the
    received batch itself (its header, and :meth:`RecordBatch.columns` for vectorised readers,
    which must skip the records before ``first_offset``).
    """

    topic: str
    partition: int
    batch: RecordBatch
    first_offset: int
    _claim: PartitionClaim = attrs.field(repr=False)

    @property
    def _skip(self) -> int:
        return self.first_offset - self.batch.base_offset

    def __len__(self) -> int:
        return self.batch.next_offset - self.first_offset

    @property
    def topic_partition(self) -> TopicPartition:
        return TopicPartition(topic=self.topic, partition=self.partition)

    @property
    def offsets(self) -> range:
        return range(self.first_offset, self.batch.next_offset)

    def keys(self) -> list[bytes | None]:
        keys = self.batch.keys()
        return keys[self._skip :] if self._skip else keys

    def values(self) -> list[bytes | None]:
        values = self.batch.values()
        return values[self._skip :] if self._skip else values

    def timestamps(self) -> list[int]:
        timestamps = self.batch.timestamps()
        return timestamps[self._skip :] if self._skip else timestamps

    def headers(self) -> list[tuple[Header, ...]]:
        headers = self.batch.headers()
        return headers[self._skip :] if self._skip else headers

    def records(
        self,
        key_deserializer: Deserializer | None = None,
        value_deserializer: Deserializer | None = None,
    ) -> list[ConsumerRecord]:
        """One record each, keys and values passed through the deserializers given (a None key
        or value stays None)."""
        claim = self._claim
        keys: list[Any] = self.keys()
        values: list[Any] = self.values()
        if key_deserializer is not None:
            keys = [None if key is None else key_deserializer(key) for key in keys]
        if value_deserializer is not None:
            values = [None if value is None else value_deserializer(value) for value in values]
        return [
            ConsumerRecord(
                topic=self.topic,
                partition=self.partition,
                offset=offset,
                timestamp_ms=ts,
                key=key,
                value=value,
                claim=claim,
                headers=headers,
            )
            for offset, ts, key, value, headers in zip(
                self.offsets,
                self.timestamps(),
                keys,
                values,
                self.headers(),
                strict=True,
            )
        ]

    def finish(self, offset: int | None = None) -> None:
        """The application finished every record of this batch (None), or those up to
        ``offset``; asking the stream for more finishes them all."""
        self._claim.finish(self.batch.last_offset if offset is None else offset)


@attrs.frozen(eq=False)
class _Failed:
    """Where a partition's records stop at a corrupt batch: in the stream's queue after the
    batches before it, raising its error (and staying) when the application reaches it."""

    error: CorruptBatch
    _claim: PartitionClaim

    def __len__(self) -> int:
        return 0


_Entry = ConsumerBatch | _Failed


@attrs.define(eq=False)
class RecordStream:
    """An async iterator over the records of the partitions currently assigned to this stream.

    Fetchers append whole batches and wait while ``max_buffered`` records are waiting, so a slow
    application slows the fetching rather than filling memory.
    """

    index: int
    topic: str | None
    """None for a wildcard subscription's streams, which take every matching topic."""
    max_buffered: int = 1000
    key_deserializer: Deserializer | None = None
    value_deserializer: Deserializer | None = None
    """What ``async for`` and ``getmany`` pass keys and values through (the batch API hands over
    the bytes)."""
    claims: dict[TopicPartition, PartitionClaim] = attrs.field(factory=dict)
    """The partitions assigned to this stream by the latest StartFetcher (active or not)."""
    _buffer: collections.deque[_Entry] = attrs.field(factory=collections.deque)
    _buffered: int = 0
    """Records in ``_buffer``."""
    _records: collections.deque[ConsumerRecord] = attrs.field(factory=collections.deque)
    """The rest of the batch ``async for`` is going through (``_current``), decoded."""
    _current: ConsumerBatch | None = None
    _changed: trio.Event = attrs.field(factory=trio.Event)
    _held: ConsumerRecord | ConsumerBatch | None = None
    _closed: bool = False
    _error: Callable[[], Exception] | None = None
    """Set when closed by a failure (being fenced): iteration raises what it makes."""
    _on_change: Callable[[], None] | None = None
    """Told of every change too: the consumer's iteration over all its streams waits on it."""

    @property
    def partitions(self) -> frozenset[TopicPartition]:
        """The partitions this stream is fetching now."""
        return frozenset(tp for tp, claim in self.claims.items() if claim.active)

    def __aiter__(self) -> RecordStream:
        return self

    async def __anext__(self) -> ConsumerRecord:
        self._finish_held()
        while (record := self._ready_record()) is None:
            if self._ended():
                raise StopAsyncIteration
            await self._changed.wait()
        return record

    def _ready_record(self) -> ConsumerRecord | None:
        """The next record if one is buffered, without waiting; it is held (finished when the
        application asks for more)."""
        while True:
            while self._records:
                record = self._records.popleft()
                claim = record._claim
                if claim.active:
                    self._held = record
                    claim.delivered = record.offset + 1
                    return record
            batch = self._ready_batch()
            if batch is None:
                return None
            self._current = batch
            self._records.extend(batch.records(self.key_deserializer, self.value_deserializer))

    def _ready_batch(self) -> ConsumerBatch | None:
        while self._buffer:
            batch = self._buffer[0]
            if isinstance(batch, _Failed) and batch._claim.active:
                raise batch.error  # and stays: the partition goes on only once sought
            self._buffer.popleft()
            self._buffered -= len(batch)
            self._notify()
            if batch._claim.active and isinstance(batch, ConsumerBatch):
                return batch
        return None

    def _ended(self) -> bool:
        """True once closed (and drained: closing clears the buffer); raises the failure that
        closed the stream, if one did."""
        if self._closed and self._error is not None:
            raise self._error()
        return self._closed

    async def next_batch(self) -> ConsumerBatch | None:
        """The next batch of records (finishing every record handed out before); None once the
        consumer has closed. Records ``async for`` decoded but has not handed out come first,
        as a batch of their own."""
        self._finish_held()
        if self._records:
            first_offset = self._records[0].offset
            self._records.clear()
            current = self._current
            if current is not None and current._claim.active:
                rest = attrs.evolve(current, first_offset=first_offset)
                return self._hand_out(rest)
        batch = await self._next_buffered()
        return None if batch is None else self._hand_out(batch)

    def _hand_out(self, batch: ConsumerBatch) -> ConsumerBatch:
        self._held = batch
        batch._claim.delivered = batch.batch.next_offset
        return batch

    async def batches(self) -> AsyncIterator[ConsumerBatch]:
        """``async for batch in stream.batches()``: :meth:`next_batch` until the consumer
        closes."""
        while (batch := await self.next_batch()) is not None:
            yield batch

    def _finish_held(self) -> None:
        if self._held is not None:
            self._held.finish()  # asking for more finishes what was handed out
            self._held = None

    async def _next_buffered(self) -> ConsumerBatch | None:
        while (batch := self._ready_batch()) is None:
            if self._ended():
                return None
            await self._changed.wait()
        return batch

    # --- the consumer's side --------------------------------------------------------------------

    async def _put(
        self,
        claim: PartitionClaim,
        batches: Iterable[ConsumerBatch],
        seeks: int | None = None,
        failed: CorruptBatch | None = None,
    ) -> bool | None:
        """Append fetched batches once there is room: True. None (nothing appended) if the claim
        became inactive meanwhile: a stopped fetcher must not deliver. False (nothing appended)
        if the partition was sought since the fetch was asked for (``seeks`` no longer
        matches): the batches are from the old position."""
        while self._buffered >= self.max_buffered and claim.active and not self._closed:
            await self._changed.wait()
        if not claim.active or self._closed:
            return None
        if seeks is not None and claim.seeks != seeks:
            return False
        for batch in batches:
            self._buffer.append(batch)
            self._buffered += len(batch)
        if failed is not None:
            claim.failed = failed
            self._buffer.append(_Failed(error=failed, claim=claim))
        self._notify()
        return True

    def assign(self, claims: Iterable[PartitionClaim]) -> None:
        self.claims = {claim.partition: claim for claim in claims}

    def take(self, claim: PartitionClaim) -> list[_Entry]:
        """Remove and return the buffered records of ``claim`` (the rest of the batch being
        iterated first), which moves to another stream of this consumer with them, so nothing is
        skipped or delivered twice."""
        taken: list[_Entry] = []
        current = self._current
        if current is not None and current._claim is claim and self._records:
            rest = [r for r in self._records if r._claim is claim]
            if rest:
                taken.append(attrs.evolve(current, first_offset=rest[0].offset))
            self._records = collections.deque(r for r in self._records if r._claim is not claim)
        taken += [b for b in self._buffer if b._claim is claim]
        self._buffer = collections.deque(b for b in self._buffer if b._claim is not claim)
        self._buffered = sum(len(b) for b in self._buffer)
        self._notify()
        return taken

    def give(self, batches: Iterable[_Entry]) -> None:
        """Append batches taken from another stream (before any fetched for them here)."""
        for batch in batches:
            self._buffer.append(batch)
            self._buffered += len(batch)
        self._notify()

    def reposition(self, claim: PartitionClaim) -> None:
        """Forget what is buffered of ``claim`` and what the application holds of it (not
        finished: a seek decides the next offset): a seek or a pause."""
        self.take(claim)
        if self._held is not None and self._held._claim is claim:
            self._held = None

    def drop_inactive(self) -> None:
        """Clear the queue of stopped partitions (seed 03: stop fetchers, clean their queues)."""
        self._buffer = collections.deque(b for b in self._buffer if b._claim.active)
        self._buffered = sum(len(b) for b in self._buffer)
        self._records = collections.deque(r for r in self._records if r._claim.active)
        self._notify()

    def close(self, error: Callable[[], Exception] | None = None) -> None:
        """End the iteration: with StopAsyncIteration, or with ``error()`` (a fresh exception
        for every task that asks)."""
        self._error = error
        self._closed = True
        self._buffer.clear()
        self._buffered = 0
        self._records.clear()
        self._notify()

    def _notify(self) -> None:
        self._changed.set()
        self._changed = trio.Event()
        if self._on_change is not None:
            self._on_change()
