"""The segment files a broker holds open: one descriptor a segment at most, least recently used
closed first, within the file budget that client connections draw on too
(``transport.limits.FileBudget``).

A worker thread borrows a segment's descriptor for one append, read or fsync and gives it back.
A descriptor is closed only when no thread holds it, so a ``pread`` never reads a number that was
closed under it and perhaps reused meanwhile for another file (a socket, another segment): the
descriptors are reference counted. Closing is eviction (the budget is used up and a file must
open, or a connection asks for one back), retention deleting the segment, or the partition
closing; a segment whose descriptor was evicted is reopened on its next use.

Only a flushed descriptor is evicted: one whose bytes written through it an fsync covered (or
under ``fsync=never``, which promises nothing, any). The fsync that acknowledges them must be
one that can report their write-back error, which Linux reports to the descriptors that were
open when it happened. So when no idle descriptor is flushed (``fsync=interval``, more
partitions written within an interval than the budget holds), the thread that needs a place
fsyncs the least recently used idle one itself and closes it, keeping a failure on its segment
for the partition's next flush to report. Only when every open descriptor is borrowed by a
thread (one a thread at most) does a file open beyond the budget, into its reserve.
"""

from __future__ import annotations

import logging
import os
import threading
from collections import OrderedDict
from collections.abc import Iterator
from contextlib import contextmanager

import attrs

from transport.limits import FileBudget

from .config import FsyncPolicy, LogConfig
from .segment import Segment

log = logging.getLogger(__name__)


@attrs.define(eq=False)
class _Handle:
    fd: int
    #: Threads using ``fd`` now: it is closed only at zero.
    borrowers: int = 0
    #: Close it when the last borrower gives it back (the segment was deleted or closed).
    doomed: bool = False


@attrs.define(eq=False)
class SegmentFiles:
    """A broker's open segment files, shared by its partitions."""

    budget: FileBudget
    #: The log fsyncs what it writes: an unflushed descriptor must stay open (see above).
    durable: bool = True
    #: Descriptors opened, first openings and reopenings after an eviction alike.
    opened: int = 0
    #: Of those, the ones opened beyond the budget.
    beyond_budget: int = 0
    _handles: OrderedDict[Segment, _Handle] = attrs.field(factory=OrderedDict)
    _lock: threading.Lock = attrs.field(factory=threading.Lock)

    def __attrs_post_init__(self) -> None:
        self.budget.reclaim = self.evict_idle

    @classmethod
    def of(cls, budget: FileBudget, config: LogConfig) -> SegmentFiles:
        return cls(budget=budget, durable=config.fsync is not FsyncPolicy.NEVER)

    @property
    def open_count(self) -> int:
        return len(self._handles)

    @contextmanager
    def borrow(self, segment: Segment) -> Iterator[int]:
        """The segment's descriptor (read, write, append), open for the block's span."""
        fd = self._acquire(segment)
        try:
            yield fd
        finally:
            self._give_back(segment)

    def evict_idle(self) -> bool:
        """Close the least recently used descriptor that no thread holds and is flushed; False
        if there is none."""
        with self._lock:
            return self._evict_one()

    def discard(self, segment: Segment) -> None:
        """The segment is deleted or its partition closed: close its descriptor once no thread
        holds it, and open none for it again."""
        with self._lock:
            segment.discarded = True
            handle = self._handles.get(segment)
            if handle is None:
                return
            if handle.borrowers:
                handle.doomed = True
            else:
                self._close(segment, handle)

    def _acquire(self, segment: Segment) -> int:
        with self._lock:
            while (handle := self._handles.get(segment)) is None:
                if segment.discarded:
                    raise FileNotFoundError(f"{segment.path} was deleted")
                if self._make_room():
                    handle = self._open(segment)
                    break
                # the lock was let go for an fsync: the segment may be open by now
            self._handles.move_to_end(segment)
            handle.borrowers += 1
            return handle.fd

    def _give_back(self, segment: Segment) -> None:
        with self._lock:
            handle = self._handles[segment]
            handle.borrowers -= 1
            if handle.doomed and not handle.borrowers:
                self._close(segment, handle)

    def _make_room(self) -> bool:
        """(lock held) Take a place in the budget for one more file, closing an idle flushed one
        if need be; True once it is taken. Else fsync the least recently used idle one, letting
        the lock go meanwhile, and return False: the caller looks again."""
        if self.budget.take_file() or self._evict_one(keep_unit=True):
            return True
        idle = next((s for s, h in self._handles.items() if not h.borrowers), None)
        if idle is None:  # every one in use by a thread (one a thread): only a tiny budget
            self.budget.take_file(beyond=True)
            self.beyond_budget += 1
            log.warning(
                "a segment file opens beyond the file budget (%d files): every open one is in use",
                self.budget.limit,
            )
            return True
        self._sync(idle)
        return False

    def _sync(self, segment: Segment) -> None:
        """(lock held, let go during the fsync) Flush an idle segment's file so that it can be
        closed; a failure is kept on the segment for its partition's next flush to report."""
        handle = self._handles[segment]
        handle.borrowers += 1
        size = segment.size
        self._lock.release()
        try:
            os.fsync(handle.fd)
            segment.synced_size = max(segment.synced_size, size)
        except OSError as exc:
            segment.sync_error = exc
        finally:
            self._lock.acquire()
            handle.borrowers -= 1
            if handle.doomed and not handle.borrowers:
                self._close(segment, handle)

    def _open(self, segment: Segment) -> _Handle:
        """(lock held, a place in the budget taken for it)"""
        try:
            fd = os.open(segment.path, os.O_RDWR | os.O_APPEND)
        except BaseException:
            self.budget.return_file()
            raise
        self.opened += 1
        handle = _Handle(fd=fd)
        self._handles[segment] = handle
        return handle

    def _evict_one(self, keep_unit: bool = False) -> bool:
        """(lock held) With ``keep_unit`` the evicted file's place in the budget passes to the
        file about to open."""
        for segment, handle in self._handles.items():
            if handle.borrowers or (self.durable and not segment.flushed):
                continue
            self._close(segment, handle, keep_unit=keep_unit)
            return True
        return False

    def _close(self, segment: Segment, handle: _Handle, keep_unit: bool = False) -> None:
        del self._handles[segment]
        try:
            os.close(handle.fd)
        finally:
            if not keep_unit:
                self.budget.return_file()
