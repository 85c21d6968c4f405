"""Real broker processes for tests: started with the CLI, always killed at teardown.

Every wait is bounded (CI has two busy cores, so the bounds are generous) and a broker that does not
say where it serves within them fails the test with its log attached.
"""

from __future__ import annotations

import os
import re
import resource
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from functools import partial
from pathlib import Path

import attrs
import trio

STARTUP_TIMEOUT = 30.0
STOP_TIMEOUT = 10.0
_SERVING = re.compile(rb"serving on (\S+):(\d+)")
REPO = Path(__file__).resolve().parents[1]


@attrs.define(eq=False)
class BrokerProcess:
    process: trio.Process
    host: str
    port: int
    log_path: Path

    @property
    def address(self) -> tuple[str, int]:
        return (self.host, self.port)

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    async def kill(self) -> None:
        """SIGKILL, as a crash: nothing is flushed, nothing is closed."""
        if self.process.returncode is None:
            self.process.send_signal(signal.SIGKILL)
        with trio.fail_after(STOP_TIMEOUT):
            await self.process.wait()


@asynccontextmanager
async def run_broker(
    data_dir: Path, *args: str, log_path: Path | None = None, file_limit: int | None = None
) -> AsyncIterator[BrokerProcess]:
    """``python -m cli serve --port 0 --data-dir DATA_DIR ARGS...`` for the block's span; with
    ``file_limit``, under that RLIMIT_NOFILE (soft and hard), as ``ulimit -n`` would start it."""
    log_path = log_path or data_dir.with_name(data_dir.name + ".log")
    command: Sequence[str] = [
        sys.executable,
        "-m",
        "cli",
        "serve",
        "--port",
        "0",
        "--data-dir",
        str(data_dir),
        *args,
    ]
    async with open_serving_process(command, log_path, file_limit=file_limit) as (
        process,
        host,
        port,
    ):
        yield BrokerProcess(process=process, host=host, port=port, log_path=log_path)


@asynccontextmanager
async def open_serving_process(
    command: Sequence[str],
    log_path: Path,
    *,
    startup_timeout: float = STARTUP_TIMEOUT,
    file_limit: int | None = None,
) -> AsyncIterator[tuple[trio.Process, str, int]]:
    """Run ``command``, anything that prints ``serving on HOST:PORT`` once it listens (a broker,
    the benchmarks' bare server), for the block's span, its stderr appended to ``log_path``;
    yields the process and where it serves. One that does not say so within
    ``startup_timeout`` fails with its log attached. The tests' brokers and the benchmarks'
    servers both start here."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    limit = (
        None
        if file_limit is None
        else partial(resource.setrlimit, resource.RLIMIT_NOFILE, (file_limit, file_limit))
    )
    with open(log_path, "ab") as log_file:
        process = await trio.lowlevel.open_process(
            list(command),
            stdout=subprocess.PIPE,
            stderr=log_file,
            cwd=REPO,
            env=env,
            preexec_fn=limit,
        )
    try:
        assert process.stdout is not None
        seen = b""
        with trio.move_on_after(startup_timeout):
            while (match := _SERVING.search(seen)) is None:
                chunk = await process.stdout.receive_some(4096)
                if not chunk:
                    break
                seen += chunk
        if match is None:
            raise RuntimeError(
                f"{' '.join(command[1:])} did not start: {seen!r}\n"
                f"{log_path.read_text(errors='replace')}"
            )
        yield process, match.group(1).decode(), int(match.group(2))
    finally:
        with trio.CancelScope(shield=True):
            await stop_process(process)
            if process.stdout is not None:
                await process.stdout.aclose()


async def stop_process(process: trio.Process) -> None:
    """SIGTERM, after SIGCONT (a paused process acts on nothing until it runs again), then
    SIGKILL if it has not ended within STOP_TIMEOUT."""
    if process.returncode is None:
        process.send_signal(signal.SIGCONT)
        process.terminate()
        with trio.move_on_after(STOP_TIMEOUT):
            await process.wait()
    if process.returncode is None:
        process.kill()
        await process.wait()
