"""The log directory's format version, so that a broker never reads a log it does not understand,
and each partition directory's incarnation, so that it never serves one topic's log as another's.

Torn-tail recovery cuts whatever does not parse as the current format, so a broker started on a
log of another format would take every record in it for a torn tail and delete it. The log
directory therefore names its format in a file, and a broker refuses to start on one it does not
know, saying what to do, before it opens any partition.

A topic deleted and created again under its name is another topic (docs/design.md#topic-ids), so
a partition directory, named after the topic, names the incarnation its records belong to in a
``partition.metadata`` file (Kafka's name and text: ``version: 0`` and ``topic_id: <uuid>``),
written before the directory holds any record. Format 2 had no such file: a broker reading
format 2 gives each partition the id its store now gives the topic, then marks the log format 3.

The log directory has an identity of its own (KIP-858), ``log-dir.metadata`` holding
``directory.id=<uuid>``: a replica is in sync as a broker *and* a directory, so that a broker
whose disk was wiped (a directory made anew, so a new id) is not taken for the one that held the
records. It is independent of the format: a directory of any format gets one the first time it
is asked for, and keeps it.
"""

from __future__ import annotations

import uuid
from pathlib import Path

from protocol.types import TopicId
from store.durable import replace_atomically

#: 1: records one at a time (``protocol.records``), no version file. 2: record batches. 3: each
#: partition directory names its topic's id (``partition.metadata``).
LOG_FORMAT = 3
#: The format this broker upgrades to :data:`LOG_FORMAT` when it starts on it.
UPGRADABLE_FORMAT = 2
FORMAT_FILE = "log-format"
PARTITION_METADATA = "partition.metadata"
LOG_DIR_METADATA = "log-dir.metadata"


class LogFormatError(ValueError):
    """The log directory holds a format this broker does not read."""


def check_log_format(directory: Path) -> int:
    """Refuse a log of another format; mark a new or empty one as ours (blocking). Returns the
    format found: :data:`LOG_FORMAT`, or :data:`UPGRADABLE_FORMAT`, which the broker upgrades
    once it knows its topics' ids (:func:`mark_log_format`)."""
    marker = directory / FORMAT_FILE
    try:
        text = marker.read_text().strip()
    except FileNotFoundError:
        text = None
    if text is None:
        if directory.is_dir() and any(p.is_dir() for p in directory.iterdir()):
            found = "format 1 (records one at a time, no version file)"
        else:
            directory.mkdir(parents=True, exist_ok=True)
            mark_log_format(directory)
            return LOG_FORMAT
    elif text in (str(LOG_FORMAT), str(UPGRADABLE_FORMAT)):
        return int(text)
    else:
        found = f"format {text!r}"
    raise LogFormatError(
        f"the log in {directory} is {found}, and this broker reads log format {LOG_FORMAT} "
        f"(or {UPGRADABLE_FORMAT}, which it upgrades) only: start it with an empty --data-dir, "
        f"or move {directory} away (its records are not converted)"
    )


def mark_log_format(directory: Path) -> None:
    """Name the directory's format as :data:`LOG_FORMAT`, durably (blocking)."""
    replace_atomically(directory / FORMAT_FILE, f"{LOG_FORMAT}\n".encode())


def read_partition_id(directory: Path) -> TopicId | None:
    """The topic id a partition directory names (blocking); None if it names none, or names it
    in a form this broker does not read."""
    try:
        text = (directory / PARTITION_METADATA).read_text()
    except FileNotFoundError:
        return None
    fields = dict(line.partition(":")[::2] for line in text.splitlines())
    if fields.get("version", "").strip() != "0":
        return None
    try:
        return uuid.UUID(fields.get("topic_id", "").strip())
    except ValueError:
        return None


def write_partition_id(directory: Path, topic_id: TopicId) -> None:
    """Name the topic incarnation a partition directory's records belong to, durably (blocking)."""
    replace_atomically(
        directory / PARTITION_METADATA, f"version: 0\ntopic_id: {topic_id}\n".encode()
    )


def log_dir_id(directory: Path) -> uuid.UUID:
    """The log directory's identity (blocking), made durably, a new random one, if it has none:
    the directory is new, or was wiped (its records with it), or was made before directories
    had one. LogFormatError if its file is damaged: a replacement would make this broker's
    replicas out of sync at once, which the operator should decide, not the broker."""
    path = directory / LOG_DIR_METADATA
    try:
        text = path.read_text()
    except FileNotFoundError:
        directory.mkdir(parents=True, exist_ok=True)
        made = uuid.uuid4()
        replace_atomically(path, f"directory.id={made}\n".encode())
        return made
    except UnicodeDecodeError:
        text = ""
    fields = dict(line.partition("=")[::2] for line in text.splitlines())
    try:
        return uuid.UUID(fields.get("directory.id", "").strip())
    except ValueError:
        raise LogFormatError(
            f"{path} names no directory.id: delete it to give {directory} a new identity (its "
            "replicas then count as new, out of sync until they catch up)"
        ) from None
