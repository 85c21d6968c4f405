"""Shedding load at the door: while the broker's own loop is behind, it takes no new work it
can put off, so that the members it already serves keep getting their Pings on time
(docs/design.md#shedding-load).

What is put off: the requests of a new connection (one none of whose requests was served
yet: a newcomer's discovery, a registration), and admin requests. What never is: a
re-registration that lists partitions it still fetches (a member whose lease is at stake, which
a refusal could cost its partitions) nor the discovery before it (a ClusterMetadata marked
``leased``), and every request of a member or a fetcher already in. A
shed request is answered at once, without touching the store or a coordinator: BROKER_BUSY with
a back-off hint where the request's version carries ``throttle_time_ms``, COORDINATOR_NOT_AVAILABLE
otherwise (every level's reference client retries it with backoff; SPEC.md §11.7).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import attrs
import trio

from broker import rights
from protocol import (
    ApiKey,
    ClusterMetadataRequest,
    ClusterMetadataResponse,
    CreatePartitionsRequest,
    CreateTopicRequest,
    DeleteGroupRequest,
    DeleteTopicRequest,
    DescribeGroupRequest,
    ErrorCode,
    ListGroupsRequest,
    RegisterConsumerRequest,
    RegisterConsumerResponse,
    Request,
    ResponseMessage,
    error_response,
)

__all__ = ["BOUND", "Door", "Lag"]

#: The first version of ClusterMetadata and of RegisterConsumer whose answer carries
#: ``throttle_time_ms`` (level 11).
HINTED_VERSION = {ApiKey.CLUSTER_METADATA: 4, ApiKey.REGISTER_CONSUMER: 3}

#: Requests put off wherever they come on a connection.
ADMIN = (
    CreateTopicRequest
    | CreatePartitionsRequest
    | DeleteTopicRequest
    | ListGroupsRequest
    | DescribeGroupRequest
    | DeleteGroupRequest
    | rights.RightsRequest
)


class Lag(Protocol):
    def recent(self) -> float:
        """How late the broker's own loop has been lately, in seconds
        (``coordinator.loop_lag.LoopLag.recent``)."""
        ...


#: The loop lag (seconds) above which new work waits (``Door.bound``'s default).
BOUND = 0.5

#: A loop lag under this is calm: the pace of new members may grow (``coordinator.loop_lag``'s
#: BEHIND: a loop that keeps up wakes a sleeper within milliseconds).
CALM = 0.1


@attrs.define(eq=False)
class Pace:
    """How many new members a second the door lets register (Kafka's
    ``max.connection.creation.rate``, made to follow the loop: additive increase while it is
    calm, halved while it is behind). A member costs the broker little when it registers and its
    Pings for as long as it stays, which show in the lag only after its first Pings and its
    group's first rebalance, seconds later: without a pace a crowd arriving together is let in
    whole before the lag says the broker cannot serve it, and then every member pays
    (docs/design.md#shedding-load). So at most ``rate`` a second, a second's worth at once."""

    rate: float = 200.0
    least: float = 20.0
    most: float = 1000.0
    increase: float = 20.0
    """Added to the rate for each calm second."""
    _tokens: float = 0.0
    _at: float | None = None
    _judged_at: float = 0.0
    _refused: int = 0
    #: Registrations refused in the last whole second: the crowd still waiting.
    waiting: int = 0

    def admit(self, now: float, lag: float, bound: float) -> bool:
        """Whether one more member may register now, the loop being ``lag`` behind (above
        ``bound``: none may, and the pace halves)."""
        if self._at is None:
            self._at, self._judged_at, self._tokens = now, now, self.rate
        if now - self._judged_at >= 1.0:
            self._judged_at, self.waiting, self._refused = now, self._refused, 0
            if lag < CALM:
                self.rate = min(self.most, self.rate + self.increase)
            elif lag > bound:
                self.rate = max(self.least, self.rate / 2)
        self._tokens = min(self.rate, self._tokens + (now - self._at) * self.rate)
        self._at = now
        if lag > bound or self._tokens < 1.0:
            self._refused += 1
            return False
        self._tokens -= 1.0
        return True

    def wait(self) -> float:
        """How long the crowd waiting takes to get in at the current pace (seconds)."""
        return self.waiting / self.rate


@attrs.define(eq=False)
class Door:
    lag: Lag
    bound: float = BOUND
    """Above this loop lag (seconds), new work waits: a third of what a member with T = 6 s can
    bear (T/3 less the lease margin, docs/design.md#shedding-load), so shedding starts long
    before lag could cost a member; and above the pauses a loaded machine gives a process now
    and then, so a broker that keeps up does not turn clients away for them."""
    retry_after: float = 1.0
    """The least back-off hint sent; a loop further behind asks for twice its lag, up to
    ``max_retry_after``."""
    max_retry_after: float = 10.0
    shed: int = 0
    """Requests refused so far."""
    on_shed: Callable[[], object] | None = None
    """Called for each request refused (the broker's metric)."""
    pace: Pace = attrs.field(factory=Pace)
    """New members a second, while the door is on."""
    clock: Callable[[], float] = trio.current_time

    def refusal(self, request: Request, *, first: bool) -> ResponseMessage | None:
        """The answer that puts ``request`` off (``first``: no request of its connection was
        served yet), or None to serve it."""
        message = request.message
        if not (first or isinstance(message, ADMIN)):
            return None
        if isinstance(message, RegisterConsumerRequest) and message.owned_partitions:
            return None
        if isinstance(message, ClusterMetadataRequest) and message.leased:
            return None  # the discovery before such a re-registration
        if not isinstance(message, ClusterMetadataRequest | RegisterConsumerRequest | ADMIN):
            return None  # a fetcher's or a producer's data, not the group's load
        lag = self.lag.recent()
        if isinstance(message, RegisterConsumerRequest):
            if self.pace.admit(self.clock(), lag, self.bound):
                return None
        elif lag <= self.bound:
            return None
        self.shed += 1
        if self.on_shed is not None:
            self.on_shed()
        if isinstance(message, ADMIN) or request.api_version < HINTED_VERSION[message.API_KEY]:
            return error_response(message, ErrorCode.COORDINATOR_NOT_AVAILABLE)
        longest = max(self.retry_after, 2 * lag, self.pace.wait())
        wait = round(1000 * min(self.max_retry_after, longest))
        if isinstance(message, RegisterConsumerRequest):
            return RegisterConsumerResponse(
                error_code=ErrorCode.BROKER_BUSY,
                coordinator_epoch=-1,
                generation=-1,
                throttle_time_ms=wait,
            )
        return ClusterMetadataResponse(
            error_code=ErrorCode.BROKER_BUSY,
            coordinator_id=-1,
            coordinator_epoch=-1,
            brokers=(),
            topics=(),
            throttle_time_ms=wait,
        )
