"""Certificates made in the test with ``trustme`` (the trio project's test CA), and brokers with
several listeners, run as real processes."""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path

import attrs
import pytest
import trio
import trustme

from launch.processes import BrokerProcess, run_broker
from tests.cli.cli_process import run_cli

_LISTENING = re.compile(r"listening on (\w+)://(\S+):(\d+)")


@attrs.frozen(kw_only=True)
class Certificates:
    """PEM files: the CA, the broker's certificate (127.0.0.1) and client certificates."""

    ca: Path
    server: Path
    #: CN=alice, from the CA.
    alice: Path
    #: CN=bob, from the CA.
    bob: Path
    #: From the CA, but expired yesterday.
    expired: Path
    #: CN=mallory, from another CA the broker does not trust.
    stranger: Path

    @property
    def server_options(self) -> list[str]:
        """``serve``'s options for the broker's certificate and key (one file)."""
        return [f"--tls-cert={self.server}", f"--tls-key={self.server}"]


@pytest.fixture
def certificates(tmp_path: Path) -> Certificates:
    ca = trustme.CA()
    other = trustme.CA()
    directory = tmp_path / "certs"
    directory.mkdir()

    def write(name: str, cert: trustme.LeafCert) -> Path:
        path = directory / f"{name}.pem"
        cert.private_key_and_cert_chain_pem.write_to_path(str(path))
        return path

    ca.cert_pem.write_to_path(str(directory / "ca.pem"))
    now = dt.datetime.now(dt.UTC)
    return Certificates(
        ca=directory / "ca.pem",
        server=write("server", ca.issue_cert("127.0.0.1", "localhost")),
        alice=write("alice", ca.issue_cert("alice@example.com", common_name="alice")),
        bob=write("bob", ca.issue_cert("bob@example.com", common_name="bob")),
        expired=write(
            "expired",
            ca.issue_cert(
                "alice@example.com",
                common_name="alice",
                not_before=now - dt.timedelta(days=10),
                not_after=now - dt.timedelta(days=1),
            ),
        ),
        stranger=write("stranger", other.issue_cert("mallory@example.com", common_name="mallory")),
    )


@attrs.frozen(kw_only=True)
class Broker:
    process: BrokerProcess
    #: Listener name -> (host, port), as the broker logged them once bound.
    listeners: dict[str, tuple[str, int]]

    def bootstrap(self, listener: str) -> str:
        host, port = self.listeners[listener]
        return f"{host}:{port}"


@asynccontextmanager
async def run_secured_broker(
    data_dir: Path, listeners: Sequence[str], *args: str
) -> AsyncIterator[Broker]:
    """A broker listening on ``listeners`` (``NAME``, each on 127.0.0.1 and a free port)."""
    options = [f"--listener={name}://127.0.0.1:0" for name in listeners]
    async with run_broker(data_dir, *options, *args) as process:
        found: dict[str, tuple[str, int]] = {}
        with trio.fail_after(30):
            while len(found) < len(listeners):
                found = {
                    name: (host, int(port))
                    for name, host, port in _LISTENING.findall(process.log_text())
                }
                await trio.sleep(0.05)
        yield Broker(process=process, listeners=found)


@asynccontextmanager
async def run_scram_broker(
    data_dir: Path, certificates: Certificates, users: dict[str, str], *args: str
) -> AsyncIterator[Broker]:
    """A broker whose one listener is SASL_SSL, knowing ``users`` (name -> password)."""
    for name, password in users.items():
        await add_user(data_dir, name, password)
    async with run_secured_broker(
        data_dir, ["SASL_SSL"], *certificates.server_options, *args
    ) as broker:
        yield broker


async def add_user(data_dir: Path, name: str, password: str) -> None:
    """``coordinator users add NAME --password-stdin`` on the (stopped) broker's store."""
    done = await run_cli(
        "users", "add", name, "--data-dir", str(data_dir), "--password-stdin",
        stdin=f"{password}\n".encode(),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr.decode(errors="replace")
