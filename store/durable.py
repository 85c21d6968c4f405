"""The few POSIX steps that make a file write survive a crash, in one place.

Everything here raises ``OSError`` as the kernel reported it; callers decide what a failure means.
"""

from __future__ import annotations

import contextlib
import os
import pathlib

__all__ = ["fsync_dir", "pwrite_all", "replace_atomically"]


def fsync_dir(directory: pathlib.Path) -> None:
    """A created or renamed file is not durable until its directory's entries are synced too."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def pwrite_all(fd: int, data: bytes, offset: int) -> None:
    """Write all of ``data``: near a size limit or on a full disk, one write may come out short."""
    view = memoryview(data)
    while view:
        written = os.pwrite(fd, view, offset)
        view = view[written:]
        offset += written


def replace_atomically(path: pathlib.Path, data: bytes) -> None:
    """Replace ``path`` with ``data`` so that a crash at any point leaves the old file or the new
    one, never a mixture: write a temporary file, fsync it, rename it over, fsync the directory."""
    temporary = path.with_name(path.name + ".tmp")
    try:
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
        try:
            pwrite_all(fd, data, 0)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(temporary, path)
    except OSError:
        with contextlib.suppress(OSError):
            temporary.unlink()
        raise
    fsync_dir(path.parent)
