"""One partition's log: an ordered list of segments, appended under a lock, read concurrently.

The trio side owns the state (offsets, the segment list); worker threads only touch files, through
one ``CapacityLimiter`` per broker so that a burst of fetches cannot starve appends of threads.
Appends to a partition are serialized by its lock; the fsync that makes them durable is shared
(group commit): whoever flushes takes every append written so far along.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Sequence
from pathlib import Path

import attrs
import trio

from protocol.records import Record, record_size, write_record

from .config import FsyncPolicy, LogConfig
from .segment import (
    SUFFIX,
    CorruptSegment,
    Segment,
    create_segment,
    fsync_directory,
    open_sealed_segment,
    open_segment,
    segment_path,
)

log = logging.getLogger(__name__)


class OffsetOutOfRange(Exception):
    pass


class LogFailed(Exception):
    """An fsync failed: the kernel may have dropped the pages it could not write, so a later fsync
    that succeeds proves nothing. The partition takes no more appends until a restart recovers it
    from what is really on disk."""


@attrs.define(eq=False)
class PartitionLog:
    directory: Path
    config: LogConfig
    limiter: trio.CapacityLimiter
    segments: list[Segment]
    #: Offsets below this are fsynced.
    flushed_offset: int
    failed: str | None = None
    _append_lock: trio.Lock = attrs.field(factory=trio.Lock)
    _flush_lock: trio.Lock = attrs.field(factory=trio.Lock)

    @property
    def log_start_offset(self) -> int:
        return self.segments[0].base_offset

    @property
    def log_end_offset(self) -> int:
        return self.segments[-1].next_offset

    @property
    def high_watermark(self) -> int:
        """What readers may see: under ``always`` only what an fsync has covered, so no consumer
        can commit an offset past a record that a power loss would take back."""
        if self.config.fsync is FsyncPolicy.ALWAYS:
            return self.flushed_offset
        return self.log_end_offset

    @property
    def size_bytes(self) -> int:
        return sum(s.size for s in self.segments)

    async def append(self, records: Sequence[Record], now_ms: int) -> int:
        """Append ``records`` (their offsets are ignored) and return the first one's offset once
        the fsync policy says the batch is acknowledged. Records without a timestamp get
        ``now_ms``."""
        async with self._append_lock:
            if self.failed is not None:
                raise LogFailed(self.failed)
            base = self.log_end_offset
            if len(records) <= ENCODE_INLINE_RECORDS:
                encoded = _encode(records, base, now_ms)
            else:
                encoded = await trio.to_thread.run_sync(
                    _encode, records, base, now_ms, limiter=self.limiter
                )
            payload, offsets, starts, max_ts = encoded
            active = self.segments[-1]
            if not active.empty and active.size + len(payload) > self.config.segment_bytes:
                active = await self._roll()
            await trio.to_thread.run_sync(
                active.append, payload, offsets, starts, max_ts, limiter=self.limiter
            )
            end = self.log_end_offset
        if self.config.fsync is FsyncPolicy.ALWAYS:
            await self._flush_to(end)
        return base

    async def _roll(self) -> Segment:
        """Start a new segment (append lock held); the old one is made durable and closed."""
        old = self.segments[-1]
        async with self._flush_lock:
            if self.config.fsync is not FsyncPolicy.NEVER:
                await trio.to_thread.run_sync(old.flush, limiter=self.limiter)
            old.close()
            new = await trio.to_thread.run_sync(
                create_segment,
                self.directory,
                old.next_offset,
                self.config.index_interval_bytes,
                limiter=self.limiter,
            )
            self.segments.append(new)
        return new

    async def flush(self) -> None:
        await self._flush_to(self.log_end_offset)

    async def _flush_to(self, offset: int) -> None:
        async with self._flush_lock:
            if self.flushed_offset >= offset:
                return  # someone else's fsync covered it
            if self.failed is not None:
                raise LogFailed(self.failed)
            target = self.log_end_offset
            active = self.segments[-1]
            try:
                await trio.to_thread.run_sync(active.flush, limiter=self.limiter)
            except OSError as exc:
                self.failed = f"fsync of {active.path} failed: {exc}"
                log.error("%s; no more appends until a restart", self.failed)
                raise LogFailed(self.failed) from exc
            self.flushed_offset = max(self.flushed_offset, target)

    async def read(self, offset: int, max_bytes: int) -> tuple[Record, ...]:
        """Records from ``offset`` up to about ``max_bytes`` (at least one whole record).

        Raises OffsetOutOfRange outside [log start, high watermark]; at the high watermark the
        answer is empty.
        """
        limit = self.high_watermark
        if not self.log_start_offset <= offset <= limit:
            raise OffsetOutOfRange(offset)
        records: list[Record] = []
        budget = max_bytes
        for segment in list(self.segments):
            if segment.next_offset <= offset or segment.empty:
                continue
            if segment.base_offset >= limit or (records and budget <= 0):
                break
            try:
                got = await trio.to_thread.run_sync(
                    segment.read, offset, budget, limit, not records, limiter=self.limiter
                )
            except FileNotFoundError:
                raise OffsetOutOfRange(offset) from None  # deleted by retention meanwhile
            if not got:
                break
            records.extend(got)
            budget -= sum(record_size(r) for r in got)
            offset = got[-1].offset + 1
        return tuple(records)

    async def enforce_retention(self, now_ms: int) -> int:
        """Delete whole segments past the time or size limit; returns how many went.

        The active segment always stays, so the log start and end survive a restart in its name.
        """
        config = self.config
        async with self._append_lock, self._flush_lock:
            doomed: list[Segment] = []
            total = self.size_bytes
            for segment in self.segments[:-1]:
                if config.retention_ms is not None and not segment.scanned:
                    try:
                        await trio.to_thread.run_sync(segment.ensure_scanned, limiter=self.limiter)
                    except CorruptSegment as exc:
                        log.error("retention stops at a damaged segment: %s", exc)
                        break
                expired = (
                    config.retention_ms is not None
                    and segment.max_timestamp_ms < now_ms - config.retention_ms
                )
                oversized = (
                    config.retention_bytes is not None
                    and total - segment.size >= config.retention_bytes
                )
                if not (expired or oversized):
                    break
                doomed.append(segment)
                total -= segment.size
            if not doomed:
                return 0
            # forget them first: a fetch that starts now sees the new log start at once
            self.segments = self.segments[len(doomed) :]
            await trio.to_thread.run_sync(_delete, self.directory, doomed, limiter=self.limiter)
        log.info(
            "%s: retention deleted %d segment(s), log start now %d",
            self.directory.name,
            len(doomed),
            self.log_start_offset,
        )
        return len(doomed)

    async def aclose(self) -> None:
        with trio.CancelScope(shield=True):
            async with self._append_lock:
                if self.config.fsync is not FsyncPolicy.NEVER and self.failed is None:
                    await self.flush()
                self.segments[-1].close()


def _delete(directory: Path, segments: list[Segment]) -> None:
    for segment in segments:
        segment.close()
        segment.path.unlink(missing_ok=True)
    fsync_directory(directory)


def _open_segments(directory: Path, config: LogConfig) -> list[Segment]:
    """Recover the active segment (blocking); sealed ones are scanned on their first read."""
    directory.mkdir(parents=True, exist_ok=True)
    bases = sorted(int(p.name[: -len(SUFFIX)]) for p in directory.glob(f"*{SUFFIX}"))
    if not bases:
        return [create_segment(directory, 0, config.index_interval_bytes)]
    segments = [
        open_sealed_segment(segment_path(directory, base), base, nxt, config.index_interval_bytes)
        for base, nxt in itertools.pairwise(bases)
    ]
    active, _, _ = open_segment(
        segment_path(directory, bases[-1]), bases[-1], config.index_interval_bytes
    )
    segments.append(active)
    return segments


async def open_partition_log(
    directory: Path, config: LogConfig, limiter: trio.CapacityLimiter
) -> PartitionLog:
    """Recover a partition's directory (creating it if new) and return its log, ready to serve."""
    segments = await trio.to_thread.run_sync(_open_segments, directory, config, limiter=limiter)
    end = segments[-1].next_offset
    return PartitionLog(
        directory=directory,
        config=config,
        limiter=limiter,
        segments=segments,
        flushed_offset=end,
    )


#: A batch of more records than this is encoded in a worker thread: one frame can hold 150,000
#: empty records, a third of a second of encoding that would otherwise hold the event loop
#: (in a thread the loop gets the interpreter back every few milliseconds).
ENCODE_INLINE_RECORDS = 1000


def _encode(
    records: Sequence[Record], base: int, now_ms: int
) -> tuple[bytes, list[int], list[int], int]:
    """The records' bytes as the log stores them, with offsets from ``base``, each record's
    start in the bytes, and the largest timestamp."""
    data = bytearray()
    offsets: list[int] = []
    starts: list[int] = []
    max_ts = -1
    for i, record in enumerate(records):
        ts = record.timestamp_ms if record.timestamp_ms >= 0 else now_ms
        starts.append(len(data))
        offsets.append(base + i)
        write_record(
            data, Record(offset=base + i, timestamp_ms=ts, key=record.key, value=record.value)
        )
        max_ts = max(max_ts, ts)
    return bytes(data), offsets, starts, max_ts
