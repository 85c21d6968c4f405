"""The simulated broker's partition logs: the real broker's Produce, Fetch and ListOffsets
handling (``broker.data_plane.DataPlaneLog``) over partitions kept in memory, on trio's clock, so
that a user's own ``open_producer`` / ``open_consumer`` code runs against the simulated cluster
with exact virtual times (docs/testing.md).

Everything is answered as the real broker answers it: producer batches checked as a consumer will
decode them, stamped with their offsets and the append time (here virtual milliseconds) and kept
whole; a Fetch answered with whole batches from the one holding the requested offset, at least one
whatever ``max_bytes`` says; version 0 clients given records. What differs is the storage: nothing
is written to disk (the real log's file I/O runs in worker threads, and virtual time would jump
while a thread works; here every step runs on the loop), retention deletes nothing, and the log
outlives :meth:`SimulatedCluster.restart_coordinator`, as a broker's files do. As the real broker
does, it follows the store's topic watch (:meth:`MemoryLog.follow`): a deleted topic's partitions
go, and a topic created again under its name (another id) starts empty.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Mapping
from typing import TypeVar

import attrs
import trio

from broker.data_plane import DataPlaneLog
from broker.log import OffsetOutOfRange
from protocol import FetchRequest, FetchResponse
from protocol.batches import BatchSpan, batch_spans, read_batches, stamp, walk_batches
from protocol.codec import ReadableBuffer
from protocol.types import NO_TOPIC_ID, TopicId, TopicPartition
from store import TopicPlacement

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

    #: The incarnation of the topic whose records these are.
    topic_id: TopicId
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

    async def batch_at_time(self, timestamp_ms: int) -> bytes:
        """The first stored batch whose newest timestamp is at least ``timestamp_ms``, by a walk
        of the headers from the log start (memory has no index to keep)."""
        for position, size, base, _, newest in walk_batches(self.data, check_crc=False):
            if base >= self.high_watermark:
                break
            if newest >= timestamp_ms:
                return bytes(self.data[position : position + size])
        return b""


@attrs.define(eq=False)
class MemoryLog(DataPlaneLog):
    """The data plane of the simulated broker (``handle_connection``'s ``data_plane``), serving
    the topics as its topic watch last showed them (:meth:`follow`)."""

    placement: Mapping[str, TopicPlacement] = attrs.field(factory=dict)
    partitions: dict[TopicPartition, MemoryPartition] = attrs.field(factory=dict)
    fetches: list[tuple[float, TopicPartition, int]] = attrs.field(factory=list)
    """Every Fetch: when, of which partition, from which offset."""
    broker_id: int = -1
    """The broker it serves as, for an answer's leader hint; -1: none (the hint says unknown)."""

    @property
    def leader_id(self) -> int:
        return self.broker_id

    def follow(self, placement: Mapping[str, TopicPlacement]) -> None:
        """The topic watch's latest value, as the real broker takes it (``BrokerLog``): the
        partitions of a topic deleted, or created again under its name, are dropped, so that
        nothing of an incarnation outlives it."""
        self.placement = placement
        for tp, stored in list(self.partitions.items()):
            if self.topic_id(tp.topic) != stored.topic_id:
                del self.partitions[tp]

    def topic_id(self, topic: str) -> TopicId | None:
        placement = self.placement.get(topic)
        return None if placement is None else placement.topic_id

    async def partition(
        self, topic: str, partition: int, topic_id: TopicId = NO_TOPIC_ID
    ) -> MemoryPartition | None:
        await trio.lowlevel.checkpoint()
        placement = self.placement.get(topic)
        if placement is None or not 0 <= partition < placement.partition_count:
            return None
        return self._stored(TopicPartition(topic=topic, partition=partition), placement.topic_id)

    def _stored(self, tp: TopicPartition, topic_id: TopicId) -> MemoryPartition:
        """The partition of incarnation ``topic_id``, a new empty one if that is not the one
        held."""
        stored = self.partitions.get(tp)
        if stored is None or stored.topic_id != topic_id:
            stored = self.partitions[tp] = MemoryPartition(topic_id=topic_id)
        return stored

    def produce_now(self, tp: TopicPartition, batches: bytes) -> int:
        """Append well-formed batches to a partition of a topic the log serves, at once, as a
        producer the test does not watch would; the first record's offset."""
        partition = self._stored(tp, self.placement[tp.topic].topic_id)
        return partition.put(batches, batch_spans(batches), self.now_ms())

    def now_ms(self) -> int:
        return round(trio.current_time() * 1000)

    async def run_sync(self, fn: Callable[..., _T], *args: object) -> _T:
        """On the loop: virtual time would jump ahead while a thread works."""
        return fn(*args)

    async def fetch(self, message: FetchRequest, api_version: int = 1) -> FetchResponse:
        tp = TopicPartition(topic=message.topic, partition=message.partition)
        self.fetches.append((trio.current_time(), tp, message.offset))
        return await super().fetch(message, api_version)

    def records(self, topic: str, partition: int) -> list[StoredRecord]:
        """Every record of the partition, in offset order."""
        stored = self.partitions.get(TopicPartition(topic=topic, partition=partition))
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
