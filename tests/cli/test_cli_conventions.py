"""What a user of git, Kafka's tools or rpk expects of a command line, run as processes: a
reader that goes away ends the command quietly, global options go before or after the verb,
``--bootstrap-server`` and ``--version`` exist, a bare command shows its help, and every option
says what it does and its default."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

import pytest

from launch.processes import REPO, run_broker
from tests.cli.cli_process import CLI, CLI_TIMEOUT, ENV, bootstrap, run_cli

pytestmark = pytest.mark.realtime


def _to_a_gone_reader(*args: str) -> subprocess.CompletedProcess[bytes]:
    """``coordinator ARGS... | head -0``: its stdout a pipe whose reader is gone before the
    first line is written."""
    read, write = os.pipe()
    os.close(read)
    try:
        return subprocess.run(
            [*CLI, *args],
            stdout=write,
            stderr=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
            timeout=CLI_TIMEOUT,
            cwd=REPO,
            env=ENV,
            check=False,
        )
    finally:
        os.close(write)


async def test_client_verbs_take_kafkas_option_names_and_a_reader_going_away(
    tmp_path: Path,
) -> None:
    async with run_broker(tmp_path / "data", "--initial-rebalance-delay", "0") as broker:
        at = bootstrap(broker)
        done = await run_cli("topics", "create", "t", "--partitions", "2", "--bootstrap-server", at)
        assert done.returncode == 0, done.stderr
        # global options after the verb too, as before it
        for args in (
            ("--log-level", "info", "topics", "list", "--bootstrap", at, "--json"),
            ("topics", "list", "--bootstrap-server", at, "--json", "--log-level", "info"),
        ):
            done = await run_cli(*args)
            assert done.returncode == 0, done.stderr
            assert [t["topic"] for t in json.loads(done.stdout)] == ["t"]
        done = await run_cli("produce", "t", "--bootstrap", at, stdin=b"a\nb\n")
        assert done.returncode == 0, done.stderr
        done = await run_cli(
            "consume",
            "t",
            "--group",
            "g",
            "--from-beginning",
            "--max-messages",
            "2",
            "--bootstrap",
            at,
        )
        assert done.returncode == 0, done.stderr
        # no value: "-" in a table, null in JSON, in every verb
        done = await run_cli(
            "groups",
            "reset-offsets",
            "h",
            "--topic",
            "t",
            "--partition",
            "0",
            "--to-earliest",
            "--bootstrap",
            at,
        )
        assert done.returncode == 0, done.stderr
        done = await run_cli("groups", "describe", "h", "--bootstrap", at)
        assert done.returncode == 0, done.stderr
        rows = [line.split() for line in done.stdout.decode().splitlines()[2:]]
        assert [row[3] for row in rows] == ["0", "-"]  # COMMITTED
        done = await run_cli("groups", "describe", "h", "--bootstrap", at, "--json")
        assert done.returncode == 0, done.stderr
        partitions = json.loads(done.stdout)["partitions"]
        assert [(p["committed"], p["lag_seconds"] is None) for p in partitions] == [
            (0, False),
            (None, True),
        ]
        # `groups describe g | head -3`: no "Broken pipe", the status of a process SIGPIPE ended
        for verb in (("groups", "describe", "g"), ("topics", "describe")):
            gone = _to_a_gone_reader(*verb, "--bootstrap", at)
            assert (gone.returncode, gone.stderr) == (128 + signal.SIGPIPE, b"")


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*CLI, *args], capture_output=True, text=True, timeout=CLI_TIMEOUT, cwd=REPO, env=ENV
    )


def test_version() -> None:
    done = _cli("--version")
    assert (done.returncode, done.stdout) == (0, "coordinator 0.1.0\n")


@pytest.mark.parametrize(
    ("args", "names"),
    [
        ((), ["serve", "topics", "groups", "produce", "consume", "users", "acls", "cluster"]),
        (("topics",), ["create", "list", "describe", "alter", "delete"]),
        (("groups",), ["list", "describe", "delete", "reset-offsets"]),
    ],
)
def test_a_bare_command_shows_its_help_and_fails_as_a_usage_mistake(
    args: tuple[str, ...], names: list[str]
) -> None:
    done = _cli(*args)
    assert done.returncode == 2
    assert done.stdout.startswith(f"usage: coordinator {' '.join(args)}".rstrip() + " ")
    listed = {line.split()[0] for line in done.stdout.splitlines() if line.startswith("    ")}
    assert set(names) <= listed
    assert done.stderr == ""


@pytest.mark.parametrize(
    ("args", "option", "shown"),
    [
        (("topics", "create"), "--partitions N", "how many (required)"),
        (("consume",), "--max-messages N", "default: run until Ctrl-C"),
        (("consume",), "--session-timeout SECONDS", "(default: 45.0)"),
        (("groups", "reset-offsets"), "--to-offset OFFSET", "to this offset"),
        (("serve",), "--broker-id ID", "(default: 1)"),
        (("serve",), "--data-dir DIR", "(default: data)"),
        (("serve",), "--min-session-timeout-ms MS", "(default: 1000)"),
        (("serve",), "--max-session-timeout-ms MS", "(default: 300000)"),
        (("serve",), "--segment-bytes BYTES", "(default: 67108864)"),
    ],
)
def test_an_option_says_what_it_does_and_its_default(
    args: tuple[str, ...], option: str, shown: str
) -> None:
    done = _cli(*args, "--help")
    assert done.returncode == 0, done.stderr
    text = " ".join(done.stdout.split())  # help lines wrap at the terminal's width
    start = text.rindex(f" {option} ")  # the entry, after the usage line
    entry = text[start : start + 200]
    assert shown in entry, entry
