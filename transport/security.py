"""Who is at the other end of a connection: TLS on a listener (``trio.SSLStream``), the SASL/SCRAM
exchange that opens a connection to a SASL listener (protocol/SPEC.md §12), and the one settings
object, :class:`ClientSecurity`, that every client (CLI verbs, consumer, producer, admin, the Spark
source and sink, and a broker connecting to its peers) takes to do the same from its side.

A listener's name is its security protocol, as in Kafka's default
``listener.security.protocol.map``: ``PLAINTEXT``, ``SSL``, ``SASL_PLAINTEXT`` or ``SASL_SSL``.
A connection is admitted in the listener's task before any of its requests is read: the TLS
handshake and the SASL exchange run under one deadline (``ConnectionLimits.handshake_timeout``)
and count against the connection limits like any other connection. A failed authentication is
answered SASL_AUTHENTICATION_FAILED after :data:`FAILED_AUTHENTICATION_DELAY` and the connection
closed (Kafka's ``connection.failed.authentication.delay.ms``): a client guessing passwords gets
ten tries a second per connection, each holding a connection of the limits meanwhile.

The exchange speaks frames through its own :class:`protocol.Connection` on each side; the
connection's :class:`~transport.channel.Channel` starts afterwards with fresh frame counts on both
sides, so the counts the ownership lease relies on (docs/design.md#ownership-lease) are the same
at both ends.
"""

from __future__ import annotations

import contextlib
import enum
import logging
import socket
import ssl
from collections.abc import Awaitable, Callable
from pathlib import Path

import attrs
import trio

from protocol import (
    NEED_DATA,
    Connection,
    ConnectionClosed,
    ErrorCode,
    PeerError,
    RemoteProtocolError,
    Request,
    RequestMessage,
    Response,
    ResponseMessage,
    Role,
    error_response,
)
from protocol.sasl import (
    ANONYMOUS,
    MECHANISMS,
    AuthenticationFailed,
    ClientExchange,
    IllegalSaslState,
    LookUp,
    ScramCredential,
    ServerExchange,
)
from transport import refusals
from transport.refusals import HandshakeFailed

__all__ = [
    "FAILED_AUTHENTICATION_DELAY",
    "ClientSecurity",
    "Endpoint",
    "HandshakeFailed",
    "ListenerSecurity",
    "Peer",
    "SecurityProtocol",
    "ServerTls",
    "admit",
    "as_its_peers_see_it",
]
from transport.channel import RateLimitedLog
from transport.scram import SCRAMP

log = logging.getLogger(__name__)
#: One line per refusal, at most one per 10 s with a count: a client guessing passwords must not
#: fill the disk.
_refusals = RateLimitedLog(log, level=logging.INFO)

#: A failed authentication is answered this long after it failed (Kafka's
#: ``connection.failed.authentication.delay.ms`` is 100 ms).
FAILED_AUTHENTICATION_DELAY = 0.1
#: The largest frame of the SASL exchange: a client nobody has authenticated yet makes the broker
#: buffer no more than this.
HANDSHAKE_MAX_FRAME = 64 * 1024
_RECEIVE_SIZE = 16 * 1024


class SecurityProtocol(enum.Enum):
    PLAINTEXT = "PLAINTEXT"
    SSL = "SSL"
    SASL_PLAINTEXT = "SASL_PLAINTEXT"
    SASL_SSL = "SASL_SSL"

    @property
    def tls(self) -> bool:
        return self in (SecurityProtocol.SSL, SecurityProtocol.SASL_SSL)

    @property
    def sasl(self) -> bool:
        return self in (SecurityProtocol.SASL_PLAINTEXT, SecurityProtocol.SASL_SSL)


@attrs.frozen(kw_only=True, order=True)
class Endpoint:
    """A listener (``--listener``) or the address it is advertised under
    (``--advertised-listener``): ``NAME://HOST:PORT``, NAME a :class:`SecurityProtocol`."""

    listener: str
    host: str
    port: int

    @classmethod
    def parse(cls, text: str) -> Endpoint:
        name, sep, address = text.partition("://")
        host, colon, port = address.rpartition(":")
        if not sep or not colon or not port.isdigit() or not 0 <= int(port) < 65536:
            raise ValueError(f"bad listener {text!r}: expected NAME://HOST:PORT")
        try:
            SecurityProtocol(name.upper())
        except ValueError:
            names = ", ".join(p.value for p in SecurityProtocol)
            raise ValueError(f"bad listener {text!r}: NAME is one of {names}") from None
        return cls(listener=name.upper(), host=host.strip("[]"), port=int(port))

    @property
    def protocol(self) -> SecurityProtocol:
        return SecurityProtocol(self.listener)

    def __str__(self) -> str:
        return f"{self.listener}://{self.host}:{self.port}"


@attrs.frozen(kw_only=True)
class Peer:
    """Who a connection was admitted as, on which listener, and from which address."""

    listener: str = SecurityProtocol.PLAINTEXT.value
    #: ``User:<name>`` after SASL; ``User:<certificate subject>`` (RFC 2253, as Kafka writes it)
    #: after mutual TLS; ``User:ANONYMOUS`` otherwise.
    principal: str = ANONYMOUS
    #: The address the connection came from ("": not known).
    host: str = ""

    @property
    def authenticated(self) -> bool:
        return self.principal != ANONYMOUS


@attrs.frozen(kw_only=True)
class ServerTls:
    """The broker's certificate, and the CA its clients' certificates must come from (mutual
    TLS: ``--tls-client-ca``)."""

    cert: Path
    key: Path
    client_ca: Path | None = None

    def context(self) -> ssl.SSLContext:
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        context.load_cert_chain(self.cert, self.key)
        if self.client_ca is not None:
            context.load_verify_locations(self.client_ca)
            context.verify_mode = ssl.CERT_REQUIRED
        return context


#: ``lookup(username, mechanism)``: the user's stored credential, or None.
CredentialLookup = Callable[[str, str], Awaitable[ScramCredential | None]]


@attrs.frozen(kw_only=True, eq=False)
class ListenerSecurity:
    """How one listener admits its connections."""

    protocol: SecurityProtocol
    #: The server context for a TLS listener.
    tls: ssl.SSLContext | None = None
    #: Where a SASL listener finds credentials.
    credentials: CredentialLookup | None = None
    mechanisms: tuple[str, ...] = MECHANISMS
    #: The TLS handshake and the SASL exchange together must end within this long.
    handshake_timeout: float = 10.0
    #: A client certificate's principal is ``User:<its common name>``, not its whole subject.
    principal_is_cn: bool = False

    def __attrs_post_init__(self) -> None:
        if self.protocol.tls and self.tls is None:
            raise ValueError(f"the {self.protocol.value} listener needs a certificate and key")
        if self.protocol.sasl and self.credentials is None:
            raise ValueError(f"the {self.protocol.value} listener needs a credential store")


async def admit(
    stream: trio.abc.Stream, security: ListenerSecurity
) -> tuple[trio.abc.Stream, Peer] | None:
    """Run the listener's TLS handshake and SASL exchange on a new connection: the stream to
    serve and who it is, or None (the connection was refused, and closed here)."""
    peer = Peer(listener=security.protocol.value)
    failed: bytes | None = None
    with trio.move_on_after(security.handshake_timeout) as deadline:
        try:
            if security.tls is not None:
                stream = trio.SSLStream(stream, security.tls, server_side=True)
                await stream.do_handshake()
                subject = _subject(stream.getpeercert(), common_name=security.principal_is_cn)
                if subject is not None:
                    peer = attrs.evolve(peer, principal=f"User:{subject}")
            if security.credentials is not None:
                principal, failed = await _authenticate(stream, security)
                if principal is not None:
                    peer = attrs.evolve(peer, principal=principal)
        except (trio.BrokenResourceError, trio.ClosedResourceError, RemoteProtocolError) as exc:
            _refusals.log("refused a connection on %s: %s", peer.listener, _reason(exc))
            failed = b""
    if deadline.cancelled_caught:
        _refusals.log(
            "refused a connection on %s: no handshake in %g s",
            peer.listener,
            security.handshake_timeout,
        )
        failed = b""
    if failed is not None:
        await _refuse(stream, failed)
        return None
    return stream, peer


async def _refuse(stream: trio.abc.Stream, answer: bytes) -> None:
    """After the delay, send the failure's answer (if any) and close."""
    with trio.CancelScope(shield=True):
        if answer:
            await trio.sleep(FAILED_AUTHENTICATION_DELAY)
            with trio.move_on_after(1.0):
                with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
                    await stream.send_all(answer)
        with trio.move_on_after(1.0):
            await trio.aclose_forcefully(stream)


async def _authenticate(
    stream: trio.abc.Stream, security: ListenerSecurity
) -> tuple[str | None, bytes | None]:
    """The broker's side of the exchange: (principal, None) once authenticated, or (None, the
    failure's answer, unsent)."""
    assert security.credentials is not None
    connection = Connection(Role.BROKER, max_frame_size=HANDSHAKE_MAX_FRAME)
    exchange = ServerExchange(engine=SCRAMP, offered=security.mechanisms)
    while True:
        request = await _next(stream, connection)
        if not isinstance(request, Request):
            return None, b""
        try:
            step = exchange.receive(request.message)
        except IllegalSaslState as exc:
            answer = error_response(request.message, ErrorCode.ILLEGAL_SASL_STATE)
            _refusals.log("refused a connection on %s: %s", security.protocol.value, exc)
            return None, _answer(connection, request, answer)
        if isinstance(step, LookUp):
            assert exchange.mechanism is not None
            try:
                found = await security.credentials(step.username, exchange.mechanism)
            except Exception as exc:  # the store cannot answer now: the client tries again
                _refusals.log("cannot check %r's credentials: %s; closing", step.username, exc)
                return None, b""
            step = exchange.credential(found)
        data = _answer(connection, request, step.message)
        if step.failed:
            _refusals.log(
                "refused a connection on %s: %s failed for %r",
                security.protocol.value,
                exchange.mechanism or "the SASL handshake",
                exchange.username,
            )
            return None, data
        await stream.send_all(data)
        if step.done:
            if connection.buffered_bytes:
                raise RemoteProtocolError(
                    "a request came before the exchange ended", ErrorCode.ILLEGAL_SASL_STATE
                )
            return exchange.principal, None


def _answer(connection: Connection, request: Request, message: ResponseMessage) -> bytes:
    return connection.send(
        Response(correlation_id=request.correlation_id, message=message, request=request.message)
    )


async def _next(stream: trio.abc.Stream, connection: Connection) -> Request | Response | None:
    """The next frame of the exchange, or None if the peer closed the connection."""
    while True:
        event = connection.next_event()
        if event is NEED_DATA:
            data = await stream.receive_some(_RECEIVE_SIZE)
            connection.receive_data(bytes(data))
            continue
        if isinstance(event, PeerError):
            raise RemoteProtocolError(
                f"the peer said {event.error_code.name}: {event.message}", event.error_code
            )
        if isinstance(event, Request | Response):
            return event
        assert isinstance(event, ConnectionClosed)
        return None


def _subject(certificate: object, *, common_name: bool = False) -> str | None:
    """A client certificate's subject as RFC 2253 writes it (most specific first:
    ``CN=alice,O=Example``), as Kafka names mutual TLS principals, or with ``common_name`` its
    common name alone (as Kafka's ``ssl.principal.mapping.rules`` are most often used to);
    None without a certificate (or without a common name, then)."""
    if not isinstance(certificate, dict) or not certificate.get("subject"):
        return None
    if common_name:
        common = [v for rdn in certificate["subject"] for k, v in rdn if k == "commonName"]
        return str(common[-1]) if common else None
    names = {
        "commonName": "CN",
        "organizationName": "O",
        "organizationalUnitName": "OU",
        "countryName": "C",
        "localityName": "L",
        "stateOrProvinceName": "ST",
        "domainComponent": "DC",
        "emailAddress": "EMAILADDRESS",
    }
    parts = []
    for rdn in reversed(certificate["subject"]):
        parts.append("+".join(f"{names.get(key, key)}={_escape(value)}" for key, value in rdn))
    return ",".join(parts)


def _escape(value: str) -> str:
    escaped = "".join(f"\\{c}" if c in ',+"\\<>;' else c for c in value)
    if escaped.startswith(("#", " ")):
        escaped = "\\" + escaped
    return escaped


def _reason(exc: BaseException) -> str:
    cause = exc.__cause__ or exc.__context__
    return str(cause or exc) or type(exc).__name__


async def _tcp(host: str, port: int) -> trio.abc.Stream:
    return await trio.open_tcp_stream(host, port)


@attrs.frozen(kw_only=True)
class ClientSecurity:
    """How a client connects: TLS (trusting ``ca``, with a client certificate for mutual TLS) and
    SASL/SCRAM. The default is a plaintext connection that authenticates nobody."""

    tls: bool = False
    #: The CA file that signed the brokers' certificates; None: the system's CAs.
    ca: Path | None = None
    #: A client certificate and its key, for a listener that requires one (mutual TLS).
    cert: Path | None = None
    key: Path | None = None
    #: ``SCRAM-SHA-256`` or ``SCRAM-SHA-512``; None: no SASL.
    sasl_mechanism: str | None = None
    username: str | None = None
    password: str | None = attrs.field(default=None, repr=False)

    def __attrs_post_init__(self) -> None:
        if self.sasl_mechanism is not None:
            if self.sasl_mechanism not in MECHANISMS:
                known = ", ".join(MECHANISMS)
                raise ValueError(f"unknown SASL mechanism {self.sasl_mechanism!r}: one of {known}")
            if not self.username or self.password is None:
                raise ValueError("SASL needs a user name and a password")
        if (self.cert is None) != (self.key is None):
            raise ValueError("a client certificate needs its key, and a key its certificate")

    @property
    def uses_tls(self) -> bool:
        return self.tls or self.ca is not None or self.cert is not None

    def ssl_context(self) -> ssl.SSLContext | None:
        if not self.uses_tls:
            return None
        context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=self.ca)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        if self.cert is not None:
            context.load_cert_chain(self.cert, self.key)
        return context

    def exchange(self) -> ClientExchange | None:
        if self.sasl_mechanism is None:
            return None
        assert self.username is not None and self.password is not None
        return ClientExchange(
            engine=SCRAMP,
            mechanism=self.sasl_mechanism,
            username=self.username,
            password=self.password,
        )

    def connector(
        self, base: Callable[[str, int], Awaitable[trio.abc.Stream]] = _tcp
    ) -> Callable[[str, int], Awaitable[trio.abc.Stream]]:
        """``connect(host, port)``: a stream to the broker, secured and authenticated as this
        says; HandshakeFailed (an OSError) when TLS or SASL fails."""
        context = self.ssl_context()
        if context is None and self.sasl_mechanism is None:
            return base

        async def connect(host: str, port: int) -> trio.abc.Stream:
            stream = await base(host, port)
            try:
                if context is not None:
                    stream = trio.SSLStream(stream, context, server_hostname=host)
                    await stream.do_handshake()
                exchange = self.exchange()
                if exchange is not None:
                    await _client_exchange(stream, exchange, f"{host}:{port}")
            except AuthenticationFailed as exc:
                await trio.aclose_forcefully(stream)
                raise refusals.AuthenticationFailed(
                    f"{host}:{port} refused user {self.username!r} ({exc})"
                ) from None
            except (trio.BrokenResourceError, RemoteProtocolError) as exc:
                await trio.aclose_forcefully(stream)
                raise HandshakeFailed(_reason(exc)) from None
            except BaseException:
                await trio.aclose_forcefully(stream)
                raise
            return stream

        return connect

    def connect_blocking(self, address: tuple[str, int], timeout: float) -> socket.socket:
        """The same for a blocking client (the Spark source and sink's tasks)."""
        sock = socket.create_connection(address, timeout=timeout)
        try:
            context = self.ssl_context()
            if context is not None:
                sock = context.wrap_socket(sock, server_hostname=address[0])
            exchange = self.exchange()
            if exchange is not None:
                _client_exchange_blocking(sock, exchange)
        except (OSError, AuthenticationFailed, RemoteProtocolError) as exc:
            sock.close()
            raise HandshakeFailed(f"{address[0]}:{address[1]}: {_reason(exc)}") from None
        return sock


def as_its_peers_see_it(
    tls: ServerTls, security: ClientSecurity, host: str, *, common_name: bool = False
) -> str | None:
    """A broker's TLS handshake with itself, in memory: its client side as it connects to its
    peers (``security``, naming ``host``, the address it advertises to them) against its own
    server side (``tls``). What a peer's check of its certificate finds, and a peer's listener
    of its client certificate, is found here, at start: ssl.SSLError (an OSError) where either
    would refuse it. The principal its certificate gives it where client certificates are
    required, as ``admit`` names it; None where they are not."""
    context = security.ssl_context()
    if context is None:
        raise ValueError("no TLS to check")
    server_in, server_out, client_in, client_out = (ssl.MemoryBIO() for _ in range(4))
    server = tls.context().wrap_bio(server_in, server_out, server_side=True)
    client = context.wrap_bio(client_in, client_out, server_hostname=host)
    ends = [(client, client_out, server_in), (server, server_out, client_in)]
    pending = {client, server}
    for _ in range(8):  # a TLS 1.2 or 1.3 handshake takes at most 3 flights each way
        for end, sent, delivered in ends:
            if end in pending:
                try:
                    end.do_handshake()
                    pending.discard(end)
                except ssl.SSLWantReadError:
                    pass
            delivered.write(sent.read())
        if not pending:
            break
    if pending:
        raise ssl.SSLError(f"a handshake of {tls.cert} with itself did not end")
    if tls.client_ca is None:
        return None
    subject = _subject(server.getpeercert(), common_name=common_name)
    return None if subject is None else f"User:{subject}"


async def _client_exchange(stream: trio.abc.Stream, exchange: ClientExchange, peer: str) -> None:
    connection = Connection(Role.CONSUMER, max_frame_size=HANDSHAKE_MAX_FRAME)
    message: RequestMessage | None = exchange.start()
    while message is not None:
        await stream.send_all(connection.send(connection.new_request(message)))
        response = await _next(stream, connection)
        unanswered = response is None and not connection.frames_received
        if unanswered and not isinstance(stream, trio.SSLStream):
            raise refusals.ListenerNeedsTls(
                f"{peer} closed the connection before answering (does this listener need TLS?)"
            )
        if not isinstance(response, Response):
            raise AuthenticationFailed("the broker closed the connection during the exchange")
        message = _client_step(exchange, response.message)


def _client_exchange_blocking(sock: socket.socket, exchange: ClientExchange) -> None:
    connection = Connection(Role.CONSUMER, max_frame_size=HANDSHAKE_MAX_FRAME)
    message: RequestMessage | None = exchange.start()
    while message is not None:
        sock.sendall(connection.send(connection.new_request(message)))
        while (event := connection.next_event()) is NEED_DATA:
            connection.receive_data(sock.recv(_RECEIVE_SIZE))
        if isinstance(event, PeerError):
            raise AuthenticationFailed(f"{event.error_code.name}: {event.message}")
        if not isinstance(event, Response):
            raise AuthenticationFailed("the broker closed the connection during the exchange")
        message = _client_step(exchange, event.message)


def _client_step(exchange: ClientExchange, message: ResponseMessage) -> RequestMessage | None:
    try:
        return exchange.receive(message)
    except IllegalSaslState as exc:
        raise AuthenticationFailed(str(exc)) from None
