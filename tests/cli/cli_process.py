"""Run the ``coordinator`` CLI as a user would: a separate process, its output captured.

Every run is bounded (CI has two busy cores, so the bound is generous); a CLI that outlives it is
killed and fails the test.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import trio

from launch.processes import REPO, BrokerProcess

CLI_TIMEOUT = 60.0
CLI = (sys.executable, "-m", "cli")
ENV = {**os.environ, "PYTHONPATH": str(REPO)}


def bootstrap(broker: BrokerProcess) -> str:
    return f"{broker.host}:{broker.port}"


async def run_cli(
    *args: str, stdin: bytes = b"", timeout: float = CLI_TIMEOUT
) -> subprocess.CompletedProcess[bytes]:
    """``coordinator ARGS...``, whatever its exit status."""
    with trio.fail_after(timeout):
        return await trio.run_process(
            [*CLI, *args],
            stdin=stdin,
            capture_stdout=True,
            capture_stderr=True,
            check=False,
            cwd=REPO,
            env=ENV,
        )


async def cli_json(broker: BrokerProcess, *args: str) -> Any:
    """``coordinator ARGS... --bootstrap BROKER --json``, which must succeed."""
    done = await run_cli(*args, "--bootstrap", bootstrap(broker), "--json")
    assert done.returncode == 0, done.stderr.decode(errors="replace")
    return json.loads(done.stdout)


async def describe_group(broker: BrokerProcess, group: str) -> dict[str, Any]:
    report = await cli_json(broker, "groups", "describe", group)
    assert isinstance(report, dict)
    return report


async def open_cli(*args: str, stdout: Path, stderr: Path) -> trio.Process:
    """``coordinator ARGS...`` in the background, its output going to files."""
    with open(stdout, "wb") as out, open(stderr, "wb") as err:
        return await trio.lowlevel.open_process(
            [*CLI, *args], stdin=subprocess.DEVNULL, stdout=out, stderr=err, cwd=REPO, env=ENV
        )


async def open_cli_piped(*args: str, stderr: Path) -> trio.Process:
    """``coordinator ARGS...`` in the background, its stdout a pipe the test reads: a process
    whose output is not read blocks once the pipe is full, which paces it by the reader."""
    with open(stderr, "wb") as err:
        return await trio.lowlevel.open_process(
            [*CLI, *args],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=err,
            cwd=REPO,
            env=ENV,
        )


async def stop(process: trio.Process, timeout: float = 20.0) -> int:
    """SIGTERM, a bounded wait, then SIGKILL: no process outlives its test."""
    if process.returncode is None:
        process.terminate()
        with trio.move_on_after(timeout):
            await process.wait()
    if process.returncode is None:
        process.kill()
        await process.wait()
    assert process.returncode is not None
    return process.returncode
