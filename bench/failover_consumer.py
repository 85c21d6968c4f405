"""One consumer process of ``bench/failover.py``: the ``consumer`` library's group consumer over
several topics, printing every record it is given as it is given.

Each line on stdout is ``RECEIVED GENERATION TOPIC PARTITION OFFSET VALUE``: RECEIVED is
CLOCK_MONOTONIC (one clock for every process on the machine, so the parent can set it against
the moment of its fault), GENERATION the generation the consumer held when the record reached the
application, VALUE the producer's stamp. Each line is flushed before the next record is asked
for, so the parent sees a record when the application would have.

    python -m bench.failover_consumer --bootstrap H:P[,H:P...] --group G --session-timeout T \\
        TOPIC [TOPIC...]
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from typing import BinaryIO

import trio

from consumer import Consumer, ConsumerSettings, RecordStream, open_consumer
from transport.connect import parse_bootstrap


async def consume(args: argparse.Namespace) -> None:
    # The library's defaults: what a user's consumer does while its coordinator fails over.
    settings = ConsumerSettings(
        session_timeout=args.session_timeout,
        auto_offset_reset="earliest",
        client_id=args.client_id,
    )
    topics = {topic: 1 for topic in args.topics}
    out = sys.stdout.buffer
    async with (
        open_consumer(args.bootstrap, args.group, topics=topics, settings=settings) as consumer,
        trio.open_nursery() as nursery,
    ):
        for topic in args.topics:
            for stream in consumer.streams_for(topic):
                nursery.start_soon(_print, consumer, stream, out)


async def _print(consumer: Consumer, stream: RecordStream, out: BinaryIO) -> None:
    async for record in stream:
        line = (
            f"{time.monotonic():.6f} {consumer.generation} {record.topic} {record.partition} "
            f"{record.offset} "
        ).encode()
        out.write(line + (record.value or b"") + b"\n")
        out.flush()


class _Monotonic(logging.Formatter):
    """Log lines stamped with CLOCK_MONOTONIC, the clock of the records' lines and of the
    parent's fault (``fault.txt`` in the run's work directory)."""

    def format(self, record: logging.LogRecord) -> str:
        return f"{time.monotonic():.6f} {super().format(record)}"


def main() -> None:
    handler = logging.StreamHandler()
    handler.setFormatter(_Monotonic("%(levelname)s %(name)s: %(message)s"))
    level = os.environ.get("BENCH_CONSUMER_LOG_LEVEL", "WARNING")
    logging.basicConfig(level=level, handlers=[handler])
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bootstrap", type=parse_bootstrap, required=True)
    parser.add_argument("--group", required=True)
    parser.add_argument("--session-timeout", type=float, required=True)
    parser.add_argument("--client-id", default="bench-failover")
    parser.add_argument("topics", nargs="+")
    trio.run(consume, parser.parse_args())


if __name__ == "__main__":
    main()
