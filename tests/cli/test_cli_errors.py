"""Every mistake a user can make at the command line ends in one clear line on stderr and a
non-zero exit status, never a traceback.

One broker (and one live consumer, for the group errors) serves the whole module; each case runs
the CLI as its own process, as a user would. The fixtures are synchronous because pytest-trio runs
each test in its own trio run, so an async fixture cannot outlive one test.
"""

from __future__ import annotations

import json
import re
import select
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import attrs
import pytest

from launch.processes import REPO, STARTUP_TIMEOUT, STOP_TIMEOUT
from tests.cli.cli_process import CLI, ENV

pytestmark = pytest.mark.realtime

TOPIC = "errors"
LIVE_GROUP = "live"
RUN_TIMEOUT = 60.0
IMMEDIATE_REBALANCE = ("--initial-rebalance-delay", "0")
_SERVING = re.compile(r"serving on (\S+):(\d+)")


@attrs.frozen(kw_only=True)
class Cluster:
    bootstrap: str
    port: int
    #: An address nothing listens on: a socket bound there, never listening, refuses connections.
    unreachable: str
    tmp: Path


def cli(*args: str, stdin: bytes = b"") -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        [*CLI, *args],
        input=stdin,
        capture_output=True,
        timeout=RUN_TIMEOUT,
        cwd=REPO,
        env=ENV,
        check=False,
    )
    return subprocess.CompletedProcess(
        done.args, done.returncode, done.stdout.decode(), done.stderr.decode()
    )


def stop(process: subprocess.Popen[bytes]) -> None:
    process.terminate()
    try:
        process.wait(STOP_TIMEOUT)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    tmp = tmp_path_factory.mktemp("cli-errors")
    refuser = socket.socket()
    refuser.bind(("127.0.0.1", 0))
    log = open(tmp / "broker.log", "wb")  # noqa: SIM115 - open for the module's span
    broker = subprocess.Popen(
        [*CLI, "serve", "--port", "0", "--data-dir", str(tmp / "data"), *IMMEDIATE_REBALANCE],
        stdout=subprocess.PIPE,
        stderr=log,
        cwd=REPO,
        env=ENV,
    )
    consumer: subprocess.Popen[bytes] | None = None
    try:
        assert broker.stdout is not None
        ready, _, _ = select.select([broker.stdout], [], [], STARTUP_TIMEOUT)
        match = _SERVING.search(broker.stdout.readline().decode()) if ready else None
        assert match, (tmp / "broker.log").read_text()
        bootstrap = f"{match.group(1)}:{match.group(2)}"
        created = cli("topics", "create", TOPIC, "--partitions", "2", "--bootstrap", bootstrap)
        assert created.returncode == 0, created.stderr
        assert cli("produce", TOPIC, "--bootstrap", bootstrap, stdin=b"a\nb\nc\n").returncode == 0
        consumer = subprocess.Popen(
            [*CLI, "consume", TOPIC, "--group", LIVE_GROUP, "--bootstrap", bootstrap],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            cwd=REPO,
            env=ENV,
        )
        deadline = time.monotonic() + STARTUP_TIMEOUT  # real-clock: a wait on real processes
        while True:
            done = cli("groups", "describe", LIVE_GROUP, "--json", "--bootstrap", bootstrap)
            if done.returncode == 0 and json.loads(done.stdout)["state"] == "Stable":
                break
            assert time.monotonic() < deadline, f"the live group never became stable: {done}"
            time.sleep(0.2)
        host, port = refuser.getsockname()
        yield Cluster(
            bootstrap=bootstrap,
            port=int(match.group(2)),
            unreachable=f"{host}:{port}",
            tmp=tmp,
        )
    finally:
        if consumer is not None:
            stop(consumer)
        stop(broker)
        log.close()
        refuser.close()


def assert_one_line_error(done: subprocess.CompletedProcess[str], pattern: str) -> None:
    """Non-zero, nothing on stdout, exactly one line on stderr matching ``pattern``."""
    lines = done.stderr.splitlines()
    assert done.returncode != 0, done
    assert "Traceback" not in done.stderr, done.stderr
    assert len(lines) == 1, done.stderr
    assert re.search(pattern, lines[0]), lines[0]
    assert done.stdout == "", done.stdout


@pytest.mark.parametrize(
    ("args", "pattern"),
    [
        (("topics", "list", "--bootstrap", "nonsense"), r"bad broker address 'nonsense'"),
        (("topics", "list", "--bootstrap", "host:99999"), r"bad broker address"),
        (("topics", "create", TOPIC, "--partitions", "0"), r"--partitions: must be at least 1"),
        (("topics", "alter", TOPIC, "--partitions", "-3"), r"--partitions: must be at least 1"),
        (("consume", TOPIC, "--max-messages", "0"), r"--max-messages must be at least 1"),
        (("topics", "frobnicate"), r"invalid choice: 'frobnicate'"),
        (("frobnicate",), r"invalid choice: 'frobnicate'"),
        (("groups", "reset-offsets", LIVE_GROUP, "--topic", TOPIC), r"one of the arguments"),
        (("groups", "reset-offsets", "g", "--topic", TOPIC, "--to-offset", "-1"), "negative"),
    ],
)
def test_bad_arguments(cluster: Cluster, args: tuple[str, ...], pattern: str) -> None:
    # With a live broker, so that only the argument can be what is wrong.
    extra = () if "--bootstrap" in args else ("--bootstrap", cluster.bootstrap)
    done = cli(*args, *extra)
    assert done.returncode == 2
    assert_one_line_error(done, pattern)


@pytest.mark.parametrize(
    "args",
    [
        ("topics", "create", "new", "--partitions", "1"),
        ("topics", "list"),
        ("topics", "describe"),
        ("topics", "alter", TOPIC, "--partitions", "3"),
        ("produce", TOPIC),
        ("consume", TOPIC),
        ("groups", "list"),
        ("groups", "describe", LIVE_GROUP),
        ("groups", "delete", LIVE_GROUP),
        ("groups", "reset-offsets", LIVE_GROUP, "--topic", TOPIC, "--to-earliest"),
    ],
)
def test_unreachable_broker(cluster: Cluster, args: tuple[str, ...]) -> None:
    done = cli(*args, "--bootstrap", cluster.unreachable, stdin=b"a\n")
    assert_one_line_error(done, rf"cannot reach any broker \({re.escape(cluster.unreachable)}")


@pytest.mark.parametrize(
    ("args", "pattern"),
    [
        (("consume", "nope"), r"topic nope: no such topic"),
        (("produce", "nope"), r"topic nope: no such topic"),
        (("topics", "describe", "nope"), r"topic nope: no such topic"),
        (("topics", "alter", "nope", "--partitions", "4"), r"alter topic nope: no such topic"),
        (("topics", "create", TOPIC, "--partitions", "2"), r"topic errors: the topic already"),
        (("topics", "alter", TOPIC, "--partitions", "1"), r"partitions can only be added"),
        (
            ("topics", "create", "huge", "--partitions", "100000"),
            r"up to the broker's --max-partitions-per-topic \(INVALID_PARTITIONS\)",
        ),
        (
            ("topics", "alter", TOPIC, "--partitions", "2147483647"),
            r"up to the broker's --max-partitions-per-topic \(INVALID_PARTITIONS\)",
        ),
        (
            ("topics", "create", "replicated", "--partitions", "1", "--replication-factor", "3"),
            r"^coordinator: create topic replicated: replication factor 3: a topic's replication"
            r" factor is 1 to the number of live brokers .*\(INVALID_REPLICATION_FACTOR\)$",
        ),
        (("groups", "describe", "g" * 256), r"at most the broker's --max-id-bytes"),
        (("groups", "describe", "nobody"), r"group nobody: no such group"),
        (("groups", "delete", "nobody"), r"group nobody: no such group"),
        (("groups", "delete", LIVE_GROUP), r"the group has live members"),
        (
            ("groups", "reset-offsets", LIVE_GROUP, "--topic", TOPIC, "--to-earliest"),
            r"the group has live members",
        ),
        (
            ("groups", "reset-offsets", "idle", "--topic", "nope", "--to-earliest"),
            r"topic nope: no such topic",
        ),
        (
            ("groups", "reset-offsets", "idle", "--topic", TOPIC, "--to-offset", "1000"),
            r"offset 1000 is outside errors-\d's log \[0, \d\]",
        ),
    ],
)
def test_refused_by_the_cluster(cluster: Cluster, args: tuple[str, ...], pattern: str) -> None:
    done = cli(*args, "--bootstrap", cluster.bootstrap, stdin=b"a\n")
    assert_one_line_error(done, pattern)


def test_nothing_was_changed_by_the_refusals(cluster: Cluster) -> None:
    """The refused operations above left the topic and the live group as they were."""
    topics = json.loads(cli("topics", "list", "--json", "--bootstrap", cluster.bootstrap).stdout)
    assert (TOPIC, 2) in {(t["topic"], t["partitions"]) for t in topics}
    assert {t["topic"] for t in topics} >= {TOPIC}
    assert not {"nope", "huge", "replicated"} & {t["topic"] for t in topics}
    report = cli("groups", "describe", LIVE_GROUP, "--json", "--bootstrap", cluster.bootstrap)
    assert json.loads(report.stdout)["state"] == "Stable"


def test_serve_on_a_port_in_use(cluster: Cluster) -> None:
    done = cli("serve", "--port", str(cluster.port), "--data-dir", str(cluster.tmp / "second"))
    assert_one_line_error(done, rf"cannot listen on 127\.0\.0\.1:{cluster.port}: .*in use")


def test_serve_on_an_unwritable_data_dir(cluster: Cluster) -> None:
    # Under a regular file: unwritable even for root, who ignores permission bits.
    blocker = cluster.tmp / "a-file"
    blocker.write_text("")
    done = cli("serve", "--port", "0", "--data-dir", str(blocker / "data"))
    assert_one_line_error(done, rf"Not a directory \({re.escape(str(blocker))}")


def test_serve_on_a_log_of_another_format_says_what_to_do(cluster: Cluster) -> None:
    # A data dir of the record-at-a-time format: a partition directory, no version file. Torn
    # tail recovery would cut its records as garbage, so the broker must not start on it.
    data = cluster.tmp / "old-format"
    segment = data / "log" / "t-0" / f"{0:020d}.log"
    segment.parent.mkdir(parents=True)
    segment.write_bytes(b"\xff" * 8 + b"records of format 1")
    done = cli("serve", "--port", "0", "--data-dir", str(data))
    log_dir = re.escape(str(data / "log"))
    assert_one_line_error(
        done,
        rf"the log in {log_dir} is format 1 \(records one at a time, no version file\), and this "
        r"broker reads log format 3 \(or 2, which it upgrades\) only: start it with an empty "
        rf"--data-dir, or move {log_dir} away \(its records are not converted\)",
    )
    assert segment.read_bytes() == b"\xff" * 8 + b"records of format 1"
