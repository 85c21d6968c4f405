"""Offsets as Spark checkpoints them, and the arithmetic of planning a read. No I/O.

An offset map is JSON ``{"topic": {"0": 10, "1": 7}}``: for each partition the next offset to
read, exactly like a committed group offset, so a batch's end offsets are what the group commits.
The source adds each topic's id under ``"id"`` (``{"topic": {"id": "<uuid>", "0": 10}}``), the
incarnation the offsets belong to (docs/design.md#topic-ids): a checkpoint names topics, and a
topic deleted and created again under its name must not be read on from the old one's offsets.
"""

from __future__ import annotations

import itertools
import json
import re
import uuid
from collections.abc import Iterable, Mapping
from typing import Any

from protocol import TopicId, TopicPartition

Offsets = dict[TopicPartition, int]
TopicIds = dict[str, TopicId]
OffsetsJson = dict[str, dict[str, int | str]]

STARTING_KEYWORDS = ("earliest", "latest", "group")
#: The key of a topic's id in its map; partitions are numbers, so it is never one's.
ID_KEY = "id"


class OptionError(ValueError):
    """An option missing, unknown or of a wrong value (its message says which, and what is
    taken instead)."""


class TopicRecreated(Exception):
    """A topic was deleted, and created again under its name, since a query took offsets from
    it: they belong to the deleted topic and mean nothing in the new one, so the query fails
    (as Spark's Kafka source fails one that lost data, ``failOnDataLoss``) rather than read
    the new topic from them or skip its first records. ``new`` None: the topic was found to be
    gone while being read, and what (if anything) replaced it is not known."""

    def __init__(self, topic: str, old: TopicId, new: TopicId | None) -> None:
        what = (
            f"was deleted and created again since this query read it (its id was {old}, it is"
            f" now {new})"
            if new is not None
            else f"was deleted, and perhaps created again, while this query read it (its id"
            f" was {old})"
        )
        super().__init__(
            f"topic {topic!r} {what}: the offsets the query holds belong to the deleted topic."
            " To read the new topic, start the query again, a streaming one with a new"
            " checkpoint location (startingOffsets says where it begins)"
        )
        self.topic = topic
        self.old = old
        self.new = new

    def __reduce__(self) -> tuple[type[TopicRecreated], tuple[str, TopicId, TopicId | None]]:
        return (type(self), (self.topic, self.old, self.new))


def to_json(
    offsets: Mapping[TopicPartition, int], ids: Mapping[str, TopicId] | None = None
) -> OffsetsJson:
    """The map Spark checkpoints; ``ids`` names the incarnation of the topics it has."""
    ids = ids or {}
    result: OffsetsJson = {}
    for tp in sorted(offsets):
        partitions = result.get(tp.topic)
        if partitions is None:
            partitions = result[tp.topic] = {}
            if (topic_id := ids.get(tp.topic)) is not None:
                partitions[ID_KEY] = str(topic_id)
        partitions[str(tp.partition)] = offsets[tp]
    return result


def _parsed(data: Mapping[str, Mapping[str, int | str]] | str) -> Mapping[str, Any]:
    if isinstance(data, str):
        data = json.loads(data)
        assert isinstance(data, dict)
    return data


def from_json(data: Mapping[str, Mapping[str, int | str]] | str) -> Offsets:
    """The offsets of a map (its ids, if any, left out: :func:`ids_from_json`)."""
    return {
        TopicPartition(topic=topic, partition=int(partition)): int(offset)
        for topic, partitions in _parsed(data).items()
        for partition, offset in partitions.items()
        if partition != ID_KEY
    }


def ids_from_json(data: Mapping[str, Mapping[str, int | str]] | str) -> TopicIds:
    """The topic ids a map names; a map written before ids (or by hand) names none."""
    return {
        topic: uuid.UUID(str(partitions[ID_KEY]))
        for topic, partitions in _parsed(data).items()
        if ID_KEY in partitions
    }


def carry_ids(taken: Mapping[str, TopicId], current: Mapping[str, TopicId]) -> TopicIds:
    """The ids of the next offsets of a stream whose last ones were ``taken`` under those ids,
    now that the topics have ``current`` ids: TopicRecreated if a topic's id changed. A topic
    that is gone keeps its id, so that it is not read on if it comes back as another; one the
    last offsets named no id for (a checkpoint written before ids) takes its current one."""
    for topic, old in sorted(taken.items()):
        new = current.get(topic)
        if new is not None and new != old:
            raise TopicRecreated(topic, old, new)
    return {**current, **taken}


class TopicSelector:
    """The ``topic`` / ``topics`` / ``pattern`` options: which topics a read covers. A pattern
    is matched in full and re-evaluated at every micro-batch, so topics created later join."""

    def __init__(self, options: Mapping[str, str]) -> None:
        given = [key for key in ("topic", "topics", "pattern") if options.get(key)]
        if len(given) != 1:
            raise OptionError("give exactly one of the options topic, topics, pattern")
        self.names: tuple[str, ...] | None = None
        self.pattern: re.Pattern[str] | None = None
        if given[0] == "pattern":
            self.pattern = re.compile(options["pattern"])
        else:
            text = options[given[0]]
            self.names = tuple(t.strip() for t in text.split(",") if t.strip())

    def matches(self, topic: str) -> bool:
        if self.pattern is not None:
            return self.pattern.fullmatch(topic) is not None
        assert self.names is not None
        return topic in self.names


def starting_offsets(
    spec: str,
    bounds: Mapping[TopicPartition, tuple[int, int]],
    committed: Mapping[TopicPartition, int],
) -> Offsets:
    """Resolve ``startingOffsets`` against each partition's (log start, end).

    ``group`` reads from the group's committed offsets, and from the log start where the group has
    none; a JSON map names offsets per partition (-2 earliest, -1 latest) and the partitions it
    leaves out start at the log start. Offsets are clamped into the log's current bounds.
    """
    spec = spec.strip()
    if spec.startswith("{"):
        named = from_json(spec)
    elif spec in STARTING_KEYWORDS:
        named = {}
    else:
        raise OptionError(f"startingOffsets must be earliest, latest, group or JSON, not {spec!r}")
    result = {}
    for tp, (start, end) in bounds.items():
        if spec == "latest":
            offset = end
        elif spec == "group":
            offset = committed.get(tp, start)
        else:
            offset = named.get(tp, -2)
            offset = start if offset == -2 else end if offset == -1 else offset
        result[tp] = min(max(offset, start), end)
    return result


def limit_ends(start: Mapping[TopicPartition, int], ends: Offsets, max_rows: int) -> Offsets:
    """End offsets that read at most ``max_rows`` in all, shared fairly: each partition gets an
    equal share of what is left, and what a short partition does not use goes to the others."""
    available = {tp: max(ends[tp] - start.get(tp, ends[tp]), 0) for tp in ends}
    result = dict(ends)
    left = max_rows
    ordered = sorted(available, key=lambda tp: (available[tp], tp))
    for i, tp in enumerate(ordered):
        share = left // (len(ordered) - i)
        take = min(available[tp], share)
        result[tp] = start.get(tp, ends[tp]) + take
        left -= take
    return result


def ranges(
    start: Mapping[TopicPartition, int], end: Mapping[TopicPartition, int]
) -> Iterable[tuple[TopicPartition, int, int]]:
    """Non-empty (partition, from, until) of a batch; a partition missing from ``start`` is new
    since the batch before and is read from offset 0 (the reader skips to its log start)."""
    for tp in sorted(end):
        first = start.get(tp, 0)
        if end[tp] > first:
            yield tp, first, end[tp]


def split(
    ranges_: Iterable[tuple[TopicPartition, int, int]], min_partitions: int
) -> list[tuple[TopicPartition, int, int]]:
    """Cut long ranges so that a batch has about ``min_partitions`` Spark tasks (Kafka's source
    option of that name): a few big topic partitions then still keep every executor busy. Each
    range gets pieces in proportion to its length; a range is never cut below one record."""
    whole = list(ranges_)
    total = sum(end - start for _, start, end in whole)
    if len(whole) >= min_partitions or total == 0:
        return whole
    result: list[tuple[TopicPartition, int, int]] = []
    for tp, start, end in whole:
        pieces = min(max(1, round((end - start) * min_partitions / total)), end - start)
        bounds = [start + (end - start) * i // pieces for i in range(pieces + 1)]
        result.extend((tp, a, b) for a, b in itertools.pairwise(bounds))
    return result
