"""What a :class:`~protocol.connection.Connection` hands its caller, and what the caller sends.

As in h11, events are plain immutable data: the connection turns bytes into events and events into
bytes, and the caller (trio code, a test, another language's port) decides what to do with them.
"""

from __future__ import annotations

import enum
from typing import Final, Literal, TypeAlias

import attrs

from .errors import ErrorCode
from .messages import NEWEST_VERSION, RequestMessage, ResponseMessage


def _newest_version(request: Request) -> int:
    # Not a message at all: Connection.send refuses it, with a better error than this would be.
    return NEWEST_VERSION.get(getattr(request.message, "API_KEY", None), 0)  # type: ignore[arg-type]


@attrs.frozen(kw_only=True)
class Request:
    """A request, received from the peer or about to be sent (see ``Connection.new_request``)."""

    correlation_id: int
    message: RequestMessage
    client_id: str = ""
    api_version: int = attrs.field(default=attrs.Factory(_newest_version, takes_self=True))
    """The version it was sent in; its response is sent in the same one. Sending: the newest
    unless a caller speaks an older one on purpose."""

    def response(self, message: ResponseMessage) -> Response:
        """The Response event answering this request, ready for ``Connection.send``."""
        return Response(correlation_id=self.correlation_id, message=message, request=self.message)


@attrs.frozen(kw_only=True)
class Response:
    """A response; ``request`` is the request it answers, so callers need no table of their own."""

    correlation_id: int
    message: ResponseMessage
    request: RequestMessage


@attrs.frozen(kw_only=True)
class PeerError:
    """The peer sent an error frame: it refuses this connection and is about to close it."""

    error_code: ErrorCode
    message: str
    correlation_id: int
    """The request it refers to, or -1."""


@attrs.frozen(kw_only=True)
class ConnectionClosed:
    """The peer closed the connection cleanly, at a frame boundary."""


class _Sentinel(enum.Enum):
    NEED_DATA = "NEED_DATA"

    def __repr__(self) -> str:
        return self.value

    __str__ = __repr__


NEED_DATA: Final = _Sentinel.NEED_DATA
"""Returned by ``next_event`` when no whole frame is buffered: call ``receive_data`` first."""
NeedData: TypeAlias = Literal[_Sentinel.NEED_DATA]

Event: TypeAlias = Request | Response | PeerError | ConnectionClosed
