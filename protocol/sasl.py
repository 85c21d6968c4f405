"""SASL/SCRAM-SHA-256 and -512 (RFC 5802, RFC 7677) as the exchange that opens a connection to a
SASL listener, sans-IO: both sides' steps as objects that take a message and return the next one
(protocol/SPEC.md §12). This module decides which message may come when; the proofs are computed
by a :class:`ScramEngine` the caller passes in (``transport/scram.py`` wraps the ``scramp``
package, which imports ``ssl`` for channel binding and so stays out of this package), and
transport/ moves the frames.

The broker keeps for each user only the salted, hashed form
(:class:`ScramCredential`): the salt, the iteration count, StoredKey and ServerKey. Neither lets
anyone who reads the store log in, and the password never crosses the wire.
"""

from __future__ import annotations

import enum
from typing import Protocol

import attrs

from .errors import ErrorCode, IllegalInput
from .messages import (
    RequestMessage,
    ResponseMessage,
    SaslAuthenticateRequest,
    SaslAuthenticateResponse,
    SaslHandshakeRequest,
    SaslHandshakeResponse,
)

__all__ = [
    "MECHANISMS",
    "AuthenticationFailed",
    "ClientExchange",
    "IllegalSaslState",
    "LookUp",
    "Reply",
    "ScramCredential",
    "ScramEngine",
    "ScramFailure",
    "ServerExchange",
    "principal_of",
]

MECHANISMS = ("SCRAM-SHA-256", "SCRAM-SHA-512")
#: PBKDF2 rounds for a new credential: Kafka's and RFC 7677's minimum is 4096.
ITERATIONS = 4096
#: The principal of a connection nobody authenticated on (Kafka's name).
ANONYMOUS = "User:ANONYMOUS"


def principal_of(username: str) -> str:
    """The principal a user authenticates as, as ACLs and ``--super-users`` name it."""
    return f"User:{username}"


@attrs.frozen(kw_only=True)
class ScramCredential:
    """What the broker stores for one user and mechanism (RFC 5802 §3)."""

    mechanism: str
    salt: bytes
    stored_key: bytes
    server_key: bytes
    iterations: int


class ScramFailure(Exception):
    """The engine refused a message: a wrong proof, a bad signature, a malformed message."""


class ServerEngine(Protocol):
    """One exchange's SCRAM computations on the broker's side (RFC 5802 §5)."""

    def set_client_first(self, message: str) -> None: ...
    def get_server_first(self) -> str: ...
    def set_client_final(self, message: str) -> None: ...
    def get_server_final(self) -> str: ...


class ClientEngine(Protocol):
    """One exchange's SCRAM computations on a client's side."""

    def get_client_first(self) -> str: ...
    def set_server_first(self, message: str) -> None: ...
    def get_client_final(self) -> str: ...
    def set_server_final(self, message: str) -> None: ...


class ScramEngine(Protocol):
    """Makes each exchange's engines; every method raises :class:`ScramFailure` on a refusal."""

    def server(self, credential: ScramCredential) -> ServerEngine: ...
    def client(self, mechanism: str, username: str, password: str) -> ClientEngine: ...
    def decoy(self, mechanism: str) -> ScramCredential:
        """A credential nobody knows the password of, for unknown users (fixed per mechanism)."""
        ...


class AuthenticationFailed(Exception):
    """The exchange failed: the broker refused the credentials, or proved to be no broker that
    knows them (a wrong server signature)."""


class IllegalSaslState(IllegalInput):
    """A message that may not come now (any other request before the exchange is done, a second
    handshake); nothing changed."""


@attrs.frozen(kw_only=True)
class Reply:
    """Send ``message``; then the exchange is ``done`` (authenticated) or ``failed``."""

    message: ResponseMessage
    done: bool = False
    failed: bool = False


@attrs.frozen(kw_only=True)
class LookUp:
    """Find ``username``'s credential for the chosen mechanism and pass it to
    :meth:`ServerExchange.credential` (None when there is no such user)."""

    username: str


class _ServerState(enum.Enum):
    HANDSHAKE = "handshake"
    CLIENT_FIRST = "client-first"
    LOOKING_UP = "looking-up"
    CLIENT_FINAL = "client-final"
    DONE = "done"
    FAILED = "failed"


@attrs.define(eq=False)
class ServerExchange:
    """The broker's side: SaslHandshake, then SaslAuthenticate twice (client-first, then
    client-final)."""

    engine: ScramEngine
    offered: tuple[str, ...] = MECHANISMS
    _state: _ServerState = _ServerState.HANDSHAKE
    mechanism: str | None = None
    username: str | None = None
    _known: bool = False
    _client_first: bytes = b""
    _server: ServerEngine | None = None

    @property
    def done(self) -> bool:
        return self._state is _ServerState.DONE

    @property
    def principal(self) -> str:
        assert self._state is _ServerState.DONE and self.username is not None
        return principal_of(self.username)

    def receive(self, message: RequestMessage) -> Reply | LookUp:
        """The next step after the client's ``message``; IllegalSaslState if it may not come now."""
        state = self._state
        if state is _ServerState.HANDSHAKE and isinstance(message, SaslHandshakeRequest):
            if message.mechanism not in self.offered:
                self._state = _ServerState.FAILED
                return Reply(
                    message=SaslHandshakeResponse(
                        error_code=ErrorCode.UNSUPPORTED_SASL_MECHANISM, mechanisms=self.offered
                    ),
                    failed=True,
                )
            self.mechanism = message.mechanism
            self._state = _ServerState.CLIENT_FIRST
            return Reply(
                message=SaslHandshakeResponse(error_code=ErrorCode.NONE, mechanisms=self.offered)
            )
        if state is _ServerState.CLIENT_FIRST and isinstance(message, SaslAuthenticateRequest):
            username = _username(message.auth_bytes)
            if username is None:
                self._state = _ServerState.FAILED
                return _failure("malformed client-first message")
            self.username = username
            self._client_first = message.auth_bytes
            self._state = _ServerState.LOOKING_UP
            return LookUp(username=username)
        if state is _ServerState.CLIENT_FINAL and isinstance(message, SaslAuthenticateRequest):
            assert self._server is not None
            try:
                self._server.set_client_final(message.auth_bytes.decode())
                final = self._server.get_server_final()
            except (ScramFailure, UnicodeDecodeError):
                self._state = _ServerState.FAILED
                return _failure("authentication failed")
            if not self._known:  # a decoy's proof cannot match; checked anyway, to fail alike
                self._state = _ServerState.FAILED
                return _failure("authentication failed")
            self._state = _ServerState.DONE
            return Reply(
                message=SaslAuthenticateResponse(
                    error_code=ErrorCode.NONE, error_message="", auth_bytes=final.encode()
                ),
                done=True,
            )
        raise IllegalSaslState(
            f"{type(message).__name__} may not come while the exchange is at {state.value}"
        )

    def credential(self, found: ScramCredential | None) -> Reply:
        """The credential :class:`LookUp` asked for: the server-first message, or a failure."""
        if self._state is not _ServerState.LOOKING_UP:
            raise IllegalSaslState(f"no credential was asked for at {self._state.value}")
        assert self.mechanism is not None
        self._known = found is not None and found.mechanism == self.mechanism
        credential = found if found is not None and self._known else None
        try:
            server = self.engine.server(credential or self.engine.decoy(self.mechanism))
            server.set_client_first(self._client_first.decode())
            first = server.get_server_first()
        except (ScramFailure, UnicodeDecodeError):
            self._state = _ServerState.FAILED
            return _failure("malformed client-first message")
        self._server = server
        self._state = _ServerState.CLIENT_FINAL
        return Reply(
            message=SaslAuthenticateResponse(
                error_code=ErrorCode.NONE, error_message="", auth_bytes=first.encode()
            )
        )


def _failure(reason: str) -> Reply:
    return Reply(
        message=SaslAuthenticateResponse(
            error_code=ErrorCode.SASL_AUTHENTICATION_FAILED, error_message=reason, auth_bytes=b""
        ),
        failed=True,
    )


def _username(client_first: bytes) -> str | None:
    """The user name of a client-first message (``gs2-header n=name,r=nonce``, RFC 5802 §5.1),
    with ``=2C`` and ``=3D`` unescaped; None if it has none."""
    try:
        text = client_first.decode()
    except UnicodeDecodeError:
        return None
    parts = text.split(",")
    if len(parts) < 4 or not parts[2].startswith("n="):
        return None
    name = parts[2][2:]
    if not name:
        return None
    return name.replace("=2C", ",").replace("=3D", "=")


class _ClientState(enum.Enum):
    HANDSHAKE = "handshake"
    SERVER_FIRST = "server-first"
    SERVER_FINAL = "server-final"
    DONE = "done"


@attrs.define(eq=False)
class ClientExchange:
    """A client's side: :meth:`start` gives the first request, :meth:`receive` each next one (None
    once authenticated); AuthenticationFailed when the broker refuses or fails to prove itself."""

    engine: ScramEngine
    mechanism: str
    username: str
    password: str = attrs.field(repr=False)
    _state: _ClientState = _ClientState.HANDSHAKE
    _client: ClientEngine | None = None

    def start(self) -> SaslHandshakeRequest:
        if self.mechanism not in MECHANISMS:
            raise ValueError(f"unknown SASL mechanism {self.mechanism!r}")
        return SaslHandshakeRequest(mechanism=self.mechanism)

    def receive(self, message: ResponseMessage) -> SaslAuthenticateRequest | None:
        state = self._state
        if state is _ClientState.HANDSHAKE and isinstance(message, SaslHandshakeResponse):
            if message.error_code is not ErrorCode.NONE:
                raise AuthenticationFailed(
                    f"the broker does not offer {self.mechanism} "
                    f"(it offers {', '.join(message.mechanisms) or 'nothing'})"
                )
            try:
                self._client = self.engine.client(self.mechanism, self.username, self.password)
                first = self._client.get_client_first()
            except ScramFailure as exc:
                raise AuthenticationFailed(f"cannot begin the exchange: {exc}") from None
            self._state = _ClientState.SERVER_FIRST
            return SaslAuthenticateRequest(auth_bytes=first.encode())
        if isinstance(message, SaslAuthenticateResponse) and state in (
            _ClientState.SERVER_FIRST,
            _ClientState.SERVER_FINAL,
        ):
            if message.error_code is not ErrorCode.NONE:
                raise AuthenticationFailed(
                    f"{message.error_code.name}: {message.error_message or 'refused'}"
                )
            assert self._client is not None
            try:
                if state is _ClientState.SERVER_FIRST:
                    self._client.set_server_first(message.auth_bytes.decode())
                    self._state = _ClientState.SERVER_FINAL
                    return SaslAuthenticateRequest(
                        auth_bytes=self._client.get_client_final().encode()
                    )
                self._client.set_server_final(message.auth_bytes.decode())
            except (ScramFailure, UnicodeDecodeError) as exc:
                raise AuthenticationFailed(f"the broker failed the exchange: {exc}") from None
            self._state = _ClientState.DONE
            return None
        raise IllegalSaslState(
            f"{type(message).__name__} may not come while the exchange is at {state.value}"
        )
