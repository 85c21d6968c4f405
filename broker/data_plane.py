"""The broker's data plane: Produce, Fetch and ListOffsets over the partitions placed on it.

:class:`DataPlaneLog` answers them — validation, the checks of a producer's batches, stamping,
whole-batch and version-0 answers, error codes — over partition logs kept by a subclass
(:class:`StoredPartition`): :class:`BrokerLog` in the broker's segment files, the simulation's
``MemoryLog`` in memory on trio's clock, so that the simulated broker answers as the real one.
:class:`BrokerLog` answers whatever the coordinator's session does not (``handle_connection``'s
``data_plane``).
Partitions are opened — recovered, a torn tail cut — before the broker serves them: those already
placed here when it starts are opened before ``open_broker_log`` yields, and new ones as soon as the
store's topic watch shows them (or on the first request for one, whichever comes first, because a
client may produce right after its CreateTopic, before the watch has caught up). A partition
whose topic the watch shows deleted, or created again (another topic id), is closed and its
directory removed, once a fresh read of the topics agrees (the watch may lag a topic created
again under the name, whose new partition a request may have opened already); at a start,
directories of topics the store does not have (deleted while this broker was down), or of
another incarnation of the name, are renamed aside (docs/design.md#deleting-a-topic). Only the
incarnation in force is served: a Fetch naming another topic id is refused with
UNKNOWN_TOPIC_ID (docs/design.md#topic-ids).

A partition of replication factor 1 has one replica, which leads it at epoch 0: an acks=all
Produce is an acks=1 one, a Fetch or ListOffsets naming epoch 0 (or none) is served. A partition
of a higher factor is served as its ``replication`` (broker/replicas.py) says: Produce, Fetch and
ListOffsets by its leader only (NOT_LEADER_OR_FOLLOWER elsewhere, UNKNOWN_TOPIC_OR_PARTITION for
the versions before level 12), reads up to its high watermark, acks=all answered once the
in-sync replicas have the records; REPLICA_FETCH is answered there too. Without it (the
simulation, a log that knows no broker), a REPLICA_FETCH finds no partition led here.
"""

from __future__ import annotations

import abc
import logging
import os
import shutil
import time
import uuid
from collections.abc import AsyncIterator, Callable, Collection, Mapping
from contextlib import AsyncExitStack, aclosing, asynccontextmanager, suppress
from functools import partial
from pathlib import Path
from typing import Protocol, TypeVar

import attrs
import trio

from broker.log import (
    LOG_FORMAT,
    CorruptSegment,
    FsyncPolicy,
    LogConfig,
    LogFailed,
    OffsetOutOfRange,
    PartitionLog,
    SegmentFiles,
    check_log_format,
    mark_log_format,
    open_partition_log,
    read_partition_id,
    write_partition_id,
)
from broker.offices import topic_reads
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
    ReplicaFetchData,
    ReplicaFetchRequest,
    ReplicaFetchResponse,
    Request,
    ResponseMessage,
    error_response,
)
from protocol.batches import (
    MAX_SECTION_BYTES,
    BatchSpan,
    batch_at,
    batch_spans,
    batches_from_records,
    check_batches,
    records_from_batches,
    section_bound,
)
from protocol.codec import ReadableBuffer
from protocol.records import Record
from protocol.types import NO_TOPIC_ID, TopicId, TopicPartition
from store import TopicPlacement, TopicStore
from transport.channel import ReadBudget
from transport.limits import FileBudget

log = logging.getLogger(__name__)

#: Worker threads for file I/O across all partitions: enough to overlap an fsync with reads, few
#: enough that the disk, not the thread pool, is the queue.
IO_THREADS = 8
#: A fetch answers at most this much (beyond one whole batch), whatever it asks for, so that the
#: response fits the default 4 MiB frame limit.
MAX_FETCH_BYTES = 2 * 1024 * 1024
#: What the records sections a broker decompresses at once (checking a Produce's batches,
#: converting batches for a version-0 Fetch) may take together: four of the largest a batch may
#: decompress to (``protocol.batches.MAX_SECTION_BYTES``).
DECOMPRESSION_BUDGET = 4 * MAX_SECTION_BYTES
#: The longest a Produce may ask to wait for its in-sync replicas (its ``timeout_ms``): a
#: producer's whole delivery timeout is 120 s, and a request held longer only holds memory.
MAX_PRODUCE_TIMEOUT_MS = 300_000
#: The leader epoch of every partition of a topic of one replica: its one replica has led it
#: since its creation.
SOLE_REPLICA_EPOCH = 0
#: A Produce's ``acks``: the leader's write (1), or every in-sync replica's (-1).
_ACKS = frozenset({1, -1})
#: The first versions that may be answered the codes of a partition led elsewhere (level 12).
_LEADER_CODES_SINCE = {"produce": 3, "fetch": 3, "list_offsets": 2}


def _now_ms() -> int:
    return int(time.time() * 1000)  # real-clock: record timestamps and retention are wall time


class DataPlaneObserver(Protocol):
    def produced(self, topic: str, records: int, size: int) -> None: ...

    def fetched(self, topic: str, records: int, size: int) -> None: ...


class StoredPartition(Protocol):
    """One partition's log as the data plane appends to and reads it: ``PartitionLog`` (files),
    or the simulation's in memory."""

    @property
    def topic_id(self) -> TopicId:
        """The incarnation of the topic whose records these are."""
        ...

    @property
    def log_start_offset(self) -> int: ...

    @property
    def log_end_offset(self) -> int: ...

    @property
    def high_watermark(self) -> int: ...

    async def append(
        self,
        batches: ReadableBuffer,
        spans: list[BatchSpan],
        now_ms: int,
        check: Callable[[], object] | None = None,
    ) -> int:
        """Stamp and append checked batches (``check`` first: what it raises, nothing is
        written); the first record's offset."""
        ...

    async def read(self, offset: int, max_bytes: int) -> bytes:
        """Whole batches from the one holding ``offset``, at least one, about ``max_bytes``;
        OffsetOutOfRange outside [log start, high watermark]; CorruptSegment for a stored batch
        it cannot read."""
        ...

    async def batch_at_time(self, timestamp_ms: int) -> bytes:
        """The first whole stored batch below the high watermark whose newest timestamp is at
        least ``timestamp_ms`` (b"": none); CorruptSegment for a stored batch it cannot read."""
        ...


class ReplicaLeading(Protocol):
    """A replicated partition led here, for one leader epoch (``broker.replicas.Led``)."""

    @property
    def epoch(self) -> int: ...

    @property
    def high_watermark(self) -> int: ...

    async def read(self, offset: int, max_bytes: int) -> bytes:
        """A consumer's read: batches below the high watermark; an offset from it to the log
        end gets an empty answer."""
        ...

    @property
    def in_force(self) -> bool:
        """Whether this broker still leads the partition under this epoch. Read where the log
        appends, in its writing thread too (one dict lookup and one attribute: atomic)."""
        ...

    def ask(self, acks_all: bool) -> tuple[int, ErrorCode]:
        """A produce's ticket and whether it may append (NONE) or not (NOT_ENOUGH_REPLICAS)."""
        ...

    async def appended(self, request: int, acks_all: bool, timeout_ms: int) -> ErrorCode:
        """The answer once the ticket's records are appended."""
        ...


class _Deposed(Exception):
    """The leader that let a produce in stopped leading before its records were written."""


def _still_leading(leading: ReplicaLeading, check: Callable[[], object]) -> object:
    """``check``, once ``leading`` is found still in force under the log's append lock (where
    the append's ``check`` runs): a produce let in while this broker led, that waited (for the
    decompression budget, for the append lock) until it followed, would otherwise write into the
    follower's log after its new leader's records, where no diverging-epoch handshake finds it."""
    if not leading.in_force:
        raise _Deposed
    return check()


class Replication(Protocol):
    """The roles of this broker's replicas of partitions of a factor above 1
    (``broker.replicas.ReplicaManager``)."""

    def replicated(self, tp: TopicPartition) -> bool: ...

    def leading(self, tp: TopicPartition) -> ReplicaLeading | None: ...

    def leader_hint(self, tp: TopicPartition) -> tuple[int, int]:
        """(leader, leader epoch) as this broker knows them; (-1, -1): none."""
        ...

    async def replica_fetch(self, message: ReplicaFetchRequest) -> ReplicaFetchResponse: ...


_T = TypeVar("_T")
_R = TypeVar("_R", ProduceResponse, FetchResponse, ListOffsetsResponse)


@attrs.define(eq=False)
class DataPlaneLog(abc.ABC):
    """Produce, Fetch and ListOffsets answered as a broker answers them (``handle_connection``'s
    ``data_plane``), over partitions a subclass stores and finds (:meth:`partition`), on its
    clock (:meth:`now_ms`), its CPU-heavy steps run where it says (:meth:`run_sync`)."""

    config: LogConfig = attrs.field(factory=LogConfig, kw_only=True)
    #: Told of each append and fetch (broker/metrics.py); None: nobody.
    observer: DataPlaneObserver | None = attrs.field(default=None, kw_only=True)
    #: Bytes of records sections being decompressed, by every request together.
    decompressed: ReadBudget = attrs.field(
        factory=lambda: ReadBudget(limit=DECOMPRESSION_BUDGET), kw_only=True
    )
    #: Who leads the partitions of a replication factor above 1; None: none is served here.
    replication: Replication | None = attrs.field(default=None, kw_only=True)

    @abc.abstractmethod
    async def partition(
        self, topic: str, partition: int, topic_id: TopicId = NO_TOPIC_ID
    ) -> StoredPartition | None:
        """The log of the partition's incarnation in force, if this broker serves it; None:
        unknown here. ``topic_id``: the incarnation a request names (NO_TOPIC_ID: none), which,
        if not the one this log knows, may be newer than its view of the topics."""

    @abc.abstractmethod
    def topic_id(self, topic: str) -> TopicId | None:
        """The id of the topic's incarnation in force, as this log knows the topics; None: no
        such topic."""

    @abc.abstractmethod
    def now_ms(self) -> int:
        """The append time stamped on produced batches, in milliseconds."""

    @abc.abstractmethod
    async def run_sync(self, fn: Callable[..., _T], *args: object) -> _T:
        """``fn(*args)`` where this log runs its decoding: a worker thread, or the loop."""

    @property
    def leader_id(self) -> int:
        """The broker that leads the partitions this log serves, for an answer's leader hint
        (SPEC.md §11.13): this one, each partition having one replica; -1: a log that knows no
        broker id."""
        return -1

    def _answering(
        self, response: Callable[..., _R], hint: tuple[int, int] | None = None
    ) -> Callable[..., _R]:
        """``response`` with the leader hint filled in: the leader and its epoch (``hint`` for a
        replicated partition), or -1 and -1 where this log knows no broker id."""
        if hint is not None:
            return partial(response, leader_id=hint[0], leader_epoch=hint[1])
        leader = self.leader_id
        epoch = SOLE_REPLICA_EPOCH if leader >= 0 else -1
        return partial(response, leader_id=leader, leader_epoch=epoch)

    def _replica_role(
        self,
        topic: str,
        partition: int,
        api: str,
        api_version: int,
        current_leader_epoch: int = -1,
    ) -> tuple[ReplicaLeading | None, ErrorCode, tuple[int, int] | None]:
        """For a partition of a factor above 1: (its leader here, NONE) or (None, the code a
        broker that does not lead it answers), with the leader hint; for one of factor 1, (None,
        NONE, None), served as it always was. The code is the epoch check's
        (:func:`epoch_error`) where this broker leads."""
        tp = TopicPartition(topic=topic, partition=partition)
        if self.replication is None or not self.replication.replicated(tp):
            return None, epoch_error(current_leader_epoch), None
        hint = self.replication.leader_hint(tp)
        leading = self.replication.leading(tp)
        if leading is not None:
            fenced = epoch_error(current_leader_epoch, leading.epoch)
            return leading, fenced, (self.leader_id, leading.epoch)
        if api_version < _LEADER_CODES_SINCE[api]:
            return None, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, hint
        if hint[0] < 0:
            return None, ErrorCode.LEADER_NOT_AVAILABLE, hint
        return None, ErrorCode.NOT_LEADER_OR_FOLLOWER, hint

    async def __call__(self, request: Request) -> ResponseMessage | None:
        message = request.message
        if isinstance(message, ReplicaFetchRequest):
            if self.replication is not None:
                return await self.replication.replica_fetch(message)
            return await self.replica_fetch(message)
        if not isinstance(message, ProduceRequest | FetchRequest | ListOffsetsRequest):
            return error_response(message, ErrorCode.INVALID_REQUEST)
        error = data_error(message)
        if error is not ErrorCode.NONE:
            return error_response(message, error)
        match message:
            case ProduceRequest():
                return await self.produce(message, request.api_version)
            case FetchRequest():
                return await self.fetch(message, request.api_version)
        return await self.list_offsets(message, request.api_version)

    async def produce(self, message: ProduceRequest, api_version: int = 3) -> ProduceResponse:
        """Appended to the incarnation in force; one naming a topic id, only if it is that one
        (whose log replaces an older one's first, if this broker's view of the topics is
        behind): an acknowledged record is never in a deleted incarnation's log. Its one
        replica is every in-sync replica, so acks=all waits for nothing more than acks=1."""
        if message.acks not in _ACKS:
            return ProduceResponse(error_code=ErrorCode.INVALID_REQUIRED_ACKS, base_offset=-1)
        if not 0 <= message.timeout_ms <= MAX_PRODUCE_TIMEOUT_MS:
            return ProduceResponse(error_code=ErrorCode.INVALID_REQUEST, base_offset=-1)
        partition = await self.partition(message.topic, message.partition, message.topic_id)
        if not self._serves(message.topic, message.topic_id, partition):
            return ProduceResponse(error_code=ErrorCode.UNKNOWN_TOPIC_ID, base_offset=-1)
        if partition is None:
            return ProduceResponse(error_code=ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, base_offset=-1)
        leading, refused, hint = self._replica_role(
            message.topic, message.partition, "produce", api_version
        )
        answered = self._answering(ProduceResponse, hint)
        if refused is not ErrorCode.NONE:
            return answered(error_code=refused, base_offset=-1)
        if message.records and message.batches:
            return answered(error_code=ErrorCode.INVALID_REQUEST, base_offset=-1)
        payload = message.batches
        if message.records:  # version 0: batches built in proportion to the records, off the loop
            payload = await self.run_sync(batches_from_records, message.records)
        if not payload:
            return answered(error_code=ErrorCode.NONE, base_offset=partition.log_end_offset)
        try:
            spans = batch_spans(payload)  # headers and one CRC call a batch
        except RemoteProtocolError as exc:
            log.warning("produce to %s-%d refused: %s", message.topic, message.partition, exc)
            return answered(error_code=ErrorCode.CORRUPT_MESSAGE, base_offset=-1)
        if any(span.size > self.config.max_batch_bytes for span in spans):
            return answered(error_code=ErrorCode.MESSAGE_TOO_LARGE, base_offset=-1)
        # Every record is checked as a consumer will decode it, by the append before it writes
        # (in the worker that writes, for files): what is acknowledged can be read
        # (docs/design.md#the-partition-log).
        acks_all = message.acks == -1
        request = -1
        if leading is not None:
            request, refused = leading.ask(acks_all)
            if refused is not ErrorCode.NONE:  # nothing written
                return answered(error_code=refused, base_offset=-1)
        check: Callable[[], object] = partial(check_batches, payload, spans)
        if leading is not None:
            check = partial(_still_leading, leading, check)
        claim = section_bound(payload, spans)
        await self.decompressed.claim(0, claim)
        try:
            base = await partition.append(payload, spans, self.now_ms(), check)
        except _Deposed:  # nothing written: a follower's log takes its leader's records only
            return answered(error_code=ErrorCode.NOT_LEADER_OR_FOLLOWER, base_offset=-1)
        except RemoteProtocolError as exc:
            log.warning("produce to %s-%d refused: %s", message.topic, message.partition, exc)
            return answered(error_code=ErrorCode.CORRUPT_MESSAGE, base_offset=-1)
        except (OSError, LogFailed) as exc:
            # not acknowledged: the producer may retry; the log is unchanged or refuses appends
            log.error("produce to %s-%d failed: %s", message.topic, message.partition, exc)
            return answered(error_code=ErrorCode.UNKNOWN_SERVER_ERROR, base_offset=-1)
        finally:
            self.decompressed.release(claim)
        if self.observer is not None:
            count = sum(span.record_count for span in spans)
            self.observer.produced(message.topic, count, len(payload))
        if leading is not None:
            code = await leading.appended(request, acks_all, message.timeout_ms)
            if code is not ErrorCode.NONE:
                return answered(error_code=code, base_offset=-1)
        return answered(error_code=ErrorCode.NONE, base_offset=base)

    async def fetch(self, message: FetchRequest, api_version: int = 1) -> FetchResponse:
        """Whole stored batches (version 1 on); version 0 gets them decoded into records. A
        Fetch naming a topic id is served only from that incarnation's log."""
        partition = await self.partition(message.topic, message.partition, message.topic_id)
        if not self._serves(message.topic, message.topic_id, partition):
            return FetchResponse(
                error_code=ErrorCode.UNKNOWN_TOPIC_ID,
                high_watermark=-1,
                log_start_offset=-1,
                records=(),
            )
        if partition is None:
            return FetchResponse(
                error_code=ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
                high_watermark=-1,
                log_start_offset=-1,
                records=(),
            )
        leading, fenced, hint = self._replica_role(
            message.topic, message.partition, "fetch", api_version, message.current_leader_epoch
        )
        answered = self._answering(FetchResponse, hint)
        if fenced is not ErrorCode.NONE:
            return answered(error_code=fenced, high_watermark=-1, log_start_offset=-1, records=())
        high_watermark = partition.high_watermark if leading is None else leading.high_watermark
        data = b""
        # At least one whole batch is answered whatever max_bytes says (zero or negative
        # included), so a consumer always moves on; at most MAX_FETCH_BYTES beyond it.
        max_bytes = max(1, min(message.max_bytes, MAX_FETCH_BYTES))
        try:
            if leading is None:
                data = await partition.read(message.offset, max_bytes)
            else:
                data = await leading.read(message.offset, max_bytes)
            error = ErrorCode.NONE
        except OffsetOutOfRange:
            error = ErrorCode.OFFSET_OUT_OF_RANGE
        except CorruptSegment as exc:
            log.error("fetch %s-%d: %s", message.topic, message.partition, exc)
            error = ErrorCode.CORRUPT_MESSAGE
        # headers only, walked once for both uses: the records are not decoded
        wanted = bool(data) and (self.observer is not None or api_version == 0)
        spans = batch_spans(data, check_crc=False) if wanted else []
        if self.observer is not None and data:
            count = sum(span.record_count for span in spans)
            self.observer.fetched(message.topic, count, len(data))
        if api_version == 0:
            try:
                records = await self._records(data, spans, message.offset, max_bytes)
            except RemoteProtocolError as exc:  # a stored batch whose records do not parse
                log.error("fetch %s-%d (v0): %s", message.topic, message.partition, exc)
                records, error = (), ErrorCode.CORRUPT_MESSAGE
            return FetchResponse(
                error_code=error,
                high_watermark=high_watermark,
                log_start_offset=partition.log_start_offset,
                records=records,
            )
        return answered(
            error_code=error,
            high_watermark=high_watermark,
            log_start_offset=partition.log_start_offset,
            records=(),
            batches=data,
        )

    def _serves(self, topic: str, topic_id: TopicId, partition: StoredPartition | None) -> bool:
        """Whether a request naming ``topic_id`` (NO_TOPIC_ID: any) may be served by
        ``partition`` (:meth:`partition`'s answer for it), or told the partition is unknown."""
        if topic_id == NO_TOPIC_ID:
            return True
        serving = self.topic_id(topic) if partition is None else partition.topic_id
        return serving == topic_id

    async def _records(
        self, data: bytes, spans: list[BatchSpan], offset: int, max_bytes: int
    ) -> tuple[Record, ...]:
        """A version-0 Fetch's records: at most ``max_bytes`` of them decoded (a batch that
        claims a million records makes no more than the Fetch asked for), by :meth:`run_sync`
        (in a worker thread decompressing releases the GIL, and the bounded decoding takes turns
        with the loop), under the broker's decompression budget."""
        if not data:
            return ()
        claim = section_bound(data, spans)
        await self.decompressed.claim(0, claim)
        try:
            return await self.run_sync(records_from_batches, data, offset, max_bytes)
        finally:
            self.decompressed.release(claim)

    async def list_offsets(
        self, message: ListOffsetsRequest, api_version: int = 2
    ) -> ListOffsetsResponse:
        """The log's bounds; from version 1, with a ``timestamp_ms`` of 0 or more, also the
        earliest offset whose record is that late (SPEC.md §8, 2): the log finds the one batch
        that holds it by the batches' newest timestamps, and only that batch is decoded here."""
        partition = await self.partition(message.topic, message.partition)
        if partition is None:
            return ListOffsetsResponse(
                error_code=ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
                log_start_offset=-1,
                high_watermark=-1,
            )
        leading, fenced, hint = self._replica_role(
            message.topic,
            message.partition,
            "list_offsets",
            api_version,
            message.current_leader_epoch,
        )
        answered = self._answering(ListOffsetsResponse, hint)
        if fenced is not ErrorCode.NONE:
            return answered(error_code=fenced, log_start_offset=-1, high_watermark=-1)
        found = (-1, -1)
        error = ErrorCode.NONE
        if message.timestamp_ms >= 0:
            try:
                found = await self._offset_at_time(partition, message.timestamp_ms)
            except (CorruptSegment, RemoteProtocolError) as exc:
                log.error("list offsets %s-%d: %s", message.topic, message.partition, exc)
                error = ErrorCode.CORRUPT_MESSAGE
        return answered(
            error_code=error,
            log_start_offset=partition.log_start_offset,
            high_watermark=partition.high_watermark if leading is None else leading.high_watermark,
            offset=found[0],
            timestamp_ms=found[1],
        )

    async def _offset_at_time(
        self, partition: StoredPartition, timestamp_ms: int
    ) -> tuple[int, int]:
        """(offset, timestamp) of the earliest record at least ``timestamp_ms`` late, (-1, -1)
        if none: its batch decoded by :meth:`run_sync`, under the decompression budget."""
        data = await partition.batch_at_time(timestamp_ms)
        if not data:
            return -1, -1
        spans = batch_spans(data, check_crc=False)
        claim = section_bound(data, spans)
        await self.decompressed.claim(0, claim)
        try:
            return await self.run_sync(_first_record_at, data, timestamp_ms)
        finally:
            self.decompressed.release(claim)

    async def replica_fetch(self, message: ReplicaFetchRequest) -> ReplicaFetchResponse:
        """No partition is led here for a follower: every one has its sole replica here. The
        request was bounded before (``broker.dispatch``: its answer repeats each partition)."""
        await trio.lowlevel.checkpoint()
        return ReplicaFetchResponse(
            error_code=ErrorCode.NONE,
            partitions=tuple(
                ReplicaFetchData(
                    topic_id=wanted.topic_id,
                    partition=wanted.partition,
                    error_code=ErrorCode.NOT_LEADER_OR_FOLLOWER,
                    high_watermark=-1,
                    log_start_offset=-1,
                    diverging_epoch=-1,
                    diverging_end_offset=-1,
                    epoch_starts=(),
                    batches=b"",
                )
                for wanted in message.partitions
            ),
        )


def epoch_error(current_leader_epoch: int, epoch: int = SOLE_REPLICA_EPOCH) -> ErrorCode:
    """What a Fetch or ListOffsets naming ``current_leader_epoch`` is refused with by a leader
    of ``epoch`` (the sole replica's: :data:`SOLE_REPLICA_EPOCH`; KIP-320): a newer epoch than
    the leader's is one it has not learned, an older one a stale view; -1 asks no check."""
    if current_leader_epoch in (-1, epoch):
        return ErrorCode.NONE
    if current_leader_epoch > epoch:
        return ErrorCode.UNKNOWN_LEADER_EPOCH
    return ErrorCode.FENCED_LEADER_EPOCH


def _first_record_at(data: bytes, timestamp_ms: int) -> tuple[int, int]:
    """(offset, timestamp) of the first record of the batch ``data`` at least ``timestamp_ms``
    late; (-1, -1) if none is (its header claimed one)."""
    batch = batch_at(data, 0, len(data))
    for offset, ts in zip(batch.offsets, batch.timestamps(), strict=True):
        if ts >= timestamp_ms:
            return offset, ts
    return -1, -1


@attrs.define(eq=False)
class BrokerLog(DataPlaneLog):
    """The partitions placed on this broker, in segment files under ``directory``."""

    broker_id: int
    store: TopicStore
    directory: Path
    #: The segment files open, for all partitions together.
    files: SegmentFiles
    limiter: trio.CapacityLimiter = attrs.field(factory=lambda: trio.CapacityLimiter(IO_THREADS))
    partitions: dict[TopicPartition, PartitionLog] = attrs.field(factory=dict)
    placement: Mapping[str, TopicPlacement] = attrs.field(factory=dict)
    _opening: dict[TopicPartition, trio.Lock] = attrs.field(factory=dict)
    #: Topic ids a fresh read of the store showed replaced or deleted: gone for good (an id is
    #: never given twice), so no view of the topics older than that read opens them again.
    _gone: set[TopicId] = attrs.field(factory=set)

    @property
    def leader_id(self) -> int:
        return self.broker_id

    def now_ms(self) -> int:
        return _now_ms()

    async def run_sync(self, fn: Callable[..., _T], *args: object) -> _T:
        return await trio.to_thread.run_sync(fn, *args, limiter=self.limiter)

    def topic_id(self, topic: str) -> TopicId | None:
        placement = self.placement.get(topic)
        return None if placement is None else placement.topic_id

    def log_end_offset(self, tp: TopicPartition) -> int | None:
        """The offset after the last record a consumer may have read (the high watermark), for
        a partition placed here; None for one placed elsewhere or unknown. A partition placed
        here but not open yet was placed after this broker started (it opens every other one
        before serving), so nothing was written to it."""
        if self.replication is not None and self.replication.replicated(tp):
            # a follower's high watermark lags its leader's: only the leader's is checked against
            leading = self.replication.leading(tp)
            return None if leading is None else leading.high_watermark
        found = self.partitions.get(tp)
        if found is not None and _in_force(self.placement, tp, found.topic_id):
            return found.high_watermark
        return 0 if self._placed_here(tp) else None

    async def partition(
        self, topic: str, partition: int, topic_id: TopicId = NO_TOPIC_ID
    ) -> PartitionLog | None:
        """The log of the partition's incarnation in force if it is placed on this broker,
        opening it on first use."""
        tp = TopicPartition(topic=topic, partition=partition)
        found = self.partitions.get(tp)
        named = topic_id in (NO_TOPIC_ID, self.topic_id(topic))
        if found is not None and named and _in_force(self.placement, tp, found.topic_id):
            return found
        # Not open yet, of an incarnation the topic no longer has, or a request names an id
        # this broker does not know as the name's: the store may be newer than the watch.
        if found is not None:
            await self._retire_stale([tp])
        elif not named or not self._placed_here(tp):
            self.placement = await topic_reads(self.store).since(trio.current_time())
        if not self._placed_here(tp):
            return None
        return await self._open(tp)

    def _placed_here(self, tp: TopicPartition) -> bool:
        placement = self.placement.get(tp.topic)
        if placement is None or not 0 <= tp.partition < placement.partition_count:
            return False
        if placement.replication_factor == 1:
            return placement.brokers[tp.partition] == self.broker_id
        return self.broker_id in placement.replicas[tp.partition]

    async def _open(self, tp: TopicPartition) -> PartitionLog | None:
        """The partition's open log, opened (for the incarnation the topics as last seen give
        the name) if it is not; None if that incarnation is gone."""
        lock = self._opening.setdefault(tp, trio.Lock())
        async with lock:
            found = self.partitions.get(tp)
            if found is None:
                placement = self.placement.get(tp.topic)
                if placement is None or placement.topic_id in self._gone:
                    return None
                path = self.directory / f"{tp.topic}-{tp.partition}"
                found = await open_partition_log(
                    path,
                    self.config.for_topic(placement.configs),
                    self.limiter,
                    self.files,
                    topic_id=placement.topic_id,
                )
                self.partitions[tp] = found
                log.info(
                    "partition %s (topic id %s) open: offsets [%d, %d)",
                    tp,
                    found.topic_id,
                    found.log_start_offset,
                    found.log_end_offset,
                )
            return found

    async def open_placed(self, placement: Mapping[str, TopicPlacement]) -> None:
        """Open every partition placed here, side by side: a recovery scan is a CRC over a
        segment (zlib releases the GIL for it), so the I/O threads overlap them; delete those
        of deleted topics, and of topics created again (another id)."""
        self.placement = placement
        stale = [
            tp for tp, p in self.partitions.items() if not _in_force(placement, tp, p.topic_id)
        ]
        if stale:
            await self._retire_stale(stale)
        async with trio.open_nursery() as nursery:
            for topic, where in sorted(self.placement.items()):
                for p, replicas in enumerate(where.replicas):
                    tp = TopicPartition(topic=topic, partition=p)
                    if self.broker_id in replicas and tp not in self.partitions:
                        nursery.start_soon(self._open, tp)

    async def _retire_stale(self, candidates: Collection[TopicPartition]) -> None:
        """Close and delete those open partitions whose incarnation the store no longer has:
        the topic is deleted, or created again under the name. Each is taken out of service
        under its open lock, held until its directory is renamed aside, so the name's next
        incarnation opens a new, empty directory, never the old one. Every lock is taken before
        the store is read, so each partition's id was learned before that read: one the read
        does not show is gone for good, whereas an id learned after it might be newer. Reads
        are shared with every other request that needs one (``TopicReads``): a client naming
        ids no topic has costs the store no more than one naming topics that do not exist."""
        doomed: list[tuple[TopicPartition, TopicId, Path]] = []
        async with AsyncExitStack() as held:
            for tp in sorted(candidates):
                await held.enter_async_context(self._opening.setdefault(tp, trio.Lock()))
            fresh = await topic_reads(self.store).since(trio.current_time())
            self.placement = fresh
            for tp in sorted(candidates):
                partition = self.partitions.get(tp)
                if partition is None or _in_force(fresh, tp, partition.topic_id):
                    continue  # retired by another caller, or in force after all
                self._gone.add(partition.topic_id)
                del self.partitions[tp]
                await partition.aclose()
                path = partition.directory
                deleted = path.with_name(f"{path.name}.{uuid.uuid4().hex}.deleted")
                os.rename(path, deleted)
                doomed.append((tp, partition.topic_id, deleted))
        for tp, topic_id, deleted in doomed:
            await trio.to_thread.run_sync(shutil.rmtree, deleted, limiter=self.limiter)
            log.info("partition %s (topic id %s) deleted with its incarnation", tp, topic_id)

    async def enforce_retention(self) -> int:
        deleted = 0
        for partition in list(self.partitions.values()):
            deleted += await partition.enforce_retention(_now_ms())
        return deleted

    async def flush(self) -> None:
        failed: LogFailed | None = None
        for partition in list(self.partitions.values()):
            try:
                await partition.flush()
            except LogFailed as exc:
                failed = exc
        if failed is not None:
            raise failed

    async def _watch_topics(self) -> None:
        async with aclosing(self.store.topic_updates()) as updates:
            async for placement in updates:
                await self.open_placed(placement)

    async def _retention_loop(self) -> None:
        while True:
            await trio.sleep(self.config.retention_check_ms / 1000)
            try:
                await self.enforce_retention()
            except OSError:
                log.exception("retention failed; next try in %d ms", self.config.retention_check_ms)

    async def _flush_loop(self) -> None:
        while True:
            await trio.sleep(self.config.fsync_interval_ms / 1000)
            with suppress(LogFailed):  # logged; that partition refuses appends from now on
                await self.flush()

    async def aclose(self) -> None:
        for partition in list(self.partitions.values()):
            await partition.aclose()


def _in_force(
    placement: Mapping[str, TopicPlacement], tp: TopicPartition, topic_id: TopicId
) -> bool:
    """Whether ``topic_id`` is the incarnation of ``tp``'s topic that ``placement`` has."""
    where = placement.get(tp.topic)
    return where is not None and where.topic_id == topic_id


def _remove_deleted(directory: Path) -> None:
    """Finish the deletions a stop cut short: directories renamed aside (``_retire_stale``)."""
    if directory.is_dir():
        for path in directory.glob("*.deleted"):
            shutil.rmtree(path, ignore_errors=True)


def _set_strays_aside(directory: Path, topic_ids: Mapping[str, TopicId], upgrade: bool) -> None:
    """Rename aside the partition directories of topics the store does not have (deleted while
    this broker was down) and of another incarnation than the store's (deleted and created
    again meanwhile). Renamed, not deleted, in case the store is not the one the data belongs
    to; either way the topic in force starts empty. With ``upgrade`` (a log of format 2, whose
    directories name no id), a directory that names none is given the store's id for its
    topic: what the log holds is taken for the incarnation in force."""
    if not directory.is_dir():
        return
    for path in directory.iterdir():
        topic, _, partition = path.name.rpartition("-")
        if not (path.is_dir() and partition.isdigit()):
            continue
        topic_id = topic_ids.get(topic)
        named = read_partition_id(path)
        if topic_id is not None and named is None and upgrade:
            write_partition_id(path, topic_id)
            continue
        if topic_id is not None and named == topic_id:
            continue
        if topic_id is None:
            why = "names a topic the store does not have"
        elif named is None:
            why = f"names no topic id (the store's topic {topic} has {topic_id})"
        else:
            why = f"holds topic id {named}, another incarnation than the store's {topic_id}"
        stray = path.with_name(f"{path.name}.{uuid.uuid4().hex}.stray")
        os.rename(path, stray)
        log.warning(
            "partition directory %s %s: renamed to %s (delete it if its topic was deleted)",
            path.name,
            why,
            stray.name,
        )


def log_directory(data_dir: Path) -> Path:
    """Where a broker with ``data_dir`` keeps its partitions' logs."""
    return data_dir / "log"


@asynccontextmanager
async def open_broker_log(
    store: TopicStore,
    broker_id: int,
    data_dir: Path,
    config: LogConfig,
    observer: DataPlaneObserver | None = None,
    budget: FileBudget | None = None,
) -> AsyncIterator[BrokerLog]:
    """Recover every partition placed on this broker, then serve (``<data_dir>/log``), its
    segment files open within ``budget`` (None: the process's file budget, shared with
    nothing)."""
    broker = BrokerLog(
        broker_id=broker_id,
        store=store,
        directory=log_directory(data_dir),
        config=config,
        files=SegmentFiles.of(budget or FileBudget.of_process(), config),
        observer=observer,
    )
    found = await trio.to_thread.run_sync(check_log_format, broker.directory)
    await trio.to_thread.run_sync(_remove_deleted, broker.directory)
    placement = await store.topics()
    topic_ids = {topic: where.topic_id for topic, where in placement.items()}
    upgrade = found != LOG_FORMAT
    await trio.to_thread.run_sync(_set_strays_aside, broker.directory, topic_ids, upgrade)
    if upgrade:  # every directory names its id now
        await trio.to_thread.run_sync(mark_log_format, broker.directory)
        log.info("log in %s upgraded from format %d to %d", broker.directory, found, LOG_FORMAT)
    try:
        await broker.open_placed(placement)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(broker._watch_topics)
            # Also without a limit of the broker's own: a topic may be created with one.
            nursery.start_soon(broker._retention_loop)
            if config.fsync is FsyncPolicy.INTERVAL:
                nursery.start_soon(broker._flush_loop)
            yield broker
            nursery.cancel_scope.cancel()
    finally:
        await broker.aclose()
