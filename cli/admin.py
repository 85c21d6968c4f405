"""The CLI's ``topics`` and ``groups`` verbs: tables for people, ``--json`` for scripts."""

from __future__ import annotations

import argparse
import datetime
import json
import logging
from collections.abc import Sequence

from broker.status import format_age
from cli.security import add_bootstrap_option, add_client_options, client_security
from consumer.admin import Admin, AdminError, TopicListing, open_admin
from protocol import TopicMetadata
from protocol.errors import ErrorCode
from protocol.shown import escape_unprintable
from protocol.topic_configs import (
    SETTINGS,
    InvalidTopicConfig,
    checked_configs,
    parse_config_argument,
)
from protocol.types import TopicPartition

log = logging.getLogger("coordinator")


def add_admin_commands(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    def client(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
        add_bootstrap_option(parser)
        parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
        add_client_options(parser)
        return parser

    topics = commands.add_parser("topics", help="create, list, describe, alter or delete topics")
    verbs = topics.add_subparsers(dest="verb", required=True, metavar="VERB")
    create = client(verbs.add_parser("create", help="create a topic"))
    create.add_argument("topic", help="the topic's name")
    create.add_argument(
        "--partitions", type=positive_int, required=True, metavar="N", help="how many (required)"
    )
    create.add_argument(
        "--brokers",
        type=_broker_ids,
        metavar="ID[,ID...]",
        help="place the partitions on these brokers, round robin (default: every live broker)",
    )
    create.add_argument(
        "--replication-factor",
        type=positive_int,
        metavar="N",
        help="replicas of each partition, on as many brokers (default: the broker's"
        " --default-replication-factor)",
    )
    create.add_argument(
        "--config",
        type=_topic_config,
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help=f"a setting of the topic's own, repeatable: {', '.join(SETTINGS)}; -1: no limit "
        "(default: the broker's --retention-ms, --retention-bytes, --segment-bytes)",
    )
    create.add_argument(
        "--if-not-exists",
        action="store_true",
        help="if the topic exists, say so and succeed (its settings are left as they are)",
    )
    client(verbs.add_parser("list", help="list topics"))
    describe = client(verbs.add_parser("describe", help="partitions, brokers and offsets"))
    describe.add_argument("topic", nargs="*", help="these topics (default: every one)")
    alter = client(verbs.add_parser("alter", help="add partitions to a topic"))
    alter.add_argument("topic", help="the topic's name")
    alter.add_argument(
        "--partitions",
        type=positive_int,
        required=True,
        metavar="N",
        help="the new total, more than it has (required)",
    )
    alter.add_argument(
        "--brokers",
        type=_broker_ids,
        metavar="ID[,ID...]",
        help="place the new partitions on these brokers (default: every live broker)",
    )
    delete = client(
        verbs.add_parser(
            "delete", help="delete a topic, its partitions' files and every group's offsets for it"
        )
    )
    delete.add_argument("topic", help="the topic's name")

    cluster = client(
        commands.add_parser(
            "cluster", help="the brokers, which are up, and which coordinator slots each holds"
        )
    )
    cluster.set_defaults(verb=None)

    groups = commands.add_parser("groups", help="list, describe, delete or reset groups")
    verbs = groups.add_subparsers(dest="verb", required=True, metavar="VERB")
    client(verbs.add_parser("list", help="list groups and their states"))
    describe = client(verbs.add_parser("describe", help="members, assignment, offsets and lag"))
    describe.add_argument("group", help="the group's id")
    delete = client(verbs.add_parser("delete", help="delete an empty group and its offsets"))
    delete.add_argument("group", help="the group's id")
    reset = client(
        verbs.add_parser(
            "reset-offsets",
            help="move an empty group's committed offsets (or, with --dry-run, show the plan)",
        )
    )
    reset.add_argument("group", help="the group's id")
    which = reset.add_mutually_exclusive_group(required=True)
    which.add_argument("--topic", help="the topic whose offsets move")
    which.add_argument(
        "--all-topics",
        action="store_true",
        help="every topic the group has committed offsets for",
    )
    reset.add_argument(
        "--partition",
        type=non_negative_int,
        help="only this partition of --topic (default: every one), e.g. to skip a corrupt batch",
    )
    where = reset.add_mutually_exclusive_group(required=True)
    where.add_argument("--to-earliest", action="store_true", help="to each partition's log start")
    where.add_argument("--to-latest", action="store_true", help="to each partition's log end")
    where.add_argument(
        "--to-offset",
        type=non_negative_int,
        metavar="OFFSET",
        help="to this offset in every partition it resets (within each one's log)",
    )
    where.add_argument(
        "--to-datetime",
        type=datetime_ms,
        metavar="YYYY-MM-DDTHH:mm:SS.sss",
        help="the earliest offset whose record is at least that late (the log end if none is); "
        "ISO 8601, with a timezone offset (Z, +01:00) or in local time",
    )
    where.add_argument(
        "--shift-by",
        type=int,
        metavar="N",
        help="move each committed offset by N (negative: back), kept within the log's bounds;"
        " every partition must have one",
    )
    mode = reset.add_mutually_exclusive_group()
    mode.add_argument(
        "--dry-run",
        action="store_true",
        help="only print the plan (current and new offset of each partition); change nothing",
    )
    mode.add_argument(
        "--execute",
        action="store_true",
        help="move the offsets and print the plan (also done without either flag, unlike"
        " Kafka's tool: README.md#coming-from-kafka-consumer-groups-kcat-or-rpk)",
    )


def _broker_ids(text: str) -> list[int]:
    try:
        ids = [int(part) for part in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a list of broker ids: {text!r}") from None
    if len(set(ids)) != len(ids):
        raise argparse.ArgumentTypeError(f"a broker id is named twice: {text!r}")
    return ids


def datetime_ms(text: str) -> int:
    """An ISO 8601 date and time (kafka-consumer-groups' ``--to-datetime``), local time unless
    it names an offset, as milliseconds since the epoch."""
    try:
        when = datetime.datetime.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"not an ISO 8601 date and time such as 2026-11-28T10:00:00.000: {text!r}"
        ) from None
    ms = round(when.timestamp() * 1000)  # a naive one is local time
    if ms < 0:
        raise argparse.ArgumentTypeError(f"before 1970: {text!r}")
    return ms


def _topic_config(text: str) -> tuple[str, str]:
    try:
        return parse_config_argument(text)
    except InvalidTopicConfig as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {value}")
    return value


def non_negative_int(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must not be negative, not {value}")
    return value


async def run_admin(args: argparse.Namespace) -> None:
    async with open_admin(args.bootstrap, security=client_security(args)) as admin:
        await _VERBS[(args.command, args.verb)](admin, args)


async def _topics_create(admin: Admin, args: argparse.Namespace) -> None:
    configs = dict(checked_configs(args.config))  # a setting named twice is refused here
    try:
        await admin.create_topic(
            args.topic, args.partitions, args.brokers, configs, args.replication_factor
        )
    except AdminError as exc:
        if not (args.if_not_exists and exc.error_code is ErrorCode.TOPIC_ALREADY_EXISTS):
            raise
        _say(
            args,
            {"topic": args.topic, "created": False},
            f"topic {args.topic} already exists: left as it is",
        )
        return
    _say(
        args,
        {"topic": args.topic, "partitions": args.partitions, "created": True},
        f"created topic {args.topic} with {args.partitions} partitions",
    )


async def _topics_alter(admin: Admin, args: argparse.Namespace) -> None:
    await admin.add_partitions(args.topic, args.partitions, args.brokers)
    _say(
        args,
        {"topic": args.topic, "partitions": args.partitions},
        f"topic {args.topic} now has {args.partitions} partitions",
    )


async def _topics_delete(admin: Admin, args: argparse.Namespace) -> None:
    await admin.delete_topic(args.topic)
    _say(args, {"topic": args.topic, "deleted": True}, f"deleted topic {args.topic}")


async def _topics_list(admin: Admin, args: argparse.Namespace) -> None:
    listing = await admin.listing()
    rows = [(t.topic, _topic_id(listing, t.topic), len(t.partitions)) for t in listing.topics]
    if args.json:
        keys = ("topic", "topic_id", "partitions")
        print(json.dumps([dict(zip(keys, row, strict=True)) for row in rows]))
    else:
        _table(("TOPIC", "TOPIC ID", "PARTITIONS"), [(t, i or "-", n) for t, i, n in rows])


async def _topics_describe(admin: Admin, args: argparse.Namespace) -> None:
    listing = await admin.listing(args.topic or None)
    live = {b.broker_id for b in (await admin.metadata(())).brokers}
    bounds = await admin.log_bounds([t.topic for t in listing.topics])
    settings = [
        (topic, name, value)
        for topic, configs in sorted(listing.configs.items())
        for name, value in sorted(configs.items())
    ]
    rows = []
    for topic in listing.topics:
        topic_id = _topic_id(listing, topic.topic)
        for p in topic.partitions:
            tp = TopicPartition(topic=topic.topic, partition=p.partition)
            start, end = bounds.get(tp, (-1, -1))
            up = p.broker_id in live
            held = listing.leaders.get(tp)
            replicas, isr = (held.replicas, held.isr) if held else ((), ())
            epoch = held.epoch if held else -1
            row = (topic.topic, topic_id, p.partition, p.broker_id, up, start, end)
            rows.append((*row, replicas, isr, epoch))
    if args.json:
        print(
            json.dumps(
                [
                    {
                        "topic": t,
                        "topic_id": i,
                        "partition": p,
                        "broker": b,  # the leader, as before replication
                        "broker_up": up,
                        "start": _or_null(start),
                        "end": _or_null(end),
                        "leader": b,
                        "replicas": list(replicas),
                        "isr": list(isr),
                        "leader_epoch": _or_null(epoch),
                        "configs": listing.configs.get(t, {}),
                    }
                    for t, i, p, b, up, start, end, replicas, isr, epoch in rows
                ]
            )
        )
        return
    header = ("TOPIC", "TOPIC ID", "PARTITION", "LEADER", "UP", "START", "END", "REPLICAS")
    _table(
        (*header, "ISR", "EPOCH"),
        [
            (
                *(t, i or "-", p, _or_dash(b), "yes" if up else "no"),
                *(_or_dash(start), _or_dash(end), _ids(replicas), _ids(isr), _or_dash(epoch)),
            )
            for t, i, p, b, up, start, end, replicas, isr, epoch in rows
        ],
    )
    if settings:  # the rest are each broker's own (serve --retention-ms and so on)
        print()
        _table(("TOPIC", "SETTING", "VALUE"), settings)


def _ids(brokers: Sequence[int]) -> str:
    return ",".join(map(str, brokers)) or "-"


def _topic_id(listing: TopicListing, topic: str) -> str | None:
    """The topic's id as shown (None: the broker did not say: it answers before version 2)."""
    topic_id = listing.ids.get(topic)
    return None if topic_id is None else str(topic_id)


async def _cluster(admin: Admin, args: argparse.Namespace) -> None:
    report = await admin.cluster()
    if args.json:
        print(json.dumps(report.as_json()))
        return
    print(f"{report.slots} coordinator slots")
    _table(
        ("BROKER", "ADDRESS", "UP", "SLOTS", "PARTITIONS", "REPLICAS"),
        [
            (
                b.broker_id,
                "-" if b.address is None else f"{b.address[0]}:{b.address[1]}",
                "yes" if b.up else "no",
                f"{len(b.slots)}: {_ranges(b.slots)}" if b.slots else "0",
                b.partitions,
                b.replicas,
            )
            for b in report.brokers
        ],
    )


def _ranges(numbers: Sequence[int]) -> str:
    """``0-4,7,9-10``: sorted numbers, runs written as ranges."""
    runs: list[list[int]] = []
    for n in numbers:
        if runs and n == runs[-1][1] + 1:
            runs[-1][1] = n
        else:
            runs.append([n, n])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)


async def _groups_list(admin: Admin, args: argparse.Namespace) -> None:
    groups = await admin.groups()
    if args.json:
        print(json.dumps([{"group": g.group_id, "state": g.state} for g in groups]))
    else:
        _table(("GROUP", "STATE"), [(g.group_id, g.state) for g in groups])


async def _groups_describe(admin: Admin, args: argparse.Namespace) -> None:
    report = await admin.describe_group(args.group)
    if args.json:
        print(json.dumps(report.as_json()))
        return
    waiting = sum(m.awaiting for m in report.members)
    print(
        f"group {escape_unprintable(report.group)}: {escape_unprintable(report.state)}, "
        f"generation {report.generation}, {len(report.members) - waiting} members"
        + (f", awaiting {waiting} after a coordinator failover" if waiting else "")
    )
    if report.members:
        _table(
            ("MEMBER", "CLIENT ID", "HOST", "PARTITIONS"),
            [
                (
                    m.id,
                    m.client_id or "-",
                    "(awaiting)" if m.awaiting else m.host or "-",
                    ",".join(f"{tp.topic}-{tp.partition}" for tp in m.partitions) or "-",
                )
                for m in report.members
            ],
        )
    _table(
        ("TOPIC", "PARTITION", "OWNER", "COMMITTED", "REPORTED", "END", "LAG", "LAG TIME"),
        [
            (
                p.topic,
                p.partition,
                p.owner or "-",
                _or_dash(p.committed),
                "-" if p.reported is None else p.reported,
                _or_dash(p.end),
                "-" if p.lag is None else p.lag,
                format_age(p.lag_seconds, unknown="-"),
            )
            for p in report.partitions
        ],
    )


async def _groups_delete(admin: Admin, args: argparse.Namespace) -> None:
    await admin.delete_group(args.group)
    _say(args, {"group": args.group, "deleted": True}, f"deleted group {args.group}")


async def _groups_reset_offsets(admin: Admin, args: argparse.Namespace) -> None:
    if args.all_topics and args.partition is not None:
        raise ValueError("--partition names a partition of --topic: not with --all-topics")
    current = await admin.committed_offsets(args.group)
    if args.all_topics:
        names = sorted({tp.topic for tp in current})
        if not names:
            raise ValueError(f"group {args.group} has no committed offsets: name a --topic")
    else:
        names = [args.topic]
    topics = await admin.topics(names)  # an unknown topic has no bounds: refused here
    bounds = await admin.log_bounds(names)
    wanted = chosen_partitions(topics, args.partition)
    unread = [tp for tp in wanted if tp not in bounds]
    bounds = {tp: bounds[tp] for tp in wanted if tp in bounds}
    if unread:
        # All or nothing: a reset that skipped a partition would leave the group half moved.
        named = ", ".join(map(str, unread))
        raise ConnectionError(
            f"cannot read the log bounds of {named} (is its broker down?): nothing was reset"
        )
    offsets = await _new_offsets(admin, args, bounds, current)
    if not args.dry_run:
        await admin.reset_offsets(args.group, offsets)
        for tp, offset in sorted(offsets.items()):  # records skipped or read again: on the record
            log.warning("group %s: committed offset of %s set to %d", args.group, tp, offset)
        if not args.execute:
            log.warning(
                "group %s: reset without --execute or --dry-run: done, as always here (Kafka's"
                " tool would only have shown the plan)",
                args.group,
            )
    rows = [
        (tp.topic, tp.partition, current.get(tp), offset) for tp, offset in sorted(offsets.items())
    ]
    if args.json:
        print(
            json.dumps(
                [
                    {
                        "group": args.group,
                        "topic": t,
                        "partition": p,
                        "current": c,
                        "committed": n if not args.dry_run else c,
                        "new": n,
                        "executed": not args.dry_run,
                    }
                    for t, p, c, n in rows
                ]
            )
        )
    else:
        _table(
            ("GROUP", "TOPIC", "PARTITION", "CURRENT-OFFSET", "NEW-OFFSET"),
            [(args.group, t, p, "-" if c is None else c, n) for t, p, c, n in rows],
        )
        if args.dry_run:
            print("(dry run: nothing changed; --execute moves the offsets)")


def chosen_partitions(
    topics: Sequence[TopicMetadata], partition: int | None
) -> list[TopicPartition]:
    """Every partition of ``topics``, or ``partition`` of each (ValueError where it has none)."""
    chosen = []
    for topic in topics:
        partitions = sorted(p.partition for p in topic.partitions)
        if partition is not None:
            if partition not in partitions:
                raise ValueError(f"topic {topic.topic} has no partition {partition}")
            partitions = [partition]
        chosen += [TopicPartition(topic=topic.topic, partition=p) for p in partitions]
    return chosen


async def _new_offsets(
    admin: Admin,
    args: argparse.Namespace,
    bounds: dict[TopicPartition, tuple[int, int]],
    current: dict[TopicPartition, int],
) -> dict[TopicPartition, int]:
    """Where each partition's committed offset goes, checked against its log [start, end]."""
    if args.to_offset is not None:
        for tp, (start, end) in sorted(bounds.items()):
            if not start <= args.to_offset <= end:
                raise ValueError(f"offset {args.to_offset} is outside {tp}'s log [{start}, {end}]")
        return dict.fromkeys(bounds, args.to_offset)
    if args.to_datetime is not None:
        found = await admin.offsets_for_times(dict.fromkeys(bounds, args.to_datetime))
        # none that late: the end, as Kafka's tool does
        return {
            tp: end if (at := found[tp]) is None else at.offset for tp, (_, end) in bounds.items()
        }
    if args.shift_by is not None:
        missing = sorted(tp for tp in bounds if tp not in current)
        if missing:  # as Kafka's tool: there is nothing to shift
            raise ValueError(
                f"group {args.group} has no committed offset for {', '.join(map(str, missing))}:"
                " nothing to shift (use --to-earliest, --to-latest or --to-offset)"
            )
        # clamped, as Kafka's tool does: an offset outside the log cannot be read from
        return {
            tp: min(max(current[tp] + args.shift_by, start), end)
            for tp, (start, end) in bounds.items()
        }
    return {tp: start if args.to_earliest else end for tp, (start, end) in bounds.items()}


_VERBS = {
    ("cluster", None): _cluster,
    ("topics", "create"): _topics_create,
    ("topics", "alter"): _topics_alter,
    ("topics", "list"): _topics_list,
    ("topics", "describe"): _topics_describe,
    ("topics", "delete"): _topics_delete,
    ("groups", "list"): _groups_list,
    ("groups", "describe"): _groups_describe,
    ("groups", "delete"): _groups_delete,
    ("groups", "reset-offsets"): _groups_reset_offsets,
}


def _or_dash(value: int) -> object:
    """No value, in a table: "-" in every verb's (--json: null, :func:`_or_null`)."""
    return "-" if value < 0 else value


def _or_null(value: int) -> int | None:
    return None if value < 0 else value


def _say(args: argparse.Namespace, as_json: dict[str, object], text: str) -> None:
    print(json.dumps(as_json) if args.json else text)


def _table(header: Sequence[str], rows: Sequence[Sequence[object]]) -> None:
    """Columns aligned, each cell escaped (:mod:`protocol.shown`): ids and names come from
    clients, and one with a bidirectional override or a zero-width space would misalign or
    disguise what an operator reads."""
    cells = [list(header)] + [[escape_unprintable(str(c)) for c in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(header))]
    for row in cells:
        print("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())
