"""One segment file: record batches back to back as the wire carries them, and its offset and
time index.

Everything here blocks (file I/O); the partition log calls it from a worker thread, with the
broker's open segment files (:mod:`broker.log.files`), from which each call borrows the segment's
descriptor. The file is ``<base_offset:020d>.log`` and holds nothing but :mod:`protocol.batches`
batches, stamped with their offsets, so the on-disk format is the wire format and a fetch answers
a byte range of the file.

The sparse index, ``(offset, position, newest_before)`` of a batch every ``index_interval`` bytes,
is kept in memory and written to ``<base_offset:020d>.index``, with the segment's size, next offset
and newest timestamp. ``newest_before`` is the newest timestamp of the segment's batches before
that one (-1: none), so the entries rise in time as in offset: a lookup by time (ListOffsets 1,
Kafka's time index) finds the two entries between which the first batch that late lies and reads
that one region of the file, whatever order the producers' timestamps came in. It is written:
when a segment is sealed (fsynced with it), when the log closes cleanly, and for the active
segment after an fsync that made ``checkpoint_bytes`` more durable (Kafka's recovery
point). An index file describes a prefix of its segment that an fsync had covered, so it never
describes bytes the segment does not hold. Opening a log reads one index file per segment; after
a clean stop that is all, after a crash the active segment is scanned from its recovery point on
(at most ``checkpoint_bytes`` plus what was not yet fsynced), checking each batch's CRC and
cutting a torn or corrupt tail. A sealed segment without a usable index is scanned on its first
read. An index file of another version (one written before the index knew time) is not used:
the segment is scanned as if it had none, and its index written again.
"""

from __future__ import annotations

import bisect
import itertools
import logging
import mmap
import os
import struct
import threading
from pathlib import Path
from typing import TYPE_CHECKING

import attrs

from protocol import RemoteProtocolError
from protocol.batches import HEADER_SIZE, BatchSpan, batch_offsets, last_offset_delta, walk_batches
from protocol.codec import ReadableBuffer

if TYPE_CHECKING:
    from .files import SegmentFiles

log = logging.getLogger(__name__)

SUFFIX = ".log"
INDEX_SUFFIX = ".index"
#: magic, version, segment size, next offset, newest timestamp, entry count
_INDEX_HEAD = struct.Struct(">4sIqqqI")
_INDEX_MAGIC = b"CCIX"
#: 1: (relative offset, position) entries; 2: the newest timestamp before each entry too.
_INDEX_VERSION = 2
#: relative offset, position (Kafka's .index), newest timestamp before it (Kafka's .timeindex)
_INDEX_ENTRY = struct.Struct(">IIq")


class CorruptSegment(Exception):
    """A sealed segment does not hold the batches its place in the log says it holds."""


def segment_path(directory: Path, base_offset: int) -> Path:
    return directory / f"{base_offset:020d}{SUFFIX}"


def index_path(directory: Path, base_offset: int) -> Path:
    return directory / f"{base_offset:020d}{INDEX_SUFFIX}"


#: A batch's offset, its position in the file, and the newest timestamp of the batches before it.
IndexEntry = tuple[int, int, int]


@attrs.define(eq=False)
class Segment:
    base_offset: int
    path: Path
    #: Bytes of whole batches in the file.
    size: int
    #: The offset the next record appended here gets.
    next_offset: int
    #: Newest record timestamp, for time retention (-1: empty).
    max_timestamp_ms: int
    index_interval: int
    #: Sparse (offset, position, newest_before) of batch starts, ascending in each; the first is
    #: always the first batch. One list of tuples, appended whole, so a reader thread never sees
    #: an offset without its position.
    index: list[IndexEntry] = attrs.field(factory=list)
    #: False for a sealed segment opened without a usable index until its first read scans it.
    scanned: bool = True
    #: Bytes an fsync covered (or that were on disk when the log opened): the segment's open
    #: file may be closed only once this reaches ``size`` (broker/log/files.py).
    synced_size: int = 0
    #: Deleted or closed with its partition: its file opens no more.
    discarded: bool = False
    #: An fsync made to close its file failed: the next flush reports it.
    sync_error: OSError | None = None
    _scan_lock: threading.Lock = attrs.field(factory=threading.Lock)
    #: Held while an append updates size, next offset, timestamp and index together, so that a
    #: checkpoint (another thread) sees them agree.
    _state_lock: threading.Lock = attrs.field(factory=threading.Lock)
    #: The size the index file on disk describes (its recovery point); 0: none.
    checkpointed_size: int = 0

    @property
    def empty(self) -> bool:
        return self.size == 0

    @property
    def flushed(self) -> bool:
        """Whether what was written is fsynced, or its fsync's failure recorded: its file may
        close without losing a write-back error."""
        return self.synced_size >= self.size or self.sync_error is not None

    @property
    def index_file(self) -> Path:
        return self.path.with_suffix(INDEX_SUFFIX)

    def _index(self, offset: int, position: int) -> None:
        """(state lock held, or the segment not shared yet) Index the batch at ``position`` if it
        is ``index_interval`` past the last one indexed, before its timestamp counts."""
        if not self.index or position - self.index[-1][1] >= self.index_interval:
            self.index.append((offset, position, self.max_timestamp_ms))

    def append(
        self, files: SegmentFiles, pieces: list[ReadableBuffer], size: int, spans: list[BatchSpan]
    ) -> None:
        """Write stamped batches, ``size`` bytes given in ``pieces``; ``spans`` say where each
        batch begins in them and its offsets."""
        # the size grows before the file is given back: until then it is not flushed, so it
        # cannot be closed before an fsync covers what was just written
        with files.borrow(self) as fd:
            try:
                _write_all(fd, pieces, size)
            except OSError:
                # a half-written batch must not sit between whole ones (disk full, say)
                os.ftruncate(fd, self.size)
                raise
            with self._state_lock:
                for span in spans:
                    self._index(span.base_offset, self.size + span.position)
                    if span.max_timestamp_ms > self.max_timestamp_ms:
                        self.max_timestamp_ms = span.max_timestamp_ms
                self.size += size
                last = spans[-1]
                self.next_offset = last.base_offset + last.record_count

    def ensure_scanned(self) -> None:
        """Build a sealed segment's index and newest timestamp (blocking; once)."""
        if self.scanned:
            return
        with self._scan_lock:
            if self.scanned:
                return
            scan = _scan(self.path, self.base_offset, self.index_interval)
            if scan.reason is not None or (scan.size, scan.next_offset) != (
                self.size,
                self.next_offset,
            ):
                raise CorruptSegment(
                    f"{self.path}: whole batches up to offset {scan.next_offset} at byte "
                    f"{scan.size}, but the log needs up to {self.next_offset} in {self.size} bytes"
                    + (f" ({scan.reason})" if scan.reason else "")
                )
            self.index = scan.index
            self.max_timestamp_ms = scan.max_timestamp_ms
            self.scanned = True
            if not self.discarded:  # the next start opens it from the index, without a scan
                self.write_index(durable=False)

    def flush(self, files: SegmentFiles, checkpoint_bytes: int | None = None) -> None:
        """fsync what was written since the last one; then, if ``checkpoint_bytes`` have been
        made durable since the index file was last written, write it again for what this fsync
        covered: a recovery after a crash trusts that prefix and checks only the bytes after
        it."""
        if self.sync_error is not None:
            raise OSError(f"an fsync of {self.path} failed: {self.sync_error}")
        with self._state_lock:
            covered = (self.size, self.next_offset, self.max_timestamp_ms, list(self.index))
        if covered[0] > self.synced_size:  # else another fsync covered it (broker/log/files.py)
            with files.borrow(self) as fd:
                os.fsync(fd)
            self.synced_size = max(self.synced_size, covered[0])
        if checkpoint_bytes is not None and covered[0] - self.checkpointed_size >= checkpoint_bytes:
            self._write_index(*covered, durable=True)

    def write_index(self, durable: bool) -> None:
        """Persist the index with what it describes (the segment's size, next offset, newest
        timestamp), through a temporary file so that a crash leaves the old one or the new."""
        if not self.scanned:
            return  # never read, so never rebuilt: the file on disk (if any) is still the truth
        with self._state_lock:
            covered = (self.size, self.next_offset, self.max_timestamp_ms, list(self.index))
        self._write_index(*covered, durable=durable)

    def _write_index(
        self,
        size: int,
        next_offset: int,
        max_timestamp_ms: int,
        index: list[IndexEntry],
        durable: bool,
    ) -> None:
        entries = [
            _INDEX_ENTRY.pack(offset - self.base_offset, position, newest_before)
            for offset, position, newest_before in index
        ]
        head = _INDEX_HEAD.pack(
            _INDEX_MAGIC, _INDEX_VERSION, size, next_offset, max_timestamp_ms, len(entries)
        )
        target = self.index_file
        tmp = target.with_suffix(".index.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            os.write(fd, head + b"".join(entries))
            if durable:
                os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, target)
        self.checkpointed_size = size

    def read(
        self,
        files: SegmentFiles,
        offset: int,
        max_bytes: int,
        limit_offset: int,
        first_whole: bool = True,
    ) -> tuple[bytes, int]:
        """Whole batches holding ``offset`` and after (below ``limit_offset``), about
        ``max_bytes`` of them, as the file holds them: one read, no batch decoded.

        With ``first_whole`` the first batch is returned even when it alone exceeds
        ``max_bytes`` (a fetch must always make progress). The descriptor it borrows stays open
        until it is given back, whatever retention or an eviction does meanwhile. Returns the
        bytes and the offset after their last record.
        """
        self.ensure_scanned()
        index = self.index
        i = bisect.bisect_right(index, offset, hi=len(index), key=_offset_of) - 1
        position = index[i][1] if i >= 0 else 0
        end = self.size  # batches past this may be mid-write
        want = max_bytes + self.index_interval + HEADER_SIZE
        with files.borrow(self) as fd:
            buf = os.pread(fd, min(want, end - position), position)
            buf_at = position
            pos = position
            start = stop = -1
            after = offset
            while pos < end:
                rel = pos - buf_at
                if rel + HEADER_SIZE <= len(buf):
                    head, at = buf, rel
                else:  # past the first read: the header alone
                    head, at = os.pread(fd, HEADER_SIZE, pos), 0
                base, size = batch_offsets(head, at)
                if base >= limit_offset:
                    break
                last = base + last_offset_delta(head, at)
                if last >= offset:
                    if start < 0:
                        if size > max_bytes and not first_whole:
                            break
                        start = pos
                    elif pos + size - start > max_bytes:
                        break
                    stop = pos + size
                    after = last + 1
                    if stop - start >= max_bytes:
                        break
                pos += size
            if start < 0:
                return b"", offset
            if buf_at <= start and stop <= buf_at + len(buf):
                return buf[start - buf_at : stop - buf_at], after
            return _read_exactly(fd, start, stop - start), after

    def batch_at_time(
        self, files: SegmentFiles, timestamp_ms: int, limit_offset: int
    ) -> bytes | None:
        """The first whole batch below ``limit_offset`` whose newest timestamp is at least
        ``timestamp_ms`` (>= 0), as the file holds it; None if this segment has none.

        The index narrows it to the region between the last entry before which every batch is
        older and the next entry (or the end), at most ``index_interval`` bytes and one batch:
        that region is read in one call and walked by the batches' headers, none decoded.
        """
        self.ensure_scanned()
        with self._state_lock:  # an append updates these together
            if self.max_timestamp_ms < timestamp_ms or not self.index:
                return None
            index, end = self.index, self.size
            entries = len(index)
        # index[0] says -1: every lookup starts at or after it
        at = bisect.bisect_left(index, timestamp_ms, hi=entries, key=_newest_before) - 1
        start = index[at][1]
        stop = index[at + 1][1] if at + 1 < entries else end
        with files.borrow(self) as fd:
            region = _read_exactly(fd, start, stop - start)
        try:
            for position, size, base, _, newest in walk_batches(region, check_crc=False):
                if base >= limit_offset:
                    return None
                if newest >= timestamp_ms:
                    return region[position : position + size]
        except RemoteProtocolError as exc:
            raise CorruptSegment(f"{self.path} at byte {start}: {exc}") from exc
        return None

    def truncate(self, files: SegmentFiles, offset: int, durable: bool) -> int:
        """Cut the segment before its first batch holding ``offset`` or a later one, and return
        the offset after what is kept (``offset`` itself unless it falls inside a batch, which
        goes whole). Scanned first (CorruptSegment, nothing cut).

        The kept prefix is found as recovery finds a torn tail (:func:`_scan`), from the last
        index entry at or before ``offset``: that entry's newest-before timestamp and the batches
        after it rebuild the index and newest timestamp of what is kept.

        Recovery trusts an index file as far as it goes (:func:`open_segment`), which holds for
        a file that only grows; a cut file may grow again with other batches where the old
        index describes the cut ones. So the old index file goes (its removal durable) before
        the file is cut, and the new one is written once the cut is: a crash at any point
        leaves no index (a scan) or one describing a prefix that stays as it is."""
        self.ensure_scanned()
        with self._state_lock:
            index = list(self.index)
        i = bisect.bisect_right(index, offset, key=_offset_of) - 1
        start = None
        if i > 0:
            at, position, newest_before = index[i]
            start = Segment(
                base_offset=self.base_offset,
                path=self.path,
                size=position,
                next_offset=at,
                max_timestamp_ms=newest_before,
                index_interval=self.index_interval,
                index=index[:i],
            )
        scan = _scan(self.path, self.base_offset, self.index_interval, start, stop_offset=offset)
        if scan.reason is not None or scan.next_offset > offset:
            raise CorruptSegment(
                f"{self.path}: cannot cut at offset {offset}: whole batches up to offset "
                f"{scan.next_offset} at byte {scan.size} ({scan.reason})"
            )
        with self._state_lock:  # readers from now on see the cut log
            self.size = scan.size
            self.next_offset = scan.next_offset
            self.max_timestamp_ms = scan.max_timestamp_ms
            self.index = scan.index
        self.index_file.unlink(missing_ok=True)
        if durable:
            fsync_directory(self.path.parent)
        with files.borrow(self) as fd:
            os.ftruncate(fd, scan.size)
            if durable:
                os.fsync(fd)
        self.synced_size = scan.size if durable else min(self.synced_size, scan.size)
        self._write_index(scan.size, scan.next_offset, scan.max_timestamp_ms, scan.index, durable)
        return scan.next_offset


#: iovecs one writev takes (Linux's IOV_MAX is 1024)
_IOV_MAX = 1024


def _write_all(fd: int, pieces: list[ReadableBuffer], size: int) -> None:
    """Write every piece, in order, with as few system calls as the kernel allows."""
    views = [memoryview(p).cast("B") for p in pieces]
    written = 0
    while written < size:
        n = os.writev(fd, views[:_IOV_MAX])
        written += n
        while views and n >= len(views[0]):
            n -= len(views[0])
            views.pop(0)
        if n:
            views[0] = views[0][n:]


def _read_exactly(fd: int, position: int, size: int) -> bytes:
    data = os.pread(fd, size, position)
    while len(data) < size:
        more = os.pread(fd, size - len(data), position + len(data))
        if not more:
            raise CorruptSegment(f"the segment ends before byte {position + size}")
        data += more
    return data


def _offset_of(entry: IndexEntry) -> int:
    return entry[0]


def _newest_before(entry: IndexEntry) -> int:
    return entry[2]


@attrs.frozen(kw_only=True)
class _Scan:
    index: list[IndexEntry]
    size: int
    next_offset: int
    max_timestamp_ms: int
    reason: str | None


def _scan(
    path: Path,
    base_offset: int,
    index_interval: int,
    start: Segment | None = None,
    stop_offset: int | None = None,
) -> _Scan:
    """Walk a segment's batches, checking each CRC and base offset, up to the first bad one;
    from the end of ``start`` (a prefix already known good) if given; with ``stop_offset``, up to
    the first batch holding that offset or a later one (where a truncation cuts)."""
    probe = Segment(
        base_offset=base_offset,
        path=path,
        size=0,
        next_offset=base_offset,
        max_timestamp_ms=-1,
        index_interval=index_interval,
        index=list(start.index) if start is not None else [],
    )
    file_size = path.stat().st_size
    pos = start.size if start is not None else 0
    expected = start.next_offset if start is not None else base_offset
    probe.max_timestamp_ms = start.max_timestamp_ms if start is not None else -1
    reason: str | None = None
    if file_size > pos:
        with (
            open(path, "rb") as f,
            mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mapped,
            memoryview(mapped) as data,
        ):
            try:
                for position, size, base, count, ts in walk_batches(data, pos, file_size):
                    if base != expected:
                        reason = f"offset {base} where {expected} belongs"
                        break
                    if stop_offset is not None and base + count > stop_offset:
                        break
                    probe._index(expected, position)
                    probe.max_timestamp_ms = max(probe.max_timestamp_ms, ts)
                    expected += count
                    pos = position + size
            except RemoteProtocolError as exc:
                reason = f"{exc.error_code.name}: {exc}"
    return _Scan(
        index=probe.index,
        size=pos,
        next_offset=expected,
        max_timestamp_ms=probe.max_timestamp_ms,
        reason=reason,
    )


def _load_index(segment: Segment, file_size: int, prefix: bool = False) -> bool:
    """Take the segment's state from its index file if that describes ``file_size`` bytes (with
    ``prefix``: at most that many, a recovery point to scan on from)."""
    try:
        data = segment.index_file.read_bytes()
    except FileNotFoundError:
        return False
    if len(data) < _INDEX_HEAD.size:
        return False
    magic, version, size, next_offset, max_ts, count = _INDEX_HEAD.unpack_from(data)
    if (
        magic != _INDEX_MAGIC
        or version != _INDEX_VERSION
        or (size > file_size if prefix else size != file_size)
        or len(data) != _INDEX_HEAD.size + count * _INDEX_ENTRY.size
        or next_offset < segment.base_offset
    ):
        return False
    base = segment.base_offset
    index = [
        (base + relative, position, newest_before)
        for relative, position, newest_before in _INDEX_ENTRY.iter_unpack(data[_INDEX_HEAD.size :])
    ]
    if size and (
        not index
        or index[0] != (base, 0, -1)
        or any(p >= size or t > max_ts for _, p, t in index)
        or any(a[2] > b[2] for a, b in itertools.pairwise(index))
    ):
        return False
    segment.size = size
    segment.next_offset = next_offset
    segment.max_timestamp_ms = max_ts
    segment.index = index
    segment.scanned = True
    segment.checkpointed_size = size
    return True


def open_sealed_segment(
    path: Path, base_offset: int, next_offset: int, index_interval: int
) -> Segment:
    """A segment before the active one: its index file if it has a usable one, else taken at
    its word until its first read scans it."""
    size = path.stat().st_size
    segment = Segment(
        base_offset=base_offset,
        path=path,
        size=size,
        next_offset=next_offset,
        max_timestamp_ms=-1,
        index_interval=index_interval,
        scanned=False,
        synced_size=size,
    )
    if _load_index(segment, segment.size) and segment.next_offset != next_offset:
        log.warning(
            "%s: its index ends at %d, the next segment starts at %d",
            path,
            segment.next_offset,
            next_offset,
        )
        segment.next_offset = next_offset
        segment.scanned = False
    return segment


def open_segment(
    path: Path, base_offset: int, index_interval: int
) -> tuple[Segment, int, str | None]:
    """Recover the active segment: from its index file after a clean stop; after a crash, from
    the recovery point its index file records (bytes an fsync had covered) on, by a scan that
    checks each batch's CRC, extends the index and cuts any torn or corrupt tail.

    Returns the segment, the bytes cut, and why (None: nothing was cut). A batch whose offset is
    not the next one is treated as corrupt too: the file can only have been damaged.
    """
    file_size = path.stat().st_size
    segment = Segment(
        base_offset=base_offset,
        path=path,
        size=0,
        next_offset=base_offset,
        max_timestamp_ms=-1,
        index_interval=index_interval,
    )
    loaded = _load_index(segment, file_size, prefix=True)
    if loaded and segment.size == file_size:
        segment.synced_size = file_size
        return segment, 0, None  # a clean stop: nothing after the index to check
    scan = _scan(path, base_offset, index_interval, start=segment if loaded else None)
    segment.size = scan.size
    segment.next_offset = scan.next_offset
    segment.max_timestamp_ms = scan.max_timestamp_ms
    segment.index = scan.index
    segment.synced_size = scan.size
    cut = file_size - scan.size
    if cut:
        log.warning(
            "%s: cutting %d bytes after offset %d (%s)",
            path,
            cut,
            scan.next_offset - 1,
            scan.reason,
        )
        os.truncate(path, scan.size)
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    return segment, cut, scan.reason


def create_segment(directory: Path, base_offset: int, index_interval: int) -> Segment:
    path = segment_path(directory, base_offset)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    os.close(fd)
    fsync_directory(directory)
    return Segment(
        base_offset=base_offset,
        path=path,
        size=0,
        next_offset=base_offset,
        max_timestamp_ms=-1,
        index_interval=index_interval,
    )


def fsync_directory(directory: Path) -> None:
    """Make a created or deleted file's name durable, not only its bytes."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
