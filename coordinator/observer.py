"""What the coordinator tells whoever watches it: one object, called at the few points where a
group or a member changes, so that metrics (broker/metrics.py) stay out of the coordinator's own
code. Every call is synchronous, must not raise and must cost little: the Ping answer path runs
it once per round trip (docs/benchmarks.md measures it).

Group inputs are passed as they are fed to the group's machine (statemachine/group.py's events
are data), so a watcher derives rebalances, their causes and durations from the same sequence the
machine sees, without a second bookkeeping in the coordinator.
"""

from __future__ import annotations

from typing import Protocol

from statemachine.member import DeathCause


class CoordinatorObserver(Protocol):
    def group_event(
        self, group_id: str, event: object, now: float, death: DeathCause | None = None
    ) -> None:
        """``event`` was fed to the group's machine at ``now`` (trio's clock); ``death``: what
        ended the member a departure is about (None: a static member away too long)."""

    def member_died(self, group_id: str, cause: DeathCause) -> None:
        """A member of ``group_id`` was declared dead (or left), before its group hears of it."""

    def ping_answered(self, round_trip: float) -> None:
        """A Ping was answered ``round_trip`` seconds after it was sent."""

    def ping_missed(self) -> None:
        """A Ping's deadline passed unanswered."""

    def ping_excused(self) -> None:
        """A Ping's deadline passed unanswered while the broker's loop was behind: not counted
        against the member (coordinator/heartbeat.py)."""


class NullObserver:
    """Watches nothing: the default."""

    def group_event(
        self, group_id: str, event: object, now: float, death: DeathCause | None = None
    ) -> None:
        pass

    def member_died(self, group_id: str, cause: DeathCause) -> None:
        pass

    def ping_answered(self, round_trip: float) -> None:
        pass

    def ping_missed(self) -> None:
        pass

    def ping_excused(self) -> None:
        pass


NULL_OBSERVER: CoordinatorObserver = NullObserver()
