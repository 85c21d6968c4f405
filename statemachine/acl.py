"""Who may do what: access control lists on topics, groups and the cluster, in the manner of
Kafka's ``AclAuthorizer`` (allow rules only), as pure rules.

A rule allows one principal (``User:alice``, ``User:CN=alice,O=Example`` for a certificate, or
``*`` for everyone, anonymous clients included) one operation on one resource (a literal name or
``*`` for every resource of its type). Once authorization is on, whatever no rule allows is denied,
except to the super users. Read, write, delete and alter each imply describe, as in Kafka.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable

import attrs

from protocol import AclBinding

__all__ = [
    "WILDCARD",
    "Acl",
    "Authorizer",
    "Operation",
    "ResourceType",
    "acl_of",
    "binding_of",
    "parse_principal",
]

WILDCARD = "*"


class ResourceType(enum.Enum):
    TOPIC = "topic"
    GROUP = "group"
    CLUSTER = "cluster"


class Operation(enum.Enum):
    READ = "read"
    """Topic: fetch and commit offsets of it; group: join it and commit its offsets."""
    WRITE = "write"
    """Topic: produce to it."""
    CREATE = "create"
    """Cluster or topic: create topics."""
    ALTER = "alter"
    """Topic: add partitions; cluster: manage it."""
    DESCRIBE = "describe"
    """Topic: see it in metadata, list its offsets; group: describe it, fetch its offsets."""
    DELETE = "delete"
    """Topic: delete it (its partitions and every group's offsets for it); group: delete it and
    its offsets."""
    ALL = "all"
    """Every operation."""


#: What each resource type's rules may name.
OPERATIONS: dict[ResourceType, frozenset[Operation]] = {
    ResourceType.TOPIC: frozenset(
        {
            Operation.READ,
            Operation.WRITE,
            Operation.CREATE,
            Operation.ALTER,
            Operation.DESCRIBE,
            Operation.DELETE,
            Operation.ALL,
        }
    ),
    ResourceType.GROUP: frozenset(
        {Operation.READ, Operation.DESCRIBE, Operation.DELETE, Operation.ALL}
    ),
    ResourceType.CLUSTER: frozenset(
        {Operation.CREATE, Operation.ALTER, Operation.DESCRIBE, Operation.ALL}
    ),
}
#: Kafka's implications: a rule for one of these allows DESCRIBE too.
_IMPLY_DESCRIBE = frozenset({Operation.READ, Operation.WRITE, Operation.DELETE, Operation.ALTER})
#: The one cluster resource's name.
CLUSTER = "cluster"


def parse_principal(text: str) -> str:
    """``*`` or ``User:<name>``; ValueError otherwise."""
    if text == WILDCARD:
        return text
    kind, sep, name = text.partition(":")
    if kind != "User" or not sep or not name:
        raise ValueError(f"bad principal {text!r}: expected User:NAME or *")
    return text


@attrs.frozen(kw_only=True, order=True)
class Acl:
    """One allow rule."""

    principal: str
    resource_type: ResourceType = attrs.field(order=lambda r: r.value)
    name: str
    operation: Operation = attrs.field(order=lambda o: o.value)

    def __attrs_post_init__(self) -> None:
        parse_principal(self.principal)
        if self.operation not in OPERATIONS[self.resource_type]:
            raise ValueError(
                f"{self.operation.value} is not an operation on a {self.resource_type.value}"
            )
        if self.resource_type is ResourceType.CLUSTER and self.name != CLUSTER:
            raise ValueError(f"the cluster resource is named {CLUSTER!r}")
        if not self.name:
            raise ValueError("a resource name is not empty")

    def allows(
        self, principal: str, operation: Operation, resource: ResourceType, name: str
    ) -> bool:
        return (
            self.principal in (principal, WILDCARD)
            and self.resource_type is resource
            and self.name in (name, WILDCARD)
            and (
                self.operation in (operation, Operation.ALL)
                or (operation is Operation.DESCRIBE and self.operation in _IMPLY_DESCRIBE)
            )
        )

    def __str__(self) -> str:
        return f"{self.principal} may {self.operation.value} {self.resource_type.value} {self.name}"


def acl_of(binding: AclBinding) -> Acl:
    """The rule a wire binding (SPEC.md §8, CreateAcls) spells; ValueError if it spells none."""
    try:
        resource = ResourceType(binding.resource_type)
        operation = Operation(binding.operation)
    except ValueError:
        raise ValueError(
            f"no such resource type or operation: {binding.resource_type!r}, {binding.operation!r}"
        ) from None
    return Acl(
        principal=binding.principal, resource_type=resource, name=binding.name, operation=operation
    )


def binding_of(acl: Acl) -> AclBinding:
    return AclBinding(
        principal=acl.principal,
        resource_type=acl.resource_type.value,
        name=acl.name,
        operation=acl.operation.value,
    )


@attrs.frozen(kw_only=True)
class Authorizer:
    """The rules in force. ``enabled`` False: everyone may do everything (no authentication is
    configured, the embedded default)."""

    enabled: bool = False
    acls: frozenset[Acl] = frozenset()
    super_users: frozenset[str] = frozenset()

    def allows(
        self, principal: str, operation: Operation, resource: ResourceType, name: str
    ) -> bool:
        if not self.enabled or principal in self.super_users:
            return True
        return any(acl.allows(principal, operation, resource, name) for acl in self.acls)

    def readable_names(self, principal: str, names: Iterable[str]) -> list[str]:
        """Those of ``names`` (topics) the principal may read."""
        return [n for n in names if self.allows(principal, Operation.READ, ResourceType.TOPIC, n)]

    def every_topic(self, principal: str, operation: Operation) -> bool:
        """Whether the principal may do ``operation`` on any topic, however named (a wildcard rule
        or a super user), so that a subscription pattern needs no narrowing."""
        if not self.enabled or principal in self.super_users:
            return True
        return any(
            acl.name == WILDCARD and acl.allows(principal, operation, ResourceType.TOPIC, acl.name)
            for acl in self.acls
        )

    def topics_by_name(self, principal: str, operation: Operation) -> frozenset[str]:
        """The literal topic names the principal's rules let it do ``operation`` on."""
        return frozenset(
            acl.name
            for acl in self.acls
            if acl.name != WILDCARD
            and acl.allows(principal, operation, ResourceType.TOPIC, acl.name)
        )
