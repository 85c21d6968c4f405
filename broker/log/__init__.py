"""The broker's partition logs: append-only segment files of the wire's record batches."""

from .config import FsyncPolicy, LogConfig
from .files import SegmentFiles
from .format import LOG_FORMAT, LogFormatError, check_log_format
from .partition import LogFailed, OffsetOutOfRange, PartitionLog, open_partition_log
from .segment import CorruptSegment

__all__ = [
    "LOG_FORMAT",
    "CorruptSegment",
    "FsyncPolicy",
    "LogConfig",
    "LogFailed",
    "LogFormatError",
    "OffsetOutOfRange",
    "PartitionLog",
    "SegmentFiles",
    "check_log_format",
    "open_partition_log",
]
