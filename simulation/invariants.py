"""The invariant checker's records: every fetch lease each consumer held, and the coordinator's
durable writes as they happen, so a regression or a two-owner instant is caught even if a later
state hides it."""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Sequence

import attrs
import trio
import trio.testing

from protocol.types import TopicPartition
from store import (
    GroupRecord,
    OffsetBatch,
)

log = logging.getLogger(__name__)


class InvariantViolation(AssertionError):
    """Two consumers held a fetch lease on one partition at once, an offset or a generation went
    backwards, or a settled group left a partition with no owner or with two."""


# --- the fetch-lease ledger -------------------------------------------------------------------


@attrs.frozen(kw_only=True)
class LeaseInterval:
    group_id: str
    consumer_id: str
    partition: TopicPartition
    start: float
    end: float


_Holder = tuple[str, str, TopicPartition]  # group, consumer, partition


@attrs.define
class OwnershipLedger:
    """Every fetch lease each simulated consumer held, as closed intervals of trio time.

    Groups are independent: two groups may read one partition at once, two members of one group
    may not."""

    _open: dict[_Holder, float] = attrs.field(factory=dict)
    closed: list[LeaseInterval] = attrs.field(factory=list)

    def began(self, group_id: str, consumer_id: str, partition: TopicPartition, at: float) -> None:
        self._open.setdefault((group_id, consumer_id, partition), at)

    def ended(self, group_id: str, consumer_id: str, partition: TopicPartition, at: float) -> None:
        start = self._open.pop((group_id, consumer_id, partition), None)
        if start is not None:
            self.closed.append(
                LeaseInterval(
                    group_id=group_id,
                    consumer_id=consumer_id,
                    partition=partition,
                    start=start,
                    end=at,
                )
            )

    def intervals(self, now: float) -> list[LeaseInterval]:
        still_open = [
            LeaseInterval(group_id=g, consumer_id=c, partition=tp, start=start, end=now)
            for (g, c, tp), start in self._open.items()
        ]
        return self.closed + still_open

    def holders(self, group_id: str, partition: TopicPartition) -> set[str]:
        return {c for (g, c, tp) in self._open if g == group_id and tp == partition}

    def check(self, now: float | None = None) -> None:
        """Raise InvariantViolation if two leases of one group on one partition overlapped."""
        at = trio.current_time() if now is None else now
        by_partition: dict[tuple[str, TopicPartition], list[LeaseInterval]] = defaultdict(list)
        for interval in self.intervals(at):
            by_partition[(interval.group_id, interval.partition)].append(interval)
        for (group_id, partition), intervals in by_partition.items():
            intervals.sort(key=lambda i: (i.start, i.end))
            latest: LeaseInterval | None = None
            for interval in intervals:
                overlaps = latest is not None and interval.start < latest.end
                if overlaps and latest is not None and interval.consumer_id != latest.consumer_id:
                    raise InvariantViolation(
                        f"group {group_id} {partition}: {latest.consumer_id} held it until "
                        f"{latest.end:.3f} but {interval.consumer_id} took it at "
                        f"{interval.start:.3f}"
                    )
                if latest is None or interval.end > latest.end:
                    latest = interval


# --- what the store was asked to make durable ------------------------------------------------


@attrs.define
class StoreHistory:
    """The coordinator's durable writes, seen as they happen: a regression between two writes is
    caught even if a later write hides it."""

    durable_offsets: dict[tuple[str, TopicPartition], int] = attrs.field(factory=dict)
    group_generations: dict[str, int] = attrs.field(factory=dict)
    #: How often each group was deleted: a group made again after that starts its generations
    #: anew, as a group that never existed.
    deletions: dict[str, int] = attrs.field(factory=dict)
    violations: list[str] = attrs.field(factory=list)

    def offsets_written(self, batches: Sequence[OffsetBatch]) -> None:
        for batch in batches:
            if batch.generation == -1:
                continue  # a standalone committer on an empty group may reset offsets anywhere
            for tp, offset in batch.offsets.items():
                key = (batch.group_id, tp)
                before = self.durable_offsets.get(key, -1)
                if offset < before:
                    self.violations.append(
                        f"group {batch.group_id} {tp}: durable offset went from {before} "
                        f"to {offset} (generation {batch.generation})"
                    )
                self.durable_offsets[key] = max(offset, before)

    def group_written(self, record: GroupRecord) -> None:
        before = self.group_generations.get(record.group_id, -1)
        # The record of a completed attempt is written again under its generation, marked so.
        if record.generation < before or (record.generation == before and not record.complete):
            self.violations.append(
                f"group {record.group_id}: generation {record.generation} persisted after {before}"
            )
        self.group_generations[record.group_id] = max(record.generation, before)

    def topic_offsets_deleted(self, topic: str, group_id: str | None = None) -> None:
        """A deleted topic's offsets (every group's, or one group's): a topic created again
        under the name starts its offsets anew, as a topic that never existed."""
        for key in [
            k for k in self.durable_offsets if k[1].topic == topic and group_id in (None, k[0])
        ]:
            del self.durable_offsets[key]

    def group_deleted(self, group_id: str) -> None:
        self.deletions[group_id] = self.deletions.get(group_id, 0) + 1
        self.group_generations.pop(group_id, None)
        for key in [k for k in self.durable_offsets if k[0] == group_id]:
            del self.durable_offsets[key]
