"""The broker's partition logs: append-only segment files in the wire's record encoding."""

from .config import FsyncPolicy, LogConfig
from .partition import LogFailed, OffsetOutOfRange, PartitionLog, open_partition_log
from .segment import CorruptSegment

__all__ = [
    "CorruptSegment",
    "FsyncPolicy",
    "LogConfig",
    "LogFailed",
    "OffsetOutOfRange",
    "PartitionLog",
    "open_partition_log",
]
