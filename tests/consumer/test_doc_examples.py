"""The programs docs/consumer.md and docs/producer.md show (examples/produce_events.py and
examples/count_events.py, kept identical by tests/test_doc_examples.py) run against a real broker
process: the producer's records arrive, the consumer counts them, and SIGTERM or Ctrl-C ends it
cleanly, with its offsets committed and no traceback."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import trio

from consumer.admin import open_admin
from launch.cluster import eventually
from launch.processes import run_broker

pytestmark = pytest.mark.realtime

ROOT = Path(__file__).resolve().parents[2]
WAIT = 60.0  # generous: CI has two busy cores
ENV = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1"}


async def run_example(name: str, bootstrap: str) -> str:
    with trio.fail_after(WAIT):
        done = await trio.run_process(
            [sys.executable, str(ROOT / "examples" / name), bootstrap],
            capture_stdout=True,
            capture_stderr=True,
            env=ENV,
        )
    assert b"Traceback" not in done.stderr, done.stderr.decode()
    return done.stdout.decode()


async def count_until(sig: signal.Signals, bootstrap: str, events: int) -> tuple[int, list[str]]:
    """Run count_events.py until it printed ``events`` counts (or none, for 0), send ``sig``:
    its exit status and output lines."""
    process = await trio.lowlevel.open_process(
        [sys.executable, str(ROOT / "examples" / "count_events.py"), bootstrap],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=ENV,
    )
    assert process.stdout is not None and process.stderr is not None
    lines: list[str] = []
    buffer = b""
    with trio.fail_after(WAIT):
        while len(lines) < events + 1:  # "consuming", then one line per event
            chunk = await process.stdout.receive_some()
            assert chunk, f"the consumer ended early: {lines}"
            buffer += chunk
            *complete, buffer = buffer.split(b"\n")
            lines += [line.decode() for line in complete]
        if events == 0:
            # registered and started, so that its reading nothing is what the signal ends
            await eventually(lambda: _started(bootstrap), deadline=WAIT)
        process.send_signal(sig)
        rest = b""
        async for chunk in process.stdout:
            rest += chunk
        errors = b""
        async for chunk in process.stderr:
            errors += chunk
        status = await process.wait()
    assert b"Traceback" not in errors and b"ExceptionGroup" not in errors, errors.decode()
    lines += (buffer + rest).decode().splitlines()
    return status, lines


async def _started(bootstrap: str) -> bool:
    async with open_admin(bootstrap) as admin:
        report = await admin.describe_group("counters")
    return report.state == "Stable" and all(p.owner is not None for p in report.partitions)


async def test_the_documented_producer_and_consumer_run_and_stop_cleanly(tmp_path: Path) -> None:
    async with run_broker(tmp_path / "broker", "--initial-rebalance-delay", "0.2") as broker:
        bootstrap = f"{broker.host}:{broker.port}"
        async with open_admin(bootstrap) as admin:
            await admin.create_topic("events", 2)

        out = await run_example("produce_events.py", bootstrap)
        assert "event 99 is stored at partition" in out
        assert "event 100 is stored at partition" in out

        status, lines = await count_until(signal.SIGTERM, bootstrap, 101)
        assert status == 0
        assert lines[0] == "consuming"
        assert lines[-1] == "stopped by signal 15: 101 events, 10 keys"
        async with open_admin(bootstrap) as admin:
            report = await admin.describe_group("counters")
        # committed on the way out (durable, or accepted and being written)
        assert all(
            p.end > 0 and (p.committed == p.end or p.reported == p.end) for p in report.partitions
        ), report
        assert sum(p.end for p in report.partitions) == 101

        # Ctrl-C: the same clean end; the group's commits let it start where it stopped
        status, lines = await count_until(signal.SIGINT, bootstrap, 0)
        assert status == 0
        assert lines == ["consuming", "stopped by signal 2: 0 events, 0 keys"]
