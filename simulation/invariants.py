"""The invariant checker's records: every fetch lease each consumer held, and the coordinator's
durable writes as they happen, so a regression or a two-owner instant is caught even if a later
state hides it."""

from __future__ import annotations

import logging
import math
from collections import defaultdict
from collections.abc import Iterable, Sequence

import attrs
import trio
import trio.testing

from protocol import (
    ErrorCode,
    FetchRequest,
    PingRequest,
    RegisterConsumerRequest,
    RegisterConsumerResponse,
    Request,
    Response,
    StartFetcherRequest,
    StopFetcherRequest,
    StopFetcherResponse,
)
from protocol.types import NO_TOPIC_ID, TopicId, TopicPartition
from store import (
    GroupRecord,
    OffsetBatch,
)
from transport.channel import acknowledged_frames

from .network import Frame, Link

log = logging.getLogger(__name__)


class InvariantViolation(AssertionError):
    """Two members of a group were permitted one partition at once, a member fetched what it was
    not permitted, an offset or a generation went backwards, or a settled group left a partition
    with no owner or with two."""


# --- the fetch-lease ledger -------------------------------------------------------------------


@attrs.frozen(kw_only=True)
class LeaseInterval:
    group_id: str
    consumer_id: str
    partition: TopicPartition
    start: float
    end: float


@attrs.frozen(kw_only=True)
class StrayFetch:
    """A Fetch a member's process sent for a partition none of its members was permitted to
    fetch at that instant."""

    group_id: str
    consumer_id: str
    partition: TopicPartition
    at: float
    #: When its latest permission on the partition ended; None: it never had one.
    permitted_until: float | None
    #: The members of its group permitted the partition then: a two-owner instant, if any.
    alongside: tuple[str, ...] = ()
    #: The topic id the Fetch named, when its member was permitted the partition then, but of
    #: another incarnation of its topic (NO_TOPIC_ID: it was not permitted the partition).
    topic_id: TopicId = NO_TOPIC_ID

    def __str__(self) -> str:
        since = (
            "it was never permitted to"
            if self.permitted_until is None
            else f"its permission ended at {self.permitted_until:.3f}"
        )
        others = f", and {', '.join(self.alongside)} may fetch it" if self.alongside else ""
        named = "" if self.topic_id == NO_TOPIC_ID else f" naming topic id {self.topic_id}"
        return (
            f"group {self.group_id} {self.partition}: {self.consumer_id} fetched it at "
            f"{self.at:.3f}{named}, but {since}{others}"
        )


_Holder = tuple[str, str, TopicPartition]  # group, consumer, partition


@attrs.define(eq=False)
class _Member:
    """One process's membership of one group under one consumer id, as the wire shows it: what
    it may fetch, and until when its lease lets it."""

    group_id: str
    consumer_id: str
    process: object
    #: T, from its latest registration.
    timeout: float = 0.0
    #: Registered in RegisterConsumer version 0 (docs/design.md#old-clients): no lease; it may
    #: fetch until a StopFetcher answer or until it knows its connection ended.
    leaseless: bool = False
    lease_end: float = -math.inf
    #: The highest coordinator epoch delivered to it: requests below it are a deposed
    #: coordinator's, and grant and renew nothing.
    highest_epoch: int = -1
    #: Each partition it may fetch now, and since when.
    permitted: dict[TopicPartition, float] = attrs.field(factory=dict)
    #: When its latest permission on each partition ended.
    ended: dict[TopicPartition, float] = attrs.field(factory=dict)
    #: The delivery number (the ledger's count) of the latest StartFetcher naming each partition.
    started: dict[TopicPartition, int] = attrs.field(factory=dict)
    #: The topic id the StartFetcher that permitted each partition named (NO_TOPIC_ID: none).
    permitted_ids: dict[TopicPartition, TopicId] = attrs.field(factory=dict)


@attrs.define(eq=False)
class _LinkState:
    process: object
    #: Frame number -> when the client handed it to the link, for its frames from its first
    #: registration on, less those before the latest one a coordinator request named: those
    #: are all a later request can name (counts on a connection only grow).
    client_sent_at: dict[int, float] = attrs.field(factory=dict)
    #: The member whose registration the client sent on it last.
    member: _Member | None = None
    #: Correlation id of each RegisterConsumer the client sent on it -> when it handed it over:
    #: the anchor of the registration's answer.
    registered_at: dict[int, float] = attrs.field(factory=dict)
    #: Correlation id of each StopFetcher delivered to the client -> its delivery number.
    stops: dict[int, int] = attrs.field(factory=dict)


@attrs.define(eq=False)
class _Window:
    member: _Member
    partition: TopicPartition
    start: float
    end: float
    #: The incarnation its StartFetcher named (NO_TOPIC_ID: none, any).
    topic_id: TopicId = NO_TOPIC_ID


def _same_incarnation(permitted: TopicId, fetched: TopicId) -> bool:
    """Whether a Fetch naming ``fetched`` is of the incarnation a permission named: either
    naming none (a client or coordinator of an older level) is of any."""
    return permitted == fetched or NO_TOPIC_ID in (permitted, fetched)


@attrs.define
class OwnershipLedger:
    """Who may fetch what, worked out from the frames on the simulated wire alone (it observes
    every link the cluster opens), applying docs/design.md#ownership-lease; and the intervals a
    simulated consumer reports of its own fetching (:meth:`began`, :meth:`ended`,
    :meth:`intervals`, :attr:`closed`, :meth:`holders`), which tests read for when a consumer
    stopped.

    A member is one process (a simulated host; a connection of no host is a process of its own)
    registered in one group under one consumer id. Its permission on a partition starts when a
    StartFetcher naming the partition is delivered to it while its lease is in force (an
    incremental start keeps what was permitted already), and ends at the earliest of: the member
    sending its StopFetcher answer (for the partitions the StopFetcher named; none named: all,
    except what a start delivered after the stop gave back) or a registration that does not
    claim the partition; the member sending an end of stream on a connection it registered on;
    and its lease's end. The lease ends T (from its registration) after the instant the member
    handed over the frame that the latest coordinator request delivered to it acknowledges (for
    a registration answer, the registration frame). The lease runs across connections: a member
    fetching through a failover keeps its permission until then, renewed by requests on its new
    connection. A request from a deposed coordinator (an epoch below the highest delivered to
    the member), or delivered after the lease ran out, grants and renews nothing. A member
    registered in version 0 keeps no lease: its permission ends at its StopFetcher answer or
    when its process closes, or learns the end of, its connection.

    :meth:`check` raises if two members of one group were permitted one partition at one
    instant (groups are independent), if a member's process sent a Fetch for a partition no
    member of it was permitted then (a Fetch naming a topic id: permitted by a StartFetcher that
    named that id, docs/design.md#topic-ids; a StartFetcher naming another id for a partition
    already permitted ends that permission and begins another), or if a consumer reports
    fetching outside what it was permitted.
    """

    _open: dict[_Holder, float] = attrs.field(factory=dict)
    closed: list[LeaseInterval] = attrs.field(factory=list)
    _links: dict[Link, _LinkState] = attrs.field(factory=dict)
    _members: dict[tuple[object, str, str], _Member] = attrs.field(factory=dict)
    _by_process: dict[object, list[_Member]] = attrs.field(factory=lambda: defaultdict(list))
    _windows: list[_Window] = attrs.field(factory=list)
    stray_fetches: list[StrayFetch] = attrs.field(factory=list)
    #: The members whose process has sent a Fetch: judged by those (a stray fetch), not by what
    #: they report, which is the harness's reading of the consumer's state, not its fetching.
    _fetching: set[tuple[str, str]] = attrs.field(factory=set)
    #: Coordinator requests delivered so far, over every link: their order.
    _deliveries: int = 0

    # --- what a simulated consumer reports ------------------------------------------------------

    def began(self, group_id: str, consumer_id: str, partition: TopicPartition, at: float) -> None:
        self._open.setdefault((group_id, consumer_id, partition), at)

    def ended(self, group_id: str, consumer_id: str, partition: TopicPartition, at: float) -> None:
        start = self._open.pop((group_id, consumer_id, partition), None)
        if start is not None:
            self.closed.append(
                LeaseInterval(
                    group_id=group_id,
                    consumer_id=consumer_id,
                    partition=partition,
                    start=start,
                    end=at,
                )
            )

    def intervals(self, now: float) -> list[LeaseInterval]:
        """What the consumers reported fetching, those still fetching until ``now``."""
        still_open = [
            LeaseInterval(group_id=g, consumer_id=c, partition=tp, start=start, end=now)
            for (g, c, tp), start in self._open.items()
        ]
        return self.closed + still_open

    def holders(self, group_id: str, partition: TopicPartition) -> set[str]:
        return {c for (g, c, tp) in self._open if g == group_id and tp == partition}

    # --- what the wire shows (simulation.network.WireObserver) ----------------------------------

    def frame_sent(self, link: Link, frame: Frame) -> None:
        if not frame.from_client:
            return
        state = self._link(link)
        at = frame.sent_at
        if state.member is not None:
            state.client_sent_at[frame.number] = at
        match frame.event:
            case Request(message=RegisterConsumerRequest() as register) as request:
                member = self._member(state.process, register.group_id, register.consumer_id)
                member.timeout = register.session_timeout_ms / 1000
                member.leaseless = request.api_version == 0
                state.member = member
                state.registered_at[request.correlation_id] = at
                state.client_sent_at[frame.number] = at
                # It names what it still fetches: the rest it says it stopped, which a
                # coordinator adopting it takes as free at once.
                self._expire(member, at)
                held = set(register.owned_partitions)
                self._end(member, [tp for tp in member.permitted if tp not in held], at)
            case Request(message=FetchRequest() as fetch):
                tp = TopicPartition(topic=fetch.topic, partition=fetch.partition)
                self._fetched(state.process, tp, at, fetch.topic_id)
            case Response(
                message=StopFetcherResponse(error_code=ErrorCode.NONE),
                request=StopFetcherRequest() as stop,
                correlation_id=correlation_id,
            ) if state.member is not None:
                member = state.member
                self._expire(member, at)
                everything = stop.partitions is None or stop.reason is not ErrorCode.NONE
                stopped = member.permitted if everything else stop.partitions or ()
                # A member carries out requests in the order they came: a start delivered after
                # this stop, answered only now, gives back what the stop took, at once.
                delivered = state.stops.pop(correlation_id, -1)
                self._end(
                    member,
                    [tp for tp in stopped if member.started.get(tp, -1) < delivered],
                    at,
                )

    def frame_delivered(self, link: Link, frame: Frame) -> None:
        if frame.from_client:
            return
        state = self._link(link)
        at = trio.current_time()
        match frame.event:
            case Response(
                message=RegisterConsumerResponse(error_code=ErrorCode.NONE) as answer,
                request=RegisterConsumerRequest() as register,
                correlation_id=correlation_id,
            ):
                registrant = self._member(state.process, register.group_id, register.consumer_id)
                self._expire(registrant, at)
                if answer.coordinator_epoch < registrant.highest_epoch:
                    return  # a deposed coordinator's: the member takes it as a refusal
                registrant.highest_epoch = answer.coordinator_epoch
                anchor = state.registered_at.get(correlation_id)
                if anchor is not None and not registrant.leaseless:
                    registrant.lease_end = max(registrant.lease_end, anchor + registrant.timeout)
            case Request(
                message=PingRequest() | StopFetcherRequest() | StartFetcherRequest() as message
            ):
                member = state.member
                if member is None:
                    return
                self._deliveries += 1
                if isinstance(message, StopFetcherRequest):
                    state.stops[frame.event.correlation_id] = self._deliveries
                self._expire(member, at)
                if message.coordinator_epoch < member.highest_epoch:
                    return
                member.highest_epoch = message.coordinator_epoch
                if not member.leaseless:
                    if at >= member.lease_end:
                        return  # read after the lease ran out: it renews and grants nothing
                    frame_number = acknowledged_frames(message)
                    anchor = state.client_sent_at.get(frame_number)
                    if anchor is not None:
                        member.lease_end = max(member.lease_end, anchor + member.timeout)
                        sent = state.client_sent_at
                        while (oldest := next(iter(sent))) < frame_number:
                            del sent[oldest]
                if isinstance(message, StartFetcherRequest):
                    ids = {t.topic: t.topic_id for t in message.topic_ids}
                    for stream in message.streams:
                        for p in stream.partitions:
                            tp = TopicPartition(topic=p.topic, partition=p.partition)
                            topic_id = ids.get(p.topic, NO_TOPIC_ID)
                            if member.permitted_ids.get(tp, topic_id) != topic_id:
                                self._end(member, [tp], at)  # another incarnation: anew
                            member.permitted.setdefault(tp, at)
                            member.permitted_ids[tp] = topic_id
                            member.started[tp] = self._deliveries

    def end_sent(self, link: Link, *, by_client: bool, reset: bool) -> None:
        state = self._links.get(link)
        member = None if state is None else state.member
        if not by_client or member is None:
            return
        # An end of stream is the member's word that it stopped (the close rule); a reset
        # proves nothing, unless the member has no lease to fetch on under.
        if not reset or member.leaseless:
            at = trio.current_time()
            self._expire(member, at)
            self._end(member, None, at)

    def end_seen(self, link: Link, *, by_client: bool) -> None:
        state = self._links.get(link)
        member = None if state is None else state.member
        if by_client and member is not None and member.leaseless:
            self._end(member, None, trio.current_time())

    def _link(self, link: Link) -> _LinkState:
        state = self._links.get(link)
        if state is None:
            process = link if link.host is None else link.host
            state = self._links[link] = _LinkState(process=process)
        return state

    def _member(self, process: object, group_id: str, consumer_id: str) -> _Member:
        member = self._members.get((process, group_id, consumer_id))
        if member is None:
            member = _Member(group_id=group_id, consumer_id=consumer_id, process=process)
            self._members[(process, group_id, consumer_id)] = member
            self._by_process[process].append(member)
        return member

    def _expire(self, member: _Member, now: float) -> None:
        """End what the member's lease permitted if the lease ran out by ``now``."""
        if not member.leaseless and member.lease_end <= now:
            self._end(member, None, member.lease_end)

    def _end(self, member: _Member, partitions: Iterable[TopicPartition] | None, at: float) -> None:
        for tp in list(member.permitted) if partitions is None else partitions:
            start = member.permitted.pop(tp, None)
            topic_id = member.permitted_ids.pop(tp, NO_TOPIC_ID)
            if start is not None:
                self._windows.append(
                    _Window(member=member, partition=tp, start=start, end=at, topic_id=topic_id)
                )
                member.ended[tp] = at

    def _fetched(
        self, process: object, tp: TopicPartition, at: float, topic_id: TopicId = NO_TOPIC_ID
    ) -> None:
        members = self._by_process.get(process)
        if not members or isinstance(process, Link):
            # Not a member's process (an admin tool, a producer), or a connection of no host:
            # a test's raw client or a fuzzer, whose members only the two-owner check covers.
            return
        for member in members:
            self._fetching.add((member.group_id, member.consumer_id))
            self._expire(member, at)
        if self._permitted(members, tp, at, topic_id):
            return
        # Permitted the name then, but not the incarnation its fetch named: say which it named.
        named = topic_id if self._permitted(members, tp, at, NO_TOPIC_ID) else NO_TOPIC_ID
        for member in members:
            alongside = []
            for other in self._members.values():
                if other.group_id == member.group_id and other.process is not process:
                    self._expire(other, at)
                    if tp in other.permitted:
                        alongside.append(other.consumer_id)
            self.stray_fetches.append(
                StrayFetch(
                    group_id=member.group_id,
                    consumer_id=member.consumer_id,
                    partition=tp,
                    at=at,
                    permitted_until=member.ended.get(tp),
                    alongside=tuple(sorted(alongside)),
                    topic_id=named,
                )
            )

    def _permitted(
        self, members: list[_Member], tp: TopicPartition, at: float, topic_id: TopicId
    ) -> bool:
        """Whether one of a process's ``members`` was permitted ``tp`` at ``at``, of the
        incarnation ``topic_id`` names (NO_TOPIC_ID: of any)."""
        if any(
            member.permitted.get(tp, math.inf) <= at
            and _same_incarnation(member.permitted_ids.get(tp, NO_TOPIC_ID), topic_id)
            for member in members
        ):
            return True
        # Queued inside a window that ended before its frame got out (a freeze), or in the
        # instant it ended: a fetcher's request queued before its stop was answered can leave
        # on its own connection just after the answer, in one virtual instant.
        return any(
            w.member in members
            and w.partition == tp
            and w.start <= at <= w.end
            and _same_incarnation(w.topic_id, topic_id)
            for w in self._windows
        )

    def _all_windows(self, now: float) -> list[_Window]:
        still_open = [
            _Window(
                member=member,
                partition=tp,
                start=start,
                end=now if member.leaseless else max(start, min(now, member.lease_end)),
            )
            for member in self._members.values()
            for tp, start in member.permitted.items()
        ]
        return self._windows + still_open

    def windows(self, now: float) -> list[LeaseInterval]:
        """When each member was permitted to fetch each partition, as the wire shows it; those
        still permitted until ``now`` or their lease's end."""
        return [
            LeaseInterval(
                group_id=w.member.group_id,
                consumer_id=w.member.consumer_id,
                partition=w.partition,
                start=w.start,
                end=w.end,
            )
            for w in self._all_windows(now)
        ]

    def permitted(self, group_id: str, partition: TopicPartition) -> set[str]:
        """The consumer ids of ``group_id`` whose processes may fetch ``partition`` now."""
        now = trio.current_time()
        holders = set()
        for member in self._members.values():
            if member.group_id == group_id:
                self._expire(member, now)
                if partition in member.permitted:
                    holders.add(member.consumer_id)
        return holders

    # --- the checks -----------------------------------------------------------------------------

    def check(self, now: float | None = None) -> None:
        """Raise InvariantViolation if two members of one group were permitted one partition at
        one instant, if a member's process fetched a partition it was not permitted, or if a
        consumer reports fetching outside what it was permitted."""
        at = trio.current_time() if now is None else now
        if self.stray_fetches:
            raise InvariantViolation("; ".join(str(f) for f in self.stray_fetches[:3]))
        by_partition: dict[tuple[str, TopicPartition], list[_Window]] = defaultdict(list)
        for window in self._all_windows(at):
            by_partition[(window.member.group_id, window.partition)].append(window)
        for (group_id, partition), windows in by_partition.items():
            windows.sort(key=lambda w: (w.start, w.end))
            latest: _Window | None = None
            for window in windows:
                if (
                    latest is not None
                    and window.start < latest.end
                    and window.member is not latest.member
                ):
                    raise InvariantViolation(
                        f"group {group_id} {partition}: {latest.member.consumer_id} was "
                        f"permitted it until {latest.end:.3f} but "
                        f"{window.member.consumer_id} from {window.start:.3f}"
                    )
                if latest is None or window.end > latest.end:
                    latest = window
        self._check_reported(at)

    def _check_reported(self, now: float) -> None:
        """Each interval a consumer that sends no Fetch (the tests' stand-in, which only counts)
        reports lies within what the wire permitted it."""
        permitted: dict[_Holder, list[_Window]] = defaultdict(list)
        for window in self._all_windows(now):
            member = window.member
            permitted[(member.group_id, member.consumer_id, window.partition)].append(window)
        for interval in self.intervals(now):
            if (interval.group_id, interval.consumer_id) in self._fetching:
                continue
            key = (interval.group_id, interval.consumer_id, interval.partition)
            if not any(w.start <= interval.start and interval.end <= w.end for w in permitted[key]):
                raise InvariantViolation(
                    f"group {interval.group_id} {interval.partition}: {interval.consumer_id} "
                    f"fetched from {interval.start:.3f} to {interval.end:.3f}, but was permitted "
                    + (
                        ", ".join(f"{w.start:.3f} to {w.end:.3f}" for w in permitted[key])
                        or "never"
                    )
                )


# --- what the store was asked to make durable ------------------------------------------------


@attrs.define
class StoreHistory:
    """The coordinator's durable writes, seen as they happen: a regression between two writes is
    caught even if a later write hides it."""

    durable_offsets: dict[tuple[str, TopicPartition], int] = attrs.field(factory=dict)
    group_generations: dict[str, int] = attrs.field(factory=dict)
    #: How often each group was deleted: a group made again after that starts its generations
    #: anew, as a group that never existed.
    deletions: dict[str, int] = attrs.field(factory=dict)
    violations: list[str] = attrs.field(factory=list)

    def offsets_written(self, batches: Sequence[OffsetBatch]) -> None:
        for batch in batches:
            if batch.generation == -1:
                continue  # a standalone committer on an empty group may reset offsets anywhere
            for tp, offset in batch.offsets.items():
                key = (batch.group_id, tp)
                before = self.durable_offsets.get(key, -1)
                if offset < before:
                    self.violations.append(
                        f"group {batch.group_id} {tp}: durable offset went from {before} "
                        f"to {offset} (generation {batch.generation})"
                    )
                self.durable_offsets[key] = max(offset, before)

    def group_written(self, record: GroupRecord) -> None:
        before = self.group_generations.get(record.group_id, -1)
        # The record of a completed attempt is written again under its generation, marked so.
        if record.generation < before or (record.generation == before and not record.complete):
            self.violations.append(
                f"group {record.group_id}: generation {record.generation} persisted after {before}"
            )
        self.group_generations[record.group_id] = max(record.generation, before)

    def topic_offsets_deleted(self, topic: str, group_id: str | None = None) -> None:
        """A deleted topic's offsets (every group's, or one group's): a topic created again
        under the name starts its offsets anew, as a topic that never existed."""
        for key in [
            k for k in self.durable_offsets if k[1].topic == topic and group_id in (None, k[0])
        ]:
            del self.durable_offsets[key]

    def group_deleted(self, group_id: str) -> None:
        self.deletions[group_id] = self.deletions.get(group_id, 0) + 1
        self.group_generations.pop(group_id, None)
        for key in [k for k in self.durable_offsets if k[0] == group_id]:
            del self.durable_offsets[key]
