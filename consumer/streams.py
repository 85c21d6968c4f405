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

A partition's :class:`PartitionClaim` lives from the StartFetcher that gives the partition to this
consumer until its fetcher is stopped (an incremental StartFetcher that keeps the partition keeps
its claim, and so its position and consumed offset). Once stopped it is inactive: buffered records
of it are dropped, and finishing a record of it changes nothing (the offsets for it went out with
the StopFetcher response; the partition may already be elsewhere).

A consumer fenced out of its group (a newer process took its instance id, SPEC.md §11.11) closes
its streams with :class:`InstanceFenced`, which iterating them then raises.
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Iterable

import attrs
import trio

from protocol.errors import ErrorCode
from protocol.types import TopicPartition

__all__ = ["ConsumerRecord", "InstanceFenced", "PartitionClaim", "RecordStream"]


class InstanceFenced(Exception):
    """A newer process registered under this consumer's instance id (FENCED_INSTANCE_ID,
    SPEC.md §11.11): this one stopped, closed and will not register again."""

    error_code = ErrorCode.FENCED_INSTANCE_ID

    def __init__(self, instance_id: str | None) -> None:
        self.instance_id = instance_id
        super().__init__(f"instance id {instance_id!r} was taken over by a newer process")


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
    key: bytes | None
    value: bytes | None
    _claim: PartitionClaim = attrs.field(eq=False, repr=False)

    @property
    def topic_partition(self) -> TopicPartition:
        return TopicPartition(topic=self.topic, partition=self.partition)

    def finish(self) -> None:
        self._claim.finish(self.offset)


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
    claims: dict[TopicPartition, PartitionClaim] = attrs.field(factory=dict)
    """The partitions assigned to this stream by the latest StartFetcher (active or not)."""
    _buffer: collections.deque[ConsumerRecord] = attrs.field(factory=collections.deque)
    _changed: trio.Event = attrs.field(factory=trio.Event)
    _held: ConsumerRecord | None = None
    _closed: bool = False
    _error: Callable[[], Exception] | None = None
    """Set when closed by a failure (being fenced): iteration raises what it makes."""

    @property
    def partitions(self) -> frozenset[TopicPartition]:
        """The partitions this stream is fetching now."""
        return frozenset(tp for tp, claim in self.claims.items() if claim.active)

    def __aiter__(self) -> RecordStream:
        return self

    async def __anext__(self) -> ConsumerRecord:
        if self._held is not None:
            self._held.finish()  # asking for the next record finishes the previous one
            self._held = None
        while True:
            while self._buffer:
                record = self._buffer.popleft()
                self._notify()
                if record._claim.active:
                    self._held = record
                    return record
            if self._closed:
                if self._error is not None:
                    raise self._error()
                raise StopAsyncIteration
            await self._changed.wait()

    # --- the consumer's side --------------------------------------------------------------------

    async def put(self, claim: PartitionClaim, records: Iterable[ConsumerRecord]) -> bool:
        """Append a fetched batch once there is room; False (nothing appended) if the claim
        became inactive meanwhile: a stopped fetcher must not deliver."""
        while len(self._buffer) >= self.max_buffered and claim.active and not self._closed:
            await self._changed.wait()
        if not claim.active or self._closed:
            return False
        self._buffer.extend(records)
        self._notify()
        return True

    def assign(self, claims: Iterable[PartitionClaim]) -> None:
        self.claims = {claim.partition: claim for claim in claims}

    def take(self, claim: PartitionClaim) -> list[ConsumerRecord]:
        """Remove and return the buffered records of ``claim``, which moves to another stream of
        this consumer with them, so nothing is skipped or delivered twice."""
        taken = [r for r in self._buffer if r._claim is claim]
        self._buffer = collections.deque(r for r in self._buffer if r._claim is not claim)
        self._notify()
        return taken

    def give(self, records: Iterable[ConsumerRecord]) -> None:
        """Append records taken from another stream (before any fetched for them here)."""
        self._buffer.extend(records)
        self._notify()

    def drop_inactive(self) -> None:
        """Clear the queue of stopped partitions (seed 03: stop fetchers, clean their queues)."""
        self._buffer = collections.deque(r for r in self._buffer if r._claim.active)
        self._notify()

    def close(self, error: Callable[[], Exception] | None = None) -> None:
        """End the iteration: with StopAsyncIteration, or with ``error()`` (a fresh exception
        for every task that asks)."""
        self._error = error
        self._closed = True
        self._buffer.clear()
        self._notify()

    def _notify(self) -> None:
        self._changed.set()
        self._changed = trio.Event()
