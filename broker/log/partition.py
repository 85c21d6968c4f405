"""One partition's log: an ordered list of segments, appended under a lock, read concurrently.

The trio side owns the state (offsets, the segment list); worker threads only touch files, through
one ``CapacityLimiter`` per broker so that a burst of fetches cannot starve appends of threads,
and with the segment files the broker holds open (:mod:`broker.log.files`, shared by its
partitions: a partition keeps no file of its own open).
Appends to a partition are serialized by its lock; the fsync that makes them durable is shared
(group commit): whoever flushes takes every append written so far along.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable
from pathlib import Path

import attrs
import trio

from protocol.batches import BatchSpan, stamped_pieces, stamped_spans
from protocol.codec import ReadableBuffer
from protocol.types import TopicId
from transport.limits import FileBudget

from .config import FsyncPolicy, LogConfig
from .files import SegmentFiles
from .format import read_partition_id, write_partition_id
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


class WrongIncarnation(Exception):
    """A partition directory holds (or may hold) another incarnation's records than the one it
    was opened for: its ``partition.metadata`` names another topic id, or none while it holds
    segments. The broker sets such a directory aside before it opens the partition; this is the
    last check."""


class LogFailed(Exception):
    """An fsync failed: the kernel may have dropped the pages it could not write, so a later fsync
    that succeeds proves nothing. The partition takes no more appends until a restart recovers it
    from what is really on disk."""


@attrs.define(eq=False)
class PartitionLog:
    directory: Path
    #: The incarnation of the topic whose records these are (``partition.metadata``).
    topic_id: TopicId
    config: LogConfig
    limiter: trio.CapacityLimiter
    files: SegmentFiles
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

    async def append(
        self,
        batches: ReadableBuffer,
        spans: list[BatchSpan],
        now_ms: int,
        check: Callable[[], object] | None = None,
    ) -> int:
        """Append checked batches (``spans``: where each is in ``batches``) and return the first
        record's offset once the fsync policy says they are acknowledged. Their offsets and
        append time are stamped on the way to the file, without copying the batches.

        ``check`` runs in the worker thread that writes, before it writes (one hand-off for
        both): what it raises is raised here, and nothing is written."""
        async with self._append_lock:
            if self.failed is not None:
                raise LogFailed(self.failed)
            base = self.log_end_offset
            pieces = stamped_pieces(batches, spans, base, now_ms)
            stamped = stamped_spans(spans, base, now_ms)
            active = self.segments[-1]
            if not active.empty and active.size + len(batches) > self.config.segment_bytes:
                active = await self._roll()

            def checked_append() -> None:
                if check is not None:
                    check()
                active.append(self.files, pieces, len(batches), stamped)

            await trio.to_thread.run_sync(checked_append, limiter=self.limiter)
            end = self.log_end_offset
        if self.config.fsync is FsyncPolicy.ALWAYS:
            await self._flush_to(end)
        return base

    async def _roll(self) -> Segment:
        """Start a new segment (append lock held); the old one is made durable (its open file
        stays among the broker's, for reads, until evicted)."""
        old = self.segments[-1]
        async with self._flush_lock:
            durable = self.config.fsync is not FsyncPolicy.NEVER
            if durable:
                await trio.to_thread.run_sync(old.flush, self.files, limiter=self.limiter)
            await trio.to_thread.run_sync(old.write_index, durable, limiter=self.limiter)
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
                await trio.to_thread.run_sync(
                    active.flush,
                    self.files,
                    self.config.index_checkpoint_bytes,
                    limiter=self.limiter,
                )
            except OSError as exc:
                self.failed = f"fsync of {active.path} failed: {exc}"
                log.error("%s; no more appends until a restart", self.failed)
                raise LogFailed(self.failed) from exc
            self.flushed_offset = max(self.flushed_offset, target)

    async def read(self, offset: int, max_bytes: int) -> bytes:
        """Whole stored batches from the one holding ``offset``, about ``max_bytes`` of them (at
        least one whole batch), as the segments hold them.

        Raises OffsetOutOfRange outside [log start, high watermark]; at the high watermark the
        answer is empty.
        """
        limit = self.high_watermark
        if not self.log_start_offset <= offset <= limit:
            raise OffsetOutOfRange(offset)
        parts: list[bytes] = []
        budget = max_bytes
        for segment in list(self.segments):
            if segment.next_offset <= offset or segment.empty:
                continue
            if segment.base_offset >= limit or (parts and budget <= 0):
                break
            try:
                got, after = await trio.to_thread.run_sync(
                    segment.read, self.files, offset, budget, limit, not parts, limiter=self.limiter
                )
            except FileNotFoundError:
                raise OffsetOutOfRange(offset) from None  # deleted by retention meanwhile
            if not got:
                break
            parts.append(got)
            budget -= len(got)
            offset = after
            if after < segment.next_offset:
                break  # the budget ended inside this segment
        return parts[0] if len(parts) == 1 else b"".join(parts)

    async def batch_at_time(self, timestamp_ms: int) -> bytes:
        """The first whole stored batch below the high watermark whose newest timestamp is at
        least ``timestamp_ms`` (>= 0), as stored (b"": none): the one that holds the earliest
        record that late (ListOffsets 1). Segments whose newest record is older are passed over
        without a read; in the one that is not, one region the time index narrows it to is
        read. CorruptSegment for a segment it cannot read."""
        limit = self.high_watermark

        def find(segments: list[Segment]) -> bytes:
            for segment in segments:
                if segment.base_offset >= limit:
                    break
                if segment.empty:
                    continue
                try:
                    found = segment.batch_at_time(self.files, timestamp_ms, limit)
                except FileNotFoundError:
                    continue  # deleted by retention meanwhile: its records are gone
                if found is not None:
                    return found
            return b""

        return await trio.to_thread.run_sync(find, list(self.segments), limiter=self.limiter)

    async def enforce_retention(self, now_ms: int) -> int:
        """Delete whole segments past the time or size limit; returns how many went.

        The active segment always stays, so the log start and end survive a restart in its name.
        """
        config = self.config
        if config.retention_ms is None and config.retention_bytes is None:
            return 0  # kept forever: not worth a lock
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
            await trio.to_thread.run_sync(
                _delete, self.files, self.directory, doomed, limiter=self.limiter
            )
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
                durable = self.config.fsync is not FsyncPolicy.NEVER
                if durable and self.failed is None:
                    await self.flush()
                for segment in self.segments:
                    self.files.discard(segment)
                active = self.segments[-1]
                if self.failed is None:
                    # the next start opens from it instead of scanning the segment
                    await trio.to_thread.run_sync(active.write_index, durable, limiter=self.limiter)


def _delete(files: SegmentFiles, directory: Path, segments: list[Segment]) -> None:
    for segment in segments:
        files.discard(segment)
        segment.path.unlink(missing_ok=True)
        segment.index_file.unlink(missing_ok=True)
    fsync_directory(directory)


def _open_segments(directory: Path, config: LogConfig, topic_id: TopicId) -> list[Segment]:
    """Recover the active segment (blocking); sealed ones are scanned on their first read. A new
    directory names ``topic_id`` before it holds a segment."""
    directory.mkdir(parents=True, exist_ok=True)
    bases = sorted(int(p.name[: -len(SUFFIX)]) for p in directory.glob(f"*{SUFFIX}"))
    named = read_partition_id(directory)
    if named is None and not bases:
        write_partition_id(directory, topic_id)
    elif named != topic_id:
        held = "no topic id" if named is None else f"topic id {named}"
        raise WrongIncarnation(f"{directory} names {held}, not {topic_id}")
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
    directory: Path,
    config: LogConfig,
    limiter: trio.CapacityLimiter,
    files: SegmentFiles | None = None,
    *,
    topic_id: TopicId,
) -> PartitionLog:
    """Recover a partition's directory of the topic incarnation ``topic_id`` (creating it if new)
    and return its log, ready to serve, its files open among ``files`` (None: files of its own,
    within the process's budget). WrongIncarnation if the directory is another's."""
    segments = await trio.to_thread.run_sync(
        _open_segments, directory, config, topic_id, limiter=limiter
    )
    end = segments[-1].next_offset
    return PartitionLog(
        directory=directory,
        topic_id=topic_id,
        config=config,
        limiter=limiter,
        files=files or SegmentFiles.of(FileBudget.of_process(), config),
        segments=segments,
        flushed_offset=end,
    )
