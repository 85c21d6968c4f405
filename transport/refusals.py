"""How a client learns that the cluster refused it: one exception per kind of refusal.

A refusal is an answer that asking again does not change until someone changes a credential, an
access rule or the client's settings: the library raises it instead of retrying (a consumer ends
its run with it, after closing cleanly), and the CLI turns each kind into one line saying what to
do. The kinds that end a connection are also what a lost connection is (:class:`ChannelClosed`,
:class:`HandshakeFailed`), so code that copes with one copes with them.
"""

from __future__ import annotations

from protocol import ErrorCode

__all__ = [
    "AuthenticationFailed",
    "ChannelClosed",
    "ClusterAuthorizationFailed",
    "GroupAuthorizationFailed",
    "HandshakeFailed",
    "ListenerNeedsSasl",
    "ListenerNeedsTls",
    "Refused",
    "TopicAuthorizationFailed",
    "UnsupportedVersion",
    "final_refusal",
    "refusal",
]


class ChannelClosed(Exception):
    """The connection ended (or failed) before the response arrived."""


class HandshakeFailed(ConnectionError):
    """The TLS handshake or the SASL exchange with a broker failed: a client treats the broker
    like one that refused the connection, and says why."""


class Refused(Exception):
    """The cluster refused this client; ``error_code`` is the broker's answer (NONE when the
    broker gave none: it closed the connection), ``name`` the topic or group refused ("": none,
    or the cluster)."""

    error_code = ErrorCode.NONE

    def __init__(self, message: str, *, name: str = "") -> None:
        super().__init__(message)
        self.name = name


class AuthenticationFailed(Refused, HandshakeFailed):
    """The broker refused the SASL user or its password (58 SASL_AUTHENTICATION_FAILED)."""

    error_code = ErrorCode.SASL_AUTHENTICATION_FAILED


class ListenerNeedsSasl(Refused, ChannelClosed):
    """The listener authenticates its clients with SASL and this one did not: the broker answered
    its first request 34 ILLEGAL_SASL_STATE (an answer that carries nothing else, never to be
    read as an empty one) and closed the connection."""

    error_code = ErrorCode.ILLEGAL_SASL_STATE


class ListenerNeedsTls(Refused, HandshakeFailed, ChannelClosed):
    """A broker closed a connection that does not use TLS before answering anything: what a TLS
    listener does, since what it receives is no TLS handshake (it sends no alert a client could
    tell apart from a broker that went away, so this is the likely reason, not a certain one: a
    consumer, which outlives restarts, retries it)."""


class TopicAuthorizationFailed(Refused):
    """No access rule lets this principal do that to the topic (29)."""

    error_code = ErrorCode.TOPIC_AUTHORIZATION_FAILED


class GroupAuthorizationFailed(Refused):
    """No access rule lets this principal do that to the group (30)."""

    error_code = ErrorCode.GROUP_AUTHORIZATION_FAILED


class ClusterAuthorizationFailed(Refused):
    """No access rule lets this principal do that to the cluster (31)."""

    error_code = ErrorCode.CLUSTER_AUTHORIZATION_FAILED


class UnsupportedVersion(Refused, ChannelClosed):
    """The broker does not serve the version of an api this client sent (35): in an answer, or
    in the error frame it closes the connection with."""

    error_code = ErrorCode.UNSUPPORTED_VERSION


_BY_CODE: dict[ErrorCode, type[Refused]] = {
    kind.error_code: kind
    for kind in (
        TopicAuthorizationFailed,
        GroupAuthorizationFailed,
        ClusterAuthorizationFailed,
        UnsupportedVersion,
    )
}


def refusal(
    error_code: ErrorCode, what: str, *, operation: str = "", name: str = ""
) -> Refused | None:
    """The refusal an answer's ``error_code`` is, about ``what`` (``"group 'g'"``), which this
    client asked to ``operation`` (``"read"``); None if the code is no refusal."""
    kind = _BY_CODE.get(error_code)
    if kind is None:
        return None
    if kind is UnsupportedVersion:
        return kind(f"{what}: the broker does not serve this version ({error_code.name})")
    allowed = f"not allowed to {operation}" if operation else "not allowed"
    return kind(f"{what}: {allowed} ({error_code.name})", name=name)


def final_refusal(exc: BaseException | None) -> Refused | None:
    """The refusal a client ends with rather than retries that ``exc`` is or holds (trio wraps
    a task's error in groups), if any: not a listener that closed a plaintext connection
    unanswered, which a broker going away does too."""
    if isinstance(exc, BaseExceptionGroup):
        for inner in exc.exceptions:
            if (found := final_refusal(inner)) is not None:
                return found
        return None
    if isinstance(exc, Refused) and not isinstance(exc, ListenerNeedsTls):
        return exc
    return None
