"""Probes that ask a cluster of brokers, as a client would, who coordinates and how a group is.

A broker closes its connections when it takes or loses a group's coordinator slot, so a probe that
meets a closed connection, a refusal or silence reports "not known yet" and the caller polls again.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence

import trio

from consumer.admin import AdminError, open_admin
from transport.channel import ChannelClosed
from transport.connect import Address

__all__ = [
    "agreed_coordinator",
    "coordinator_seen_by",
    "eventually",
    "group_state",
    "slots_shared",
]

PROBE_DEADLINE = 5.0
_UNKNOWN = (OSError, AdminError, ChannelClosed, trio.TooSlowError)


async def eventually(check: Callable[[], Awaitable[bool]], *, deadline: float) -> None:
    """Poll ``check`` every 50 ms until it holds; ``trio.TooSlowError`` after ``deadline``."""
    with trio.fail_after(deadline):
        while not await check():
            await trio.sleep(0.05)


async def coordinator_seen_by(address: Address, group: str) -> int | None:
    """The coordinator of ``group`` that the broker at ``address`` names in ClusterMetadata, if
    any."""
    found: list[int] = []
    try:
        with trio.fail_after(PROBE_DEADLINE):
            async with open_admin([address]) as admin:
                found.append((await admin.metadata(group=group)).coordinator_id)
    except* _UNKNOWN:
        pass
    return found[0] if found and found[0] >= 0 else None


async def agreed_coordinator(
    brokers: Sequence[tuple[int, Address]], *, group: str, deadline: float
) -> int:
    """Wait until every broker (id, address) names the same one of them as ``group``'s
    coordinator, and return its id."""
    agreed: list[int] = []

    async def agree() -> bool:
        seen = {await coordinator_seen_by(address, group) for _id, address in brokers}
        if len(seen) == 1 and (only := seen.pop()) in {broker_id for broker_id, _ in brokers}:
            agreed.append(only)
            return True
        return False

    await eventually(agree, deadline=deadline)
    return agreed[0]


async def slots_shared(address: Address, broker_ids: Sequence[int]) -> bool:
    """Whether the broker at ``address`` sees every coordinator slot held by one of
    ``broker_ids``, each holding its share (the counts differ by at most one)."""
    reports = []
    try:
        with trio.fail_after(PROBE_DEADLINE):
            async with open_admin([address]) as admin:
                reports.append(await admin.cluster())
    except* _UNKNOWN:
        pass
    if not reports:
        return False
    report = reports[0]
    held = {b.broker_id: len(b.slots) for b in report.brokers}
    counts = [held.get(broker, 0) for broker in broker_ids]
    return sum(counts) == report.slots and max(counts) - min(counts) <= 1


async def group_state(address: Address, group: str) -> str | None:
    """The group's state as the broker at ``address`` describes it (its coordinator's view)."""
    found: list[str] = []
    try:
        with trio.fail_after(PROBE_DEADLINE):
            async with open_admin([address]) as admin:
                found.append((await admin.describe_group(group)).state)
    except* _UNKNOWN:
        pass
    return found[0] if found else None
