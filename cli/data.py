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
import re
import signal
import sys
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from functools import partial
from typing import BinaryIO, Protocol, TypeVar

import attrs
import trio

from cli.admin import chosen_partitions, non_negative_int
from cli.security import add_bootstrap_option, add_client_options, client_security
from consumer import (
    ConsumerSettings,
    CorruptBatch,
    Delivery,
    InstanceFenced,
    ProducerConfig,
    RecordStream,
    open_consumer,
    open_producer,
)
from consumer.admin import Admin, open_admin
from consumer.runtime import unwrap_single
from protocol import TopicMetadata
from protocol.batches import Compression, Header, RecordBatch
from protocol.types import TopicPartition
from transport.refusals import Refused

#: Lines produced between two checkpoints (the producer does not yield per record).
PRODUCE_CHUNK = 500
#: Bytes of stdin read at a time by ``produce``.
READ_BLOCK = 64 * 1024

_T = TypeVar("_T")


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
    produce.add_argument(
        "--partition",
        type=non_negative_int,
        metavar="P",
        help="send every record to partition P (default: by the key's hash, round robin"
        " without a key)",
    )
    produce.add_argument(
        "-H",
        "--header",
        dest="headers",
        type=_header,
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="attach this header to every record; repeat for more (default: none)",
    )
    produce.add_argument(
        "--acks",
        choices=["all", "1"],
        default="all",
        help="all: a record is acknowledged once every in-sync replica has it; 1: once its"
        " leader wrote it (a topic of one replica treats both alike)",
    )
    consume = commands.add_parser(
        "consume",
        help="print records as lines, in a group, or from a partition and offset without one",
    )
    consume.add_argument(
        "topic",
        nargs="*",
        metavar="TOPIC",
        help="the topics to read (one or more), or give --pattern",
    )
    consume.add_argument(
        "--pattern",
        metavar="REGEX",
        help="every topic whose whole name matches REGEX, those created later too (default:"
        " the TOPICs named)",
    )
    consume.add_argument(
        "--group",
        help="consumer group (default: a new one of its own; none with --partition or --offset)",
    )
    consume.add_argument(
        "--partition",
        type=non_negative_int,
        metavar="P",
        help="read only partition P of each TOPIC, without a group: nothing is committed"
        " (default: every partition, as the group assigns them)",
    )
    consume.add_argument(
        "--offset",
        type=_start_offset,
        metavar="OFFSET",
        help="start at OFFSET without a group: N (with --partition), -N (N before the end),"
        " beginning or end; every partition without --partition (default: as"
        " --auto-offset-reset says)",
    )
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
    consume.add_argument(
        "--format",
        type=RecordFormat.parse,
        metavar="TEMPLATE",
        help="print each record as TEMPLATE (kcat's -f): %%t topic, %%p partition, %%o offset,"
        " %%T timestamp (ms), %%k key, %%K key size, %%s value, %%S value size, %%h headers"
        " (name=value,...), %%%% a %%; \\n \\t \\r \\\\ escapes; no newline unless"
        " it has one (default: VALUE\\n, KEY<TAB>VALUE\\n with --print-key)",
    )
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
    config = ProducerConfig(
        compression=Compression[args.compression.upper()],
        acks="all" if args.acks == "all" else 1,
    )
    headers = tuple(args.headers)
    partition = args.partition
    async with open_producer(args.bootstrap, config=config, security=security) as producer:
        count = await producer.partitions_for(args.topic)
        if partition is not None and partition >= count:  # before reading stdin
            raise ValueError(f"topic {args.topic} has no partition {partition} (it has {count})")
        async for line in _lines(sys.stdin.fileno()):
            value = line
            key = None
            if separator is not None and separator in value:
                key, value = value.split(separator, 1)
            try:  # the fast path: no coroutine and no checkpoint per line
                deliveries.append(
                    producer.enqueue_nowait(
                        args.topic, value, key, headers=headers, partition=partition
                    )
                )
            except trio.WouldBlock:
                deliveries.append(
                    await producer.enqueue(
                        args.topic, value, key, headers=headers, partition=partition
                    )
                )
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
    default = ConsumerSettings().auto_offset_reset  # one default: the library's
    return "earliest" if args.from_beginning else args.auto_offset_reset or default


def _header(text: str) -> Header:
    name, equals, value = text.partition("=")
    if not equals or not name:
        raise argparse.ArgumentTypeError(f"not NAME=VALUE: {text!r}")
    return name, value.encode()


def _start_offset(text: str) -> str | int:
    if text in ("beginning", "end"):
        return text
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an offset, -N, beginning or end: {text!r}") from None


class _Records(Protocol):
    """A batch's records from a first offset on: what a :class:`RecordFormat` prints."""

    @property
    def offsets(self) -> range: ...
    def keys(self) -> list[bytes | None]: ...
    def values(self) -> list[bytes | None]: ...
    def timestamps(self) -> list[int]: ...
    def headers(self) -> list[tuple[Header, ...]]: ...


@attrs.frozen
class _From:
    """A received batch from ``first_offset`` on (it may begin before): the records of a read
    without a group, as :class:`~consumer.ConsumerBatch` gives those of a group's."""

    batch: RecordBatch
    first_offset: int

    @property
    def offsets(self) -> range:
        return range(self.first_offset, self.batch.next_offset)

    def _skip(self, column: list[_T]) -> list[_T]:
        return column[self.first_offset - self.batch.base_offset :]

    def keys(self) -> list[bytes | None]:
        return self._skip(self.batch.keys())

    def values(self) -> list[bytes | None]:
        return self._skip(self.batch.values())

    def timestamps(self) -> list[int]:
        return self._skip(self.batch.timestamps())

    def headers(self) -> list[tuple[Header, ...]]:
        return self._skip(self.batch.headers())


#: kcat's -f escapes (``\n``...) and ``%`` fields: literal text between them.
_TEMPLATE = re.compile(r"%(.)|\\(.)|([^%\\]+)|(.)", re.DOTALL)
_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "\\": "\\"}
_FIELDS = "tpoTkKsSh"


@attrs.frozen
class RecordFormat:
    """``--format``'s template, kcat's ``-f`` fields: raw keys, values and header values (bytes
    as stored, as the default output prints them), a null key or value as nothing."""

    parts: tuple[bytes | str, ...]
    """Literal bytes, or the letter of a field."""

    @classmethod
    def parse(cls, template: str) -> RecordFormat:
        parts: list[bytes | str] = []
        for match in _TEMPLATE.finditer(template):
            field, escaped, text, stray = match.groups()
            if field is not None:
                if field == "%":
                    parts.append(b"%")
                elif field in _FIELDS:
                    parts.append(field)
                else:
                    raise argparse.ArgumentTypeError(f"unknown field %{field} in {template!r}")
            elif escaped is not None:
                if escaped not in _ESCAPES:
                    raise argparse.ArgumentTypeError(f"unknown escape \\{escaped} in {template!r}")
                parts.append(_ESCAPES[escaped].encode())
            else:
                if stray is not None:  # a trailing % or \\
                    raise argparse.ArgumentTypeError(f"{template!r} ends in {stray!r}")
                parts.append(text.encode())
        return cls(tuple(parts))

    def render(self, topic: str, partition: int, records: _Records) -> list[bytes]:
        """Each record printed; a column is decoded only if a field needs it."""
        used = {p for p in self.parts if isinstance(p, str)}
        n = len(records.offsets)
        keys = records.keys() if used & {"k", "K"} else [None] * n
        values = records.values() if used & {"s", "S"} else [None] * n
        stamps = records.timestamps() if "T" in used else [-1] * n
        headers = records.headers() if "h" in used else [()] * n
        out = []
        for offset, key, value, stamp, header in zip(
            records.offsets, keys, values, stamps, headers, strict=True
        ):
            fields = {
                "t": topic.encode(),
                "p": b"%d" % partition,
                "o": b"%d" % offset,
                "T": b"%d" % stamp,
                "k": key or b"",
                "K": b"%d" % (-1 if key is None else len(key)),
                "s": value or b"",
                "S": b"%d" % (-1 if value is None else len(value)),
                "h": b",".join(
                    name.encode() + (b"" if v is None else b"=" + v) for name, v in header
                ),
            }
            out.append(b"".join(fields[p] if isinstance(p, str) else p for p in self.parts))
        return out


@attrs.define
class _Printer:
    """Prints records a batch at a time up to ``--max-messages``, flushed before the next batch
    is asked for (the offset reported never covers a line that was not written out)."""

    out: BinaryIO
    format: RecordFormat | None
    print_key: bool
    limit: int | None
    printed: int = 0

    def print(self, topic: str, partition: int, records: _Records) -> int:
        """How many of ``records`` were printed (fewer than all: the limit is reached)."""
        if self.format is not None:
            lines = self.format.render(topic, partition, records)
        else:
            lines = [v or b"" for v in records.values()]
            if self.print_key:
                keys = records.keys()
                lines = [(k or b"") + b"\t" + v for k, v in zip(keys, lines, strict=True)]
        if self.limit is not None:
            lines = lines[: self.limit - self.printed]
        if self.format is not None:
            self.out.write(b"".join(lines))
        elif lines:
            self.out.write(b"\n".join(lines) + b"\n")
        self.out.flush()
        self.printed += len(lines)
        return len(lines)

    @property
    def done(self) -> bool:
        return self.printed == self.limit


def _check_consume(args: argparse.Namespace) -> None:
    if args.max_messages is not None and args.max_messages < 1:
        raise ValueError("--max-messages must be at least 1")
    if bool(args.topic) == (args.pattern is not None):
        raise ValueError("name the topics to read, or give --pattern, not both")
    if args.pattern is not None:
        try:
            re.compile(args.pattern)
        except re.error as exc:
            raise ValueError(f"--pattern {args.pattern!r}: {exc}") from None
    if args.format is not None and args.print_key:
        raise ValueError("--print-key is part of the default format: use %k in --format")
    if isinstance(args.offset, int) and args.offset >= 0 and args.partition is None:
        raise ValueError(  # Kafka's console consumer's rule: an offset is one partition's
            "--offset N needs --partition (every partition: beginning, end or -N)"
        )
    if args.partition is not None or args.offset is not None:
        for given, name in (
            (args.group, "--group"),
            (args.instance_id, "--instance-id"),
            (args.pattern, "--pattern"),
        ):
            if given is not None:
                raise ValueError(f"--partition and --offset read without a group: not with {name}")


async def run_consume(args: argparse.Namespace) -> int:
    _check_consume(args)
    # The consumer itself retries unreachable brokers forever (it is a service); a person at a
    # terminal wants to hear at once that the address is wrong or the topic missing.
    security = client_security(args)
    printer = _Printer(
        out=sys.stdout.buffer,
        format=args.format,
        print_key=args.print_key,
        limit=args.max_messages,
    )
    async with open_admin(args.bootstrap, security=security) as admin:
        topics = await admin.topics(args.topic) if args.topic else ()
        if args.partition is not None or args.offset is not None:
            return await _consume_without_group(admin, args, topics, printer)
    group = args.group or f"console-consumer-{uuid.uuid4().hex[:8]}"
    settings = ConsumerSettings(
        session_timeout=args.session_timeout,
        auto_offset_reset=_offset_reset(args),
        client_id="console-consumer",
        instance_id=args.instance_id,
    )
    async with open_consumer(
        args.bootstrap,
        group,
        topics=args.topic or None,
        pattern=args.pattern,
        settings=settings,
        security=security,
    ) as consumer:

        async def print_stream(stream: RecordStream, stop: trio.CancelScope) -> None:
            # A batch at a time: its lines are written and flushed before the next batch is
            # asked for, which is what finishes (reports) this one.
            while (batch := await stream.next_batch()) is not None:
                shown = printer.print(batch.topic, batch.partition, batch)
                if printer.done:
                    if shown:  # else another stream reached the limit first: none of it is read
                        batch.finish(batch.offsets[shown - 1])
                    stop.cancel()
                    return

        try:
            await _until_stopped([partial(print_stream, s) for s in consumer.streams])
        except InstanceFenced as exc:
            print(f"coordinator: consume: {exc}", file=sys.stderr)
            return 1
        except CorruptBatch as exc:
            line = f"coordinator: consume: {exc}{_skip_hint(exc, group)}"
            print(" ".join(line.split()), file=sys.stderr)  # one line, whatever the reason
            return 1
        # Leaving the block closes gracefully: fetchers stop, offsets commit, LeaveGroup (none
        # for a static member: it closes cleanly once stopped, and may come back).
    return 0


def start_at(offset: str | int, tp: TopicPartition, start: int, end: int) -> int:
    """Where ``--offset`` starts reading ``tp``, whose log is [start, end]: -N is N records
    before the end (kcat's), the log's start at most."""
    if offset == "beginning":
        return start
    if offset == "end":
        return end
    assert isinstance(offset, int)
    if offset < 0:
        return max(start, end + offset)
    if not start <= offset <= end:
        raise ValueError(f"offset {offset} is outside {tp}'s log [{start}, {end}]")
    return offset


async def _consume_without_group(
    admin: Admin,
    args: argparse.Namespace,
    topics: Sequence[TopicMetadata],
    printer: _Printer,
) -> int:
    """kcat's ``-p``/``-o``: partitions read from a given offset with no group, so nothing is
    committed and nobody else's assignment changes."""
    wanted = chosen_partitions(topics, args.partition)
    bounds = await admin.log_bounds(sorted({tp.topic for tp in wanted}))
    starts = {}
    for tp in wanted:
        if tp not in bounds:
            raise ConnectionError(f"cannot read the log bounds of {tp} (is its broker down?)")
        offset = args.offset
        if offset is None:
            offset = "beginning" if _offset_reset(args) == "earliest" else "end"
        starts[tp] = start_at(offset, tp, *bounds[tp])
    idle = ConsumerSettings().fetch_idle_interval
    max_bytes = ConsumerSettings().fetch_max_bytes

    async def print_partition(tp: TopicPartition, stop: trio.CancelScope) -> None:
        position = starts[tp]
        while True:
            read = await admin.read(tp, position, max_bytes)
            if not read.batches:
                await trio.sleep(idle)  # the Fetch request has no long poll
            for batch in read.batches:
                printer.print(
                    tp.topic, tp.partition, _From(batch, max(position, batch.base_offset))
                )
                if printer.done:
                    stop.cancel()
                    return
                position = batch.next_offset

    await _until_stopped([partial(print_partition, tp) for tp in sorted(starts)])
    return 0


async def _until_stopped(
    readers: Sequence[Callable[[trio.CancelScope], Awaitable[None]]],
) -> None:
    """Run the readers until each has returned, one cancels the scope it is given (the limit
    was reached), SIGTERM or SIGINT, or the reader of stdout goes away (``| head``)."""
    try:
        with (
            unwrap_single(),
            trio.CancelScope() as reading,
            trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals,
        ):
            async with trio.open_nursery() as nursery:

                async def stop_on_signal() -> None:
                    async for _ in signals:
                        reading.cancel()

                nursery.start_soon(stop_on_signal)
                try:
                    async with trio.open_nursery() as readers_nursery:
                        for reader in readers:
                            readers_nursery.start_soon(reader, reading)
                finally:
                    nursery.cancel_scope.cancel()
    except BrokenPipeError:
        pass  # the reader went away (| head): leave the group cleanly
