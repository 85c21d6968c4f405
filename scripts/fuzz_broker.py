"""Throw random and mutated frames at a real broker process for as long as asked, while a consumer
group is being served on it, and say whether the broker survived.

    python scripts/fuzz_broker.py --frames 200000            # a broker of its own, embedded store
    python scripts/fuzz_broker.py --seconds 60 --seed 7 --kinds bytes,numbers
    python scripts/fuzz_broker.py --bootstrap 127.0.0.1:9092 --broker-log serve.log
    python scripts/fuzz_broker.py --frames 20000 --keep-going   # collect every distinct crash

The frames are those of the suite's fuzz test (``tests/fuzz/frames.py``): every request type,
valid ones and ones with a field changed (numeric extremes, huge counts, long strings, bad regexes,
control characters in ids), bytes mutated, size fields of -1, 0 or huge, good requests pipelined
before a bad frame, Produce of hostile record batches then version-0 Fetches, written whole,
several to a write, or a byte at a time, over ``--connections`` concurrent connections to
127.0.0.1 only. Three ``consume`` processes keep a group served meanwhile.

It prints progress every few seconds and, at the end, one JSON line of figures. It exits 1 if the
broker died, logged a traceback or an ERROR line, or stopped serving the group, printing the
frames (hex) of the connection that did it: with a broker of its own, each suspect connection is
replayed alone against a fresh broker to find the one that reproduces it.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import random
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import AsyncIterator, Sequence
from contextlib import AbstractAsyncContextManager, AsyncExitStack, asynccontextmanager
from pathlib import Path

import attrs
import trio

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # run from a checkout

from consumer.admin import AdminError, open_admin  # noqa: E402
from launch.processes import open_serving_process, stop_process  # noqa: E402
from protocol import ProtocolError  # noqa: E402
from tests.fuzz.frames import (  # noqa: E402
    SERVED_GROUP,
    SERVED_TOPIC,
    Frame,
    Kind,
    Script,
    connection_script,
    converse,
)
from transport.channel import ChannelClosed  # noqa: E402
from transport.connect import parse_bootstrap  # noqa: E402

SERVED_PARTITIONS = 6
SERVED_CONSUMERS = 3
PROGRESS_EVERY = 5.0
ANSWER_TIMEOUT = 5.0
"""Seconds a connection waits for its answers before it gives up on them (counted, not failed: a
frame cut short is the broker's to time out, after its --frame-timeout)."""
_CAPPED = (
    "import resource, runpy, sys; resource.setrlimit(resource.RLIMIT_AS, ({limit}, {limit})); "
    "sys.argv[0] = 'coordinator'; runpy.run_module('cli', run_name='__main__')"
)
"""``python -m cli`` with its address space capped."""
HISTORY = 200
SUSPECTS_SHOWN = 20
"""Connections kept for a replay: what the broker had seen before a finding (a Fetch may need the
topic an earlier connection created and the records another produced)."""
REPLAY_WAIT = 3.0
STALL = 1.0
"""A probe answered later than this is a stalled event loop."""
BROKER_OPTIONS = ("--initial-rebalance-delay", "0.3", "--ping-misses", "3")
ADMIN_ERRORS = (
    OSError,
    ChannelClosed,
    ProtocolError,
    AdminError,
    trio.TooSlowError,
    trio.BrokenResourceError,
    trio.ClosedResourceError,
)
_TRACEBACK = re.compile(r"^[ |+]*(Exception Group )?Traceback \(most recent call last\):", re.M)
_EXCEPTION_LINE = re.compile(
    r"^(?!(Base)?ExceptionGroup\b)(?:[a-z_]\w*\.)*(?:[A-Z]\w*|error)(?:: |$)"
)
_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f\u2028\u2029]")
"""A character a peer put in an id, logged raw: it can forge or hide log lines (case 9)."""
_CLI_ERROR = re.compile(r"^coordinator: .*", re.M)
"""How ``serve`` ends on an OSError or ValueError: one line, no traceback."""
_ERROR_LINE = re.compile(r"^\S+ \S+ (ERROR|CRITICAL) ", re.M)


@attrs.define
class Figures:
    frames: int = 0
    connections: int = 0
    unanswered: Counter[str] = attrs.field(factory=Counter)
    """Connections, by kind, neither answered nor closed within ANSWER_TIMEOUT."""
    codes: Counter[str] = attrs.field(factory=Counter)
    broker_requests: int = 0
    max_probe_seconds: float = 0.0
    stalls: int = 0
    brokers_started: int = 0

    def as_json(self) -> dict[str, object]:
        return {
            "frames": self.frames,
            "connections": self.connections,
            "unanswered_by_kind": dict(self.unanswered),
            "answers_by_code": dict(self.codes.most_common()),
            "requests_from_broker": self.broker_requests,
            "max_probe_seconds": round(self.max_probe_seconds, 3),
            "stalls_over_1s": self.stalls,
            "brokers_started": self.brokers_started,
        }


@attrs.frozen(kw_only=True)
class Finding:
    what: str
    """``traceback``, ``error-line``, ``log-forgery``, ``died`` (without a traceback) or
    ``group-not-served``."""
    died: bool
    signature: str
    """The traceback's last line (or the log line): what tells two findings apart."""
    suspects: tuple[Script, ...]
    reproduction: tuple[Script, ...] | None = None
    """Connections that do it on a fresh broker, one after the other."""

    @property
    def key(self) -> str:
        return _key(self.signature)

    def as_json(self) -> dict[str, object]:
        found = self.reproduction
        return {
            "what": self.what,
            "broker_died": self.died,
            "signature": self.signature,
            "reproduced": found is not None,
            "connections_hex": None if found is None else [s.hex() for s in found],
            "kinds": None if found is None else [s.kind.value for s in found],
            "last_suspects_hex": (
                None if found is not None else [s.hex() for s in self.suspects[-SUSPECTS_SHOWN:]]
            ),
        }


class Stop(Exception):
    """A finding ends the run (without --keep-going)."""


@attrs.define(eq=False)
class Broker:
    """The broker under fuzz: a process of our own, or one at --bootstrap."""

    host: str
    port: int
    process: trio.Process | None = None
    log_path: Path | None = None
    _log_seen: int = 0

    @property
    def alive(self) -> bool:
        return self.process is None or self.process.returncode is None

    def new_log(self) -> str:
        """What the broker logged since the last call."""
        if self.log_path is None or not self.log_path.exists():
            return ""
        with self.log_path.open("rb") as log:
            log.seek(self._log_seen)
            new = log.read()
        self._log_seen += len(new)
        return new.decode(errors="replace")


def _signature(log_text: str) -> tuple[str, str] | None:
    """(kind, signature) of the first traceback or ERROR line in ``log_text``: the innermost
    exception's line with its numbers blanked, so that one bug counts once."""
    match = _TRACEBACK.search(log_text)
    if match is not None:
        leaves = [
            line.strip(" |+")
            for line in log_text[match.start() :].splitlines()
            if _EXCEPTION_LINE.match(line.strip(" |+"))
        ]
        last = leaves[-1] if leaves else "a traceback"
        return "traceback", re.sub(r"\d+", "N", last)[:300]
    match = _CONTROL.search(log_text)
    if match is not None:
        return "log-forgery", "a peer's control character in the log"
    match = _CLI_ERROR.search(log_text)
    if match is not None:
        return "died", re.sub(r"\d+", "N", match.group(0))[:300]
    match = _ERROR_LINE.search(log_text)
    if match is not None:
        line = log_text[match.start() :].splitlines()[0]
        return "error-line", re.sub(r"\d+", "N", line.split(" ", 2)[-1])[:300]
    return None


@asynccontextmanager
async def open_own_broker(
    work: Path, figures: Figures, *, served: bool = True, memory_mb: int = 4096
) -> AsyncIterator[Broker]:
    """A fresh broker on the embedded store in a new data dir under ``work``, with the served
    topic, and (``served``) its consumer group. Its address space is capped at ``memory_mb``, so
    that a request that makes it allocate without bound ends in a MemoryError (a finding), not
    in the machine swapping."""
    figures.brokers_started += 1
    data_dir = Path(tempfile.mkdtemp(prefix="broker-", dir=work))
    log_path = data_dir.with_suffix(".log")
    command = [
        sys.executable, "-c", _CAPPED.format(limit=memory_mb * 2**20),
        "serve", "--host", "127.0.0.1", "--port", "0", "--data-dir", str(data_dir), *BROKER_OPTIONS,
    ]  # fmt: skip
    try:
        async with open_serving_process(command, log_path) as (process, host, port):
            broker = Broker(host=host, port=port, process=process, log_path=log_path)
            async with open_served_group(broker, consumers=SERVED_CONSUMERS if served else 0):
                yield broker
    finally:
        shutil.rmtree(data_dir, ignore_errors=True)  # the log stays


@asynccontextmanager
async def open_served_group(
    broker: Broker, *, consumers: int = SERVED_CONSUMERS
) -> AsyncIterator[None]:
    """The served topic (created if missing) and ``consumers`` ``consume`` processes in the
    served group, stopped when the block ends."""
    bootstrap = f"{broker.host}:{broker.port}"
    async with open_admin(parse_bootstrap(bootstrap)) as admin:
        with contextlib.suppress(AdminError):  # it exists already
            await admin.create_topic(SERVED_TOPIC, SERVED_PARTITIONS)
    command = [
        sys.executable, "-m", "cli", "consume", SERVED_TOPIC, "--group", SERVED_GROUP,
        "--bootstrap", bootstrap,
    ]  # fmt: skip
    processes = [
        await trio.lowlevel.open_process(
            command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=REPO
        )
        for _ in range(consumers)
    ]
    try:
        with trio.move_on_after(60):
            while processes and not await group_served(broker):
                await trio.sleep(0.2)
        yield
    finally:
        with trio.CancelScope(shield=True):
            for process in processes:
                await stop_process(process)


async def group_served(broker: Broker) -> bool:
    """Whether the served group is Stable with its consumers, each partition owned once."""
    report = None
    try:
        with trio.fail_after(10):
            async with open_admin([(broker.host, broker.port)]) as admin:
                report = await admin.describe_group(SERVED_GROUP)
    except* ADMIN_ERRORS:
        pass  # not served, then
    if report is None:
        return False
    owned = [tp for member in report.members for tp in member.partitions]
    return (
        report.state.lower() == "stable"
        and len(report.members) == SERVED_CONSUMERS
        and len(owned) == len(set(owned)) == SERVED_PARTITIONS
    )


async def run_connection(
    broker: Broker, script: Script, figures: Figures | None, linger: float
) -> None:
    """One fuzz connection: write the script, wait for the answers or the end, linger, close."""
    try:
        stream = await trio.open_tcp_stream(broker.host, broker.port)
    except OSError:
        return  # refused: the broker is gone, which the watch reports
    answers, done = await converse(stream, script, answer_timeout=ANSWER_TIMEOUT, linger=linger)
    if figures is not None:
        figures.frames += len(script.frames)
        figures.connections += 1
        figures.codes.update(answers.codes)
        figures.broker_requests += answers.requests
        if not done:
            figures.unanswered[script.kind.value] += 1


@attrs.define
class Fuzzer:
    args: argparse.Namespace
    kinds: tuple[Kind, ...]
    figures: Figures = attrs.field(factory=Figures)
    rng: random.Random = attrs.field(init=False)
    findings: list[Finding] = attrs.field(factory=list)
    started: float = attrs.field(factory=time.monotonic)
    history: collections.deque[Script] = attrs.field(
        factory=lambda: collections.deque(maxlen=HISTORY)
    )
    """The latest connections in the order they began."""
    broker_alive: bool = False
    """Whether the broker fuzzed last was alive at the end."""
    group_served: bool | None = None
    """Whether it still served the group at the end (None: not asked, it had a finding)."""

    def __attrs_post_init__(self) -> None:
        self.rng = random.Random(self.args.seed)

    def done(self) -> bool:
        if self.args.frames is not None and self.figures.frames >= self.args.frames:
            return True
        return (
            self.args.seconds is not None and time.monotonic() - self.started >= self.args.seconds
        )

    def next_script(self) -> tuple[Script, float]:
        script = connection_script(self.rng, self.rng.choice(self.kinds), slow_topic_max=24)
        linger = min(script.linger, self.args.linger_max) if self.rng.random() < 0.1 else 0.0
        return script, linger

    async def lane(self, broker: Broker) -> None:
        while not self.done():
            script, linger = self.next_script()
            self.history.append(script)
            await run_connection(broker, script, self.figures, linger)

    async def watch(self, broker: Broker, lanes: trio.CancelScope) -> None:
        """Every half second: is the broker alive, did it log a traceback, does it answer?"""
        last_progress = time.monotonic()
        while True:
            await trio.sleep(0.5)
            await self.probe(broker)
            seen = _signature(broker.new_log())
            if not broker.alive or seen is not None:
                if not broker.alive:
                    await trio.sleep(0.5)  # the rest of its last words
                    seen = seen or _signature(broker.new_log())
                code = None if broker.process is None else broker.process.returncode
                what, signature = seen or ("died", f"exited with {code}")
                self.report(
                    Finding(
                        what=what,
                        died=not broker.alive,
                        signature=signature,
                        suspects=tuple(self.history),
                    )
                )
                lanes.cancel()
                return
            if time.monotonic() - last_progress >= PROGRESS_EVERY:
                last_progress = time.monotonic()
                self.progress()

    async def probe(self, broker: Broker) -> None:
        """A ListGroups round trip: how long the broker's event loop keeps others waiting (a
        probe still unanswered when the watch moves on counts as long as it waited)."""
        began = time.monotonic()
        answered = False
        try:
            with trio.move_on_after(30):
                async with open_admin([(broker.host, broker.port)]) as admin:
                    await admin.groups()
                    answered = True
        except* ADMIN_ERRORS:
            pass  # gone: the watch finds out from the process
        took = time.monotonic() - began
        if not answered and not broker.alive:
            return
        self.figures.max_probe_seconds = max(self.figures.max_probe_seconds, took)
        if took > STALL:
            self.figures.stalls += 1
            print(f"  stall: a ListGroups took {took:.1f} s", file=sys.stderr)

    def report(self, finding: Finding) -> None:
        if finding.key in {f.key for f in self.findings}:
            return
        self.findings.append(finding)
        print(f"FOUND {finding.what}: {finding.signature}", file=sys.stderr, flush=True)

    def progress(self) -> None:
        elapsed = time.monotonic() - self.started
        f = self.figures
        print(
            f"{elapsed:6.0f} s  {f.frames} frames  {f.connections} connections  "
            f"{f.frames / max(elapsed, 1e-9):.0f} frames/s  findings {len(self.findings)}",
            file=sys.stderr,
            flush=True,
        )

    async def run(self, work: Path) -> None:
        """Fuzz until done, or until the first finding without --keep-going."""
        while True:
            already = len(self.findings)
            async with AsyncExitStack() as stack:
                broker = await self.open_broker(stack, work)
                async with trio.open_nursery() as nursery:
                    lanes = trio.CancelScope()
                    nursery.start_soon(self.watch, broker, lanes)
                    with lanes:
                        async with trio.open_nursery() as fuzz:
                            for _ in range(self.args.connections):
                                fuzz.start_soon(self.lane, broker)
                    nursery.cancel_scope.cancel()
                for finding in self.findings[already:]:
                    await self.reproduce(finding, work)
                if self.done() and broker.alive and not lanes.cancelled_caught:
                    self.group_served = served = await group_served(broker)
                    self.broker_alive = broker.alive
                    if not served:
                        self.report(
                            Finding(
                                what="group-not-served",
                                died=False,
                                signature="the served group is not Stable with every partition "
                                "owned once",
                                suspects=(),
                            )
                        )
                    return
                if not self.args.keep_going or self.done() or self.args.bootstrap:
                    self.broker_alive = broker.alive
                    return

    async def open_broker(self, stack: AsyncExitStack, work: Path) -> Broker:
        if self.args.bootstrap:
            ((host, port),) = parse_bootstrap(self.args.bootstrap)[:1]
            if host not in ("127.0.0.1", "localhost", "::1"):
                raise SystemExit("fuzz only a broker on this machine (127.0.0.1)")
            broker = Broker(host=host, port=port, log_path=self.args.broker_log)
            broker.new_log()  # what was there before is not ours
            await stack.enter_async_context(open_served_group(broker))
            return broker
        return await stack.enter_async_context(self.own_broker(work, self.figures))

    def own_broker(
        self, work: Path, figures: Figures, *, served: bool = True
    ) -> AbstractAsyncContextManager[Broker]:
        return open_own_broker(work, figures, served=served, memory_mb=self.args.broker_memory_mb)

    async def reproduce(self, finding: Finding, work: Path) -> None:
        """Replay the connections the broker had seen, in order and one at a time, against a
        fresh broker until one does it again; then try that one alone on a broker of its own,
        after each of the earlier ones that may have made state it needs, after all of those,
        and after everything before it."""
        if self.args.bootstrap:
            return
        suspects = list(finding.suspects)
        culprit = None
        async with self.own_broker(work, Figures(), served=False) as broker:
            for index, script in enumerate(suspects):
                if await self.replay(broker, script, wait=0.1, like=finding):
                    culprit = index
                    break
        if culprit is None:
            print("  not reproduced by a replay; the suspects are in the JSON", file=sys.stderr)
            return
        earlier = [s for s in suspects[:culprit] if _makes_state(s)][-self.args.replay_limit :]
        everything = suspects[:culprit]
        for prefix in ([], *([s] for s in reversed(earlier)), earlier, everything):
            async with self.own_broker(work, Figures(), served=False) as broker:
                for script in prefix:
                    await run_connection(broker, script, None, 0.0)
                if await self.replay(broker, suspects[culprit], like=finding):
                    found = (*prefix, suspects[culprit])
                    index = self.findings.index(finding)
                    self.findings[index] = attrs.evolve(finding, reproduction=found)
                    print(
                        "  reproduced by:\n" + "\n".join(s.describe() for s in found),
                        file=sys.stderr,
                    )
                    return
        print("  the replay did it but no reduction does; see suspects", file=sys.stderr)

    async def replay(
        self, broker: Broker, script: Script, *, wait: float = REPLAY_WAIT, like: Finding
    ) -> bool:
        """Whether ``script`` alone makes ``broker`` do what ``like`` says (die, or log the same
        kind of traceback) within ``wait`` seconds after its connection ends (a registration
        stays connected through its group's first rebalance)."""
        broker.new_log()
        linger = 0.5 if _makes_state(script) else 0.0
        await run_connection(broker, script, None, linger)
        seen: list[tuple[str, str]] = []
        with trio.move_on_after(wait):
            while broker.alive and not seen:
                found = _signature(broker.new_log())
                if found is not None:
                    seen.append(found)
                await trio.sleep(0.05)
        if not broker.alive:
            await trio.sleep(0.2)
            found = _signature(broker.new_log())
            if found is not None:
                seen.append(found)
        if any(_key(signature) == like.key for _, signature in seen):
            return True
        return like.what == "died" and not seen and not broker.alive


def _key(signature: str) -> str:
    """What tells two findings apart: the exception's type, and for the protocol's own errors
    (one type, many bugs) its message too."""
    if signature.startswith("protocol."):
        return signature
    return signature.split(":")[0]


def _makes_state(script: Script) -> bool:
    """Whether a connection may leave something a later one needs: a topic, records, a member."""
    return any(
        label in frame.label
        for frame in script.frames
        for label in ("CreateTopic", "CreatePartitions", "Produce", "RegisterConsumer")
    )


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--frames", type=int, help="stop after this many frames")
    parser.add_argument("--seconds", type=float, help="stop after this long")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--connections", type=int, default=32, help="concurrent connections")
    parser.add_argument(
        "--kinds",
        default=",".join(k.value for k in Kind),
        help="classes of input, comma-separated (default: all): "
        + ", ".join(k.value for k in Kind),
    )
    parser.add_argument("--bootstrap", help="fuzz this broker (127.0.0.1 only), not one of ours")
    parser.add_argument("--broker-log", type=Path, help="with --bootstrap: its log, for tracebacks")
    parser.add_argument(
        "--keep-going",
        action="store_true",
        help="after a finding, start a fresh broker and go on; report every distinct one",
    )
    parser.add_argument(
        "--broker-memory-mb",
        type=int,
        default=4096,
        help="address space of a broker of our own: past it, a MemoryError (default 4096)",
    )
    parser.add_argument("--linger-max", type=float, default=2.0)
    parser.add_argument(
        "--replay-limit", type=int, default=20, help="earlier connections tried with a culprit"
    )
    parser.add_argument(
        "--replay",
        action="append",
        metavar="HEX[,HEX...]",
        help="instead of fuzzing, send this connection's frames to a fresh broker (repeatable: "
        "one connection each, in order) and report whether it died or logged a traceback",
    )
    parser.add_argument("--work-dir", type=Path, help="data dirs and logs (default: a temp dir)")
    args = parser.parse_args(argv)
    if args.frames is None and args.seconds is None:
        args.frames = 10_000
    return args


def replay_script(text: str) -> Script:
    """One connection of a reproduction: its frames' hex, comma-separated, sent in one write."""
    frames = tuple(
        Frame(data=bytes.fromhex(part), intact=False, correlation_id=-1, label="replayed")
        for part in text.split(",")
    )
    return Script(kind=Kind.VALID, frames=frames, writes=(b"".join(f.data for f in frames),))


async def replay_main(args: argparse.Namespace) -> int:
    """Send each --replay connection, one after the other, to a fresh broker of our own (its
    served topic created, no consumers), and say whether it died or logged a traceback."""
    work = args.work_dir or Path(tempfile.mkdtemp(prefix="fuzz-replay-"))
    seen = None
    memory_mb = args.broker_memory_mb
    async with open_own_broker(work, Figures(), served=False, memory_mb=memory_mb) as broker:
        for text in args.replay:
            await run_connection(broker, replay_script(text), None, args.linger_max)
        with trio.move_on_after(REPLAY_WAIT):
            while broker.alive and (seen := _signature(broker.new_log())) is None:
                await trio.sleep(0.1)
        seen = seen or _signature(broker.new_log())
        alive = broker.alive
    print(json.dumps({"broker_alive": alive, "finding": seen, "log": str(broker.log_path)}))
    return 0 if alive and seen is None else 1


async def main(args: argparse.Namespace) -> int:
    if args.replay:
        return await replay_main(args)
    kinds = tuple(Kind(name) for name in args.kinds.split(",") if name)
    fuzzer = Fuzzer(args=args, kinds=kinds)
    work = args.work_dir or Path(tempfile.mkdtemp(prefix="fuzz-broker-"))
    work.mkdir(parents=True, exist_ok=True)
    print(f"fuzzing: seed {args.seed}, kinds {args.kinds}, logs under {work}", file=sys.stderr)
    await fuzzer.run(work)
    fuzzer.progress()
    elapsed = time.monotonic() - fuzzer.started
    failed = bool(fuzzer.findings)
    summary = {
        **fuzzer.figures.as_json(),
        "seconds": round(elapsed, 1),
        "frames_per_s": round(fuzzer.figures.frames / max(elapsed, 1e-9), 1),
        "seed": args.seed,
        "broker_alive": fuzzer.broker_alive,
        "group_served": fuzzer.group_served,
        "tracebacks": sum(f.what == "traceback" for f in fuzzer.findings),
        "deaths": sum(f.what == "died" for f in fuzzer.findings),
        "findings": [f.as_json() for f in fuzzer.findings],
    }
    print(json.dumps(summary), flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(trio.run(main, parse_args()))
