"""The simulated broker's partition logs: Produce, Fetch and ListOffsets served from memory, on
trio's clock, so that a user's own ``open_producer`` / ``open_consumer`` code runs against the
simulated cluster with exact virtual times (docs/testing.md).

It answers as the real broker's log does (``broker.data_plane``): producer batches are checked
as a consumer will decode them, stamped with their offsets and the append time (virtual
milliseconds) and kept whole; a Fetch answers whole batches from the one holding the requested
offset, at least one whatever ``max_bytes`` says; version 0 clients get records, as many as
``max_bytes`` holds (one at least). Nothing is written to disk (the real log's
file I/O runs in threads, and virtual time would jump while a thread works), nothing is deleted,
and the log outlives :meth:`SimulatedCluster.restart_coordinator`, as a broker's files do.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable

import attrs
import trio

from broker.data_plane import MAX_FETCH_BYTES
from coordinator.validation import data_error
from protocol import (
    ErrorCode,
    FetchRequest,
    FetchResponse,
    ListOffsetsRequest,
    ListOffsetsResponse,
    ProduceRequest,
    ProduceResponse,
    RemoteProtocolError,
    Request,
    ResponseMessage,
    error_response,
)
from protocol.batches import (
    batch_spans,
    batches_from_records,
    check_batches,
    read_batches,
    records_from_batches,
    stamp,
)
from protocol.types import TopicPartition

__all__ = ["MemoryLog", "StoredRecord"]


@attrs.frozen(kw_only=True)
class StoredRecord:
    """One record as the log holds it: what a test compares with what its consumers saw."""

    offset: int
    timestamp_ms: int
    key: bytes | None
    value: bytes | None


@attrs.define(eq=False)
class _Partition:
    data: bytearray = attrs.field(factory=bytearray)
    #: Per stored batch: its base offset and where it starts in ``data``.
    bases: list[int] = attrs.field(factory=list)
    positions: list[int] = attrs.field(factory=list)
    high_watermark: int = 0

    def append(self, payload: bytes, now_ms: int) -> int:
        spans = batch_spans(payload)  # raises RemoteProtocolError for a bad batch
        check_batches(payload, spans)  # and for records a consumer could not decode
        base = self.high_watermark
        batches = bytearray(payload)
        self.high_watermark = stamp(batches, spans, base, now_ms)
        offset = base
        for span in spans:
            self.bases.append(offset)
            self.positions.append(len(self.data) + span.position)
            offset += span.record_count
        self.data += batches
        return base

    def read(self, offset: int, max_bytes: int) -> bytes | None:
        """Whole batches from the one holding ``offset``; None: out of range."""
        if not 0 <= offset <= self.high_watermark:
            return None
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
class MemoryLog:
    """The data plane of the simulated broker (``handle_connection``'s ``data_plane``).

    ``partition_count`` says how many partitions a topic has now (None: no such topic), as the
    coordinator's topic watch knows them."""

    partition_count: Callable[[str], int | None]
    partitions: dict[TopicPartition, _Partition] = attrs.field(factory=dict)
    fetches: list[tuple[float, TopicPartition, int]] = attrs.field(factory=list)
    """Every Fetch: when, of which partition, from which offset."""

    async def __call__(self, request: Request) -> ResponseMessage | None:
        await trio.lowlevel.checkpoint()
        message = request.message
        if not isinstance(message, ProduceRequest | FetchRequest | ListOffsetsRequest):
            return error_response(message, ErrorCode.INVALID_REQUEST)
        error = data_error(message)
        if error is not ErrorCode.NONE:
            return error_response(message, error)
        partition = self._partition(message.topic, message.partition)
        if partition is None:
            return error_response(message, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION)
        match message:
            case ProduceRequest():
                return self._produce(partition, message)
            case FetchRequest():
                return self._fetch(partition, message, request.api_version)
        return ListOffsetsResponse(
            error_code=ErrorCode.NONE, log_start_offset=0, high_watermark=partition.high_watermark
        )

    def _partition(self, topic: str, partition: int) -> _Partition | None:
        count = self.partition_count(topic)
        if count is None or not 0 <= partition < count:
            return None
        return self.partitions.setdefault(
            TopicPartition(topic=topic, partition=partition), _Partition()
        )

    def _produce(self, partition: _Partition, message: ProduceRequest) -> ProduceResponse:
        if message.records and message.batches:
            return ProduceResponse(error_code=ErrorCode.INVALID_REQUEST, base_offset=-1)
        payload = batches_from_records(message.records) if message.records else message.batches
        if not payload:
            return ProduceResponse(error_code=ErrorCode.NONE, base_offset=partition.high_watermark)
        now_ms = round(trio.current_time() * 1000)
        try:
            base = partition.append(payload, now_ms)
        except RemoteProtocolError:
            return ProduceResponse(error_code=ErrorCode.CORRUPT_MESSAGE, base_offset=-1)
        return ProduceResponse(error_code=ErrorCode.NONE, base_offset=base)

    def _fetch(self, partition: _Partition, message: FetchRequest, version: int) -> FetchResponse:
        tp = TopicPartition(topic=message.topic, partition=message.partition)
        self.fetches.append((trio.current_time(), tp, message.offset))
        max_bytes = max(1, min(message.max_bytes, MAX_FETCH_BYTES))
        data = partition.read(message.offset, max_bytes)
        error = ErrorCode.NONE if data is not None else ErrorCode.OFFSET_OUT_OF_RANGE
        data = data or b""
        return FetchResponse(
            error_code=error,
            high_watermark=partition.high_watermark,
            log_start_offset=0,
            records=records_from_batches(data, message.offset, max_bytes) if version == 0 else (),
            batches=b"" if version == 0 else data,
        )

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
