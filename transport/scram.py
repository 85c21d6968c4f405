"""The SCRAM computations (RFC 5802, RFC 7677) of the ``scramp`` package behind
:class:`protocol.sasl.ScramEngine`, so that the sans-IO exchange in protocol/ never imports it
(scramp imports ``ssl`` for channel binding, which this protocol does not use)."""

from __future__ import annotations

import hmac
import secrets

import attrs
import scramp

from protocol.sasl import MECHANISMS, ClientEngine, ScramCredential, ScramFailure, ServerEngine

__all__ = ["ITERATIONS", "SCRAMP", "Scramp", "make_credential", "password_matches"]

#: PBKDF2 rounds for a new credential: RFC 7677's minimum, and Kafka's default.
ITERATIONS = 4096


def make_credential(mechanism: str, password: str, iterations: int = ITERATIONS) -> ScramCredential:
    """A new salted, hashed credential for ``password``, under a fresh random salt: what the
    store keeps (RFC 5802 §3), from which nobody can log in."""
    if mechanism not in MECHANISMS:
        raise ValueError(f"unknown mechanism {mechanism!r}: one of {', '.join(MECHANISMS)}")
    salt, stored_key, server_key, count = scramp.ScramMechanism(mechanism).make_auth_info(
        password, iteration_count=iterations
    )
    return ScramCredential(
        mechanism=mechanism,
        salt=salt,
        stored_key=stored_key,
        server_key=server_key,
        iterations=count,
    )


def password_matches(credential: ScramCredential, password: str) -> bool:
    """Whether ``password`` is the one ``credential`` was made from: the salted password derived
    again under the stored salt and iterations, and StoredKey and ServerKey compared with the
    stored ones in constant time. For a login that sends the password itself (HTTP Basic, on the
    status page) rather than a SCRAM proof; PBKDF2's iterations make it cost milliseconds, so
    callers run it in a thread and bound how many run at once."""
    try:
        _, stored_key, server_key, _ = scramp.ScramMechanism(credential.mechanism).make_auth_info(
            password, iteration_count=credential.iterations, salt=credential.salt
        )
    except (scramp.ScramException, ValueError, TypeError):
        return False  # not a password SASLprep allows, or a mechanism scramp does not know
    stored = hmac.compare_digest(stored_key, credential.stored_key)
    server = hmac.compare_digest(server_key, credential.server_key)
    return stored and server


@attrs.define(eq=False)
class _Checked:
    """A scramp server or client whose refusals are ScramFailure."""

    inner: scramp.core.ScramServer | scramp.ScramClient

    def __getattr__(self, name: str) -> object:
        method = getattr(self.inner, name)

        def call(*args: object) -> object:
            try:
                return method(*args)
            except scramp.ScramException as exc:
                raise ScramFailure(str(exc)) from None

        return call


@attrs.define(eq=False)
class Scramp:
    """:class:`protocol.sasl.ScramEngine` on scramp."""

    #: One decoy per mechanism, made on first use: an unknown user then fails where a wrong
    #: password does, at the client's proof, and user names cannot be probed.
    _decoys: dict[str, ScramCredential] = attrs.field(factory=dict)

    def server(self, credential: ScramCredential) -> ServerEngine:
        info = (
            credential.salt,
            credential.stored_key,
            credential.server_key,
            credential.iterations,
        )
        mechanism = scramp.ScramMechanism(credential.mechanism)
        engine: ServerEngine = _Checked(mechanism.make_server(lambda _username: info))  # type: ignore[assignment]
        return engine

    def client(self, mechanism: str, username: str, password: str) -> ClientEngine:
        engine: ClientEngine = _Checked(scramp.ScramClient([mechanism], username, password))  # type: ignore[assignment]
        return engine

    def decoy(self, mechanism: str) -> ScramCredential:
        if mechanism not in self._decoys:
            self._decoys[mechanism] = make_credential(mechanism, secrets.token_urlsafe(32))
        return self._decoys[mechanism]


#: The engine every side of this repository uses.
SCRAMP = Scramp()
