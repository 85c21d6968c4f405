"""Writing a Spark task's rows to a topic with Produce, from the task's own process.

Rows need a ``value`` column and may have ``key``, ``partition`` and ``timestamp``; strings are
sent as UTF-8. A keyed row goes to ``crc32(key) % partitions`` like the project's producer
(``consumer.producer``), so a key's records stay in order on one partition whichever writes them.
Each batch is acknowledged (under the broker's fsync policy) before the task finishes; a task that
Spark retries produces its rows again (at least once).
"""

from __future__ import annotations

import datetime as dt
import itertools
import zlib
from collections.abc import Iterable
from typing import Any

import attrs

from pipeline.offsets import OptionError
from pipeline.wire import Cluster, PipelineError, Placement, client_security
from protocol import ErrorCode, TopicPartition
from protocol.batches import BatchBuilder
from transport.security import ClientSecurity

MAX_BATCH_RECORDS = 10_000
MAX_BATCH_BYTES = 1024 * 1024


def _bytes(value: Any) -> bytes | None:
    if value is None or isinstance(value, bytes):
        return value
    if isinstance(value, bytearray | memoryview):
        return bytes(value)
    return str(value).encode()


def _timestamp_ms(value: Any) -> int:
    if value is None:
        return -1  # the broker stamps its own time
    if isinstance(value, dt.datetime):
        return int(value.timestamp() * 1000)
    return int(value)


@attrs.define(eq=False)
class TopicWriter:
    bootstrap: str
    topic: str
    security: ClientSecurity | None = None
    _pending: dict[int, list[BatchBuilder]] = attrs.field(factory=dict)
    _round_robin: itertools.count[int] = attrs.field(factory=itertools.count)

    @classmethod
    def from_options(cls, options: dict[str, str]) -> TopicWriter:
        topic = options.get("topic")
        if not topic:
            raise OptionError("writing to format coordinator needs the topic option")
        return cls(
            bootstrap=options.get("bootstrap", "127.0.0.1:9092"),
            topic=topic,
            security=client_security(options),
        )

    def write_rows(self, rows: Iterable[Any]) -> int:
        """Produce every row; returns how many were acknowledged."""
        written = 0
        with Cluster(self.bootstrap, self.security) as cluster:
            placements = self._placements(cluster)
            for row in rows:
                fields = row.asDict() if hasattr(row, "asDict") else dict(row)
                key = _bytes(fields.get("key"))
                if fields.get("partition") is not None:
                    partition = int(fields["partition"])
                elif key is not None:
                    partition = zlib.crc32(key) % len(placements)
                else:
                    partition = next(self._round_robin) % len(placements)
                value = _bytes(fields.get("value"))
                timestamp_ms = _timestamp_ms(fields.get("timestamp"))
                batches = self._pending.setdefault(partition, [])
                if not batches or not batches[-1].append(value, key, timestamp_ms):
                    # a row whose timestamp the open batch cannot carry starts the next one
                    batches.append(BatchBuilder(max_bytes=MAX_BATCH_BYTES))
                    batches[-1].append(value, key, timestamp_ms)
                last = batches[-1]
                if last.count >= MAX_BATCH_RECORDS or last.size >= MAX_BATCH_BYTES:
                    written += self._send(cluster, placements, partition)
            for partition in list(self._pending):
                written += self._send(cluster, placements, partition)
        return written

    def _placements(self, cluster: Cluster) -> list[Placement]:
        found = cluster.placements([self.topic])
        ordered = [found[tp] for tp in sorted(found) if tp.topic == self.topic]
        if not ordered:
            raise PipelineError(f"topic {self.topic!r}", ErrorCode.UNKNOWN_TOPIC_OR_PARTITION)
        return ordered

    def _send(self, cluster: Cluster, placements: list[Placement], partition: int) -> int:
        batches = self._pending.pop(partition, [])
        if not batches:
            return 0
        if not 0 <= partition < len(placements):
            tp = TopicPartition(topic=self.topic, partition=partition)
            raise PipelineError(f"partition {tp}", ErrorCode.UNKNOWN_TOPIC_OR_PARTITION)
        cluster.produce(placements[partition], b"".join(b.build() for b in batches))
        return sum(b.count for b in batches)
