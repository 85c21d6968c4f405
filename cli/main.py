"""``coordinator`` / ``python -m cli``: the command line.

Errors a user can cause (a bad argument, a port in use, an unreachable broker) print one line and
exit non-zero; a traceback means a bug.
"""

from __future__ import annotations

import argparse
import errno
import gc
import importlib.metadata
import logging
import os
import signal
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, NoReturn

import trio

from broker.log import FsyncPolicy, LogConfig
from broker.metrics import MetricsConfig
from broker.node import NodeSettings, run_node
from cli.admin import add_admin_commands, positive_int, run_admin
from cli.data import add_data_commands, run_consume, run_produce
from cli.logformat import configure_logging
from cli.refusals import what_to_do
from cli.security import (
    add_acl_commands,
    add_serve_options,
    add_user_commands,
    run_acls,
    run_users,
    serve_security,
)
from consumer import ProduceError
from consumer.admin import AdminError
from coordinator.config import CoordinatorConfig, RebalanceProtocol
from coordinator.limits import RequestLimits
from protocol.shown import escape_unprintable
from store import StoreError
from transport.channel import ChannelClosed
from transport.limits import ConnectionLimits
from transport.refusals import Refused

log = logging.getLogger("coordinator")


class _HelpFormatter(argparse.HelpFormatter):
    """Every option's help ends with its default, unless it says the default itself."""

    def _get_help_string(self, action: argparse.Action) -> str:
        help = action.help or ""
        if (
            "default" in help
            or not action.option_strings
            or action.default in (None, False, argparse.SUPPRESS)
            or action.default == []
        ):
            return help
        return f"{help} (default: %(default)s)" if help else "(default: %(default)s)"


class _Parser(argparse.ArgumentParser):
    """Bad arguments are one line, like every other error a user can make (not a usage block);
    every parser, subcommands' too, shows each option's default."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", _HelpFormatter)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: {message} (see {self.prog} --help)\n")


#: The server allocates a few short-lived objects per Ping, and with thousands of connections the
#: interpreter's default (a young collection every 700 allocations) promotes them into the old
#: generations, whose collections then walk every connection's objects: at 5,000 consumers they
#: take a fifth of the server's CPU (docs/benchmarks.md, Benchmarks I). Young collections every
#: 50,000 allocations let them die first. Cycles are still collected, just in larger batches.
SERVER_GC_THRESHOLDS = (50_000, 20, 20)


def _parser() -> argparse.ArgumentParser:
    parser: argparse.ArgumentParser = _Parser(
        prog="coordinator",
        description="A Kafka-style broker with a broker-side consumer group coordinator.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    _add_log_level(parser, default=None)
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    serve = commands.add_parser("serve", help="run a broker and its coordinator")
    serve.add_argument("--host", default="127.0.0.1", help="address to listen on")
    serve.add_argument("--port", type=int, default=9092, help="port to listen on (0: any)")
    serve.add_argument(
        "--broker-id",
        type=int,
        default=1,
        metavar="ID",
        help="this broker's id, unique in its cluster (Kafka's broker.id)",
    )
    serve.add_argument(
        "--data-dir",
        type=Path,
        default=Path("data"),
        metavar="DIR",
        help="the partition logs, and the embedded metadata store without --zookeeper "
        "(Kafka's log.dirs)",
    )
    serve.add_argument(
        "--zookeeper",
        metavar="HOST:PORT[,HOST:PORT...][/CHROOT]",
        help="keep metadata in this ZooKeeper ensemble, shared with the cluster's other brokers, "
        "which elect one coordinator (default: the embedded store under --data-dir)",
    )
    serve.add_argument(
        "--zookeeper-session-timeout",
        type=float,
        default=NodeSettings().zookeeper_session_timeout,
        help="seconds ZooKeeper keeps this broker's registration and office after losing it; "
        "keep it below a third of the consumers' session timeout less 4 s (docs/design.md)",
    )
    serve.add_argument(
        "--coordinator-slots",
        type=positive_int,
        default=CoordinatorConfig().coordinator_slots,
        help="coordinator slots the cluster's groups are hashed onto; fixed by the first broker "
        "on a ZooKeeper store, and a broker configured otherwise refuses to start",
    )
    serve.add_argument(
        "--default-replication-factor",
        type=positive_int,
        default=None,
        help="replicas per partition of a topic created without --replication-factor "
        "(default: 3 with --zookeeper, 1 on the embedded store); a topic needing more replicas "
        "than live brokers is refused",
    )
    serve.add_argument(
        "--group-retention-minutes",
        type=positive_int,
        default=int(CoordinatorConfig().group_retention / 60),
        help="a group with no member for this long is removed with its offsets (Kafka's "
        "offsets.retention.minutes, 7 days)",
    )
    defaults = CoordinatorConfig()
    serve.add_argument(
        "--min-session-timeout-ms",
        type=int,
        default=defaults.min_session_timeout_ms,
        metavar="MS",
        help="the shortest session timeout a consumer may ask for (Kafka's "
        "group.min.session.timeout.ms)",
    )
    serve.add_argument(
        "--max-session-timeout-ms",
        type=int,
        default=defaults.max_session_timeout_ms,
        metavar="MS",
        help="the longest session timeout a consumer may ask for (Kafka's "
        "group.max.session.timeout.ms)",
    )
    serve.add_argument(
        "--ping-misses",
        type=int,
        default=defaults.max_missed_pings,
        help="deadlines a consumer may miss in a row before it is declared dead",
    )
    serve.add_argument(
        "--shed-above-lag",
        type=float,
        default=None,
        metavar="SECONDS",
        help="refuse new connections, registrations and admin requests with a retriable code "
        "(and pace accepts) while the broker's own event loop is more than SECONDS behind or it "
        "uses most of the CPU it may have, and let whole groups go, the newest first, while it "
        "stays that far behind or holds more members than its CPU serves, so that the members it "
        "keeps get their Pings on time (default: off; 0.5 suits T = 6 s: "
        "docs/design.md#shedding-load)",
    )
    serve.add_argument(
        "--initial-rebalance-delay",
        type=float,
        default=defaults.initial_rebalance_delay,
        help="seconds a new group waits for more members before its first rebalance; each "
        "join restarts the wait",
    )
    serve.add_argument(
        "--initial-rebalance-max-delay",
        type=float,
        default=defaults.initial_rebalance_max_delay,
        help="seconds after its first member that a new group rebalances at the latest, "
        "however many keep joining",
    )
    serve.add_argument(
        "--rebalance-backoff",
        type=float,
        default=defaults.rebalance_backoff_fraction,
        help="after a failed rebalance, wait this fraction of the longest session timeout",
    )
    serve.add_argument(
        "--rebalance-protocol",
        choices=[protocol.value for protocol in RebalanceProtocol],
        default=defaults.rebalance_protocol.value,
        help="incremental: a rebalance stops only the partitions that move and asks only the "
        "members that lose or gain some; eager: every member stops everything, then starts",
    )
    serve.add_argument(
        "--commit-interval",
        type=float,
        default=defaults.commit_interval,
        help="seconds between writes of offsets reported in Pings",
    )
    logs = LogConfig()
    serve.add_argument(
        "--fsync",
        choices=[p.value for p in FsyncPolicy],
        default=logs.fsync.value,
        help="always: fsync before acknowledging a produce; interval: every --fsync-interval-ms",
    )
    serve.add_argument(
        "--fsync-interval-ms",
        type=int,
        default=logs.fsync_interval_ms,
        metavar="MS",
        help="with --fsync interval, milliseconds between fsyncs",
    )
    serve.add_argument(
        "--retention-ms",
        type=int,
        default=logs.retention_ms,
        metavar="MS",
        help="delete a partition's segments once their records are this old; -1: keep forever",
    )
    serve.add_argument(
        "--retention-bytes",
        type=int,
        default=-1,
        metavar="BYTES",
        help="delete a partition's oldest segments while the rest hold this much; -1: no limit",
    )
    serve.add_argument(
        "--retention-check-ms",
        type=int,
        default=logs.retention_check_ms,
        metavar="MS",
        help="milliseconds between two looks for segments retention deletes",
    )
    serve.add_argument(
        "--segment-bytes",
        type=int,
        default=logs.segment_bytes,
        metavar="BYTES",
        help="a partition's log rolls to a new segment file at this size",
    )
    _add_limit_options(serve)
    _add_metrics_options(serve)
    add_serve_options(serve)
    add_admin_commands(commands)
    add_data_commands(commands)
    add_user_commands(commands)
    add_acl_commands(commands)
    for sub in [parser, *_subparsers(parser)]:
        for action in sub._actions:
            if isinstance(action, argparse._SubParsersAction):
                action.required = False  # a bare command shows its help (main), not an error
        if sub is not parser:
            # after the command too, as git's and Kafka's tools take theirs; SUPPRESS: not
            # given there, the value given before the command (or None) stands
            _add_log_level(sub, default=argparse.SUPPRESS)
    return parser


def _add_log_level(parser: argparse.ArgumentParser, default: str | None) -> None:
    parser.add_argument(
        "--log-level",
        default=default,
        choices=["DEBUG", "INFO", "WARNING", "ERROR"],
        type=str.upper,
        metavar="LEVEL",
        help="DEBUG, INFO, WARNING or ERROR (default: INFO for serve, WARNING otherwise)",
    )


def _version() -> str:
    try:
        return importlib.metadata.version("consumer-coordinator")
    except importlib.metadata.PackageNotFoundError:  # run from a checkout, not installed
        return "(not installed)"


def _subparsers(parser: argparse.ArgumentParser) -> Iterator[argparse.ArgumentParser]:
    """Every command's and verb's parser under ``parser``, depth first."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                yield sub
                yield from _subparsers(sub)


def _unfinished(
    parser: argparse.ArgumentParser, args: argparse.Namespace
) -> argparse.ArgumentParser | None:
    """The parser whose command or verb ``args`` lacks (``coordinator``, ``coordinator
    topics``), if any: its help is what a user who typed that wants to see."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            chosen = getattr(args, action.dest, None)
            if chosen is None:
                return parser
            return _unfinished(action.choices[chosen], args)
    return None


def _add_metrics_options(serve: argparse.ArgumentParser) -> None:
    metrics = MetricsConfig()
    group = serve.add_argument_group("metrics and status page (README: Metrics)")
    group.add_argument(
        "--metrics-port",
        type=int,
        default=None,
        help="serve Prometheus metrics on /metrics and a status page on / at this port (0: any)",
    )
    group.add_argument(
        "--metrics-host",
        default=metrics.host,
        help="address of the metrics endpoint, which has no authentication (default: %(default)s)",
    )
    group.add_argument(
        "--metrics-partition-lag",
        action="store_true",
        help="also export lag per group and partition",
    )
    group.add_argument(
        "--metrics-partition-lag-max-series",
        type=int,
        default=metrics.partition_lag_max_series,
        help="at most this many per-partition lag series (default: %(default)s)",
    )


def _add_limit_options(serve: argparse.ArgumentParser) -> None:
    """Bounds on what any one client may make the broker hold or do (docs/limits.md)."""
    group = serve.add_argument_group("limits (docs/limits.md)")
    connections = ConnectionLimits()
    requests = RequestLimits()
    group.add_argument(
        "--max-connections",
        type=int,
        default=connections.max_connections,
        help="open client connections at once (default: the file budget less the files kept "
        "for segment files, docs/limits.md#files)",
    )
    group.add_argument(
        "--max-connections-per-address",
        type=int,
        default=connections.max_connections_per_address,
        help="open connections from one client address (default: no limit)",
    )
    group.add_argument(
        "--idle-timeout",
        type=float,
        default=connections.idle_timeout,
        help="seconds a connection may send nothing before it is closed",
    )
    group.add_argument(
        "--frame-timeout",
        type=float,
        default=connections.frame_timeout,
        help="seconds a frame may take to arrive once its first byte has",
    )
    group.add_argument(
        "--max-buffered-request-bytes",
        type=int,
        default=connections.max_buffered_request_bytes,
        help="bytes of unfinished frames buffered for all connections together",
    )
    group.add_argument(
        "--handshake-timeout",
        type=float,
        default=connections.handshake_timeout,
        help="seconds a connection to a TLS or SASL listener has to finish its handshake",
    )
    group.add_argument(
        "--max-frame-size",
        type=int,
        default=CoordinatorConfig().max_frame_size,
        help="largest frame received or sent, in bytes",
    )
    group.add_argument(
        "--max-id-bytes",
        type=int,
        default=requests.max_id_bytes,
        help="UTF-8 bytes of an id or a name a client sends (group, member, topic, client id)",
    )
    group.add_argument(
        "--max-pattern-bytes",
        type=int,
        default=requests.max_pattern_bytes,
        help="UTF-8 bytes of a subscription's pattern",
    )
    group.add_argument(
        "--max-streams-per-topic",
        type=int,
        default=requests.max_streams_per_topic,
        help="streams a subscription may ask for on one topic or pattern",
    )
    group.add_argument(
        "--max-topics-per-subscription",
        type=int,
        default=requests.max_topics_per_subscription,
        help="topics one subscription or metadata request may name",
    )
    group.add_argument(
        "--max-partitions-per-topic",
        type=int,
        default=requests.max_partitions_per_topic,
        help="partitions of one topic",
    )
    group.add_argument(
        "--max-partitions-per-broker",
        type=int,
        default=requests.max_partitions_per_broker,
        help="partitions placed on one broker, over all topics",
    )
    group.add_argument(
        "--max-group-size",
        type=int,
        default=requests.max_group_size,
        help="members of one group (Kafka's group.max.size)",
    )
    group.add_argument(
        "--max-group-streams",
        type=int,
        default=requests.max_group_streams,
        help="streams of one group, each member counting its widest topic",
    )
    group.add_argument(
        "--max-partitions-per-request",
        type=int,
        default=requests.max_partitions_per_request,
        help="partitions one OffsetCommit, OffsetFetch or RegisterConsumer may name",
    )


async def _serve(settings: NodeSettings) -> None:
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async with trio.open_nursery() as nursery:
            port = await nursery.start(run_node, settings)
            host = settings.endpoints()[0].host
            print(f"serving on {host}:{port} (broker {settings.broker_id})", flush=True)
            async for signum in signals:
                log.info("%s: shutting down", signal.Signals(signum).name)
                nursery.cancel_scope.cancel()
                break


#: The exit status of a command whose reader went away (``coordinator groups describe g | head
#: -3``): that of a process SIGPIPE ended, as ``cat`` and ``git log`` end then, without a word.
READER_GONE = 128 + signal.SIGPIPE

#: The exit status of a command without its verb, after its help: a usage mistake, as argparse's
#: (and POSIX utilities') other ones.
USAGE = 2


def main(argv: Sequence[str] | None = None) -> int:
    try:
        try:
            status = _main(argv)
        finally:
            sys.stdout.flush()  # here, where a closed pipe is caught: not at interpreter exit
    except BrokenPipeError:
        # Nothing more reaches the reader, and the interpreter's own flush at exit must not
        # report what is left in the buffer either.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return READER_GONE
    return status


def _main(argv: Sequence[str] | None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    unfinished = _unfinished(parser, args)
    if unfinished is not None:
        unfinished.print_help()
        return USAGE
    configure_logging(
        (args.log_level or ("INFO" if args.command == "serve" else "WARNING")).upper(), sys.stderr
    )
    try:
        if args.command == "serve":
            config = CoordinatorConfig(
                min_session_timeout_ms=args.min_session_timeout_ms,
                max_session_timeout_ms=args.max_session_timeout_ms,
                max_missed_pings=args.ping_misses,
                initial_rebalance_delay=args.initial_rebalance_delay,
                initial_rebalance_max_delay=args.initial_rebalance_max_delay,
                rebalance_backoff_fraction=args.rebalance_backoff,
                rebalance_protocol=RebalanceProtocol(args.rebalance_protocol),
                commit_interval=args.commit_interval,
                max_frame_size=args.max_frame_size,
                coordinator_slots=args.coordinator_slots,
                default_replication_factor=args.default_replication_factor,
                group_retention=args.group_retention_minutes * 60.0,
                shed_groups_above_lag=args.shed_above_lag,
                limits=RequestLimits(
                    max_id_bytes=args.max_id_bytes,
                    max_pattern_bytes=args.max_pattern_bytes,
                    max_streams_per_topic=args.max_streams_per_topic,
                    max_topics_per_subscription=args.max_topics_per_subscription,
                    max_partitions_per_topic=args.max_partitions_per_topic,
                    max_partitions_per_broker=args.max_partitions_per_broker,
                    max_group_size=args.max_group_size,
                    max_group_streams=args.max_group_streams,
                    max_partitions_per_request=args.max_partitions_per_request,
                ),
            )
            settings = NodeSettings(
                broker_id=args.broker_id,
                host=args.host,
                port=args.port,
                data_dir=args.data_dir,
                zookeeper=args.zookeeper,
                zookeeper_session_timeout=args.zookeeper_session_timeout,
                coordinator=config,
                connections=ConnectionLimits(
                    max_connections=args.max_connections,
                    max_connections_per_address=args.max_connections_per_address,
                    idle_timeout=args.idle_timeout,
                    frame_timeout=args.frame_timeout,
                    max_buffered_request_bytes=args.max_buffered_request_bytes,
                    handshake_timeout=args.handshake_timeout,
                ),
                log=LogConfig(
                    fsync=FsyncPolicy(args.fsync),
                    fsync_interval_ms=args.fsync_interval_ms,
                    retention_ms=None if args.retention_ms < 0 else args.retention_ms,
                    retention_bytes=None if args.retention_bytes < 0 else args.retention_bytes,
                    retention_check_ms=args.retention_check_ms,
                    segment_bytes=args.segment_bytes,
                ),
                metrics=MetricsConfig(
                    port=args.metrics_port,
                    host=args.metrics_host,
                    partition_lag=args.metrics_partition_lag,
                    partition_lag_max_series=args.metrics_partition_lag_max_series,
                ),
                shed_above_lag=args.shed_above_lag,
                **serve_security(args),  # type: ignore[arg-type]
            )
            gc.set_threshold(*SERVER_GC_THRESHOLDS)
            trio.run(_serve, settings)
        elif args.command == "produce":
            return trio.run(run_produce, args)
        elif args.command == "consume":
            return trio.run(run_consume, args)
        elif args.command == "users":
            trio.run(run_users, args)
        elif args.command == "acls":
            trio.run(run_acls, args)
        else:
            trio.run(run_admin, args)
    except (
        ValueError,
        OSError,
        StoreError,
        AdminError,
        ProduceError,
        ChannelClosed,
        Refused,
        ExceptionGroup,
    ) as exc:
        cause = _user_error(exc)
        if cause is None:
            raise
        if isinstance(cause, BrokenPipeError):
            raise cause from None  # not a mistake to report: the reader has all it wanted
        message = _describe(cause)
        if isinstance(cause, Refused):
            message = f"{message}: {what_to_do(cause, args)}"
        if args.command == "serve" and getattr(cause, "errno", None) == errno.EADDRINUSE:
            message = f"cannot listen on {args.host}:{args.port}: {message}"
        # One line, whatever an id or a name from the broker in it holds.
        print(f"coordinator: {escape_unprintable(message)}", file=sys.stderr)
        return 2 if isinstance(cause, ValueError) else 1
    return 0


def _user_error(exc: BaseException) -> BaseException | None:
    """The error a user caused, if that is what ``exc`` is (trio wraps task errors in groups)."""
    if isinstance(exc, BaseExceptionGroup):
        for inner in exc.exceptions:
            found = _user_error(inner)
            if found is not None:
                return found
        return None
    return (
        exc
        if isinstance(
            exc,
            ValueError | OSError | StoreError | AdminError | ProduceError | ChannelClosed | Refused,
        )
        else None
    )


def _describe(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.strerror:
        where = f" ({exc.filename})" if exc.filename else ""
        return f"{exc.strerror}{where}"
    return str(exc)


if __name__ == "__main__":
    sys.exit(main())
