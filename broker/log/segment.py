"""One segment file: records back to back in the wire encoding, plus its sparse offset index.

Everything here blocks (file I/O); the partition log calls it from a worker thread. The file is
``<base_offset:020d>.log`` and holds nothing but :func:`protocol.records.write_record` output, so
the on-disk format is the wire format. The index is not stored: the active segment's is rebuilt by
the scan that crash recovery needs anyway, and a sealed segment's on its first read (sealed
segments were fsynced when they were rolled, unless the policy is ``never``, so opening a log
costs one segment's scan however long the log is; the scan runs at ~17 MB/s). A rebuilt index can
never disagree with its file.
"""

from __future__ import annotations

import bisect
import logging
import mmap
import os
import threading
from pathlib import Path

import attrs

from protocol import RemoteProtocolError
from protocol.records import Record, decode_record

log = logging.getLogger(__name__)

SUFFIX = ".log"


class CorruptSegment(Exception):
    """A sealed segment does not hold the records its place in the log says it holds."""


def segment_path(directory: Path, base_offset: int) -> Path:
    return directory / f"{base_offset:020d}{SUFFIX}"


@attrs.define(eq=False)
class Segment:
    base_offset: int
    path: Path
    #: Bytes of whole records in the file.
    size: int
    #: The offset the next record appended here gets.
    next_offset: int
    #: Newest record timestamp, for time retention (-1: empty).
    max_timestamp_ms: int
    index_interval: int
    #: Sparse (offset, position) pairs, ascending; the first is always the first record. One list
    #: of pairs, appended whole, so a reader thread never sees an offset without its position.
    index: list[tuple[int, int]] = attrs.field(factory=list)
    #: False for a sealed segment opened from disk until its first read scans it.
    scanned: bool = True
    _write_fd: int | None = None
    _scan_lock: threading.Lock = attrs.field(factory=threading.Lock)

    @property
    def empty(self) -> bool:
        return self.size == 0

    def _index(self, offset: int, position: int) -> None:
        if not self.index or position - self.index[-1][1] >= self.index_interval:
            self.index.append((offset, position))

    def append(self, data: bytes, offsets: list[int], starts: list[int], max_ts: int) -> None:
        """Write an encoded batch; record ``offsets[i]`` begins at ``data[starts[i]]``."""
        if self._write_fd is None:
            self._write_fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        view = memoryview(data)
        written = 0
        try:
            while written < len(data):
                written += os.write(self._write_fd, view[written:])
        except OSError:
            # a half-written batch must not sit between whole records (disk full, say)
            os.ftruncate(self._write_fd, self.size)
            raise
        for offset, start in zip(offsets, starts, strict=True):
            self._index(offset, self.size + start)
        self.size += len(data)
        self.next_offset = offsets[-1] + 1
        self.max_timestamp_ms = max(self.max_timestamp_ms, max_ts)

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
                    f"{self.path}: whole records up to offset {scan.next_offset} at byte "
                    f"{scan.size}, but the log needs up to {self.next_offset} in {self.size} bytes"
                    + (f" ({scan.reason})" if scan.reason else "")
                )
            self.index = scan.index
            self.max_timestamp_ms = scan.max_timestamp_ms
            self.scanned = True

    def flush(self) -> None:
        if self._write_fd is not None:
            os.fsync(self._write_fd)

    def close(self) -> None:
        if self._write_fd is not None:
            os.close(self._write_fd)
            self._write_fd = None

    def read(
        self, offset: int, max_bytes: int, limit_offset: int, first_whole: bool = True
    ) -> list[Record]:
        """Records from ``offset`` (below ``limit_offset``) worth about ``max_bytes``.

        With ``first_whole`` the first record is returned even when it alone exceeds
        ``max_bytes`` (a fetch must always make progress). Opens its own
        descriptor so a concurrent retention delete can never leave it reading a reused one.
        """
        self.ensure_scanned()
        index = self.index
        i = bisect.bisect_right(index, offset, hi=len(index), key=_offset_of) - 1
        position = index[i][1] if i >= 0 else 0
        end = self.size  # records past this may be mid-write
        records: list[Record] = []
        taken = 0
        want = max_bytes + self.index_interval
        with open(self.path, "rb", buffering=0) as f:
            while position < end:
                chunk = os.pread(f.fileno(), min(want, end - position), position)
                pos = 0
                while pos < len(chunk):
                    try:
                        record, nxt = decode_record(chunk, pos)
                    except RemoteProtocolError:
                        break  # runs past the chunk: read on from here
                    if record.offset >= limit_offset:
                        return records
                    if record.offset >= offset:
                        if (records or not first_whole) and taken + (nxt - pos) > max_bytes:
                            return records
                        records.append(record)
                        taken += nxt - pos
                    pos = nxt
                if pos == 0:
                    if len(chunk) >= end - position:
                        raise RuntimeError(f"{self.path}: no whole record at {position}")
                    want *= 2  # one record bigger than the chunk
                position += pos
                if records and taken >= max_bytes:
                    break
        return records


def _offset_of(entry: tuple[int, int]) -> int:
    return entry[0]


@attrs.frozen(kw_only=True)
class _Scan:
    index: list[tuple[int, int]]
    size: int
    next_offset: int
    max_timestamp_ms: int
    reason: str | None


def _scan(path: Path, base_offset: int, index_interval: int) -> _Scan:
    """Walk a segment's records, checking each CRC and offset, up to the first bad one."""
    probe = Segment(
        base_offset=base_offset,
        path=path,
        size=0,
        next_offset=base_offset,
        max_timestamp_ms=-1,
        index_interval=index_interval,
    )
    file_size = path.stat().st_size
    pos = 0
    expected = base_offset
    max_ts = -1
    reason: str | None = None
    if file_size:
        with (
            open(path, "rb") as f,
            mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mapped,
            memoryview(mapped) as data,
        ):
            while pos < file_size:
                try:
                    record, nxt = decode_record(data, pos)
                except RemoteProtocolError as exc:
                    reason = f"{exc.error_code.name}: {exc}"
                    break
                if record.offset != expected:
                    reason = f"offset {record.offset} where {expected} belongs"
                    break
                probe._index(expected, pos)
                max_ts = max(max_ts, record.timestamp_ms)
                expected += 1
                pos = nxt
    return _Scan(
        index=probe.index, size=pos, next_offset=expected, max_timestamp_ms=max_ts, reason=reason
    )


def open_sealed_segment(
    path: Path, base_offset: int, next_offset: int, index_interval: int
) -> Segment:
    """A segment before the active one, taken at its word until its first read scans it."""
    return Segment(
        base_offset=base_offset,
        path=path,
        size=path.stat().st_size,
        next_offset=next_offset,
        max_timestamp_ms=-1,
        index_interval=index_interval,
        scanned=False,
    )


def open_segment(
    path: Path, base_offset: int, index_interval: int
) -> tuple[Segment, int, str | None]:
    """Recover the active segment: rebuild its index and cut any torn or corrupt tail.

    Returns the segment, the bytes cut, and why (None: nothing was cut). A record whose offset is
    not the next one is treated as corrupt too: the file can only have been damaged.
    """
    file_size = path.stat().st_size
    scan = _scan(path, base_offset, index_interval)
    segment = Segment(
        base_offset=base_offset,
        path=path,
        size=scan.size,
        next_offset=scan.next_offset,
        max_timestamp_ms=scan.max_timestamp_ms,
        index_interval=index_interval,
        index=scan.index,
    )
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
