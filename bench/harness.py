"""What the benchmarks share: start the coordinator, the bare server and the load generator's
workers (:mod:`bench.loadgen`) as processes, drive the workers (hold consumers, count false
deaths, hold the bare baseline), read the servers' CPU and memory from /proc, and give each run
its work directory. Figures are printed by :func:`bench.measure.figure`.

Every process is owned by an async context manager and stopped (SIGCONT, SIGTERM, then SIGKILL)
when its block ends, whatever happened inside.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import math
import os
import re
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import urllib.request
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any

import attrs
import trio

from bench.bare import BROADCAST_SIZES, FrameReader, LineReader, bare_frame
from bench.loadgen import PER_WORKER
from bench.measure import figure, now
from consumer.runtime import first_cause
from launch.processes import open_serving_process, stop_process
from protocol import ClusterMetadataRequest, CreateTopicRequest, CreateTopicResponse, ErrorCode
from transport.connect import open_channel

REPO = Path(__file__).resolve().parents[1]
STARTUP_TIMEOUT = 60.0
_CLK_TCK = os.sysconf("SC_CLK_TCK")


# --- the parent's handles -----------------------------------------------------------------------


def cpu_seconds(pid: int) -> float:
    """utime + stime of process ``pid``, from /proc/<pid>/stat."""
    text = Path(f"/proc/{pid}/stat").read_text()
    fields = text[text.rindex(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / _CLK_TCK


@attrs.define(eq=False)
class ServerProcess:
    process: trio.Process
    host: str
    port: int
    log_path: Path

    def cpu_seconds(self) -> float:
        return cpu_seconds(self.process.pid)

    def rss_bytes(self, field: str = "VmRSS") -> int:
        """Resident memory now; ``field="VmHWM"``: its peak over the process's life."""
        for line in Path(f"/proc/{self.process.pid}/status").read_text().splitlines():
            if line.startswith(f"{field}:"):
                return int(line.split()[1]) * 1024
        return 0

    def open_files(self) -> int:
        """Descriptors the process holds now (sockets included): what its file limit caps."""
        return len(os.listdir(f"/proc/{self.process.pid}/fd"))

    def file_limit(self) -> int:
        """The process's soft limit of open files, from /proc/<pid>/limits."""
        for line in Path(f"/proc/{self.process.pid}/limits").read_text().splitlines():
            if line.startswith("Max open files"):
                return int(line.split()[3])
        return 0


@asynccontextmanager
async def _open_server(command: Sequence[str], log_path: Path) -> AsyncIterator[ServerProcess]:
    async with open_serving_process(command, log_path, startup_timeout=STARTUP_TIMEOUT) as (
        process,
        host,
        port,
    ):
        yield ServerProcess(process=process, host=host, port=port, log_path=log_path)


def open_coordinator(data_dir: Path, *args: str) -> AbstractAsyncContextManager[ServerProcess]:
    """A real broker + coordinator: ``python -m cli serve --port 0`` with ``args``, on a
    fresh ``data_dir`` (whatever a previous run left there is removed)."""
    shutil.rmtree(data_dir, ignore_errors=True)
    data_dir.mkdir(parents=True)
    command = [
        sys.executable,
        "-m",
        "cli",
        "--log-level",
        os.environ.get("BENCH_SERVER_LOG_LEVEL", "WARNING"),
        "serve",
        "--port",
        "0",
        "--data-dir",
        str(data_dir),
        *args,
    ]
    return _open_server(command, data_dir / "server.log")


def open_bare_server(
    work_dir: Path, broadcast: Sequence[tuple[int, int]] = ()
) -> AbstractAsyncContextManager[ServerProcess]:
    """The bare baseline server; ``broadcast`` gives its two rounds' (request, reply) sizes."""
    work_dir.mkdir(parents=True, exist_ok=True)
    sizes = [str(n) for pair in (broadcast or BROADCAST_SIZES) for n in pair]
    command = [sys.executable, "-m", "bench.loadgen", "bare-serve", "--sizes", *sizes]
    return _open_server(command, work_dir / "bare.log")


@attrs.define(eq=False)
class Worker:
    process: trio.Process
    lines: LineReader
    #: The clients this worker was started for (those it joins on "join", if started idle).
    share: int = 0

    async def command(self, line: str, *, within: float = 60.0) -> dict[str, Any]:
        assert self.process.stdin is not None
        # One exchange, never cut in half by the caller's deadline: an unread reply would be
        # taken as the answer to the next command.
        with trio.CancelScope(shield=True), trio.fail_after(within):
            await self.process.stdin.send_all(line.encode() + b"\n")
            reply = await self.lines.next()
        if reply is None:
            raise RuntimeError(f"worker {self.process.pid} ended")
        result: dict[str, Any] = json.loads(reply)
        return result

    def signal(self, signum: int) -> None:
        self.process.send_signal(signum)


@asynccontextmanager
async def open_module(
    module: str, arguments: Sequence[str], log_path: Path, *, stdin: bool = False
) -> AsyncIterator[trio.Process]:
    """``python -m module arguments`` from this checkout, its stdout a pipe (and its stdin, with
    ``stdin``), its stderr appended to ``log_path``; stopped when the block ends."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    with open(log_path, "ab") as log_file:
        process = await trio.lowlevel.open_process(
            [sys.executable, "-m", module, *arguments],
            stdin=subprocess.PIPE if stdin else None,
            stdout=subprocess.PIPE,
            stderr=log_file,
            cwd=REPO,
            env=env,
        )
    try:
        yield process
    finally:
        with trio.CancelScope(shield=True):
            if process.stdin is not None:
                await process.stdin.aclose()
            await stop_process(process)


@asynccontextmanager
async def open_worker(arguments: Sequence[str], log_path: Path) -> AsyncIterator[Worker]:
    async with open_module("bench.loadgen", arguments, log_path, stdin=True) as process:
        assert process.stdout is not None
        yield Worker(process=process, lines=LineReader(process.stdout))


@asynccontextmanager
async def _open_workers(
    count: int, per_worker: int, command: Callable[[int, int], tuple[list[str], Path]]
) -> AsyncIterator[list[Worker]]:
    """Load workers for ``count`` of something, at most ``per_worker`` each (a process may hold
    20,000 open files); ``command(first, share)``: one worker's arguments and log file."""
    workers: list[Worker] = []
    async with trio.open_nursery() as nursery:
        try:
            for first in range(0, count, per_worker):
                share = min(per_worker, count - first)
                arguments, log_path = command(first, share)
                workers.append(await _start(nursery, arguments, log_path))
                workers[-1].share = share
            yield workers
        finally:
            nursery.cancel_scope.cancel()


def open_consumers(
    server: ServerProcess,
    count: int,
    work_dir: Path,
    *,
    group_size: int,
    session_timeout_ms: int,
    topic: str = "bench",
    group_prefix: str = "g",
    member_prefix: str = "m",
    first: int = 0,
    per_worker: int = PER_WORKER,
    tls_ca: Path | None = None,
    bootstrap: Sequence[ServerProcess] = (),
    idle: bool = False,
    rejoin: bool = False,
) -> AbstractAsyncContextManager[list[Worker]]:
    """``count`` consumers over ceil(count / per_worker) workers; member i is in group
    i // group_size; over TLS trusting ``tls_ca`` if given. With ``bootstrap``, each consumer
    registers with its group's coordinator as these brokers name it, not with ``server``.
    ``idle``: the workers start with no consumer, for :func:`join` to start their share.
    ``rejoin``: a consumer whose registered connection ended registers again (``--rejoin``)."""
    found_through = ",".join(f"{b.host}:{b.port}" for b in bootstrap)

    def command(offset: int, share: int) -> tuple[list[str], Path]:
        index = first + offset
        arguments = ["consumers", f"--host={server.host}", f"--port={server.port}"]
        arguments += [f"--count={0 if idle else share}", f"--first={index}"]
        arguments += [f"--group-size={group_size}"]
        arguments += [f"--group-prefix={group_prefix}", f"--member-prefix={member_prefix}"]
        arguments += [f"--topic={topic}", f"--session-timeout-ms={session_timeout_ms}"]
        arguments += [] if tls_ca is None else [f"--tls-ca={tls_ca}"]
        arguments += [f"--bootstrap={found_through}"] if bootstrap else []
        arguments += ["--rejoin"] if rejoin else []
        return arguments, work_dir / f"{member_prefix}{index}.log"

    return _open_workers(count, per_worker, command)


def open_bare_clients(
    server: ServerProcess,
    count: int,
    work_dir: Path,
    *,
    interval: float,
    request_size: int = 64,
    reply_size: int = 64,
    per_worker: int = PER_WORKER,
    join_sizes: Sequence[int] = (),
    idle: bool = False,
) -> AbstractAsyncContextManager[list[Worker]]:
    """``count`` bare clients (see :func:`open_consumers` for ``idle``); ``join_sizes``: they
    join as a consumer does on the wire (``bench.loadgen bare --join-sizes``)."""

    def command(first: int, share: int) -> tuple[list[str], Path]:
        arguments = ["bare", f"--host={server.host}", f"--port={server.port}"]
        arguments += [f"--count={0 if idle else share}", f"--interval={interval}"]
        arguments += [f"--request-size={request_size}", f"--reply-size={reply_size}"]
        arguments += ["--join-sizes", *map(str, join_sizes)] if join_sizes else []
        return arguments, work_dir / f"bare{first}.log"

    return _open_workers(count, per_worker, command)


@asynccontextmanager
async def open_bare(
    work: Path,
    count: int,
    *,
    interval: float,
    ping: tuple[int, int],
    servers: int = 1,
    join_sizes: Sequence[int] = (),
    idle: bool = False,
) -> AsyncIterator[list[tuple[ServerProcess, list[Worker]]]]:
    """``servers`` bare servers, each with its share of ``count`` clients doing one round trip
    per ``interval``; ``ping``: the Ping's request and answer sizes, of which a bare server
    receives the answer's and sends the request's, as a coordinator does. ``join_sizes`` and
    ``idle``: see :func:`open_bare_clients`."""
    async with contextlib.AsyncExitStack() as stack:
        held = []
        for index in range(servers):
            share = count // servers + (1 if index < count % servers else 0)
            where = work / f"bare{index}" if servers > 1 else work / "bare"
            bare = await stack.enter_async_context(open_bare_server(where))
            clients = await stack.enter_async_context(
                open_bare_clients(
                    bare,
                    share,
                    where,
                    interval=interval,
                    request_size=ping[1],
                    reply_size=ping[0],
                    join_sizes=join_sizes,
                    idle=idle,
                )
            )
            held.append((bare, clients))
        yield held


async def _start(nursery: trio.Nursery, arguments: list[str], log_path: Path) -> Worker:
    """A worker owned by ``nursery``'s task, which keeps it until the nursery is cancelled."""

    async def hold(task_status: trio.TaskStatus[Worker]) -> None:
        async with open_worker(arguments, log_path) as worker:
            task_status.started(worker)
            await trio.sleep_forever()

    worker: Worker = await nursery.start(hold)
    return worker


@attrs.frozen(kw_only=True)
class Join:
    """Seconds from the first client started to the last joined; CPU seconds over that time of
    the clients' workers together, and of each server process asked about."""

    wall: float
    clients_cpu: float
    servers_cpu: list[float]


async def join(
    workers: Sequence[Worker], *, together: bool, within: float, pids: Sequence[int] = ()
) -> Join:
    """Start each idle worker's share of clients (consumers or bare) and wait until every one
    has joined or given up. ``together``: all workers at once; else one after the other, each
    once the previous one's have joined. A worker says when its last client joined, so no poll
    interval is counted; the workers are running before the clock starts, so no process start
    is either. ``pids``: the servers whose CPU is measured."""
    for worker in workers:
        await worker.command("stats")  # up, its modules loaded
    clients = [w.process.pid for w in workers]
    cpu0 = [cpu_seconds(pid) for pid in (*clients, *pids)]
    started = now()
    ended = started
    if together:
        for worker in workers:
            await worker.command(f"join {worker.share}")
    for worker in workers:
        if not together:
            await worker.command(f"join {worker.share}")
        reply = await worker.command("settled", within=within)
        ended = max(ended, float(reply["t"]))
    cpu = [cpu_seconds(pid) - c for pid, c in zip((*clients, *pids), cpu0, strict=True)]
    return Join(
        wall=ended - started, clients_cpu=sum(cpu[: len(clients)]), servers_cpu=cpu[len(clients) :]
    )


async def stats(workers: Sequence[Worker]) -> list[dict[str, Any]]:
    return [await w.command("stats") for w in workers]


async def wait_until(
    workers: Sequence[Worker], done: Any, *, timeout: float, every: float = 0.2
) -> list[dict[str, Any]]:
    """Poll the workers' stats until ``done(stats)``; RuntimeError with the last stats if not."""
    last: list[dict[str, Any]] = []
    with trio.move_on_after(timeout):
        while True:
            last = await stats(workers)
            if done(last):
                return last
            await trio.sleep(every)
    raise RuntimeError(f"condition not reached in {timeout} s: {_summary(last)}")


def _summary(all_stats: list[dict[str, Any]]) -> str:
    keys = ("consumers", "registered", "live", "dropped", "error_count", "errors", "generations")
    return json.dumps([{k: s.get(k) for k in keys} for s in all_stats])[:2000]


async def fewest_live(
    workers: Sequence[Worker],
    seconds: float,
    *,
    every: float,
    each_poll: Callable[[], None] = lambda: None,
) -> int:
    """Hold for ``seconds``, asking the workers every ``every`` seconds how many of their
    consumers are live (and calling ``each_poll``); the fewest seen at any poll."""
    deadline = trio.current_time() + seconds
    fewest = math.inf
    while trio.current_time() < deadline:
        await trio.sleep(min(every, max(0.0, deadline - trio.current_time())))
        fewest = min(fewest, sum(s["live"] for s in await stats(workers)))
        each_poll()
    return int(fewest) if fewest < math.inf else sum(s["live"] for s in await stats(workers))


@attrs.frozen(kw_only=True)
class ConsumerHold:
    """What ``consumers`` consumers did over a hold: the fewest live at any poll, the workers'
    stats at its end, its length, and the CPU seconds of each process asked about over it."""

    consumers: int
    worst_live: int
    stats: list[dict[str, Any]]
    wall: float
    cpu: list[float]

    def total(self, key: str) -> int:
        return sum(int(s[key]) for s in self.stats)

    @property
    def false_deaths(self) -> int:
        """Connections the coordinator closed, failed registrations, consumers not live at some
        poll."""
        dropped, errors = self.total("dropped"), self.total("error_count")
        return dropped + errors + self.consumers - self.worst_live

    @property
    def held(self) -> int:
        """The consumers held: the fewest live, if none died falsely; else none."""
        return self.worst_live if self.false_deaths == 0 else 0

    def lateness(self, key: str) -> float:
        """The worst of the workers' Ping lateness ``key`` (seconds)."""
        return max(s[key] or 0.0 for s in self.stats)


def report_hold(
    benchmark: str,
    holding: ConsumerHold,
    baseline: BareHold | None,
    *,
    session_timeout_ms: int,
    common: dict[str, Any],
    **held: Any,
) -> None:
    """The figures of a hold: consumers held against what the bare servers held (if measured),
    false deaths and what they were, and how late Pings came against their deadline (2T/3)."""
    bare_held = None if baseline is None else sum(baseline.held)
    bare_hold = {} if baseline is None else {"bare_hold_s": round(baseline.wall, 1)}
    figure(
        benchmark,
        "consumers_held",
        holding.held,
        "consumers",
        bare_held,
        **common,
        **bare_hold,
        **held,
    )
    figure(
        benchmark,
        "false_deaths",
        holding.false_deaths,
        "consumers",
        0,
        **common,
        dropped=holding.total("dropped"),
        errors=holding.total("error_count"),
        not_live_at_a_poll=holding.consumers - holding.worst_live,
        first_errors=[e for s in holding.stats for e in s["errors"]][:5],
    )
    p99, worst = holding.lateness("lateness_p99"), holding.lateness("lateness_max")
    figure(benchmark, "ping_lateness_p99", p99 * 1e3, "ms", None, **common)
    figure(
        benchmark,
        "ping_lateness_max",
        worst * 1e3,
        "ms",
        None,
        **common,
        deadline_ms=session_timeout_ms * 2 / 3,
    )


async def hold_consumers(
    workers: Sequence[Worker],
    count: int,
    seconds: float,
    *,
    every: float,
    pids: Sequence[int] = (),
    each_poll: Callable[[], None] = lambda: None,
) -> ConsumerHold:
    """Reset the workers' counters, then hold ``count`` consumers for ``seconds`` (see
    :func:`fewest_live`), measuring the CPU of the processes ``pids`` over the hold."""
    for worker in workers:
        await worker.command("reset")
    cpu0, t0 = [cpu_seconds(pid) for pid in pids], now()
    worst_live = await fewest_live(workers, seconds, every=every, each_poll=each_poll)
    wall = now() - t0
    cpu = [cpu_seconds(pid) - c for pid, c in zip(pids, cpu0, strict=True)]
    return ConsumerHold(
        consumers=count, worst_live=worst_live, stats=await stats(workers), wall=wall, cpu=cpu
    )


async def groups_formed(workers: Sequence[Worker], *, timeout: float, every: float = 0.2) -> bool:
    """Whether every group finished its first rebalance within ``timeout``: a benchmark that
    goes on without says so rather than hide it."""
    try:
        await wait_until(workers, all_groups_stable, timeout=timeout, every=every)
    except RuntimeError:
        return False
    return True


@attrs.frozen(kw_only=True)
class BareHold:
    """What bare servers and their clients did: per server, CPU seconds over the hold, RSS at its
    end and at its peak, and the connections it held; the round trips of the hold, its length,
    and the time the clients took to connect (all, or as many as the servers took in time)."""

    cpu: list[float]
    rss: list[int]
    peak_rss: list[int]
    held: list[int]
    round_trips: int
    wall: float
    connect: float
    #: With the workers started idle: the join's CPU seconds (:class:`Join`).
    joined: Join | None = None


async def hold_bare(
    servers: Sequence[tuple[ServerProcess, Sequence[Worker]]],
    count: int,
    *,
    hold: float,
    connect_timeout: float,
    started_idle: bool = False,
    together: bool = True,
) -> BareHold:
    """Wait (bounded) until ``count`` bare clients are connected over ``servers``, then hold
    for ``hold`` seconds and measure each server. ``started_idle``: the workers were started
    idle, and join here (:func:`join`), all at once or, unless ``together``, one worker after
    another, taking the servers in turn."""
    every = [w for _, clients in servers for w in clients]
    joined = None
    if started_idle:
        pids = [server.process.pid for server, _ in servers]
        in_turn = [w for ws in itertools.zip_longest(*(c for _, c in servers)) for w in ws if w]
        joined = await join(in_turn, together=together, within=connect_timeout, pids=pids)
        connect = joined.wall
    else:
        started = now()
        # Under load trio's accept loop takes one connection per scheduler pass, and a bare
        # server may not get them all in time: what it then holds is the baseline.
        with contextlib.suppress(RuntimeError):
            await wait_until(
                every, lambda st: sum(s["connected"] for s in st) >= count, timeout=connect_timeout
            )
        connect = now() - started
    await trio.sleep(1.0)
    for worker in every:
        await worker.command("reset")
    cpu0 = [server.cpu_seconds() for server, _ in servers]
    t0 = now()
    await trio.sleep(hold)
    cpu = [server.cpu_seconds() - c for (server, _), c in zip(servers, cpu0, strict=True)]
    wall = now() - t0
    per_server = [await stats(clients) for _, clients in servers]
    return BareHold(
        cpu=cpu,
        rss=[server.rss_bytes() for server, _ in servers],
        peak_rss=[server.rss_bytes("VmHWM") for server, _ in servers],
        held=[sum(s["connected"] - s["dropped"] for s in st) for st in per_server],
        round_trips=sum(s["round_trips"] for st in per_server for s in st),
        wall=wall,
        connect=connect,
        joined=joined,
    )


def metrics_samples(metrics_port: int) -> list[tuple[str, float]]:
    """A broker's Prometheus endpoint (``serve --metrics-port``) as (sample with its labels,
    value) pairs, comments left out."""
    url = f"http://127.0.0.1:{metrics_port}/metrics"
    with urllib.request.urlopen(url, timeout=60) as answer:
        text = answer.read().decode()
    samples = []
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            samples.append((name, float(value)))
    return samples


def registered(expected: int) -> Any:
    return lambda all_stats: sum(s["registered"] for s in all_stats) >= expected


def all_live(expected: int) -> Any:
    """``expected`` consumers live: registered, neither dropped nor closed since."""
    return lambda all_stats: sum(s["live"] for s in all_stats) >= expected


def stable_at(expected: int, above: int = -1) -> Any:
    """Every one of ``expected`` live consumers holds a StartFetcher of one generation > above."""

    def check(all_stats: list[dict[str, Any]]) -> bool:
        live = sum(s["live"] for s in all_stats)
        gens = {g for s in all_stats for g in s["generations"]}
        return live == expected and len(gens) == 1 and int(next(iter(gens))) > above

    return check


def stable_generation(all_stats: list[dict[str, Any]]) -> tuple[int, float]:
    """The generation every live consumer holds, and when the last of them got its StartFetcher."""
    (generation,) = {int(g) for s in all_stats for g in s["generations"]}
    last = max(s["generations"][str(generation)][1] for s in all_stats if s["generations"])
    return generation, last


def all_groups_stable(all_stats: list[dict[str, Any]]) -> bool:
    """Every live consumer has had a StartFetcher (each group finished its first rebalance)."""
    return all("-1" not in s["generations"] for s in all_stats)


async def create_topic(server: ServerProcess, topic: str, partitions: int) -> None:
    stream = await trio.open_tcp_stream(server.host, server.port)
    async with open_channel(stream, client_id="bench") as channel:
        with trio.fail_after(120):
            response = await channel.request(CreateTopicRequest(topic=topic, partitions=partitions))
    assert isinstance(response, CreateTopicResponse), response
    if response.error_code is not ErrorCode.NONE:
        raise RuntimeError(f"create topic {topic}: {response.error_code.name}")


#: A probe's round trip that takes longer is an error, not a figure: the run must end.
PROBE_DEADLINE = 30.0


async def probe_coordinator(server: ServerProcess, seconds: float, every: float) -> list[float]:
    """Round trips of a small request (metadata of no topics) through the loaded server."""
    rtts: list[float] = []
    stream = await trio.open_tcp_stream(server.host, server.port)
    async with open_channel(stream, client_id="probe") as channel:
        deadline = trio.current_time() + seconds
        while trio.current_time() < deadline:
            sent = trio.current_time()
            with trio.fail_after(PROBE_DEADLINE):
                await channel.request(ClusterMetadataRequest(group_id=None, topics=()))
            rtts.append(trio.current_time() - sent)
            await trio.sleep_until(sent + every)
    return rtts


async def probe_bare(
    server: ServerProcess, seconds: float, every: float, request_size: int, reply_size: int
) -> list[float]:
    rtts: list[float] = []
    stream = await trio.open_tcp_stream(server.host, server.port)
    async with stream:
        reader = FrameReader(stream)
        frame = bare_frame(b"E", request_size, reply_size)
        deadline = trio.current_time() + seconds
        while trio.current_time() < deadline:
            sent = trio.current_time()
            with trio.fail_after(PROBE_DEADLINE):
                await stream.send_all(frame)
                if await reader.next() is None:
                    raise RuntimeError("the bare server closed the probe's connection")
            rtts.append(trio.current_time() - sent)
            await trio.sleep_until(sent + every)
    return rtts


async def bare_broadcast(server: ServerProcess) -> float:
    """Seconds the bare server takes for two round trips to every hello'd peer."""
    stream = await trio.open_tcp_stream(server.host, server.port)
    async with stream:
        await stream.send_all(bare_frame(b"B", 9))
        data = b""
        with trio.fail_after(120):
            while len(data) < 24:
                chunk = await stream.receive_some(64)
                if not chunk:
                    raise RuntimeError("bare server closed")
                data += chunk
    (elapsed,) = struct.unpack_from(">d", data, 16)
    return float(elapsed)


async def profile_server(
    server: ServerProcess, seconds: float, out: Path
) -> dict[str, list[tuple[str, float]]]:
    """Sample the server with py-spy for ``seconds`` (its raw stacks go to ``out``); return the
    functions with the largest share of samples, by self time and inclusive."""
    py_spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    command = [py_spy, "record", "--pid", str(server.process.pid), "--duration", str(int(seconds))]
    command += ["--rate", "100", "--nonblocking", "--format", "raw", "-o", str(out)]
    await trio.run_process(command, capture_stdout=True, capture_stderr=True, check=False)
    return top_frames(out)


def top_frames(path: Path, n: int = 12) -> dict[str, list[tuple[str, float]]]:
    own: Counter[str] = Counter()
    inclusive: Counter[str] = Counter()
    total = 0
    for line in path.read_text().splitlines() if path.exists() else ():
        stack, _, count_text = line.rpartition(" ")
        count = int(count_text)
        frames = [re.sub(r":\d+\)$", ")", frame) for frame in stack.split(";")]
        total += count
        own[frames[-1]] += count
        for frame in set(frames):
            inclusive[frame] += count
    return {
        "self": [(f, round(c / total, 3)) for f, c in own.most_common(n)],
        "inclusive": [(f, round(c / total, 3)) for f, c in inclusive.most_common(n * 2)],
        "samples": [("all", float(total))],
    }


def run(main: Callable[[], Awaitable[None]]) -> None:
    """``trio.run(main)``, cancelled by SIGTERM (a test that times out sends one) so that every
    server and worker this benchmark started is stopped on the way out, not left behind."""

    async def guarded() -> None:
        with trio.open_signal_receiver(signal.SIGTERM) as signals:
            async with trio.open_nursery() as nursery:

                async def watch() -> None:
                    async for _ in signals:
                        nursery.cancel_scope.cancel()

                nursery.start_soon(watch)
                await main()
                nursery.cancel_scope.cancel()

    try:
        trio.run(guarded)
    except BaseExceptionGroup as group:
        # argparse's --help and usage errors exit from inside main: exit as they meant to.
        exits, rest = group.split(SystemExit)
        if exits is None or rest is not None:
            raise
        raise first_cause(exits) from None


@contextmanager
def work_area(work_dir: Path | None, name: str = "") -> Iterator[Path]:
    """Where a benchmark's data dirs and logs go: ``work_dir`` (``--work-dir``: kept after the
    run), else a temporary directory removed afterwards; the subdirectory ``name`` of it, made."""
    with contextlib.ExitStack() as stack:
        base = work_dir or Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-")))
        work = base / name
        work.mkdir(parents=True, exist_ok=True)
        yield work


class BenchArguments(argparse.ArgumentParser):
    """Every benchmark's options: ``--quick`` (CI sizes: seconds, not minutes), ``--work-dir``,
    and its own sizes, each with a default for either mode (:meth:`sized`)."""

    def __init__(self, description: str) -> None:
        super().__init__(description=description)
        self._sized: dict[str, tuple[object, object]] = {}
        self.add_argument("--quick", action="store_true", help="CI sizes: seconds, not minutes")
        self.add_argument(
            "--work-dir", type=Path, default=None, help="data dirs and logs (default: a temp dir)"
        )

    def sized(
        self, flag: str, *, quick: object, full: object, kind: type = float, help: str = ""
    ) -> None:
        """An option that defaults to ``quick`` with ``--quick``, else to ``full``."""
        text = f"{help} (default {full}; {quick} with --quick)".strip()
        action = self.add_argument(flag, type=kind, default=None, help=text)
        self._sized[action.dest] = (quick, full)

    def parse(self) -> argparse.Namespace:
        args = self.parse_args()
        for dest, (quick, full) in self._sized.items():
            if getattr(args, dest) is None:
                setattr(args, dest, quick if args.quick else full)
        return args


def bench_arguments(description: str) -> BenchArguments:
    return BenchArguments(description)
