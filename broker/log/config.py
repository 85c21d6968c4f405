"""How a broker's log behaves: durability, segment size, retention."""

from __future__ import annotations

import enum

import attrs

from protocol.topic_configs import RETENTION_BYTES, RETENTION_MS, SEGMENT_BYTES


class FsyncPolicy(enum.Enum):
    #: fsync before a produce is acknowledged: an acknowledged record survives a power loss.
    ALWAYS = "always"
    #: fsync every ``fsync_interval_ms``: a process crash loses nothing (the kernel has the bytes),
    #: a power loss loses up to one interval.
    INTERVAL = "interval"
    #: leave it to the kernel.
    NEVER = "never"


@attrs.frozen(kw_only=True)
class LogConfig:
    #: The default is ALWAYS because the system promises that no acknowledged record is lost and
    #: group commit (one fsync for every append waiting on it) keeps its cost per batch, not per
    #: record (numbers in the broker's report: bench/throughput.py).
    fsync: FsyncPolicy = FsyncPolicy.ALWAYS
    fsync_interval_ms: int = attrs.field(default=1000, validator=attrs.validators.gt(0))
    segment_bytes: int = attrs.field(default=64 * 1024 * 1024, validator=attrs.validators.gt(0))
    #: Segments whose newest record is older than this are deleted (None: keep forever).
    retention_ms: int | None = 7 * 24 * 3600 * 1000
    #: Oldest segments are deleted while the rest still hold at least this much (None: no limit).
    retention_bytes: int | None = None
    retention_check_ms: int = attrs.field(default=60_000, validator=attrs.validators.gt(0))
    #: One index entry per this many bytes of segment: a lookup reads at most this much extra.
    index_interval_bytes: int = attrs.field(default=4096, validator=attrs.validators.gt(0))
    #: The active segment's index file is rewritten after an fsync that made this much more of
    #: it durable: after a crash, recovery checks at most this much (plus what no fsync covered)
    #: per partition. Not under ``never``, which fsyncs nothing but at a roll or a clean stop.
    index_checkpoint_bytes: int = attrs.field(
        default=4 * 1024 * 1024, validator=attrs.validators.gt(0)
    )
    #: A record batch larger than this (as sent, compressed or not) is refused with
    #: MESSAGE_TOO_LARGE.
    max_batch_bytes: int = attrs.field(default=1024 * 1024, validator=attrs.validators.gt(0))

    def for_topic(self, configs: tuple[tuple[str, str], ...]) -> LogConfig:
        """This broker's settings with those a topic was created with (checked already:
        protocol/topic_configs.py) in place of its own; -1 is "no limit", as in Kafka."""
        config = self
        for name, value in configs:
            # WORKAROUND (helper J, issue 37; broker/log is helper G's): a topic's settings
            # include non-log ones (unclean.leader.election.enable=true is no number), which
            # int() made a broker exit on; only the log's own are read here.
            if name not in (RETENTION_MS, RETENTION_BYTES, SEGMENT_BYTES):
                continue
            number = int(value)
            limit = None if number < 0 else number
            if name == RETENTION_MS:
                config = attrs.evolve(config, retention_ms=limit)
            elif name == RETENTION_BYTES:
                config = attrs.evolve(config, retention_bytes=limit)
            elif name == SEGMENT_BYTES:
                config = attrs.evolve(config, segment_bytes=number)
        return config
