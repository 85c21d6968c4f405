"""One end of one connection, sans-IO, in the manner of h11's ``Connection``.

The caller feeds received bytes in with :meth:`Connection.receive_data` and takes events out with
:meth:`Connection.next_event`; it turns events into bytes with :meth:`Connection.send` and writes
them itself. The object keeps the only state the wire needs: which requests each side still owes an
answer to. Both sides send requests on the same connection (the broker sends Ping/StopFetcher/
StartFetcher to the consumer that connected to it), so each direction has its own correlation ids,
and a response is matched against the requests of the direction it answers.

Errors follow h11: a :class:`~protocol.errors.LocalProtocolError` from ``send`` means the caller
tried something illegal and nothing changed; a :class:`~protocol.errors.RemoteProtocolError` from
``next_event`` means the peer did, and the connection is in ERROR for good. The caller should then
``send_error`` to tell the peer why, and close.
"""

from __future__ import annotations

import enum

from .codec import MAX_STRING_BYTES, STRING, Reader, malformed
from .errors import ErrorCode, LocalProtocolError, RemoteProtocolError
from .events import NEED_DATA, ConnectionClosed, Event, NeedData, PeerError, Request, Response
from .framing import (
    HEADER,
    HEADER_SIZE,
    SIZE,
    FrameKind,
    decode_error_body,
    encode_error_frame,
    encode_frame,
)
from .messages import (
    COORDINATOR_REQUESTS,
    NEWEST_VERSION,
    REQUEST_CODECS,
    REQUEST_TYPES,
    RESPONSE_CODECS,
    RESPONSE_TYPES,
    ApiKey,
    RequestMessage,
)
from .schema import dropped_fields

__all__ = ["NEED_DATA", "Connection", "ConnectionState", "Role"]

CORRELATION_ID_LIMIT = 2**31
"""Correlation ids run 0 .. 2**31 - 1 and wrap; -1 in an error frame means "no request"."""

_COMPACT_THRESHOLD = 64 * 1024
_unpack_size = SIZE.unpack_from
_unpack_header = HEADER.unpack_from
_API_KEYS = {int(key): key for key in ApiKey}


class Role(enum.Enum):
    CONSUMER = "consumer"
    """The side that opened the connection: sends every request except the coordinator's three."""
    BROKER = "broker"
    """The side that accepted it: answers the consumer, and sends Ping/StopFetcher/StartFetcher."""


class ConnectionState(enum.Enum):
    OPEN = "open"
    CLOSED = "closed"
    """The peer closed cleanly; nothing more can be sent or received."""
    ERROR = "error"
    """Someone broke the protocol or a send failed; only ``send_error`` is left, then close."""


def may_send(role: Role, api_key: ApiKey) -> bool:
    """Whether ``role`` may send ``api_key`` requests (the peer may then receive them)."""
    return (api_key in COORDINATOR_REQUESTS) == (role is Role.BROKER)


_REQUEST_KEYS: dict[type, ApiKey] = {cls: key for key, cls in REQUEST_TYPES.items()}
_SENDABLE: dict[Role, dict[type, ApiKey]] = {
    role: {cls: key for cls, key in _REQUEST_KEYS.items() if may_send(role, key)} for role in Role
}


class Connection:
    def __init__(
        self, our_role: Role, *, client_id: str = "", max_frame_size: int = 4 * 1024 * 1024
    ) -> None:
        self._our_role = our_role
        self._peer_role = Role.BROKER if our_role is Role.CONSUMER else Role.CONSUMER
        self._client_id = client_id
        self._max_frame_size = max_frame_size
        self._state = ConnectionState.OPEN
        # Why the connection is in ERROR, re-raised by every later next_event.
        self._error: RemoteProtocolError | None = None
        self._buf = bytearray()
        self._pos = 0
        self._eof = False
        self._next_correlation_id = 0
        self._last_frame_bytes = 0
        # correlation id -> the request and the version it went in (its answer's version)
        self._outstanding: dict[int, tuple[RequestMessage, int]] = {}
        self._pending: dict[int, tuple[RequestMessage, int]] = {}
        self._frames_sent = 0
        self._frames_received = 0

    # --- properties ------------------------------------------------------------------------------

    @property
    def our_role(self) -> Role:
        return self._our_role

    @property
    def state(self) -> ConnectionState:
        return self._state

    @property
    def outstanding_requests(self) -> frozenset[int]:
        """Correlation ids of requests we sent and still await a response to."""
        return frozenset(self._outstanding)

    @property
    def pending_requests(self) -> frozenset[int]:
        """Correlation ids of requests we received and have not answered yet."""
        return frozenset(self._pending)

    @property
    def frames_sent(self) -> int:
        """Frames :meth:`send` and :meth:`send_error` have returned on this connection: frame n
        (1-based) is the n-th the caller writes. A frame returned and then not written (its
        write failed) still counts, which can only make a peer's count name an earlier frame."""
        return self._frames_sent

    @property
    def frames_received(self) -> int:
        """Complete frames decoded on this connection (requests, responses, error frames): what
        a coordinator request's ``acknowledged_frames`` reports (SPEC.md §1)."""
        return self._frames_received

    @property
    def max_frame_size(self) -> int:
        return self._max_frame_size

    @property
    def last_frame_bytes(self) -> int:
        """The whole size of the frame the latest event was decoded from: what the request it
        carried cost to receive, for a receiver bounding what it holds of unanswered requests."""
        return self._last_frame_bytes

    @property
    def buffered_bytes(self) -> int:
        """Bytes received but not yet returned as events. After NEED_DATA: the part of an
        unfinished frame that has arrived, what a receiver bounds with its frame deadline and
        its memory budget."""
        return len(self._buf) - self._pos

    @property
    def next_frame_bytes(self) -> int | None:
        """The whole size (size field included) of the next frame once its size field has
        arrived, None before: what buffering that frame will cost, known from its first four
        bytes. A size the next ``next_event`` will refuse counts as it claims."""
        if len(self._buf) - self._pos < SIZE.size:
            return None
        size: int = _unpack_size(self._buf, self._pos)[0]
        return SIZE.size + max(size, 0)

    # --- receiving -------------------------------------------------------------------------------

    def receive_data(self, data: bytes) -> None:
        """Buffer bytes read from the socket; ``b""`` means the peer closed its end (EOF)."""
        if self._state is ConnectionState.ERROR:
            return  # nothing more will be parsed; do not let a misbehaving peer fill memory
        if not data:
            self._eof = True
            return
        if self._eof:
            raise RuntimeError("received data after EOF")
        self._buf += data

    def next_event(self) -> Event | NeedData:
        """Decode at most one frame; NEED_DATA if no whole frame is buffered yet.

        Raises RemoteProtocolError if the peer broke the protocol, and again on every later call.
        """
        if self._state is not ConnectionState.OPEN:
            if self._state is ConnectionState.CLOSED:
                return ConnectionClosed()
            raise self._error_again()
        buf = self._buf
        pos = self._pos
        available = len(buf) - pos
        if available >= 4:
            (size,) = _unpack_size(buf, pos)
            if size < HEADER_SIZE:
                raise self._fail(malformed(f"frame size {size} is smaller than a header"))
            if size > self._max_frame_size:
                raise self._fail(
                    RemoteProtocolError(
                        f"frame of {size} bytes exceeds the limit of {self._max_frame_size}",
                        ErrorCode.FRAME_TOO_LARGE,
                    )
                )
            end = pos + 4 + size
            if end <= len(buf):
                try:
                    event = self._decode_frame(pos + 4, end)
                except RemoteProtocolError as exc:
                    raise self._fail(exc) from None
                self._consumed(end)
                self._last_frame_bytes = end - pos
                self._frames_received += 1
                return event
        if self._eof:
            if available:
                raise self._fail(malformed(f"connection closed mid-frame ({available} bytes)"))
            self._state = ConnectionState.CLOSED
            return ConnectionClosed()
        return NEED_DATA

    def _consumed(self, end: int) -> None:
        buf = self._buf
        if end == len(buf):
            buf.clear()
            self._pos = 0
        elif end > _COMPACT_THRESHOLD and end * 2 > len(buf):
            del buf[:end]
            self._pos = 0
        else:
            self._pos = end

    def _decode_frame(self, start: int, end: int) -> Event:
        kind, raw_key, version, correlation_id = _unpack_header(self._buf, start)
        r = Reader(self._buf, start + HEADER_SIZE, end)
        try:
            if kind == FrameKind.ERROR:
                # The error frame's layout never changes, so its version is not checked: a peer
                # refusing our version must still be able to say so.
                error_code, message = decode_error_body(r)
                self._check_end(r)
                self._error = RemoteProtocolError(
                    f"peer reported {error_code.name}: {message}",
                    error_code,
                    correlation_id=correlation_id,
                    api_key=raw_key,
                )
                self._state = ConnectionState.ERROR
                return PeerError(
                    error_code=error_code, message=message, correlation_id=correlation_id
                )
            if kind != FrameKind.REQUEST and kind != FrameKind.RESPONSE:
                raise malformed(f"unknown frame kind {kind}")
            api_key = _API_KEYS.get(raw_key)
            if api_key is None:
                raise RemoteProtocolError(f"unknown api key {raw_key}", ErrorCode.UNKNOWN_API_KEY)
            if not 0 <= version <= NEWEST_VERSION[api_key]:
                raise RemoteProtocolError(
                    f"{api_key.name} version {version} is not supported"
                    f" (0 to {NEWEST_VERSION[api_key]})",
                    ErrorCode.UNSUPPORTED_VERSION,
                )
            if kind == FrameKind.REQUEST:
                return self._decode_request(api_key, version, correlation_id, r)
            return self._decode_response(api_key, version, correlation_id, r)
        except RemoteProtocolError as exc:
            exc.correlation_id = correlation_id
            exc.api_key = raw_key
            raise

    def _decode_request(
        self, api_key: ApiKey, version: int, correlation_id: int, r: Reader
    ) -> Request:
        if not may_send(self._peer_role, api_key):
            raise RemoteProtocolError(
                f"a {self._peer_role.value} may not send {api_key.name} requests",
                ErrorCode.UNEXPECTED_RESPONSE,
            )
        if correlation_id < 0 or correlation_id in self._pending:
            raise RemoteProtocolError(
                f"request correlation id {correlation_id} is negative or already pending",
                ErrorCode.INVALID_REQUEST,
            )
        client_id: str = STRING.decode(r)
        message = REQUEST_CODECS[api_key, version].decode(r)
        self._check_end(r)
        self._pending[correlation_id] = (message, version)
        return Request(
            correlation_id=correlation_id,
            message=message,
            client_id=client_id,
            api_version=version,
        )

    def _decode_response(
        self, api_key: ApiKey, version: int, correlation_id: int, r: Reader
    ) -> Response:
        request, sent_version = self._outstanding.get(correlation_id, (None, -1))
        if request is None or request.API_KEY is not api_key:
            raise RemoteProtocolError(
                f"{api_key.name} response {correlation_id} answers no outstanding request",
                ErrorCode.UNEXPECTED_RESPONSE,
            )
        if version != sent_version:
            raise RemoteProtocolError(
                f"{api_key.name} response {correlation_id} is version {version},"
                f" its request was version {sent_version}",
                ErrorCode.UNSUPPORTED_VERSION,
            )
        message = RESPONSE_CODECS[api_key, version].decode(r)
        self._check_end(r)
        del self._outstanding[correlation_id]
        return Response(correlation_id=correlation_id, message=message, request=request)

    @staticmethod
    def _check_end(r: Reader) -> None:
        if r.pos != r.end:
            raise malformed(f"{r.end - r.pos} bytes left over after the body")

    def _fail(self, exc: RemoteProtocolError) -> RemoteProtocolError:
        self._state = ConnectionState.ERROR
        self._error = exc
        self._buf.clear()
        self._pos = 0
        return exc

    def _error_again(self) -> RemoteProtocolError:
        cause = self._error
        if cause is None:  # pragma: no cover - every way into ERROR records a cause
            cause = RemoteProtocolError("connection is in ERROR", ErrorCode.UNKNOWN_SERVER_ERROR)
        return RemoteProtocolError(
            f"connection is in ERROR: {cause}",
            cause.error_code,
            correlation_id=cause.correlation_id,
            api_key=cause.api_key,
        )

    # --- sending ---------------------------------------------------------------------------------

    def new_request(self, message: RequestMessage, api_version: int | None = None) -> Request:
        """A Request with the next free correlation id of our direction; ``send`` sends it.
        ``api_version`` None: the newest; else the version the peer serves (SPEC.md §3)."""
        api_key = self._check_may_send(message)
        correlation_id = self._next_correlation_id
        while correlation_id in self._outstanding:
            correlation_id = (correlation_id + 1) % CORRELATION_ID_LIMIT
        self._next_correlation_id = (correlation_id + 1) % CORRELATION_ID_LIMIT
        return Request(
            correlation_id=correlation_id,
            message=message,
            client_id=self._client_id,
            api_version=NEWEST_VERSION[api_key] if api_version is None else api_version,
        )

    def send(self, event: Request | Response) -> bytes:
        """The bytes of ``event``, recording what it changes (a request becomes outstanding, a
        response answers a pending request). Raises LocalProtocolError, changing nothing, if the
        event is not legal now."""
        self._check_open()
        if isinstance(event, Request):
            return self._send_request(event)
        if isinstance(event, Response):
            return self._send_response(event)
        raise LocalProtocolError(f"cannot send {event!r}", ErrorCode.INVALID_REQUEST)

    def _send_request(self, event: Request) -> bytes:
        message = event.message
        api_key = self._check_may_send(message)
        correlation_id = event.correlation_id
        if not 0 <= correlation_id < CORRELATION_ID_LIMIT:
            raise LocalProtocolError(
                f"correlation id {correlation_id} is outside 0 .. 2**31 - 1",
                ErrorCode.INVALID_REQUEST,
                correlation_id=correlation_id,
                api_key=api_key,
            )
        if correlation_id in self._outstanding:
            raise LocalProtocolError(
                f"correlation id {correlation_id} is already outstanding",
                ErrorCode.INVALID_REQUEST,
                correlation_id=correlation_id,
                api_key=api_key,
            )
        version = event.api_version
        if not 0 <= version <= NEWEST_VERSION[api_key]:
            raise LocalProtocolError(
                f"{api_key.name} has no version {version} (0 to {NEWEST_VERSION[api_key]})",
                ErrorCode.UNSUPPORTED_VERSION,
                correlation_id=correlation_id,
                api_key=api_key,
            )
        if version < NEWEST_VERSION[api_key] and (lost := dropped_fields(message, version)):
            raise LocalProtocolError(
                f"{api_key.name} version {version} cannot carry {', '.join(lost)}",
                ErrorCode.UNSUPPORTED_VERSION,
                correlation_id=correlation_id,
                api_key=api_key,
            )
        frame = self._encode(
            FrameKind.REQUEST, api_key, version, correlation_id, message, event.client_id
        )
        self._outstanding[correlation_id] = (message, version)
        return frame

    def _send_response(self, event: Response) -> bytes:
        correlation_id = event.correlation_id
        message = event.message
        request, version = self._pending.get(correlation_id, (None, -1))
        if request is None:
            raise LocalProtocolError(
                f"no received request {correlation_id} is waiting for a response",
                ErrorCode.UNEXPECTED_RESPONSE,
                correlation_id=correlation_id,
            )
        api_key = request.API_KEY
        if type(message) is not RESPONSE_TYPES[api_key]:
            raise LocalProtocolError(
                f"request {correlation_id} is {api_key.name}; "
                f"{type(message).__name__} does not answer it",
                ErrorCode.UNEXPECTED_RESPONSE,
                correlation_id=correlation_id,
                api_key=api_key,
            )
        if event.request is not request and event.request != request:
            raise LocalProtocolError(
                f"Response.request is not the request {correlation_id} being answered",
                ErrorCode.UNEXPECTED_RESPONSE,
                correlation_id=correlation_id,
                api_key=api_key,
            )
        frame = self._encode(FrameKind.RESPONSE, api_key, version, correlation_id, message, None)
        del self._pending[correlation_id]
        return frame

    def _encode(
        self,
        kind: FrameKind,
        api_key: ApiKey,
        version: int,
        correlation_id: int,
        message: object,
        client_id: str | None,
    ) -> bytes:
        codecs = REQUEST_CODECS if kind is FrameKind.REQUEST else RESPONSE_CODECS
        try:
            frame = encode_frame(
                kind,
                api_key,
                correlation_id,
                codecs[api_key, version],
                message,
                client_id,
                api_version=version,
            )
        except LocalProtocolError as exc:
            exc.correlation_id = correlation_id
            exc.api_key = api_key
            raise
        size = len(frame) - SIZE.size
        if size > self._max_frame_size:
            raise LocalProtocolError(
                f"frame of {size} bytes exceeds the limit of {self._max_frame_size}",
                ErrorCode.FRAME_TOO_LARGE,
                correlation_id=correlation_id,
                api_key=api_key,
            )
        self._frames_sent += 1
        return bytes(frame)

    def _check_open(self) -> None:
        if self._state is not ConnectionState.OPEN:
            raise LocalProtocolError(
                f"cannot send in state {self._state.name}", ErrorCode.INVALID_REQUEST
            )

    def _check_may_send(self, message: RequestMessage) -> ApiKey:
        api_key = _SENDABLE[self._our_role].get(type(message))
        if api_key is not None:
            return api_key
        api_key = _REQUEST_KEYS.get(type(message))
        if api_key is None:
            raise LocalProtocolError(f"{message!r} is not a request", ErrorCode.INVALID_REQUEST)
        raise LocalProtocolError(
            f"a {self._our_role.value} may not send {api_key.name} requests",
            ErrorCode.UNEXPECTED_RESPONSE,
            api_key=api_key,
        )

    def send_error(
        self,
        error_code: ErrorCode,
        message: str,
        *,
        correlation_id: int | None = -1,
        api_key: int | None = -1,
    ) -> bytes:
        """An error frame telling the peer why we are about to close; the one send allowed in
        ERROR. The connection is in ERROR afterwards (unless already CLOSED): after refusing the
        peer, nothing else may be sent or received on it.

        ``message`` is cut to the longest string the wire allows, so that reporting an error
        (often ``str(exc)``) cannot itself fail; None for an id means -1, so a caught
        ProtocolError's ``correlation_id`` and ``api_key`` can be passed on as they are.
        """
        text = message.encode("utf-8", "replace")[:MAX_STRING_BYTES].decode("utf-8", "ignore")
        correlation_id = -1 if correlation_id is None else correlation_id
        api_key = -1 if api_key is None else api_key
        frame = bytes(encode_error_frame(error_code, text, correlation_id, api_key))
        self._frames_sent += 1
        if self._state is ConnectionState.OPEN:
            self._fail(
                RemoteProtocolError(
                    f"we sent the peer {error_code.name}: {message}",
                    error_code,
                    correlation_id=correlation_id,
                    api_key=api_key,
                )
            )
        return frame

    def send_failed(self) -> None:
        """Tell the connection that writing its bytes failed: the peer's view is unknown now."""
        if self._state is ConnectionState.OPEN:
            self._fail(RemoteProtocolError("a send failed", ErrorCode.UNKNOWN_SERVER_ERROR))
