"""Frame layout: ``size:int32`` then a header, then a body.

Header: ``kind:int8, api_key:int16, api_version:int16, correlation_id:int32``, and for requests only
``client_id:string``. The kind byte is what makes the channel bidirectional: both sides send
requests and responses over one connection, so a frame must say which it is before anyone can look
its correlation id up. This module only lays bytes out; which frames are *allowed* is
:mod:`protocol.connection`'s business.
"""

from __future__ import annotations

import enum
import struct
from typing import Any

from .codec import ERROR_CODE, STRING, Codec, Reader
from .errors import ErrorCode, LocalProtocolError

ERROR_FRAME_VERSION = 0
"""The version an error frame is sent with; receivers do not check it (its layout never changes).
Which versions each api has is :data:`protocol.messages.NEWEST_VERSION`'s business."""


class FrameKind(enum.IntEnum):
    REQUEST = 0
    RESPONSE = 1
    ERROR = 2
    """Sent just before closing a connection its sender refuses; body ``error_code, message``."""


SIZE = struct.Struct(">i")
HEADER = struct.Struct(">bhhi")
"""kind, api_key, api_version, correlation_id (client_id follows in requests)."""
SIZE_AND_HEADER = struct.Struct(">ibhhi")
HEADER_SIZE = HEADER.size
"""The smallest legal value of the size field: a header with nothing after it."""


def encode_frame(
    kind: FrameKind,
    api_key: int,
    correlation_id: int,
    body: Codec[Any],
    message: object,
    client_id: str | None = None,
    *,
    api_version: int,
) -> bytearray:
    """One whole frame, size field included. ``client_id`` is written only for requests;
    ``body`` must be the codec of ``api_version``.

    Raises LocalProtocolError (from the codecs) when a value does not fit its wire type.
    """
    w = _header(kind, api_key, api_version, correlation_id)
    if kind is FrameKind.REQUEST:
        STRING.encode(w, client_id)
    body.encode(w, message)
    SIZE.pack_into(w, 0, len(w) - SIZE.size)
    return w


def _header(kind: FrameKind, api_key: int, api_version: int, correlation_id: int) -> bytearray:
    """Size placeholder and header; the size is filled in once the body is written."""
    w = bytearray(SIZE_AND_HEADER.size)
    try:
        SIZE_AND_HEADER.pack_into(w, 0, 0, kind, api_key, api_version, correlation_id)
    except struct.error as exc:
        raise LocalProtocolError(
            f"header field out of range (api_key={api_key!r}, api_version={api_version!r},"
            f" correlation_id={correlation_id!r})"
            f": {exc}",
            ErrorCode.INVALID_REQUEST,
        ) from None
    return w


def encode_error_frame(
    error_code: ErrorCode, message: str, correlation_id: int, api_key: int
) -> bytearray:
    """An error frame; ``correlation_id``/``api_key`` are the offending request's, or -1."""
    w = _header(FrameKind.ERROR, api_key, ERROR_FRAME_VERSION, correlation_id)
    ERROR_CODE.encode(w, error_code)
    STRING.encode(w, message)
    SIZE.pack_into(w, 0, len(w) - SIZE.size)
    return w


def decode_error_body(r: Reader) -> tuple[ErrorCode, str]:
    return ERROR_CODE.decode(r), STRING.decode(r)
