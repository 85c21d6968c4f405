"""What a person does about each refusal, in the CLI's own options: appended to the library's
message (which names what was refused) on the one line a refused verb ends with."""

from __future__ import annotations

import argparse

from cli.security import PASSWORD_VARIABLE
from transport.refusals import (
    AuthenticationFailed,
    ClusterAuthorizationFailed,
    GroupAuthorizationFailed,
    ListenerNeedsSasl,
    ListenerNeedsTls,
    Refused,
    TopicAuthorizationFailed,
    UnsupportedVersion,
)

__all__ = ["what_to_do"]

_PASSWORD = f"--password-file FILE or ${PASSWORD_VARIABLE}"

#: (command, verb) -> the operation each resource needs for it (README: Security).
_OPERATIONS: dict[tuple[str, str | None], dict[type[Refused], str]] = {
    ("consume", None): {GroupAuthorizationFailed: "read", TopicAuthorizationFailed: "read"},
    ("produce", None): {TopicAuthorizationFailed: "write"},
    ("topics", "create"): {ClusterAuthorizationFailed: "create"},
    ("topics", "alter"): {TopicAuthorizationFailed: "alter"},
    ("topics", "delete"): {TopicAuthorizationFailed: "delete"},
    ("groups", "delete"): {GroupAuthorizationFailed: "delete"},
    ("groups", "reset-offsets"): {
        GroupAuthorizationFailed: "read",
        TopicAuthorizationFailed: "read",
    },
    ("users", "add"): {ClusterAuthorizationFailed: "alter"},
    ("users", "delete"): {ClusterAuthorizationFailed: "alter"},
    ("acls", "add"): {ClusterAuthorizationFailed: "alter"},
    ("acls", "remove"): {ClusterAuthorizationFailed: "alter"},
}


def what_to_do(refused: Refused, args: argparse.Namespace) -> str:
    if isinstance(refused, ListenerNeedsSasl):
        return f"pass --sasl-mechanism and --user, with {_PASSWORD}"
    if isinstance(refused, ListenerNeedsTls):
        return "if it does, pass --tls-ca CA.pem (or --tls to trust the system's CAs)"
    if isinstance(refused, AuthenticationFailed):
        return f"check --user, its password ({_PASSWORD}) and --sasl-mechanism"
    if isinstance(refused, UnsupportedVersion):
        return "the broker is older than this client: upgrade it"
    return _rule(refused, args)


def _rule(refused: Refused, args: argparse.Namespace) -> str:
    """The access rule an administrator would add."""
    key = (args.command, getattr(args, "verb", None))
    operation = _OPERATIONS.get(key, {}).get(type(refused), "describe")
    if isinstance(refused, GroupAuthorizationFailed):
        resource = f"--group {refused.name or getattr(args, 'group', None) or 'GROUP'}"
    elif isinstance(refused, TopicAuthorizationFailed):
        topic = getattr(args, "topic", None)
        if isinstance(topic, list):
            topic = topic[0] if len(topic) == 1 else None
        resource = f"--topic {refused.name or topic or 'TOPIC'}"
    else:
        resource = "--cluster"
    user = getattr(args, "user", None)
    principal = f"User:{user}" if user else "PRINCIPAL"
    return (
        "an administrator can allow it with: coordinator acls add "
        f"--principal {principal} --operation {operation} {resource}"
    )
