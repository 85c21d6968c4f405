"""TLS and SASL/SCRAM against real broker processes, with certificates made in the test: what a
user connecting with the wrong (or no) credentials sees, and that the right ones work end to end."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

from consumer import ClusterAuthorizationFailed, ListenerNeedsSasl, Refused
from consumer.admin import open_admin
from protocol import ClusterMetadataResponse
from tests.cli.cli_process import run_cli
from tests.security.conftest import Certificates, run_scram_broker, run_secured_broker
from transport.channel import ChannelClosed
from transport.connect import NoBrokerAvailable, parse_bootstrap
from transport.security import FAILED_AUTHENTICATION_DELAY, ClientSecurity

pytestmark = pytest.mark.realtime


async def _metadata(bootstrap: str, security: ClientSecurity) -> ClusterMetadataResponse:
    with trio.fail_after(30):
        async with open_admin(parse_bootstrap(bootstrap), security=security) as admin:
            return await admin.metadata()


async def _refused(bootstrap: str, security: ClientSecurity) -> str:
    """Why asking ``bootstrap`` for metadata fails (it must). Under TLS 1.3 a client learns that
    the broker refused its certificate only when it reads, so either place counts."""
    try:
        await _metadata(bootstrap, security)
    except (NoBrokerAvailable, ChannelClosed, Refused) as exc:
        return str(exc)
    except ExceptionGroup as group:
        matched, rest = group.split((NoBrokerAvailable, ChannelClosed, Refused))
        assert matched is not None and rest is None, group
        return str(matched.exceptions[0])
    raise AssertionError(f"{bootstrap} answered a client it should have refused")


async def test_tls_and_plaintext_listeners_side_by_side_each_advertising_its_own_address(
    tmp_path: Path, certificates: Certificates
) -> None:
    async with run_secured_broker(
        tmp_path / "broker",
        ["SSL", "PLAINTEXT"],
        *certificates.server_options,
    ) as broker:
        ssl_port = broker.listeners["SSL"][1]
        plain_port = broker.listeners["PLAINTEXT"][1]
        over_tls = await _metadata(broker.bootstrap("SSL"), ClientSecurity(ca=certificates.ca))
        assert [(b.host, b.port) for b in over_tls.brokers] == [("127.0.0.1", ssl_port)]
        plain = await _metadata(broker.bootstrap("PLAINTEXT"), ClientSecurity())
        assert [(b.host, b.port) for b in plain.brokers] == [("127.0.0.1", plain_port)]
        # a plaintext client on the TLS port, and a TLS client that does not trust the CA
        assert "closed" in await _refused(broker.bootstrap("SSL"), ClientSecurity())
        assert "CERTIFICATE_VERIFY_FAILED" in await _refused(
            broker.bootstrap("SSL"), ClientSecurity(tls=True)
        )
        assert "anyone who can reach its port can do anything" in broker.process.log_text()


async def test_mutual_tls_refuses_a_missing_an_unknown_and_an_expired_certificate(
    tmp_path: Path, certificates: Certificates
) -> None:
    async with run_secured_broker(
        tmp_path / "broker",
        ["SSL"],
        *certificates.server_options,
        f"--tls-client-ca={certificates.ca}",
        "--tls-principal=cn",
        "--super-users=User:alice",
    ) as broker:
        bootstrap = broker.bootstrap("SSL")
        alice = ClientSecurity(ca=certificates.ca, cert=certificates.alice, key=certificates.alice)
        bob = ClientSecurity(ca=certificates.ca, cert=certificates.bob, key=certificates.bob)
        # the certificate's common name is the principal: alice is a super user, bob nobody
        with trio.fail_after(30):
            async with open_admin(parse_bootstrap(bootstrap), security=alice) as admin:
                await admin.create_topic("t", 1)
            async with open_admin(parse_bootstrap(bootstrap), security=bob) as admin:
                assert [t.topic for t in (await admin.metadata()).topics] == []
                with pytest.raises(ClusterAuthorizationFailed, match="create topic u"):
                    await admin.create_topic("u", 1)
        await _refused(bootstrap, ClientSecurity(ca=certificates.ca))
        for cert in (certificates.stranger, certificates.expired):
            await _refused(bootstrap, ClientSecurity(ca=certificates.ca, cert=cert, key=cert))
        log = broker.process.log_text()
        assert "refused a connection on SSL" in log  # once, then a count per 10 s
        assert "anyone who can reach" not in log  # every listener authenticates its clients


async def test_scram_refuses_a_wrong_password_after_the_delay_and_serves_nothing_before_it(
    tmp_path: Path, certificates: Certificates
) -> None:
    async with run_scram_broker(
        tmp_path / "broker", certificates, {"alice": "right password"}
    ) as broker:
        bootstrap = broker.bootstrap("SASL_SSL")

        def alice(password: str, mechanism: str = "SCRAM-SHA-512") -> ClientSecurity:
            return ClientSecurity(
                ca=certificates.ca, sasl_mechanism=mechanism, username="alice", password=password
            )

        for mechanism in ("SCRAM-SHA-256", "SCRAM-SHA-512"):
            response = await _metadata(bootstrap, alice("right password", mechanism))
            assert [b.port for b in response.brokers] == [broker.listeners["SASL_SSL"][1]]
        for security in (alice("wrong"), attr_user(alice("right password"), "bob")):
            began = trio.current_time()
            reason = await _refused(bootstrap, security)
            assert "SASL_AUTHENTICATION_FAILED" in reason
            assert trio.current_time() - began >= FAILED_AUTHENTICATION_DELAY
        # TLS but no SASL: the first request is not the handshake, and is all it gets (answered
        # ILLEGAL_SASL_STATE, which the client raises rather than read as an empty answer)
        with trio.fail_after(30):
            async with open_admin(
                parse_bootstrap(bootstrap), security=ClientSecurity(ca=certificates.ca)
            ) as admin:
                with pytest.raises(ListenerNeedsSasl):
                    await admin.metadata()


def attr_user(security: ClientSecurity, username: str) -> ClientSecurity:
    """``security`` as another (unknown) user with the same password."""
    return ClientSecurity(
        ca=security.ca,
        sasl_mechanism=security.sasl_mechanism,
        username=username,
        password=security.password,
    )


async def test_one_consumer_reads_a_topic_over_tls_and_scram_with_the_cli(
    tmp_path: Path, certificates: Certificates
) -> None:
    data_dir = tmp_path / "broker"
    async with run_scram_broker(
        data_dir, certificates, {"alice": "s3cret"}, "--super-users=User:alice"
    ) as broker:
        password_file = tmp_path / "password"
        password_file.write_text("s3cret\n")
        client = [
            "--bootstrap",
            broker.bootstrap("SASL_SSL"),
            f"--tls-ca={certificates.ca}",
            "--sasl-mechanism=SCRAM-SHA-256",
            "--user=alice",
            f"--password-file={password_file}",
        ]
        created = await run_cli("topics", "create", "t", "--partitions", "2", *client)
        assert created.returncode == 0, created.stderr
        produced = await run_cli("produce", "t", *client, stdin=b"one\ntwo\nthree\n")
        assert produced.returncode == 0, produced.stderr
        consumed = await run_cli(
            "consume", "t", "--group", "g", "--from-beginning", "--max-messages", "3", *client
        )
        assert consumed.returncode == 0, consumed.stderr
        assert sorted(consumed.stdout.decode().split()) == ["one", "three", "two"]
        wrong = tmp_path / "wrong"
        wrong.write_text("guess\n")
        refused = await run_cli("topics", "list", *client[:-1], f"--password-file={wrong}")
        assert refused.returncode == 1
        assert "SASL_AUTHENTICATION_FAILED" in refused.stderr.decode()
        assert b"s3cret" not in (data_dir / "metadata" / "metadata.journal").read_bytes()
