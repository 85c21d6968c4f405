"""The simulated broker's partition logs: the real broker's Produce, Fetch and ListOffsets
handling (``broker.data_plane.DataPlaneLog``) over partitions kept in memory, on trio's clock, so
that a user's own ``open_producer`` / ``open_consumer`` code runs against the simulated cluster
with exact virtual times (docs/testing.md).

Everything is answered as the real broker answers it: producer batches checked as a consumer will
decode them, stamped with their offsets and the append time (here virtual milliseconds) and kept
whole; a Fetch answered with whole batches from the one holding the requested offset, at least one
whatever ``max_bytes`` says; version 0 clients given records. What differs is the storage: nothing
is written to disk (the real log's file I/O runs in worker threads, and virtual time would jump
while a thread works; here every step runs on the loop), nothing is deleted, and the log outlives
:meth:`SimulatedCluster.restart_coordinator`, as a broker's files do.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable
from typing import TypeVar

import attrs
import trio

from broker.data_plane import DataPlaneLog
from broker.log import OffsetOutOfRange
from protocol import ErrorCode, FetchRequest, FetchResponse
from protocol.batches import BatchSpan, batch_spans, read_batches, stamp
from protocol.codec import ReadableBuffer
from protocol.types import NO_TOPIC_ID, TopicId, TopicPartition

__all__ = ["MemoryLog", "MemoryPartition", "StoredRecord"]

_T = TypeVar("_T")


@attrs.frozen(kw_only=True)
class StoredRecord:
    """One record as the log holds it: what a test compares with what its consumers saw."""

    offset: int
    timestamp_ms: int
    key: bytes | None
    value: bytes | None


@attrs.define(eq=False)
class MemoryPartition:
    """One partition's stored batches, back to back as the wire carries them (a
    ``broker.data_plane.StoredPartition``)."""

    data: bytearray = attrs.field(factory=bytearray)
    #: Per stored batch: its base offset and where it starts in ``data``.
    bases: list[int] = attrs.field(factory=list)
    positions: list[int] = attrs.field(factory=list)
    log_end_offset: int = 0

    @property
    def log_start_offset(self) -> int:
        return 0

    @property
    def high_watermark(self) -> int:
        return self.log_end_offset

    async def append(
        self,
        batches: ReadableBuffer,
        spans: list[BatchSpan],
        now_ms: int,
        check: Callable[[], object] | None = None,
    ) -> int:
        if check is not None:
            check()
        return self.put(batches, spans, now_ms)

    def put(self, batches: ReadableBuffer, spans: list[BatchSpan], now_ms: int) -> int:
        """Stamp and store batches already checked, at once (a test's producer)."""
        base = self.log_end_offset
        stamped = bytearray(batches)
        self.log_end_offset = stamp(stamped, spans, base, now_ms)
        offset = base
        for span in spans:
            self.bases.append(offset)
            self.positions.append(len(self.data) + span.position)
            offset += span.record_count
        self.data += stamped
        return base

    async def read(self, offset: int, max_bytes: int) -> bytes:
        if not self.log_start_offset <= offset <= self.high_watermark:
            raise OffsetOutOfRange(offset)
        if offset == self.high_watermark:
            return b""
        first = bisect.bisect_right(self.bases, offset) - 1
        start = self.positions[first]
        end = start
        for position in [*self.positions[first + 1 :], len(self.data)]:
            if end > start and position - start > max_bytes:
                break
            end = position
        return bytes(self.data[start:end])


@attrs.define(eq=False)
class MemoryLog(DataPlaneLog):
    """The data plane of the simulated broker (``handle_connection``'s ``data_plane``).

    ``partition_count`` says how many partitions a topic has now (None: no such topic), as the
    coordinator's topic watch knows them, and ``topic_id`` which incarnation of the name that
    is (docs/design.md#topic-ids): a partition of another is set aside, and a new, empty one
    takes its place; a Fetch naming another id is answered UNKNOWN_TOPIC_ID."""

    partition_count: Callable[[str], int | None]
    topic_id: Callable[[str], TopicId | None] = lambda topic: None
    partitions: dict[TopicPartition, MemoryPartition] = attrs.field(factory=dict)
    #: The incarnation each partition of ``partitions`` belongs to.
    incarnations: dict[TopicPartition, TopicId] = attrs.field(factory=dict)
    #: The partitions of incarnations no longer in force, set aside: (partition, id) -> log.
    set_aside: dict[tuple[TopicPartition, TopicId], MemoryPartition] = attrs.field(factory=dict)
    fetches: list[tuple[float, TopicPartition, int]] = attrs.field(factory=list)
    """Every Fetch: when, of which partition, from which offset."""

    async def partition(self, topic: str, partition: int) -> MemoryPartition | None:
        await trio.lowlevel.checkpoint()
        count = self.partition_count(topic)
        if count is None or not 0 <= partition < count:
            return None
        return self._current(TopicPartition(topic=topic, partition=partition))

    def _current(self, tp: TopicPartition) -> MemoryPartition:
        """The partition's log of the incarnation in force: another's is set aside first."""
        topic_id = self.topic_id(tp.topic)
        held = self.incarnations.get(tp)
        if topic_id is not None and held is not None and held != topic_id:
            self.set_aside[tp, held] = self.partitions.pop(tp)
        if topic_id is not None:
            self.incarnations[tp] = topic_id
        return self.partitions.setdefault(tp, MemoryPartition())

    def produce_now(self, tp: TopicPartition, batches: bytes) -> int:
        """Append well-formed batches to a partition at once, as a producer the test does not
        watch would; the first record's offset."""
        partition = self._current(tp)
        return partition.put(batches, batch_spans(batches), self.now_ms())

    def now_ms(self) -> int:
        return round(trio.current_time() * 1000)

    async def run_sync(self, fn: Callable[..., _T], *args: object) -> _T:
        """On the loop: virtual time would jump ahead while a thread works."""
        return fn(*args)

    async def fetch(self, message: FetchRequest, api_version: int = 1) -> FetchResponse:
        tp = TopicPartition(topic=message.topic, partition=message.partition)
        self.fetches.append((trio.current_time(), tp, message.offset))
        current = self.topic_id(message.topic)
        if message.topic_id != NO_TOPIC_ID and current is not None and message.topic_id != current:
            await trio.lowlevel.checkpoint()
            return FetchResponse(
                error_code=ErrorCode.UNKNOWN_TOPIC_ID,
                high_watermark=-1,
                log_start_offset=-1,
                records=(),
            )
        return await super().fetch(message, api_version)

    def records(self, topic: str, partition: int) -> list[StoredRecord]:
        """Every record of the partition, in offset order."""
        tp = TopicPartition(topic=topic, partition=partition)
        stored = self._current(tp) if tp in self.partitions else None
        if stored is None:
            return []
        return [
            StoredRecord(offset=offset, timestamp_ms=ts, key=key, value=value)
            for batch in read_batches(stored.data)
            for offset, ts, key, value in batch
        ]

    def high_watermark(self, topic: str, partition: int) -> int:
        stored = self.partitions.get(TopicPartition(topic=topic, partition=partition))
        return 0 if stored is None else stored.high_watermark
