"""The third-party client example (protocol/, the consumer machine and a blocking socket) against a
real broker process."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import trio

from launch.processes import REPO, run_broker

pytestmark = pytest.mark.realtime

#: Runs the script, then checks that it imported neither trio nor any package of the service.
WRAPPER = """
import runpy, sys
sys.argv = sys.argv[1:]
try:
    runpy.run_path(sys.argv[0], run_name="__main__")
    code = 0
except SystemExit as exc:
    code = exc.code
service = {"trio", "transport", "store", "coordinator", "consumer", "broker", "cli"}
leaked = sorted(service & {m.split(".")[0] for m in sys.modules})
if leaked:
    sys.exit(f"the raw client imported {leaked}")
sys.exit(code)
"""


async def test_raw_client_joins_a_group_and_prints_its_assignment(tmp_path: Path) -> None:
    async with run_broker(tmp_path / "data", "--initial-rebalance-delay", "0.2") as broker:
        with trio.fail_after(60):
            done = await trio.run_process(
                [
                    sys.executable,
                    "-c",
                    WRAPPER,
                    str(REPO / "examples" / "raw_client.py"),
                    "--bootstrap",
                    f"{broker.host}:{broker.port}",
                    "--topic",
                    "raw",
                    "--partitions",
                    "3",
                    "--group",
                    "g",
                    "--consumer-id",
                    "raw-1",
                ],
                capture_stdout=True,
                capture_stderr=True,
                check=False,
                env={"PYTHONPATH": ""},  # nothing but the script's own checkout
                stdin=subprocess.DEVNULL,
            )
    assert done.returncode == 0, done.stderr.decode()
    lines = done.stdout.decode().splitlines()
    assert lines[0] == "registered in g as raw-1"
    assignment = json.loads(lines[1].removeprefix("assignment "))
    assert assignment["generation"] >= 1
    (partitions,) = assignment["streams"].values()
    assert sorted((topic, p) for topic, p, _, _ in partitions) == [
        ("raw", 0),
        ("raw", 1),
        ("raw", 2),
    ]
