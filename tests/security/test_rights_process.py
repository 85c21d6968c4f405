"""Users and access rules managed over the wire while a TLS + SCRAM broker runs on the embedded
store, with the CLI run as a user would run it: the first super user made offline, everything
else through ``--bootstrap`` as that user; a principal that may not alter the cluster refused in
one line; the offline form, while the broker holds the store, pointing at ``--bootstrap``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.cli.cli_process import run_cli
from tests.security.conftest import Certificates, add_user, run_scram_broker

pytestmark = pytest.mark.realtime


async def test_users_and_rules_change_over_the_wire_while_the_broker_runs(
    tmp_path: Path, certificates: Certificates
) -> None:
    data_dir = tmp_path / "broker"
    await add_user(data_dir, "admin", "admin-pw")  # offline: the first super user
    async with run_scram_broker(data_dir, certificates, {}, "--super-users=User:admin") as broker:
        passwords = {}
        for user in ("admin", "alice"):
            passwords[user] = tmp_path / f"{user}.password"
            passwords[user].write_text(f"{user}-pw\n")

        def as_user(user: str) -> list[str]:
            return [
                "--bootstrap", broker.bootstrap("SASL_SSL"), f"--tls-ca={certificates.ca}",
                "--sasl-mechanism=SCRAM-SHA-256", f"--user={user}",
                f"--password-file={passwords[user]}",
            ]  # fmt: skip

        async def cli(*args: str, stdin: bytes = b"") -> tuple[int, str, str]:
            done = await run_cli(*args, stdin=stdin)
            return done.returncode, done.stdout.decode(), done.stderr.decode()

        async def ok(*args: str, stdin: bytes = b"") -> str:
            code, out, err = await cli(*args, stdin=stdin)
            assert code == 0, err
            return out

        # users: added, listed (mechanisms, no keys), and able to authenticate at once
        await ok(
            "users", "add", "alice", "--password-stdin", *as_user("admin"), stdin=b"alice-pw\n"
        )
        listed = await ok("users", "list", *as_user("admin"))
        assert sorted(listed.splitlines()) == [
            "admin\tSCRAM-SHA-256,SCRAM-SHA-512",
            "alice\tSCRAM-SHA-256,SCRAM-SHA-512",
        ]
        assert json.loads(await ok("topics", "list", "--json", *as_user("alice"))) == []

        # rules: added, listed, in force on this broker before the answer, removed
        await ok("topics", "create", "t", "--partitions", "1", *as_user("admin"))
        rule = ["--principal", "User:alice", "--operation", "read", "--topic", "t"]
        await ok("acls", "add", *rule, *as_user("admin"))
        assert await ok("acls", "list", *as_user("admin")) == "User:alice\tread\ttopic\tt\n"
        topics = json.loads(await ok("topics", "list", "--json", *as_user("alice")))
        assert [t["topic"] for t in topics] == ["t"]
        await ok("acls", "remove", *rule, *as_user("admin"))
        assert await ok("acls", "list", *as_user("admin")) == ""
        assert json.loads(await ok("topics", "list", "--json", *as_user("alice"))) == []

        # a principal that may not alter the cluster: refused, in one line
        for args, stdin in (
            (["acls", "add", *rule], b""),
            (["acls", "list"], b""),
            (["users", "add", "mallory", "--password-stdin"], b"pw\n"),
            (["users", "delete", "admin"], b""),
        ):
            code, _, err = await cli(*args, *as_user("alice"), stdin=stdin)
            assert code == 1, err
            assert len(err.splitlines()) == 1 and "CLUSTER_AUTHORIZATION_FAILED" in err, err
        assert "mallory" not in await ok("users", "list", *as_user("admin"))

        # the offline form, while the broker holds the store: one line naming --bootstrap
        code, _, err = await cli("acls", "list", "--data-dir", str(data_dir))
        assert code == 1
        assert len(err.splitlines()) == 1 and "--bootstrap" in err, err

        # a user deleted over the wire no longer authenticates
        await ok("users", "delete", "alice", *as_user("admin"))
        code, _, err = await cli("topics", "list", *as_user("alice"))
        assert code == 1 and "SASL_AUTHENTICATION_FAILED" in err, err
        code, _, err = await cli("users", "delete", "alice", *as_user("admin"))
        assert code == 1 and "no such user" in err, err
