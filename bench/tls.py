"""Benchmark 8, what TLS costs: each figure over a TLS listener next to the same over plaintext,
in the same run (docs/benchmarks.md, Results VII).

* **Ping path**: server CPU per Ping round trip at N consumers (T = 10 s: a Ping per consumer
  every 3.3 s), TLS against plaintext. TLS loses the direct socket write of a Ping (the frame is
  encrypted first, by the writer task), so the target is at most 2x.
* **Consumers held**: how many TLS consumers one process holds with no false death for the hold
  time (the target: at least 10,000), next to what the plaintext listener held in the capacity
  benchmark's way.
* **Throughput**: produce and fetch rates of one client, TLS against plaintext.

The certificates are a throwaway CA made here with ``trustme`` (the ``bench`` extra).

    python -m bench.tls [--quick] [--consumers N] [--held N] [--hold SECONDS] [--records N]
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import trio
import trustme

from bench.harness import (
    ConsumerHold,
    ServerProcess,
    Worker,
    all_groups_stable,
    bench_arguments,
    hold_consumers,
    open_consumers,
    open_coordinator,
    registered,
    report_hold,
    run,
    stats,
    wait_until,
    work_area,
)
from bench.measure import figure, micros_per, now, reporting_errors
from consumer import ProducerConfig, open_producer
from protocol import CreateTopicRequest, FetchRequest, FetchResponse
from protocol.batches import walk_batches
from transport.connect import connect_any, open_channel
from transport.security import ClientSecurity

BENCH = "tls"
#: The size of each record's value in the produce and fetch rates.
VALUE_BYTES = 100
SESSION_TIMEOUT_MS = 10_000
POLL = 5.0


async def client_rates(
    port: int, records: int, batch: int, *, security: ClientSecurity | None = None
) -> tuple[float, float]:
    """(records/s produced, records/s fetched) by one client, connecting as ``security`` says."""
    address = ("127.0.0.1", port)
    connect = (security or ClientSecurity()).connector()
    stream, _ = await connect_any([address], connect=connect)
    async with open_channel(stream, client_id="bench") as channel:
        await channel.request(CreateTopicRequest(topic="bench", partitions=1))
        value = b"x" * VALUE_BYTES
        config = ProducerConfig(linger=0.02, max_batch_records=batch)
        start = time.perf_counter()
        async with open_producer([address], config=config, connect=connect) as producer:
            for _ in range(records):
                await producer.enqueue("bench", value)
            await producer.flush()
        produce_rate = records / (time.perf_counter() - start)

        start = time.perf_counter()
        offset = 0
        while offset < records:
            response = await channel.request(
                FetchRequest(topic="bench", partition=0, offset=offset, max_bytes=1024 * 1024)
            )
            assert isinstance(response, FetchResponse) and response.batches
            for _, _, base, count, _ in walk_batches(response.batches, check_crc=False):
                offset = base + count
        consume_rate = records / (time.perf_counter() - start)
    return produce_rate, consume_rate


def certificates(directory: Path) -> tuple[Path, Path]:
    """(the CA to trust, the broker's certificate and key in one file)."""
    ca = trustme.CA()
    ca.cert_pem.write_to_path(str(directory / "ca.pem"))
    ca.issue_cert("127.0.0.1").private_key_and_cert_chain_pem.write_to_path(
        str(directory / "server.pem")
    )
    return directory / "ca.pem", directory / "server.pem"


def server_args(tls: bool, server_pem: Path, *extra: str) -> list[str]:
    """A coordinator's listener: TLS with ``server_pem`` when ``tls``, else plaintext."""
    listener = "SSL" if tls else "PLAINTEXT"
    args = [f"--listener={listener}://127.0.0.1:0", *extra]
    if tls:
        args += [f"--tls-cert={server_pem}", f"--tls-key={server_pem}"]
    return args


@asynccontextmanager
async def _loaded(
    work: Path, name: str, n: int, tls_ca: Path | None, server_pem: Path, *extra: str
) -> AsyncIterator[tuple[ServerProcess, list[Worker]]]:
    """A coordinator (on a TLS listener when ``tls_ca`` is given) and ``n`` consumers of it in
    groups of 100, every one registered."""
    async with (
        open_coordinator(
            work / name, *server_args(tls_ca is not None, server_pem, *extra)
        ) as server,
        open_consumers(
            server,
            n,
            work,
            group_size=100,
            session_timeout_ms=SESSION_TIMEOUT_MS,
            member_prefix=name,
            tls_ca=tls_ca,
        ) as workers,
    ):
        await wait_until(workers, registered(n), timeout=120 + n / 10)
        yield server, workers


async def _ping_cpu(
    work: Path, n: int, window: float, tls: bool, ca: Path, server_pem: Path
) -> tuple[float, int, float]:
    """(server CPU seconds, Ping round trips, wall seconds) over ``window`` at ``n`` consumers."""
    name = "ping-tls" if tls else "ping-plaintext"
    async with _loaded(
        work, name, n, ca if tls else None, server_pem, "--initial-rebalance-delay", "2"
    ) as (server, workers):
        await wait_until(workers, all_groups_stable, timeout=120)
        await trio.sleep(SESSION_TIMEOUT_MS / 1000)  # the Ping schedule settles after joins
        for worker in workers:
            await worker.command("reset")
        cpu0, t0 = server.cpu_seconds(), now()
        await trio.sleep(window)
        cpu, wall = server.cpu_seconds() - cpu0, now() - t0
        pings = sum(s["pings"] for s in await stats(workers))
    return cpu, pings, wall


async def _held(
    work: Path, n: int, hold: float, ca: Path, server_pem: Path
) -> tuple[ConsumerHold, float, float]:
    """(the hold, connect-and-register seconds, server RSS MiB)."""
    started = now()
    async with _loaded(
        work,
        "held-tls",
        n,
        ca,
        server_pem,
        "--initial-rebalance-delay",
        "3",
        "--max-connections",
        str(n + 100),
    ) as (server, workers):
        connect_time = now() - started
        await wait_until(workers, all_groups_stable, timeout=180)
        held = await hold_consumers(workers, n, hold, every=POLL)
        return held, connect_time, server.rss_bytes() / 2**20


async def main() -> None:
    parser = bench_arguments(__doc__ or BENCH)
    parser.sized("--consumers", quick=200, full=5000, kind=int, help="for the Ping path")
    parser.sized("--window", quick=6.0, full=60.0, help="seconds")
    parser.sized("--held", quick=200, full=10_000, kind=int, help="TLS consumers to hold")
    parser.sized("--hold", quick=6.0, full=120.0, help="seconds")
    parser.sized("--records", quick=20_000, full=200_000, kind=int)
    parser.add_argument(
        "--parts",
        default="ping,held,rates",
        help="which measures to run, comma separated (default: %(default)s)",
    )
    args = parser.parse()
    parts = set(args.parts.split(","))
    n, window, held_n, hold = args.consumers, args.window, args.held, args.hold
    records = args.records
    with work_area(args.work_dir, BENCH) as work:
        ca, server_pem = certificates(work)

        if "ping" in parts:
            with reporting_errors(BENCH, "cpu_per_round_trip", consumers=n):
                await _report_ping(work, n, window, ca, server_pem)
        if "held" in parts:
            with reporting_errors(BENCH, "consumers_held", consumers=held_n):
                await _report_held(work, held_n, hold, ca, server_pem)
        if "rates" in parts:
            with reporting_errors(BENCH, "throughput", records=records):
                await _report_rates(work, records, ca, server_pem)


async def _report_ping(work: Path, n: int, window: float, ca: Path, server_pem: Path) -> None:
    measured = {tls: await _ping_cpu(work, n, window, tls, ca, server_pem) for tls in (False, True)}
    (plain_cpu, plain_pings, plain_wall), (cpu, pings, wall) = measured[False], measured[True]
    common = {"consumers": n, "session_timeout_ms": SESSION_TIMEOUT_MS, "baseline_is": "plaintext"}
    figure(
        BENCH,
        "cpu_per_round_trip",
        micros_per(cpu, pings),
        "us",
        micros_per(plain_cpu, plain_pings),
        window_s=round(wall, 1),
        **common,
    )
    figure(BENCH, "round_trips_per_s", pings / wall, "1/s", plain_pings / plain_wall, **common)
    figure(BENCH, "server_cpu_share", cpu / wall, "cores", plain_cpu / plain_wall, **common)


async def _report_held(work: Path, n: int, hold: float, ca: Path, server_pem: Path) -> None:
    held, connect_time, rss = await _held(work, n, hold, ca, server_pem)
    common = {"consumers": n, "hold_s": round(held.wall, 1), "tls": True}
    report_hold(BENCH, held, None, session_timeout_ms=SESSION_TIMEOUT_MS, common=common)
    figure(BENCH, "start_to_all_registered", connect_time, "s", None, **common)
    figure(BENCH, "server_rss", rss, "MiB", None, **common)


async def _report_rates(work: Path, records: int, ca: Path, server_pem: Path) -> None:
    rates: dict[bool, tuple[float, float]] = {}
    for tls in (False, True):
        name = "tls" if tls else "plaintext"
        async with open_coordinator(
            work / f"rates-{name}", *server_args(tls, server_pem, "--fsync", "never")
        ) as server:
            security = ClientSecurity(ca=ca) if tls else ClientSecurity()
            rates[tls] = await client_rates(server.port, records, 1000, security=security)
    for index, what in enumerate(("produce_rate", "fetch_rate")):
        figure(
            BENCH,
            what,
            rates[True][index],
            "records/s",
            rates[False][index],
            baseline_is="plaintext",
            records=records,
            value_bytes=VALUE_BYTES,
            fsync="never",
        )


if __name__ == "__main__":
    run(main)
