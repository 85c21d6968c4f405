"""Every refusal a TLS + SCRAM broker gives a client ends the CLI verb in one line on stderr that
names what was refused and what to do, with a non-zero exit; the library raises one named
exception per kind. Run as the README's Security section does: real broker processes, the CLI as
processes, certificates made in the test."""

from __future__ import annotations

import subprocess
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import attrs
import pytest
import trio

import consumer as library
from consumer import ConsumerSettings, open_consumer
from consumer.admin import open_admin
from launch.processes import REPO
from tests.cli.cli_process import CLI, ENV, run_cli
from tests.security.conftest import Broker, Certificates, run_scram_broker
from transport.connect import parse_bootstrap
from transport.security import ClientSecurity

pytestmark = pytest.mark.realtime

#: A refusal ends a verb well within this (a consumer used to retry for ever).
REFUSED_WITHIN = 30.0


@attrs.frozen(kw_only=True)
class Secured:
    broker: Broker
    certificates: Certificates
    #: ``--password-file`` of each user.
    passwords: dict[str, Path]

    def tls(self) -> list[str]:
        """Connection options without SASL."""
        return [
            "--bootstrap",
            self.broker.bootstrap("SASL_SSL"),
            f"--tls-ca={self.certificates.ca}",
        ]

    def as_user(self, user: str) -> list[str]:
        return [
            *self.tls(),
            "--sasl-mechanism=SCRAM-SHA-256",
            f"--user={user}",
            f"--password-file={self.passwords[user]}",
        ]

    def security(self, user: str) -> ClientSecurity:
        return ClientSecurity(
            ca=self.certificates.ca,
            sasl_mechanism="SCRAM-SHA-256",
            username=user,
            password=self.passwords[user].read_text().strip(),
        )


@asynccontextmanager
async def _secured(tmp_path: Path, certificates: Certificates) -> AsyncIterator[Secured]:
    """A SASL_SSL broker with topics ``t`` and ``u``; ``admin`` may do everything, ``alice`` may
    read topic ``t`` and group ``g`` and nothing else."""
    data_dir = tmp_path / "broker"
    users = {"admin": "admin password", "alice": "alice password"}
    passwords = {}
    for name, password in users.items():
        passwords[name] = tmp_path / f"{name}.pw"
        passwords[name].write_text(f"{password}\n")
    for rule in (["--topic", "t"], ["--group", "g"]):
        added = await run_cli(
            "acls", "add", "--principal", "User:alice", "--operation", "read", *rule,
            "--data-dir", str(data_dir),
        )  # fmt: skip
        assert added.returncode == 0, added.stderr
    async with run_scram_broker(
        data_dir, certificates, users, "--super-users=User:admin"
    ) as broker:
        secured = Secured(broker=broker, certificates=certificates, passwords=passwords)
        for topic in ("t", "u"):
            created = await run_cli(
                "topics", "create", topic, "--partitions=1", *secured.as_user("admin")
            )
            assert created.returncode == 0, created.stderr
        yield secured


def _one_line(done: subprocess.CompletedProcess[bytes], *wanted: str) -> str:
    """The verb failed with one line on stderr holding each of ``wanted``."""
    stderr = done.stderr.decode(errors="replace")
    assert done.returncode != 0, (done.returncode, stderr, done.stdout)
    assert len(stderr.splitlines()) == 1, stderr
    assert "Traceback" not in stderr
    for text in wanted:
        assert text in stderr, (text, stderr)
    return stderr


async def _cli(*args: str, stdin: bytes = b"") -> subprocess.CompletedProcess[bytes]:
    return await run_cli(*args, stdin=stdin, timeout=REFUSED_WITHIN)


async def _consumed(
    secured: Secured, group: str, topic: str, security: ClientSecurity | None = None
) -> BaseException:
    """What the library's consumer (default: as alice) raises from its stream of ``topic``."""
    settings = ConsumerSettings(auto_offset_reset="earliest", discovery_timeout=REFUSED_WITHIN)
    with trio.fail_after(REFUSED_WITHIN):
        async with open_consumer(
            secured.broker.bootstrap("SASL_SSL"),
            group,
            topics={topic: 1},
            settings=settings,
            security=security or secured.security("alice"),
        ) as consumer:
            (stream,) = consumer.streams_for(topic)
            with pytest.raises(library.Refused) as raised:
                await stream.next_batch()
    return raised.value


async def test_a_consumer_that_may_not_read_its_group_ends_in_one_line(
    tmp_path: Path, certificates: Certificates
) -> None:
    async with _secured(tmp_path, certificates) as secured:
        done = await _cli("consume", "t", "--group", "other", *secured.as_user("alice"))
        _one_line(done, "GROUP_AUTHORIZATION_FAILED", "group 'other'", "acls add", "--group other")
        # the library's consumer: its streams end with the named exception, not a retry for ever
        refused = await _consumed(secured, "other", "t")
        assert isinstance(refused, library.GroupAuthorizationFailed)
        assert "group 'other'" in str(refused)
        log = secured.broker.process.log_text()
        assert "Traceback" not in log


async def test_a_consumer_that_may_not_read_its_topic_ends_in_one_line(
    tmp_path: Path, certificates: Certificates
) -> None:
    async with _secured(tmp_path, certificates) as secured:
        done = await _cli("consume", "u", "--group", "g", *secured.as_user("alice"))
        _one_line(done, "TOPIC_AUTHORIZATION_FAILED", "topic u", "acls add", "--topic u")
        # alice may read t, not write it
        produced = await _cli("produce", "t", *secured.as_user("alice"), stdin=b"one\n")
        _one_line(produced, "TOPIC_AUTHORIZATION_FAILED", "--operation write --topic t")
        refused = await _consumed(secured, "g", "u")
        assert isinstance(refused, library.TopicAuthorizationFailed)
        assert "topic 'u'" in str(refused)


async def test_a_tls_client_without_sasl_on_a_sasl_listener_is_told_to_pass_user(
    tmp_path: Path, certificates: Certificates
) -> None:
    async with _secured(tmp_path, certificates) as secured:
        for verb in (
            ["topics", "list"],
            ["topics", "describe"],
            ["cluster"],
            ["groups", "list"],
            ["groups", "describe", "g"],
            ["consume", "t", "--group", "g"],
        ):
            done = await _cli(*verb, *secured.tls())
            _one_line(done, "this listener needs SASL", "--user")
        produced = await _cli("produce", "t", *secured.tls(), stdin=b"one\n")
        _one_line(produced, "this listener needs SASL", "--user")
        with trio.fail_after(REFUSED_WITHIN):
            async with open_admin(
                parse_bootstrap(secured.broker.bootstrap("SASL_SSL")),
                security=ClientSecurity(ca=certificates.ca),
            ) as admin:
                with pytest.raises(library.ListenerNeedsSasl):
                    await admin.topics()
        refused = await _consumed(secured, "g", "t", ClientSecurity(ca=certificates.ca))
        assert isinstance(refused, library.ListenerNeedsSasl)


async def test_a_client_without_tls_on_a_tls_listener_is_asked_whether_it_needs_tls(
    tmp_path: Path, certificates: Certificates
) -> None:
    async with _secured(tmp_path, certificates) as secured:
        bootstrap = ["--bootstrap", secured.broker.bootstrap("SASL_SSL")]
        done = await _cli("topics", "list", *bootstrap)
        _one_line(done, "TLS", "--tls")
        # SASL without TLS on a SASL_SSL listener
        password = f"--password-file={secured.passwords['alice']}"
        sasl = ["--sasl-mechanism=SCRAM-SHA-256", "--user=alice", password]
        done = await _cli("topics", "list", *bootstrap, *sasl)
        _one_line(done, "TLS", "--tls")


async def test_a_wrong_password_ends_in_one_line_naming_the_user(
    tmp_path: Path, certificates: Certificates
) -> None:
    async with _secured(tmp_path, certificates) as secured:
        wrong = tmp_path / "wrong.pw"
        wrong.write_text("guess\n")
        options = [*secured.as_user("alice")[:-1], f"--password-file={wrong}"]
        for verb in (["topics", "list"], ["consume", "t", "--group", "g"]):
            done = await _cli(*verb, *options)
            _one_line(done, "SASL_AUTHENTICATION_FAILED", "'alice'", "password")
        wrong_password = attrs.evolve(secured.security("alice"), password="guess")
        refused = await _consumed(secured, "g", "t", wrong_password)
        assert isinstance(refused, library.AuthenticationFailed)


async def _without_terminal(*args: str) -> subprocess.CompletedProcess[bytes]:
    """The CLI in a session of its own (no controlling terminal), stdin /dev/null."""
    with trio.fail_after(REFUSED_WITHIN):
        return await trio.run_process(
            [*CLI, *args],
            stdin=subprocess.DEVNULL,
            capture_stdout=True,
            capture_stderr=True,
            check=False,
            cwd=REPO,
            env={k: v for k, v in ENV.items() if k != "COORDINATOR_PASSWORD"},
            start_new_session=True,
        )


async def test_a_password_prompt_without_a_terminal_fails_in_one_line(tmp_path: Path) -> None:
    data_dir = str(tmp_path / "broker")
    done = await _without_terminal("users", "add", "admin", "--data-dir", data_dir)
    _one_line(done, "--password-stdin")
    assert done.returncode == 2
    # a client verb with --user and no password source: refused before connecting anywhere
    done = await _without_terminal(
        "topics", "list", "--bootstrap", "127.0.0.1:1", "--sasl-mechanism=SCRAM-SHA-256",
        "--user=alice",
    )  # fmt: skip
    _one_line(done, "--password-file", "COORDINATOR_PASSWORD")
    assert done.returncode == 2
