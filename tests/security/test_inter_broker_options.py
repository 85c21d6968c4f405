"""``serve``'s inter-broker options as the broker gets them (docs/security.md#brokers): the
listener's name, the CA trusted for peers, and the SCRAM user whose password comes from a file
or the environment, never from the command line."""

from __future__ import annotations

from pathlib import Path

import pytest

from cli.main import _parser
from cli.security import INTER_BROKER_PASSWORD_VARIABLE, serve_security

SERVE = [
    "serve",
    "--listener=SASL_SSL://127.0.0.1:0",
    "--listener=SSL://127.0.0.1:0",
    "--tls-cert=broker.pem",
    "--tls-key=broker.pem",
]


def _settings(*argv: str) -> dict[str, object]:
    return serve_security(_parser().parse_args([*SERVE, *argv]))


def test_the_inter_broker_listener_ca_and_user_reach_the_broker(tmp_path: Path) -> None:
    password = tmp_path / "broker.pw"
    password.write_text("s3cret\nignored\n")
    settings = _settings(
        "--inter-broker-listener=sasl_ssl",
        "--tls-ca=ca.pem",
        "--inter-broker-user=broker",
        f"--inter-broker-password-file={password}",
        "--inter-broker-sasl-mechanism=scram-sha-256",
    )
    assert settings["inter_broker_listener"] == "SASL_SSL"
    assert settings["tls_ca"] == Path("ca.pem")
    assert settings["inter_broker_user"] == "broker"
    assert settings["inter_broker_password"] == "s3cret"
    assert settings["inter_broker_sasl_mechanism"] == "SCRAM-SHA-256"


def test_by_default_the_first_listener_and_no_user() -> None:
    settings = _settings()
    assert settings["inter_broker_listener"] is None
    assert settings["inter_broker_user"] is None
    assert settings["inter_broker_password"] is None


def test_the_password_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(INTER_BROKER_PASSWORD_VARIABLE, "from-env")
    settings = _settings("--inter-broker-user=broker")
    assert settings["inter_broker_password"] == "from-env"


def test_a_user_without_a_password_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(INTER_BROKER_PASSWORD_VARIABLE, raising=False)
    with pytest.raises(ValueError, match="--inter-broker-user needs --inter-broker-password-file"):
        _settings("--inter-broker-user=broker")
    with pytest.raises(ValueError, match="--inter-broker-password-file needs --inter-broker-user"):
        _settings("--inter-broker-password-file=broker.pw")
