"""The broker's partition logs: append-only segment files of the wire's record batches."""

from .checkpoints import CorruptCheckpoint, read_high_watermarks, write_high_watermarks
from .config import FsyncPolicy, LogConfig
from .epochs import UNDEFINED_EPOCH, UNDEFINED_OFFSET, EpochEnd, EpochRefused, LeaderEpochCache
from .files import SegmentFiles
from .format import (
    LOG_FORMAT,
    UPGRADABLE_FORMAT,
    LogFormatError,
    check_log_format,
    log_dir_id,
    mark_log_format,
    read_partition_id,
    write_partition_id,
)
from .partition import (
    LogFailed,
    NotContiguous,
    OffsetOutOfRange,
    PartitionLog,
    WrongIncarnation,
    open_partition_log,
)
from .segment import CorruptSegment

__all__ = [
    "LOG_FORMAT",
    "UNDEFINED_EPOCH",
    "UNDEFINED_OFFSET",
    "UPGRADABLE_FORMAT",
    "CorruptCheckpoint",
    "CorruptSegment",
    "EpochEnd",
    "EpochRefused",
    "FsyncPolicy",
    "LeaderEpochCache",
    "LogConfig",
    "LogFailed",
    "LogFormatError",
    "NotContiguous",
    "OffsetOutOfRange",
    "PartitionLog",
    "SegmentFiles",
    "WrongIncarnation",
    "check_log_format",
    "log_dir_id",
    "mark_log_format",
    "open_partition_log",
    "read_high_watermarks",
    "read_partition_id",
    "write_high_watermarks",
    "write_partition_id",
]
