"""An append-only journal of checksummed JSON lines, each durable before ``append`` returns.

A line is ``<crc32 of the JSON, 8 hex digits> <JSON>\\n``. Writes are serialized and each is synced
before the next, so at most one line can be unfinished when the process or the machine dies, and
it is the last one. Opening the journal therefore drops a torn or corrupt *last* line (a write
that never returned) and refuses a bad line anywhere else: that is damage to writes that were
acknowledged, and silently dropping them would break the store's promise.
"""

from __future__ import annotations

import json
import logging
import os
import pathlib
import zlib
from typing import Any

import attrs

from .durable import fsync_dir, pwrite_all
from .interface import StoreUnavailable

__all__ = ["Journal"]

logger = logging.getLogger(__name__)

_CRC_DIGITS = 8


def _frame(entry: dict[str, Any]) -> bytes:
    # ensure_ascii keeps every newline inside a string escaped, so "\n" only ever ends a line.
    payload = json.dumps(entry, separators=(",", ":"), check_circular=False).encode("ascii")
    return b"%08x %s\n" % (zlib.crc32(payload), payload)


def _unframe(line: bytes) -> dict[str, Any] | None:
    """The entry in a line without its newline, or None if the line is not one we wrote whole."""
    if len(line) <= _CRC_DIGITS + 1 or line[_CRC_DIGITS : _CRC_DIGITS + 1] != b" ":
        return None
    payload = line[_CRC_DIGITS + 1 :]
    try:
        if int(line[:_CRC_DIGITS], 16) != zlib.crc32(payload):
            return None
        entry = json.loads(payload)
    except ValueError:
        return None
    return entry if isinstance(entry, dict) else None


def _parse(data: bytes, path: pathlib.Path) -> tuple[list[dict[str, Any]], int]:
    """The entries of the whole lines and the length of the prefix they occupy."""
    entries: list[dict[str, Any]] = []
    position = 0
    while position < len(data):
        end = data.find(b"\n", position)
        if end == -1:
            break  # torn: the last write never finished
        entry = _unframe(data[position:end])
        if entry is None:
            if end + 1 < len(data):
                raise StoreUnavailable(
                    f"{path} is damaged at byte {position}, before writes that were "
                    "acknowledged; refusing to drop them (restore the file or move it away)"
                )
            break  # a whole last line that does not check out: a write that never returned
        entries.append(entry)
        position = end + 1
    return entries, position


@attrs.define
class Journal:
    path: pathlib.Path
    _fd: int
    _size: int
    """Where the next line goes: the end of the last line that was fully written and synced."""
    _broken: bool = False

    @classmethod
    def open(cls, path: pathlib.Path) -> tuple[Journal, list[dict[str, Any]]]:
        """Open (or create) the journal and return it with the entries it holds, having cut off a
        torn or corrupt last line so the next append starts on a clean line."""
        try:
            created = not path.exists()
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except OSError as exc:
            raise StoreUnavailable(f"cannot open {path}: {exc}") from exc
        try:
            if created:
                fsync_dir(path.parent)
            data = _read_all(fd)
            entries, size = _parse(data, path)
            if size < len(data):
                logger.warning(
                    "%s: dropping %d bytes of an unfinished last write", path, len(data) - size
                )
                os.ftruncate(fd, size)
                os.fsync(fd)
        except OSError as exc:
            os.close(fd)
            raise StoreUnavailable(f"cannot read {path}: {exc}") from exc
        except BaseException:
            os.close(fd)
            raise
        return cls(path=path, fd=fd, size=size), entries

    @property
    def size(self) -> int:
        return self._size

    def append(self, entry: dict[str, Any]) -> None:
        """Write one line and sync it; on failure leave the file as it was before, or, if even that
        fails, refuse every later append so that nothing can land behind a half-written line."""
        if self._broken:
            raise StoreUnavailable(f"{self.path} failed earlier and could not be repaired; reopen")
        line = _frame(entry)
        try:
            pwrite_all(self._fd, line, self._size)
            os.fdatasync(self._fd)
        except OSError as exc:
            self._cut_back()
            raise StoreUnavailable(f"cannot write {self.path}: {exc}") from exc
        self._size += len(line)

    def clear(self) -> None:
        """Empty the journal once a snapshot covers all of it. Raises ``OSError``; a journal that
        could not be emptied still holds only entries the snapshot covers, which is harmless."""
        os.ftruncate(self._fd, 0)
        # From here on the file may be empty, so the next line must go to its start; if the
        # emptying cannot be synced, old bytes could come back behind new lines after a crash.
        self._size = 0
        try:
            os.fsync(self._fd)
        except OSError:
            self._broken = True
            raise

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def _cut_back(self) -> None:
        try:
            os.ftruncate(self._fd, self._size)
            os.fsync(self._fd)
        except OSError:
            logger.exception("%s: cannot remove a failed write; refusing further writes", self.path)
            self._broken = True


def _read_all(fd: int) -> bytes:
    chunks = []
    offset = 0
    while chunk := os.pread(fd, 1 << 20, offset):
        chunks.append(chunk)
        offset += len(chunk)
    return b"".join(chunks)
