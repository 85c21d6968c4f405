"""A partition's leader-epoch cache (KIP-101): the first offset each leader epoch wrote, kept
in ``leader-epoch-checkpoint`` in the partition's directory (Kafka's name and text).

A record batch here has no field for the leader epoch it was written under (SPEC.md §6.2), so
the epochs live beside the log, not in it. A follower asks its leader where the epoch it last
fetched ends on the leader, and truncates to that end rather than to its high watermark, which
may be below records the leader kept (KIP-101) or above records a new leader never had.

The cache is read once and changed only through this class, each change written whole and
atomically before it is taken (write a temporary file, fsync it, rename it, fsync the
directory): a crash leaves the old cache or the new one. A truncation cuts the log first and
the cache after, so a crash between leaves entries past the log's end, which the log drops when
it reads the cache again (``PartitionLog.leader_epochs``); the reverse order could leave
records past the cache's last epoch, counted in an epoch that did not write them.
"""

from __future__ import annotations

import bisect
import itertools
from pathlib import Path

import attrs

from statemachine.partition_state import EpochStart
from store.durable import replace_atomically

from .checkpoints import CorruptCheckpoint, decode_rows, encode_rows

LEADER_EPOCHS = "leader-epoch-checkpoint"
#: Kafka's answer for an epoch it cannot place: no epoch, no offset.
UNDEFINED_EPOCH = -1
UNDEFINED_OFFSET = -1


class EpochRefused(ValueError):
    """An epoch assigned out of order: not above the latest one, or starting before it."""


@attrs.frozen(kw_only=True)
class EpochEnd:
    """Where an epoch ends in this log (Kafka's OffsetForLeaderEpoch answer): ``epoch`` is the
    largest epoch at most the one asked for, ``end_offset`` the start of the next larger one, or
    the log end for the latest. Both :data:`UNDEFINED_EPOCH` / :data:`UNDEFINED_OFFSET` for an
    epoch above every one known (or -1)."""

    epoch: int
    end_offset: int


def _start_of(entry: EpochStart) -> int:
    return entry.start_offset


def _epoch_of(entry: EpochStart) -> int:
    return entry.epoch


@attrs.define(eq=False)
class LeaderEpochCache:
    """Epoch starts, ascending in epoch and in start offset both (every method but the reads
    blocks: it writes the file)."""

    path: Path
    entries: tuple[EpochStart, ...] = ()

    @classmethod
    def load(cls, directory: Path) -> LeaderEpochCache:
        """The cache a partition directory holds (empty if none; blocking). CorruptCheckpoint if
        its file is damaged: an empty cache in its place could let a follower keep records its
        leader does not have."""
        path = directory / LEADER_EPOCHS
        rows = decode_rows(path, 2)
        try:
            entries = tuple(EpochStart(epoch=int(e), start_offset=int(s)) for e, s in rows or ())
        except ValueError:
            raise CorruptCheckpoint(f"{path}: an entry is not two integers") from None
        for before, after in itertools.pairwise(entries):
            if not (before.epoch < after.epoch and before.start_offset < after.start_offset):
                raise CorruptCheckpoint(f"{path}: {after} after {before}")
        if entries and (entries[0].epoch < 0 or entries[0].start_offset < 0):
            raise CorruptCheckpoint(f"{path}: {entries[0]} is negative")
        return cls(path=path, entries=entries)

    @property
    def latest(self) -> EpochStart | None:
        return self.entries[-1] if self.entries else None

    def assign(self, epoch: int, start_offset: int) -> None:
        """Record that ``epoch`` starts at ``start_offset`` (durably). An epoch at or below the
        latest, or starting before it, is refused (EpochRefused, nothing written); one starting
        where the latest starts replaces it (that epoch wrote nothing)."""
        latest = self.latest
        if epoch < 0 or start_offset < 0:
            raise EpochRefused(f"epoch {epoch} at offset {start_offset}: negative")
        if latest is not None:
            if epoch <= latest.epoch:
                raise EpochRefused(f"epoch {epoch} is not above the latest, {latest.epoch}")
            if start_offset < latest.start_offset:
                raise EpochRefused(
                    f"epoch {epoch} at offset {start_offset} starts before epoch "
                    f"{latest.epoch}, at {latest.start_offset}"
                )
        kept = self.entries
        if latest is not None and start_offset == latest.start_offset:
            kept = kept[:-1]
        self._replace((*kept, EpochStart(epoch=epoch, start_offset=start_offset)))

    def end_offset_for(self, epoch: int, log_end_offset: int) -> EpochEnd:
        """Where ``epoch`` ends in a log ending at ``log_end_offset``, as Kafka answers it: the
        latest epoch ends at the log end; an earlier one where the next larger one starts,
        named by the largest epoch at most the one asked for (the one whose records those are;
        the epoch asked for itself if it is below every one known); an epoch above every one
        known (or none known) is undefined."""
        latest = self.latest
        if epoch < 0 or latest is None:
            return EpochEnd(epoch=UNDEFINED_EPOCH, end_offset=UNDEFINED_OFFSET)
        if epoch == latest.epoch:
            return EpochEnd(epoch=epoch, end_offset=log_end_offset)
        higher = bisect.bisect_right(self.entries, epoch, key=_epoch_of)
        if higher == len(self.entries):
            return EpochEnd(epoch=UNDEFINED_EPOCH, end_offset=UNDEFINED_OFFSET)
        end = self.entries[higher].start_offset
        floor = self.entries[higher - 1].epoch if higher else epoch
        return EpochEnd(epoch=floor, end_offset=end)

    def epoch_at(self, offset: int) -> int:
        """The epoch the record at ``offset`` was written in (:data:`UNDEFINED_EPOCH`: before
        every epoch known); a follower's last fetched epoch is ``epoch_at(log end - 1)``."""
        at = bisect.bisect_right(self.entries, offset, key=_start_of) - 1
        return self.entries[at].epoch if at >= 0 else UNDEFINED_EPOCH

    def starts_in(self, start_offset: int, end_offset: int) -> tuple[EpochStart, ...]:
        """The entries that records in [start_offset, end_offset) were written under: the one in
        force at ``start_offset`` and those starting after it, before ``end_offset`` (what a
        leader sends with the records it serves a follower, so that it learns their epochs)."""
        first = max(bisect.bisect_right(self.entries, start_offset, key=_start_of) - 1, 0)
        stop = bisect.bisect_left(self.entries, end_offset, key=_start_of)
        return self.entries[first:stop]

    def truncate_from_end(self, end_offset: int) -> None:
        """Drop the entries starting at ``end_offset`` or later: the log was cut there."""
        cut = bisect.bisect_left(self.entries, end_offset, key=_start_of)
        if cut < len(self.entries):
            self._replace(self.entries[:cut])

    def truncate_from_start(self, start_offset: int) -> None:
        """Drop the entries wholly before ``start_offset`` (the log's new start, after
        retention): the last one starting at or before it is kept, moved to start there, as
        the epoch of the log's first records."""
        before = bisect.bisect_right(self.entries, start_offset, key=_start_of)
        if not before or (before == 1 and self.entries[0].start_offset == start_offset):
            return
        moved = EpochStart(epoch=self.entries[before - 1].epoch, start_offset=start_offset)
        self._replace((moved, *self.entries[before:]))

    def _replace(self, entries: tuple[EpochStart, ...]) -> None:
        rows = [(entry.epoch, entry.start_offset) for entry in entries]
        replace_atomically(self.path, encode_rows(rows))
        self.entries = entries
