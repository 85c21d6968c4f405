"""The broker's partition logs: append-only segment files of the wire's record batches."""

from .config import FsyncPolicy, LogConfig
from .files import SegmentFiles
from .format import (
    LOG_FORMAT,
    UPGRADABLE_FORMAT,
    LogFormatError,
    check_log_format,
    mark_log_format,
    read_partition_id,
    write_partition_id,
)
from .partition import (
    LogFailed,
    OffsetOutOfRange,
    PartitionLog,
    WrongIncarnation,
    open_partition_log,
)
from .segment import CorruptSegment

__all__ = [
    "LOG_FORMAT",
    "UPGRADABLE_FORMAT",
    "CorruptSegment",
    "FsyncPolicy",
    "LogConfig",
    "LogFailed",
    "LogFormatError",
    "OffsetOutOfRange",
    "PartitionLog",
    "SegmentFiles",
    "WrongIncarnation",
    "check_log_format",
    "mark_log_format",
    "open_partition_log",
    "read_partition_id",
    "write_partition_id",
]
