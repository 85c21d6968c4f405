"""A consumer group's failure detection and departures."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import attrs

from protocol.types import PartitionOffset, TopicPartition
from statemachine import group as group_sm
from statemachine import member as member_sm
from statemachine import ownership as ownership_sm
from statemachine.consumer_group_core import GroupCore
from statemachine.consumer_group_types import (
    _ENDINGS,
    Away,
    AwayUntil,
    CloseConnection,
    Effect,
    Ending,
    FromNow,
    GroupMember,
    MemberDied,
    Note,
    Placed,
)
from statemachine.records import MemberRecord


class FailureDetection(GroupCore):
    """A member's connection ending, its LeaveGroup, its Pings and missed deadlines, its death
    and a static member away (docs/design.md#failure-detection)."""

    __slots__ = ()

    def fenced_closed(self, older: GroupMember, now: float) -> list[Effect]:
        """A fenced process, or a member told its group was let go, closed its connection
        cleanly (end of stream): it stopped fetching first (docs/design.md#ownership-lease), so
        its partitions are free now."""
        if not (older.fenced or older.told_shed):
            return []
        return self._own(ownership_sm.OwnerClosed(incarnation=older.incarnation, now=now))

    # --- failure detection and departures ----------------------------------------------------

    def connection_ended(self, member: GroupMember, ending: Ending, now: float) -> list[Effect]:
        """The member's connection task ended: a fenced process's clean close frees what it
        held; a live member dies, as the ending says."""
        if member.machine.alive:
            return self._member_input(member, _ENDINGS[ending](now=now), now)
        if ending is Ending.CLOSED:
            return self.fenced_closed(member, now)
        return []

    def left(self, member: GroupMember, now: float) -> list[Effect]:
        """LeaveGroup: a graceful close after the member stopped its fetchers and committed. One
        that reaches a member declared dead since it arrived (its last Ping deadline passed in
        the same instant) changes nothing: its death has decided, and its connection is closing.
        The machine refuses ``Left`` in Dead, and a refusal here would fail the whole group for
        one peer's request."""
        if not member.machine.alive:
            return []
        return self._member_input(member, member_sm.Left(now=now), now)

    def ping_sent(self, member: GroupMember, now: float) -> list[Effect]:
        """A Ping is about to leave now. A member whose lease ran out stopped by its own rule; a
        Ping would restart it, so it is dead instead (docs/design.md#ownership-lease)."""
        return self._member_input(member, member_sm.PingSent(now=now), now)

    def ping_withheld(self, member: GroupMember) -> list[Effect]:
        """A Ping was held back: this coordinator is out of contact with its store, perhaps
        deposed, and renews no lease. A member that keeps no lease would fetch on while a
        successor counts its lease from taking office: its connection ends now, which it stops
        at (docs/design.md#old-clients)."""
        if member.machine.timeouts.follows_lease:
            return []
        return [CloseConnection(incarnation=member.incarnation)]

    def ping_answered(
        self,
        member: GroupMember,
        generation: int,
        offsets: Iterable[PartitionOffset],
        *,
        topics: Mapping[str, Placed],
        now: float,
    ) -> dict[TopicPartition, int]:
        """The member answered a Ping sent under ``generation``: it is heard from, and the
        offsets its answer reports count as :meth:`counted_offsets` says (returned)."""
        machine = member.machine
        if not machine.alive:
            return {}
        machine.handle(member_sm.PingAnswered(now=now))
        if not offsets:
            return {}
        return self.counted_offsets(member, generation, offsets, topics=topics)

    def deadline_missed(self, member: GroupMember, now: float, *, handover: bool) -> list[Effect]:
        """A Ping (or, ``handover``, a StopFetcher or StartFetcher) went unanswered for 2/3 of
        the session timeout: a miss, which may declare the member dead."""
        if not member.machine.alive:
            return []
        return self._member_input(member, member_sm.DeadlineMissed(now=now, handover=handover), now)

    def handover_refused(self, member: GroupMember, now: float) -> list[Effect]:
        """A StopFetcher or StartFetcher answered with an error (or with something else) counts
        as a miss: a member that refuses every time is dead after its allowed misses (its lease
        honoured, since whether it stopped is unknown)."""
        if not member.machine.alive:
            return []
        return self._member_input(member, member_sm.HandoverRefused(now=now), now)

    def _member_input(self, member: GroupMember, event: object, now: float) -> list[Effect]:
        """Feed a failure-path input to the member's machine; if it declares the member dead,
        handle its failure (docs/design.md#failure-detection): close its connection, remove it,
        cancel an attempt in flight, rebalance what is left."""
        deaths = member.machine.handle(event)
        if not deaths and member.machine.alive:  # the common case: a Ping that renews nothing
            return []
        effects: list[Effect] = []
        if not member.machine.alive and not (member.fenced or member.told_shed):
            effects.append(CloseConnection(incarnation=member.incarnation))
        if not deaths or not self.is_member(member):
            return effects
        (death,) = deaths
        effects.append(MemberDied(member_id=member.member_id, cause=death.cause))
        holding = self.holding(member)
        del self.members[member.member_id]
        self.processes.pop(member.consumer_id, None)
        died = ownership_sm.OwnerDied(
            incarnation=member.incarnation, until=death.partitions_free_at, now=now
        )
        effects += self._own(died)
        if member.static and death.cause is not member_sm.DeathCause.LEFT:
            # No rebalance: its partitions wait for a restart within T
            # (docs/design.md#static-members). Its record keeps its own generation, under which
            # a successor claims its partitions.
            record = attrs.evolve(member.record, generation=holding.generation)
            away = self._set_away(record, since=now, partitions=holding.partitions)
            effects.append(AwayUntil(member_id=member.member_id, away=away))
            effects.append(
                Note(
                    "group %s: %s's process ended (%s); away (its session timeout ends %s), its "
                    "partitions free %s",
                    (
                        self.group_id,
                        member.member_id,
                        death.cause.value,
                        FromNow(away.until, now),
                        FromNow(death.partitions_free_at, now),
                    ),
                )
            )
            effects += self._group_input(group_sm.MemberAway(member_id=member.member_id), now)
            return effects
        self._streams -= member.record.subscription.stream_count
        free = FromNow(death.partitions_free_at, now)
        if death.cause is member_sm.DeathCause.LEFT:
            note = Note(
                "group %s: %s left; its partitions are free %s",
                (self.group_id, member.member_id, free),
            )
        else:
            note = Note(
                "group %s: %s is dead (%s); its partitions are free %s",
                (self.group_id, member.member_id, death.cause.value, free),
            )
        effects.append(note)
        effects += self._departed(member.member_id, now, death.cause)
        return effects

    def _set_away(
        self,
        record: MemberRecord,
        *,
        since: float,
        partitions: frozenset[TopicPartition] = frozenset(),
    ) -> Away:
        away = self.away[record.member_id] = Away(
            record=record, until=since + record.session_timeout_ms / 1000, partitions=partitions
        )
        return away

    def away_ended(self, member_id: str, away: Away, now: float) -> list[Effect]:
        """A static member away for its session timeout departs, and its group rebalances;
        nothing if it came back since."""
        if self.away.get(member_id) is not away:
            return []
        del self.away[member_id]
        self._streams -= away.record.subscription.stream_count
        effects: list[Effect] = [
            Note("group %s: %s stayed away for its session timeout", (self.group_id, member_id))
        ]
        return effects + self._departed(member_id, now)

    def _departed(
        self, member_id: str, now: float, death: member_sm.DeathCause | None = None
    ) -> list[Effect]:
        self.last_member_at = now
        remaining = len(self.members) + len(self.away)
        departed = group_sm.MemberDeparted(member_id=member_id, remaining=remaining)
        return self._group_input(departed, now, death)
