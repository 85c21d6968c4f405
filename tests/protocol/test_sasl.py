"""The SCRAM exchange's two sides, sans-IO (protocol/SPEC.md §12): what each message leads to, and
that a message out of turn raises and changes nothing."""

from __future__ import annotations

import pytest

from protocol import (
    ClusterMetadataRequest,
    ErrorCode,
    SaslAuthenticateRequest,
    SaslAuthenticateResponse,
    SaslHandshakeRequest,
    SaslHandshakeResponse,
)
from protocol.sasl import (
    AuthenticationFailed,
    ClientExchange,
    IllegalSaslState,
    LookUp,
    Reply,
    ScramCredential,
    ServerExchange,
)
from transport.scram import SCRAMP, make_credential

USERS = {
    "alice": {m: make_credential(m, "right") for m in ("SCRAM-SHA-256", "SCRAM-SHA-512")},
}


def _run(client: ClientExchange, server: ServerExchange) -> Reply:
    """Both sides to the end; the server's last reply."""
    message: SaslHandshakeRequest | SaslAuthenticateRequest = client.start()
    while True:
        step = server.receive(message)
        if isinstance(step, LookUp):
            found: ScramCredential | None = USERS.get(step.username, {}).get(server.mechanism or "")
            step = server.credential(found)
        if step.failed:
            return step
        answer = client.receive(step.message)
        if answer is None:
            return step
        message = answer


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-256", "SCRAM-SHA-512"])
def test_the_right_password_authenticates_as_the_user(mechanism: str) -> None:
    server = ServerExchange(engine=SCRAMP)
    last = _run(
        ClientExchange(engine=SCRAMP, mechanism=mechanism, username="alice", password="right"),
        server,
    )
    assert last.done and not last.failed
    assert server.principal == "User:alice"


@pytest.mark.parametrize("username", ["alice", "mallory"])
def test_a_wrong_password_and_an_unknown_user_fail_alike_at_the_last_step(username: str) -> None:
    server = ServerExchange(engine=SCRAMP)
    last = _run(
        ClientExchange(
            engine=SCRAMP, mechanism="SCRAM-SHA-256", username=username, password="wrong"
        ),
        server,
    )
    assert last.failed
    assert isinstance(last.message, SaslAuthenticateResponse)
    assert last.message.error_code is ErrorCode.SASL_AUTHENTICATION_FAILED
    assert last.message.error_message == "authentication failed"
    assert not server.done


def test_a_mechanism_the_listener_does_not_offer_is_refused() -> None:
    server = ServerExchange(engine=SCRAMP, offered=("SCRAM-SHA-512",))
    step = server.receive(SaslHandshakeRequest(mechanism="SCRAM-SHA-256"))
    assert isinstance(step, Reply) and step.failed
    assert step.message == SaslHandshakeResponse(
        error_code=ErrorCode.UNSUPPORTED_SASL_MECHANISM, mechanisms=("SCRAM-SHA-512",)
    )
    client = ClientExchange(
        engine=SCRAMP, mechanism="SCRAM-SHA-256", username="alice", password="right"
    )
    client.start()
    with pytest.raises(AuthenticationFailed, match="offers SCRAM-SHA-512"):
        client.receive(step.message)


def test_any_other_request_before_the_exchange_ends_raises_and_changes_nothing() -> None:
    server = ServerExchange(engine=SCRAMP)
    with pytest.raises(IllegalSaslState):
        server.receive(ClusterMetadataRequest(group_id=None, topics=None))
    with pytest.raises(IllegalSaslState):
        server.receive(SaslAuthenticateRequest(auth_bytes=b"n,,n=alice,r=abc"))
    # still at the handshake: the exchange goes on as if nothing had come
    step = server.receive(SaslHandshakeRequest(mechanism="SCRAM-SHA-256"))
    assert isinstance(step, Reply) and not step.failed
    with pytest.raises(IllegalSaslState):
        server.receive(SaslHandshakeRequest(mechanism="SCRAM-SHA-256"))


def test_a_broker_that_does_not_know_the_password_cannot_pass_as_one_that_does() -> None:
    """The client checks the server's signature: a server holding another credential fails it."""
    client = ClientExchange(
        engine=SCRAMP, mechanism="SCRAM-SHA-256", username="alice", password="right"
    )
    impostor = ServerExchange(engine=SCRAMP)
    step = impostor.receive(client.start())
    assert isinstance(step, Reply)
    step = impostor.receive(client.receive(step.message))  # type: ignore[arg-type]
    assert isinstance(step, LookUp)
    # the impostor stores a credential for the same user made from a guessed password; the
    # client's proof then fails on the impostor's side, and nothing authenticates
    reply = impostor.credential(make_credential("SCRAM-SHA-256", "guess"))
    final = impostor.receive(client.receive(reply.message))  # type: ignore[arg-type]
    assert isinstance(final, Reply) and final.failed


def test_a_malformed_client_first_message_fails() -> None:
    server = ServerExchange(engine=SCRAMP)
    server.receive(SaslHandshakeRequest(mechanism="SCRAM-SHA-256"))
    step = server.receive(SaslAuthenticateRequest(auth_bytes=b"\xff\xfe"))
    assert isinstance(step, Reply) and step.failed
