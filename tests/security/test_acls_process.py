"""Access rules against a real broker process: one consumer allowed to read one topic in one
group can do that and nothing else, anonymous clients nothing at all, and a pattern subscription
takes only the topics its principal may read."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import trio

from consumer import ConsumerSettings, open_consumer
from protocol.types import TopicPartition
from tests.cli.cli_process import run_cli
from tests.security.conftest import Certificates, add_user, run_secured_broker
from transport.connect import parse_bootstrap
from transport.security import ClientSecurity

pytestmark = pytest.mark.realtime


async def test_a_reader_of_t_in_g_consumes_t_and_may_do_nothing_else(
    tmp_path: Path, certificates: Certificates
) -> None:
    data_dir = tmp_path / "broker"
    await add_user(data_dir, "admin", "admin-pw")
    await add_user(data_dir, "alice", "alice-pw")
    for args in (["--topic", "t"], ["--group", "g"]):
        done = await run_cli(
            "acls", "add", "--principal", "User:alice", "--operation", "read", *args,
            "--data-dir", str(data_dir),
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
    async with run_secured_broker(
        data_dir,
        ["SASL_SSL", "PLAINTEXT"],
        *certificates.server_options,
        "--super-users=User:admin",
    ) as broker:
        passwords = {}
        for user in ("admin", "alice"):
            passwords[user] = tmp_path / f"{user}.password"
            passwords[user].write_text(f"{user}-pw\n")

        def as_user(user: str) -> list[str]:
            return [
                "--bootstrap", broker.bootstrap("SASL_SSL"), f"--tls-ca={certificates.ca}",
                "--sasl-mechanism=SCRAM-SHA-512", f"--user={user}",
                f"--password-file={passwords[user]}",
            ]  # fmt: skip

        async def cli(*args: str, stdin: bytes = b"") -> tuple[int, str, str]:
            done = await run_cli(*args, stdin=stdin)
            return done.returncode, done.stdout.decode(), done.stderr.decode()

        for topic in ("t", "secret"):
            assert (await cli("topics", "create", topic, "--partitions", "2", *as_user("admin")))[
                0
            ] == 0
        assert (await cli("produce", "t", *as_user("admin"), stdin=b"a\nb\nc\n"))[0] == 0

        code, out, err = await cli(
            "consume", "t", "--group", "g", "--from-beginning", "--max-messages", "3",
            *as_user("alice"),
        )  # fmt: skip
        assert code == 0, err
        assert sorted(out.split()) == ["a", "b", "c"]

        code, _, err = await cli("groups", "delete", "g", *as_user("alice"))
        assert code == 1 and "GROUP_AUTHORIZATION_FAILED" in err
        code, _, err = await cli(
            "groups", "reset-offsets", "h", "--topic", "t", "--to-earliest", *as_user("alice")
        )
        assert code == 1 and "GROUP_AUTHORIZATION_FAILED" in err
        code, _, err = await cli("produce", "t", *as_user("alice"), stdin=b"x\n")
        assert code == 1 and "TOPIC_AUTHORIZATION_FAILED" in err
        code, _, err = await cli("topics", "create", "x", "--partitions", "1", *as_user("alice"))
        assert code == 1 and "CLUSTER_AUTHORIZATION_FAILED" in err
        code, out, err = await cli("topics", "list", "--json", *as_user("alice"))
        assert code == 0 and [t["topic"] for t in json.loads(out)] == ["t"]

        # anonymous, on the plaintext listener beside: nothing
        anonymous = ["--bootstrap", broker.bootstrap("PLAINTEXT")]
        code, out, err = await cli("topics", "list", "--json", *anonymous)
        assert code == 0 and out.strip() == "[]"
        code, _, err = await cli("groups", "describe", "g", *anonymous)
        assert code == 1 and "GROUP_AUTHORIZATION_FAILED" in err
        assert "anyone who can reach its port" not in broker.process.log_text()

        # a pattern takes only what alice may read
        alice = ClientSecurity(
            ca=certificates.ca,
            sasl_mechanism="SCRAM-SHA-256",
            username="alice",
            password="alice-pw",
        )
        with trio.fail_after(60):
            async with open_consumer(
                parse_bootstrap(broker.bootstrap("SASL_SSL")),
                "g",
                pattern=".*",
                settings=ConsumerSettings(auto_offset_reset="earliest", session_timeout=6.0),
                security=alice,
            ) as consumer:
                held = await consumer.assignment.wait_value(lambda held: bool(held))
        assert held == {TopicPartition(topic="t", partition=p) for p in (0, 1)}
