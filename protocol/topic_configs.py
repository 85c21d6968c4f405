"""Per-topic settings: Kafka's names for the three a topic may set, their bounds, and the one
check that the CLI, the client library and the broker share, so a setting is refused with the
same words wherever it is caught, and a broker never stores one it cannot apply.

A topic's settings are fixed when it is created (CreateTopic v2's ``configs``); a setting it does
not name is the broker's own (``serve --retention-ms`` and so on). Values are decimal integers,
as Kafka writes them; -1 means "no limit" where Kafka's does.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

import attrs

__all__ = [
    "RETENTION_BYTES",
    "RETENTION_MS",
    "SEGMENT_BYTES",
    "SETTINGS",
    "InvalidTopicConfig",
    "Setting",
    "checked_configs",
    "parse_config_argument",
]

RETENTION_MS = "retention.ms"
RETENTION_BYTES = "retention.bytes"
SEGMENT_BYTES = "segment.bytes"


@attrs.frozen(kw_only=True)
class Setting:
    minimum: int
    maximum: int


#: Kafka's names and bounds: retention from -1 (none) up; segment.bytes from Kafka's smallest
#: segment (14) to Kafka's int32 limit.
SETTINGS: Mapping[str, Setting] = {
    #: Delete a segment once its newest record is this old (-1: keep forever).
    RETENTION_MS: Setting(minimum=-1, maximum=2**63 - 1),
    #: Delete a partition's oldest segments while the rest still hold this much (-1: no limit).
    RETENTION_BYTES: Setting(minimum=-1, maximum=2**63 - 1),
    #: Start a new segment file past this size.
    SEGMENT_BYTES: Setting(minimum=14, maximum=2**31 - 1),
}

#: Digits only: ``int()`` also takes ``+``, ``_`` and other scripts' digits, which no other
#: Kafka tool reads the same way.
_INTEGER = re.compile(r"-?[0-9]{1,19}")


class InvalidTopicConfig(ValueError):
    """A setting whose name is not one of :data:`SETTINGS`, whose value is not a whole number
    within its bounds, or that is named twice; the message names it."""


def checked_configs(pairs: Iterable[tuple[str, str]]) -> tuple[tuple[str, str], ...]:
    """The settings as stored and sent: sorted by name, each value written canonically (``007``
    is ``7``). Raises :class:`InvalidTopicConfig` for the first wrong one."""
    found: dict[str, str] = {}
    for name, value in pairs:
        setting = SETTINGS.get(name)
        if setting is None:
            known = ", ".join(sorted(SETTINGS))
            raise InvalidTopicConfig(f"unknown topic setting {name!r} (known: {known})")
        if name in found:
            raise InvalidTopicConfig(f"topic setting {name} is given twice")
        if _INTEGER.fullmatch(value) is None:
            raise InvalidTopicConfig(f"{name} must be a whole number, not {value!r}")
        number = int(value)
        if not setting.minimum <= number <= setting.maximum:
            raise InvalidTopicConfig(
                f"{name} must be between {setting.minimum} and {setting.maximum}, not {number}"
            )
        found[name] = str(number)
    return tuple(sorted(found.items()))


def parse_config_argument(text: str) -> tuple[str, str]:
    """``name=value`` as the CLI's ``--config`` takes it (kafka-topics' form)."""
    name, equals, value = text.partition("=")
    if not equals:
        raise InvalidTopicConfig(f"expected name=value, not {text!r}")
    checked_configs([(name, value)])
    return name, value
