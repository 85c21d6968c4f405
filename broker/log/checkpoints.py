"""Small files beside the log that replication keeps: the text form they share (Kafka's: a
version line, a count line, one entry a line), and the high-watermark checkpoint.

The high watermarks of every partition a broker holds go in one file per log directory,
``replication-offset-checkpoint`` (Kafka's name and place), not one per partition: it is
rewritten every few seconds, and one atomic replacement (write, fsync, rename, fsync the
directory) for the whole directory costs what one partition's would, where a file each would cost
an fsync per partition per round, thousands of them at thousands of partitions. It is keyed by
topic id and partition, so a topic deleted and created again under its name never takes its
predecessor's high watermark.

A high watermark read back is at most the true one (it only rises, and the file is older than
now): a leader restarted with it serves less than it may, never more. So a damaged or missing
file is read as no high watermarks at all: that is safe, only slower to serve.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

from statemachine.partition_state import PartitionKey
from store.durable import replace_atomically

log = logging.getLogger(__name__)

HIGH_WATERMARKS = "replication-offset-checkpoint"
_VERSION = "0"


class CorruptCheckpoint(ValueError):
    """A checkpoint file does not read as one (written atomically, so damaged on disk)."""


def encode_rows(rows: Iterable[Sequence[object]]) -> bytes:
    """The checkpoint text of ``rows``: each row's values separated by a space."""
    lines = [" ".join(str(value) for value in row) for row in rows]
    return "\n".join([_VERSION, str(len(lines)), *lines, ""]).encode()


def decode_rows(path: Path, width: int) -> list[list[str]] | None:
    """The rows of the checkpoint file at ``path``, ``width`` values each (blocking); None if
    there is no such file. CorruptCheckpoint if it does not read as one."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    except UnicodeDecodeError as exc:
        raise CorruptCheckpoint(f"{path}: not text ({exc})") from None
    lines = text.splitlines()
    if len(lines) < 2 or lines[0].strip() != _VERSION:
        raise CorruptCheckpoint(f"{path}: no version {_VERSION} line")
    count = lines[1].strip()
    if not count.isdigit() or int(count) != len(lines) - 2:
        raise CorruptCheckpoint(f"{path}: says {count!r} entries, holds {len(lines) - 2}")
    rows = [line.split() for line in lines[2:]]
    for number, row in enumerate(rows, start=3):
        if len(row) != width:
            raise CorruptCheckpoint(f"{path}:{number}: {width} values expected: {row}")
    return rows


def write_high_watermarks(directory: Path, marks: Mapping[PartitionKey, int]) -> None:
    """Replace the log directory's high-watermark checkpoint with ``marks``, atomically and
    durably (blocking). Partitions left out are forgotten."""
    rows = [(key.topic_id, key.partition, mark) for key, mark in sorted(marks.items())]
    replace_atomically(directory / HIGH_WATERMARKS, encode_rows(rows))


def read_high_watermarks(directory: Path) -> dict[PartitionKey, int]:
    """The high watermarks the log directory's checkpoint holds (blocking); none if it has no
    checkpoint or a damaged one (see above: reading less is safe)."""
    path = directory / HIGH_WATERMARKS
    try:
        rows = decode_rows(path, 3)
        marks = {
            PartitionKey(topic_id=uuid.UUID(topic_id), partition=int(partition)): int(mark)
            for topic_id, partition, mark in rows or ()
        }
    except ValueError as exc:  # CorruptCheckpoint, or a value that is no uuid or int
        log.warning("%s is damaged, read as no high watermarks: %s", path, exc)
        return {}
    if any(mark < 0 or key.partition < 0 for key, mark in marks.items()):
        log.warning("%s holds a negative value, read as no high watermarks", path)
        return {}
    return marks
