"""Per-topic settings: Kafka's names for those a topic may set, their bounds, and the one check
that the CLI, the client library and the broker share, so a setting is refused with the same
words wherever it is caught, and a broker never stores one it cannot apply.

A topic's settings are fixed when it is created (CreateTopic v2's ``configs``); a setting it does
not name is the broker's own (``serve --retention-ms`` and so on), or for the replication
settings Kafka's default (``min_insync_replicas``, ``unclean_leader_election``). Values are
decimal integers, as Kafka writes them (-1 means "no limit" where Kafka's does), or ``true`` and
``false`` for a switch.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Literal

import attrs

__all__ = [
    "MIN_INSYNC_REPLICAS",
    "REPLICATION_SETTINGS",
    "RETENTION_BYTES",
    "RETENTION_MS",
    "SEGMENT_BYTES",
    "SETTINGS",
    "UNCLEAN_LEADER_ELECTION",
    "InvalidTopicConfig",
    "Setting",
    "checked_configs",
    "min_insync_replicas",
    "parse_config_argument",
    "unclean_leader_election",
]

RETENTION_MS = "retention.ms"
RETENTION_BYTES = "retention.bytes"
SEGMENT_BYTES = "segment.bytes"
MIN_INSYNC_REPLICAS = "min.insync.replicas"
UNCLEAN_LEADER_ELECTION = "unclean.leader.election.enable"


@attrs.frozen(kw_only=True)
class Setting:
    """An integer within ``minimum``..``maximum``, or a switch (``boolean``: ``true`` or
    ``false``, whatever the case, written in lower case as Kafka writes it)."""

    minimum: int = 0
    maximum: int = 1
    kind: Literal["integer", "boolean"] = "integer"


#: Kafka's names and bounds: retention from -1 (none) up; segment.bytes from Kafka's smallest
#: segment (14) to Kafka's int32 limit.
SETTINGS: Mapping[str, Setting] = {
    #: Delete a segment once its newest record is this old (-1: keep forever).
    RETENTION_MS: Setting(minimum=-1, maximum=2**63 - 1),
    #: Delete a partition's oldest segments while the rest still hold this much (-1: no limit).
    RETENTION_BYTES: Setting(minimum=-1, maximum=2**63 - 1),
    #: Start a new segment file past this size.
    SEGMENT_BYTES: Setting(minimum=14, maximum=2**31 - 1),
    #: The in-sync replicas an acks=all produce needs, from 1 to the topic's replication factor
    #: (checked where the factor is known: ``checked_configs(..., replication_factor=)``).
    MIN_INSYNC_REPLICAS: Setting(minimum=1, maximum=2**31 - 1),
    #: Whether a replica out of sync may be elected when none in sync is live (records the old
    #: leader acknowledged may be lost).
    UNCLEAN_LEADER_ELECTION: Setting(kind="boolean"),
}

#: The settings only a replicating store knows: a broker of an older layout refuses a topic
#: node naming a setting it does not know, so a store writes them only once every broker reads
#: them (store/zookeeper.py).
REPLICATION_SETTINGS = frozenset({MIN_INSYNC_REPLICAS, UNCLEAN_LEADER_ELECTION})

_BOOLEANS = {"true": "true", "false": "false"}

#: Digits only: ``int()`` also takes ``+``, ``_`` and other scripts' digits, which no other
#: Kafka tool reads the same way.
_INTEGER = re.compile(r"-?[0-9]{1,19}")


class InvalidTopicConfig(ValueError):
    """A setting whose name is not one of :data:`SETTINGS`, whose value is not a whole number
    within its bounds (or ``true``/``false`` for a switch), or that is named twice; the message
    names it."""


def checked_configs(
    pairs: Iterable[tuple[str, str]], *, replication_factor: int | None = None
) -> tuple[tuple[str, str], ...]:
    """The settings as stored and sent: sorted by name, each value written canonically (``007``
    is ``7``, ``True`` is ``true``). Raises :class:`InvalidTopicConfig` for the first wrong one.
    Given the topic's ``replication_factor``, ``min.insync.replicas`` must not exceed it."""
    found: dict[str, str] = {}
    for name, value in pairs:
        setting = SETTINGS.get(name)
        if setting is None:
            known = ", ".join(sorted(SETTINGS))
            raise InvalidTopicConfig(f"unknown topic setting {name!r} (known: {known})")
        if name in found:
            raise InvalidTopicConfig(f"topic setting {name} is given twice")
        found[name] = _checked_value(name, setting, value)
    wanted = int(found.get(MIN_INSYNC_REPLICAS, "1"))
    if replication_factor is not None and wanted > replication_factor:
        raise InvalidTopicConfig(
            f"{MIN_INSYNC_REPLICAS} must be between 1 and the replication factor "
            f"{replication_factor}, not {wanted}"
        )
    return tuple(sorted(found.items()))


def _checked_value(name: str, setting: Setting, value: str) -> str:
    if setting.kind == "boolean":
        checked = _BOOLEANS.get(value.lower())
        if checked is None:
            raise InvalidTopicConfig(f"{name} must be true or false, not {value!r}")
        return checked
    if _INTEGER.fullmatch(value) is None:
        raise InvalidTopicConfig(f"{name} must be a whole number, not {value!r}")
    number = int(value)
    if not setting.minimum <= number <= setting.maximum:
        raise InvalidTopicConfig(
            f"{name} must be between {setting.minimum} and {setting.maximum}, not {number}"
        )
    return str(number)


def min_insync_replicas(configs: Iterable[tuple[str, str]], replication_factor: int) -> int:
    """The in-sync replicas an acks=all produce needs: the topic's own setting, else 2 at a
    factor of 3 or more (one replica may fail without refusing writes, and no write is
    acknowledged by one replica alone), else 1."""
    value = dict(configs).get(MIN_INSYNC_REPLICAS)
    if value is not None:
        return int(value)
    return 2 if replication_factor >= 3 else 1


def unclean_leader_election(configs: Iterable[tuple[str, str]]) -> bool:
    """Whether the topic lets an out-of-sync replica lead (off unless it says so, as Kafka)."""
    return dict(configs).get(UNCLEAN_LEADER_ELECTION) == "true"


def parse_config_argument(text: str) -> tuple[str, str]:
    """``name=value`` as the CLI's ``--config`` takes it (kafka-topics' form)."""
    name, equals, value = text.partition("=")
    if not equals:
        raise InvalidTopicConfig(f"expected name=value, not {text!r}")
    checked_configs([(name, value)])
    return name, value
