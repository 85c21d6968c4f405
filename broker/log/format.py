"""The log directory's format version, so that a broker never reads a log it does not understand.

Torn-tail recovery cuts whatever does not parse as the current format, so a broker started on a
log of another format would take every record in it for a torn tail and delete it. The log
directory therefore names its format in a file, and a broker refuses to start on one it does not
know, saying what to do, before it opens any partition.
"""

from __future__ import annotations

import os
from pathlib import Path

#: 1: records one at a time (``protocol.records``), no version file. 2: record batches.
LOG_FORMAT = 2
FORMAT_FILE = "log-format"


class LogFormatError(ValueError):
    """The log directory holds a format this broker does not read."""


def check_log_format(directory: Path) -> None:
    """Refuse a log of another format; mark a new or empty one as ours (blocking)."""
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
            tmp = marker.with_suffix(".tmp")
            tmp.write_text(f"{LOG_FORMAT}\n")
            fd = os.open(tmp, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(tmp, marker)
            return
    elif text == str(LOG_FORMAT):
        return
    else:
        found = f"format {text!r}"
    raise LogFormatError(
        f"the log in {directory} is {found}, and this broker reads log format {LOG_FORMAT} only: "
        f"start it with an empty --data-dir, or move {directory} away (its records are not "
        "converted)"
    )
