"""Real broker processes for tests: started with the CLI, always killed at teardown.

Every wait is bounded (CI has two busy cores, so the bounds are generous) and a broker that does not
say where it serves within them fails the test with its log attached.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path

import attrs
import trio

STARTUP_TIMEOUT = 30.0
STOP_TIMEOUT = 10.0
_SERVING = re.compile(rb"serving on (\S+):(\d+)")
REPO = Path(__file__).resolve().parents[2]


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
    data_dir: Path, *args: str, log_path: Path | None = None
) -> AsyncIterator[BrokerProcess]:
    """``python -m coordinator serve --port 0 --data-dir DATA_DIR ARGS...`` for the block's span."""
    log_path = log_path or data_dir.with_name(data_dir.name + ".log")
    command: Sequence[str] = [
        sys.executable,
        "-m",
        "coordinator",
        "serve",
        "--port",
        "0",
        "--data-dir",
        str(data_dir),
        *args,
    ]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    with open(log_path, "ab") as log_file:
        process = await trio.lowlevel.open_process(
            command, stdout=subprocess.PIPE, stderr=log_file, cwd=REPO, env=env
        )
    try:
        assert process.stdout is not None
        seen = b""
        with trio.move_on_after(STARTUP_TIMEOUT):
            while (match := _SERVING.search(seen)) is None:
                chunk = await process.stdout.receive_some(4096)
                if not chunk:
                    break
                seen += chunk
        if match is None:
            raise RuntimeError(
                f"broker did not start: {seen!r}\n{log_path.read_text(errors='replace')}"
            )
        yield BrokerProcess(
            process=process,
            host=match.group(1).decode(),
            port=int(match.group(2)),
            log_path=log_path,
        )
    finally:
        with trio.CancelScope(shield=True):
            if process.returncode is None:
                process.terminate()
                with trio.move_on_after(STOP_TIMEOUT):
                    await process.wait()
            if process.returncode is None:
                process.kill()
                await process.wait()
            if process.stdout is not None:
                await process.stdout.aclose()
