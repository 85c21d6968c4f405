"""The CLI's ``produce`` and ``consume`` verbs: lines in, lines out.

``produce`` sends each line through the producer's fast path (records join record batches,
compressed with ``--compression``). ``consume`` prints one record value per line, a fetched batch
at a time, and flushes the batch's lines before asking for the next batch, so the offset it
reports (through Pings, on close) never covers a line that was not written out
(docs/design.md#offsets): a consumer killed mid-stream re-prints at most what it had printed but
not yet reported, never loses a line.
"""

from __future__ import annotations

import argparse
import math
import os
import signal
import sys
import uuid
from collections.abc import AsyncIterator

import trio

from cli.security import add_bootstrap_option, add_client_options, client_security
from consumer import (
    ConsumerSettings,
    CorruptBatch,
    Delivery,
    InstanceFenced,
    ProducerConfig,
    open_consumer,
    open_producer,
)
from consumer.admin import open_admin
from protocol.batches import Compression
from transport.refusals import Refused

#: Lines produced between two checkpoints (the producer does not yield per record).
PRODUCE_CHUNK = 500
#: Bytes of stdin read at a time by ``produce``.
READ_BLOCK = 64 * 1024


def add_data_commands(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    produce = commands.add_parser("produce", help="send lines from stdin as records")
    produce.add_argument("topic", help="the topic to send to")
    produce.add_argument(
        "--key-separator",
        metavar="SEP",
        help="split each line at the first SEP into key and value (default: no key)",
    )
    produce.add_argument("--progress", action="store_true", help="show progress on stderr")
    produce.add_argument(
        "--compression",
        choices=[c.name.lower() for c in Compression],
        default="none",
        help="compress each record batch (stored compressed; consumers decompress)",
    )
    consume = commands.add_parser("consume", help="print records as lines, in a group")
    consume.add_argument("topic", help="the topic to read")
    consume.add_argument("--group", help="consumer group (default: a new one of its own)")
    consume.add_argument(
        "--auto-offset-reset",
        choices=["earliest", "latest"],
        default=None,
        help="with no committed offset, start at the oldest record (earliest) or take only new "
        "ones (latest, the default); the library's and the Spark source's names",
    )
    consume.add_argument(
        "--from-beginning",
        action="store_true",
        help="the same as --auto-offset-reset earliest (Kafka's console consumer's name)",
    )
    consume.add_argument(
        "--max-messages",
        type=int,
        default=None,
        metavar="N",
        help="exit after N records, their offsets committed (default: run until Ctrl-C)",
    )
    consume.add_argument(
        "--session-timeout",
        type=float,
        default=ConsumerSettings().session_timeout,
        metavar="SECONDS",
        help="T: a coordinator failover must fit in T/3 (docs/design.md)",
    )
    consume.add_argument(
        "--instance-id",
        metavar="ID",
        help=(
            "a static member's name (SPEC.md §11.11): restarted within the session timeout, it gets"
            " its partitions back and nobody else is disturbed; a newer process under the same"
            " name ends this one"
        ),
    )
    consume.add_argument("--print-key", action="store_true", help="print KEY<TAB>VALUE")
    for parser in (produce, consume):
        add_bootstrap_option(parser)
        add_client_options(parser)


async def run_produce(args: argparse.Namespace) -> int:
    security = client_security(args)
    async with open_admin(args.bootstrap, security=security) as admin:
        await admin.topics([args.topic])  # before reading stdin, as ``consume`` does
    separator = args.key_separator.encode() if args.key_separator else None
    deliveries: list[Delivery] = []
    shown_at = -math.inf
    config = ProducerConfig(compression=Compression[args.compression.upper()])
    async with open_producer(args.bootstrap, config=config, security=security) as producer:
        await producer.partitions_for(args.topic)
        async for line in _lines(sys.stdin.fileno()):
            value = line
            key = None
            if separator is not None and separator in value:
                key, value = value.split(separator, 1)
            try:  # the fast path: no coroutine and no checkpoint per line
                deliveries.append(producer.enqueue_nowait(args.topic, value, key))
            except trio.WouldBlock:
                deliveries.append(await producer.enqueue(args.topic, value, key))
            if len(deliveries) % PRODUCE_CHUNK == 0:
                await trio.sleep(0)
                if args.progress and trio.current_time() - shown_at >= 1.0:
                    shown_at = trio.current_time()
                    acked = sum(d.done and d.error is None for d in deliveries)
                    print(
                        f"\rsent {len(deliveries)}, acknowledged {acked}",
                        end="",
                        file=sys.stderr,
                        flush=True,
                    )
    failed = [d for d in deliveries if d.error is not None]
    if args.progress:
        print(file=sys.stderr)
    refused = next((d.error for d in failed if isinstance(d.error, Refused)), None)
    if refused is not None and len(failed) == len(deliveries):
        raise refused  # nothing went through: the one line says why and what to do
    print(
        f"produced {len(deliveries) - len(failed)} records to {args.topic}"
        + (f", {len(failed)} failed: {failed[0].error}" if failed else ""),
        file=sys.stderr,
    )
    return 1 if failed else 0


async def _lines(fd: int) -> AsyncIterator[bytes]:
    """Lines without their newline, read a block at a time: one thread hop per line (``async
    for`` over a wrapped file) made ``produce`` five times slower than the producer. ``os.read``
    returns what is there, so lines typed at a terminal still go out as they are typed."""
    pending = b""
    while chunk := await trio.to_thread.run_sync(os.read, fd, READ_BLOCK):
        *lines, pending = (pending + chunk).split(b"\n")
        for line in lines:
            yield line
    if pending:
        yield pending


def _skip_hint(exc: CorruptBatch, group: str) -> str:
    """How an operator skips the batch (docs/consumer.md#a-corrupt-batch): the group's offset
    is left at it, so every run stops there until it is moved."""
    if exc.next_offset is None:
        return ""
    return (
        f"; to skip it: coordinator groups reset-offsets {group} --topic {exc.topic}"
        f" --partition {exc.partition} --to-offset {exc.next_offset}"
    )


def _offset_reset(args: argparse.Namespace) -> str:
    if args.from_beginning and args.auto_offset_reset == "latest":
        raise ValueError("--from-beginning contradicts --auto-offset-reset latest")
    return "earliest" if args.from_beginning else args.auto_offset_reset or "latest"


async def run_consume(args: argparse.Namespace) -> int:
    if args.max_messages is not None and args.max_messages < 1:
        raise ValueError("--max-messages must be at least 1")
    # The consumer itself retries unreachable brokers forever (it is a service); a person at a
    # terminal wants to hear at once that the address is wrong or the topic missing.
    security = client_security(args)
    async with open_admin(args.bootstrap, security=security) as admin:
        await admin.topics([args.topic])
    group = args.group or f"console-consumer-{uuid.uuid4().hex[:8]}"
    settings = ConsumerSettings(
        session_timeout=args.session_timeout,
        auto_offset_reset=_offset_reset(args),
        client_id="console-consumer",
        instance_id=args.instance_id,
    )
    out = sys.stdout.buffer
    printed = 0
    async with open_consumer(
        args.bootstrap, group, topics={args.topic: 1}, settings=settings, security=security
    ) as consumer:
        (stream,) = consumer.streams_for(args.topic)
        with (
            trio.CancelScope() as reading,
            trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals,
        ):
            async with trio.open_nursery() as nursery:

                async def stop_on_signal() -> None:
                    async for _ in signals:
                        reading.cancel()

                nursery.start_soon(stop_on_signal)
                try:
                    # A batch at a time: its lines are written and flushed before the next batch
                    # is asked for, which is what finishes (reports) this one.
                    while (batch := await stream.next_batch()) is not None:
                        values = [v or b"" for v in batch.values()]
                        if args.print_key:
                            keys = batch.keys()
                            values = [
                                (k or b"") + b"\t" + v for k, v in zip(keys, values, strict=True)
                            ]
                        if args.max_messages is not None:
                            values = values[: args.max_messages - printed]
                        out.write(b"\n".join(values) + b"\n")
                        out.flush()
                        printed += len(values)
                        if printed == args.max_messages:
                            batch.finish(batch.offsets[len(values) - 1])
                            break
                except BrokenPipeError:
                    pass  # the reader went away (| head): leave the group cleanly
                except InstanceFenced as exc:
                    print(f"coordinator: consume: {exc}", file=sys.stderr)
                    return 1
                except CorruptBatch as exc:
                    line = f"coordinator: consume: {exc}{_skip_hint(exc, group)}"
                    print(" ".join(line.split()), file=sys.stderr)  # one line, whatever the reason
                    return 1
                finally:
                    nursery.cancel_scope.cancel()
        # Leaving the block closes gracefully: fetchers stop, offsets commit, LeaveGroup (none
        # for a static member: it closes cleanly once stopped, and may come back).
    return 0
