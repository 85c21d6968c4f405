"""One consumer process of ``bench/incremental.py``: the ``consumer`` library's group consumer,
printing its rebalance callbacks as JSON lines as they happen.

Each line on stdout is one JSON object with ``t`` (CLOCK_MONOTONIC, one clock for every process
on the machine, so the parent can set it against its own trigger and the other consumers) and
``event``:

* ``revoked``: ``partitions`` ("topic/partition") stopped; the callback runs once their fetchers
  have stopped, just before the StopFetcher answer (or the clean close) leaves;
* ``assigned``: ``partitions`` started, and ``generation``; the callback runs as the
  StartFetcher is carried out;
* ``records``: ``count`` records handed to the application since the previous such line (one a
  second), to show that records flow;
* ``opening``: the process has started and is about to join (a join's trigger, without the
  interpreter's start-up);
* ``closed``: the consumer left its group cleanly (SIGTERM or SIGINT asks it to).

    python -m bench.incremental_consumer --bootstrap H:P --group G --session-timeout T \\
        [--instance-id ID] TOPIC [TOPIC...]
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import time
from typing import Any

import attrs
import trio

from consumer import Consumer, ConsumerSettings, RecordStream, open_consumer
from protocol.types import TopicPartition
from transport.connect import parse_bootstrap


def emit(event: str, **fields: Any) -> None:
    line = {"t": time.monotonic(), "event": event, **fields}
    sys.stdout.write(json.dumps(line) + "\n")
    sys.stdout.flush()


def names(partitions: frozenset[TopicPartition]) -> list[str]:
    return sorted(f"{tp.topic}/{tp.partition}" for tp in partitions)


def settings_for(args: argparse.Namespace) -> ConsumerSettings:
    options: dict[str, Any] = {
        "session_timeout": args.session_timeout,
        "auto_offset_reset": "largest",
        "client_id": args.client_id,
        "max_retry_backoff": 1.0,
        "fetch_idle_interval": args.fetch_idle_interval,
    }
    if args.instance_id is not None:
        if "instance_id" not in attrs.fields_dict(ConsumerSettings):
            raise SystemExit("this consumer library has no instance_id setting")
        options["instance_id"] = args.instance_id
    return ConsumerSettings(**options)


async def consume(args: argparse.Namespace) -> None:
    received = 0

    async def revoked(partitions: frozenset[TopicPartition]) -> None:
        emit("revoked", partitions=names(partitions))

    async def assigned(partitions: frozenset[TopicPartition]) -> None:
        emit("assigned", partitions=names(partitions), generation=consumer.generation)

    async def drain(stream: RecordStream) -> None:
        nonlocal received
        async for _record in stream:
            received += 1

    async def report() -> None:
        nonlocal received
        while True:
            await trio.sleep(1)
            emit("records", count=received)
            received = 0

    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        # The process is up (interpreter and imports): from here on a join is the library's.
        emit("opening")
        consumer: Consumer
        async with (
            open_consumer(
                args.bootstrap,
                args.group,
                topics={topic: 1 for topic in args.topics},
                settings=settings_for(args),
                on_revoked=revoked,
                on_assigned=assigned,
            ) as consumer,
            trio.open_nursery() as nursery,
        ):
            for topic in args.topics:
                for stream in consumer.streams_for(topic):
                    nursery.start_soon(drain, stream)
            nursery.start_soon(report)
            async for _ in signals:
                break
            nursery.cancel_scope.cancel()
        # Leaving the block closed the consumer: fetchers stopped, then the group was left.
        emit("closed")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bootstrap", type=parse_bootstrap, required=True)
    parser.add_argument("--group", required=True)
    parser.add_argument("--session-timeout", type=float, required=True)
    parser.add_argument("--instance-id", default=None)
    parser.add_argument("--client-id", default="bench-incremental")
    parser.add_argument("--fetch-idle-interval", type=float, default=0.5)
    parser.add_argument("topics", nargs="+")
    trio.run(consume, parser.parse_args())


if __name__ == "__main__":
    main()
