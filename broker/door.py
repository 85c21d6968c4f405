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

from broker import rights
from broker.cpu_budget import CpuBudget
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
    budget: CpuBudget | None = None
    """The broker's CPU time against what it may have: while most of it is used, new work waits
    whatever the lag says (``broker/cpu_budget.py``), and is told to come back after
    ``max_retry_after``, since only members leaving free room."""

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
        spent = self.budget is not None and self.budget.spent()
        if lag <= self.bound and not spent:
            return None
        self.shed += 1
        if self.on_shed is not None:
            self.on_shed()
        if isinstance(message, ADMIN) or request.api_version < HINTED_VERSION[message.API_KEY]:
            return error_response(message, ErrorCode.COORDINATOR_NOT_AVAILABLE)
        longest = self.max_retry_after if spent else max(self.retry_after, 2 * lag)
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
