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

from protocol.batches import HEADER, BatchSpan, batch_spans, stamped_pieces, stamped_spans
from protocol.codec import ReadableBuffer
from protocol.types import TopicId
from store.durable import replace_atomically
from transport.limits import FileBudget

from .checkpoints import CorruptCheckpoint, decode_rows, encode_rows
from .config import FsyncPolicy, LogConfig
from .epochs import LEADER_EPOCHS, EpochEnd, LeaderEpochCache
from .files import SegmentFiles
from .format import read_partition_id, write_partition_id
from .segment import (
    INDEX_SUFFIX,
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

#: A partition directory's intent to empty its log and start it at the offset the file names
#: (:meth:`PartitionLog.start_at`): once it is there, the next open finishes the job.
START_OVER = "start-over"


class OffsetOutOfRange(Exception):
    pass


class WrongIncarnation(Exception):
    """A partition directory holds (or may hold) another incarnation's records than the one it
    was opened for: its ``partition.metadata`` names another topic id, or none while it holds
    segments. The broker sets such a directory aside before it opens the partition; this is the
    last check."""


class NotContiguous(Exception):
    """Replicated batches that do not begin at the log's end, or not each where the one before
    ends: a gap or an overlap. Nothing was written."""


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
    #: Read on first use (:meth:`leader_epochs`): a partition that is not replicated never
    #: reads or writes one.
    _epochs: LeaderEpochCache | None = None

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
            end = await self._write(pieces, len(batches), stamped, check)
        if self.config.fsync is FsyncPolicy.ALWAYS:
            await self._flush_to(end)
        return base

    async def append_replicated(self, batches: ReadableBuffer) -> int:
        """Append a follower's copy of its leader's batches as the leader's log holds them, their
        offsets and append times kept, and return the log end after them once the fsync policy
        says they are durable.

        Each batch's header and CRC are checked (RemoteProtocolError: CORRUPT_MESSAGE or
        MALFORMED_FRAME), not its records section: the leader checked that when it took them.
        Batches that do not begin at the log end, one after another, are refused with
        NotContiguous. Either way nothing is written."""
        spans = batch_spans(batches)
        async with self._append_lock:
            if self.failed is not None:
                raise LogFailed(self.failed)
            expected = self.log_end_offset
            for span in spans:
                if span.base_offset != expected:
                    what = "a gap" if span.base_offset > expected else "an overlap"
                    raise NotContiguous(
                        f"{self.directory.name}: a batch at offset {span.base_offset} where "
                        f"offset {expected} comes next ({what})"
                    )
                expected += span.record_count
            if not spans:
                return expected
            timed = [
                # as the leader's log indexed it: the append time for records with none
                attrs.evolve(span, max_timestamp_ms=_append_time(batches, span))
                if span.max_timestamp_ms < 0
                else span
                for span in spans
            ]
            end = await self._write([batches], len(batches), timed)
        if self.config.fsync is FsyncPolicy.ALWAYS:
            await self._flush_to(end)
        return end

    async def _write(
        self,
        pieces: list[ReadableBuffer],
        size: int,
        spans: list[BatchSpan],
        check: Callable[[], object] | None = None,
    ) -> int:
        """(append lock held) Write stamped batches to the active segment, rolling it first if
        they would overflow it; returns the log end after them."""
        active = self.segments[-1]
        if not active.empty and active.size + size > self.config.segment_bytes:
            active = await self._roll()

        def checked_append() -> None:
            if check is not None:
                check()
            active.append(self.files, pieces, size, spans)

        await trio.to_thread.run_sync(checked_append, limiter=self.limiter)
        return self.log_end_offset

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

    def _fail(self, what: str) -> LogFailed:
        """Stop appends until a restart recovers the partition from what is on disk: a write
        that failed may have left it other than this object thinks (the error to raise)."""
        self.failed = what
        log.error("%s; no more appends until a restart", what)
        return LogFailed(what)

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
                raise self._fail(f"fsync of {active.path} failed: {exc}") from exc
            self.flushed_offset = max(self.flushed_offset, target)

    async def read(self, offset: int, max_bytes: int, limit: int | None = None) -> bytes:
        """Whole stored batches from the one holding ``offset``, about ``max_bytes`` of them (at
        least one whole batch), as the segments hold them.

        Raises OffsetOutOfRange outside [log start, high watermark]; at the high watermark the
        answer is empty. With ``limit`` (a replicated partition's high watermark, or its log end
        for a follower's fetch) batches beginning at ``limit`` or later are left out instead, and
        the range is [log start, log end]: an offset from ``limit`` to the log end gets an empty
        answer.
        """
        if limit is None:
            limit = self.high_watermark
            last = limit
        else:
            last = self.log_end_offset
            limit = min(limit, last)
        if not self.log_start_offset <= offset <= last:
            raise OffsetOutOfRange(offset)
        if offset >= limit:
            return b""
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
            if self._epochs is not None:
                await trio.to_thread.run_sync(
                    self._epochs.truncate_from_start, self.log_start_offset, limiter=self.limiter
                )
        log.info(
            "%s: retention deleted %d segment(s), log start now %d",
            self.directory.name,
            len(doomed),
            self.log_start_offset,
        )
        return len(doomed)

    async def truncate_to(self, offset: int) -> int:
        """Cut the log to end at ``offset`` (a follower's log diverged from its leader's there),
        and the leader-epoch cache with it; returns the new log end: ``offset``, or the start of
        the batch holding it if it falls inside one (that batch goes whole). At or past the log
        end no record goes, only the epochs begun at the log end, which hold none (a replica
        that led without writing, now a follower); OffsetOutOfRange below the log start.

        Segments after the one holding ``offset`` are deleted, newest first, each deletion
        durable before the next, so that a crash leaves a log that ends at a segment's end;
        then that segment is cut (:meth:`Segment.truncate`) and becomes the active one. The cuts
        are fsynced unless the policy is ``never``. A crash at any point leaves a log that is
        the old one cut somewhere between its old end and ``offset``: truncate again after a
        restart. A failed cut stops appends, as a failed fsync does (LogFailed).

        A read in flight over the cut part may fail: a replicated partition's reads stop at its
        high watermark, below any cut but an unclean election's."""
        async with self._append_lock:
            epochs = await self._loaded_epochs()
            if offset >= self.log_end_offset:
                end = self.log_end_offset
                latest = epochs.latest
                if latest is not None and latest.start_offset >= end:
                    await trio.to_thread.run_sync(
                        epochs.truncate_from_end, end, limiter=self.limiter
                    )
                return end
            if offset < self.log_start_offset:
                raise OffsetOutOfRange(offset)
            async with self._flush_lock:
                if self.failed is not None:
                    raise LogFailed(self.failed)
                keep = sum(1 for segment in self.segments if segment.base_offset <= offset)
                last = self.segments[keep - 1]
                # a sealed segment never read: CorruptSegment here, before anything is cut
                await trio.to_thread.run_sync(last.ensure_scanned, limiter=self.limiter)
                doomed = self.segments[keep:]
                self.segments = self.segments[:keep]
                durable = self.config.fsync is not FsyncPolicy.NEVER
                try:
                    end = await trio.to_thread.run_sync(
                        _cut, self.files, doomed, last, offset, durable, limiter=self.limiter
                    )
                except OSError as exc:
                    raise self._fail(
                        f"truncating {self.directory} to {offset} failed: {exc}"
                    ) from exc
                # ``last`` is fsynced up to ``end`` now, the segments before it were when sealed
                self.flushed_offset = end if durable else min(self.flushed_offset, end)
            await trio.to_thread.run_sync(epochs.truncate_from_end, end, limiter=self.limiter)
        log.info("%s: truncated to offset %d", self.directory.name, end)
        return end

    async def start_at(self, offset: int) -> None:
        """Drop every record and start the log empty at ``offset`` (Kafka's
        ``truncateFullyAndStartAt``): a follower whose leader's log now starts past this one's
        end (retention took the records it would fetch next). The leader-epoch cache goes with
        the records: the epochs of the records fetched from ``offset`` on come with them.

        A crash at any point leaves the old log whole or the new empty one: the intent is
        written first, durably and atomically (:data:`START_OVER`, naming ``offset``); only
        then are the segments and the cache deleted and the new segment made, and the intent
        removed last; an open that finds the intent does all of that again first
        (:func:`_open_segments`). Nothing is appended meanwhile (the append lock is held), so
        redoing it loses nothing. A failure (OSError) stops appends until a restart finishes
        or forgets the start-over (LogFailed).

        A read in flight over the old records may fail as one over a truncation does."""
        if offset < 0:
            raise OffsetOutOfRange(offset)
        async with self._append_lock, self._flush_lock:
            if self.failed is not None:
                raise LogFailed(self.failed)
            doomed = self.segments
            for segment in doomed:
                self.files.discard(segment)
            try:
                active = await trio.to_thread.run_sync(
                    _start_over,
                    self.directory,
                    offset,
                    self.config.index_interval_bytes,
                    limiter=self.limiter,
                )
            except OSError as exc:
                raise self._fail(
                    f"starting {self.directory} over at {offset} failed: {exc}"
                ) from exc
            self.segments = [active]
            self.flushed_offset = offset
            self._epochs = LeaderEpochCache(path=self.directory / LEADER_EPOCHS)
        log.info("%s: emptied, starts at offset %d", self.directory.name, offset)

    async def leader_epochs(self) -> LeaderEpochCache:
        """The partition's leader-epoch cache, read on first use (CorruptCheckpoint if damaged).
        Entries from the log end on, or before the log start, are dropped as it is read: a crash
        between cutting the log and cutting the cache leaves them (broker/log/epochs.py)."""
        if self._epochs is not None:
            return self._epochs
        async with self._append_lock:
            return await self._loaded_epochs()

    async def _loaded_epochs(self) -> LeaderEpochCache:
        """(append lock held)"""
        if self._epochs is None:
            epochs = await trio.to_thread.run_sync(
                LeaderEpochCache.load, self.directory, limiter=self.limiter
            )
            await trio.to_thread.run_sync(
                epochs.truncate_from_end, self.log_end_offset, limiter=self.limiter
            )
            await trio.to_thread.run_sync(
                epochs.truncate_from_start, self.log_start_offset, limiter=self.limiter
            )
            self._epochs = epochs
        return self._epochs

    async def assign_epoch(self, epoch: int, start_offset: int | None = None) -> None:
        """Record durably that leader epoch ``epoch`` starts at ``start_offset`` (None: the log
        end now, as a new leader does before it takes a record); EpochRefused out of order. A
        follower records the epochs its leader sends before appending the records they cover."""
        async with self._append_lock:
            epochs = await self._loaded_epochs()
            start = self.log_end_offset if start_offset is None else start_offset
            await trio.to_thread.run_sync(epochs.assign, epoch, start, limiter=self.limiter)

    async def end_offset_for(self, epoch: int) -> EpochEnd:
        """Where ``epoch`` ends in this log (:meth:`LeaderEpochCache.end_offset_for`): what a
        leader answers a follower whose last fetched epoch it is."""
        epochs = await self.leader_epochs()
        return epochs.end_offset_for(epoch, self.log_end_offset)

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


def _append_time(batches: ReadableBuffer, span: BatchSpan) -> int:
    append_time: int = HEADER.unpack_from(batches, span.position)[2]
    return append_time


def _cut(
    files: SegmentFiles, doomed: list[Segment], last: Segment, offset: int, durable: bool
) -> int:
    """Delete ``doomed`` (the segments after ``last``) newest first, then cut ``last`` before
    ``offset``; returns the new log end (blocking). A segment's index file goes before its
    segment file: a segment made again at the same base offset must not find it."""
    for segment in reversed(doomed):
        files.discard(segment)
        segment.index_file.unlink(missing_ok=True)
        segment.path.unlink(missing_ok=True)
        if durable:
            fsync_directory(segment.path.parent)
    return last.truncate(files, offset, durable)


def _start_over(directory: Path, offset: int, index_interval: int) -> Segment:
    """Empty the partition directory's log and start it at ``offset``, crash-safely (blocking):
    the intent first, then what it says (:func:`_finish_start_over`)."""
    replace_atomically(directory / START_OVER, encode_rows([(offset,)]))
    return _finish_start_over(directory, offset, index_interval)


def _finish_start_over(directory: Path, offset: int, index_interval: int) -> Segment:
    """(blocking) Delete every segment, index and the leader-epoch cache, make the empty
    segment at ``offset``, then remove the intent; each step may be done again after a crash.
    The new segment is made anew even if it was there: nothing was appended to it before the
    intent went."""
    doomed = [
        *directory.glob(f"*{INDEX_SUFFIX}*"),  # index files first, as a truncation cuts them
        *directory.glob(f"*{SUFFIX}"),
        directory / LEADER_EPOCHS,
    ]
    for path in doomed:
        path.unlink(missing_ok=True)
    fsync_directory(directory)
    active = create_segment(directory, offset, index_interval)
    (directory / START_OVER).unlink()
    fsync_directory(directory)
    return active


def _intended_start(directory: Path) -> int | None:
    """(blocking) The offset a start-over interrupted by a crash was to start the log at; None
    if there was none. CorruptCheckpoint if its file (written atomically) does not read as one."""
    path = directory / START_OVER
    rows = decode_rows(path, 1)
    if rows is None:
        return None
    if len(rows) != 1 or not rows[0][0].isdigit():
        raise CorruptCheckpoint(f"{path}: one offset expected: {rows}")
    return int(rows[0][0])


def _open_segments(directory: Path, config: LogConfig, topic_id: TopicId) -> list[Segment]:
    """Recover the active segment (blocking); sealed ones are scanned on their first read. A new
    directory names ``topic_id`` before it holds a segment; one whose start-over a crash
    interrupted is emptied and started over first."""
    directory.mkdir(parents=True, exist_ok=True)
    start = _intended_start(directory)
    if start is not None:
        log.warning("%s: finishing its start at offset %d, cut short by a crash", directory, start)
        _finish_start_over(directory, start, config.index_interval_bytes)
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
