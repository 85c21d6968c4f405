"""Coordinator election for a cluster of brokers sharing a ZooKeeper store
(docs/design.md#coordinator-epochs-and-the-election).

Every broker stands. The one that takes office runs the group coordinator; the others answer group
requests with NOT_COORDINATOR and name the coordinator in ClusterMetadata, so that consumers find
it. A broker whose office ends — its session expired, its connection stayed lost beyond the grace,
or a successor fenced its writes — closes its coordinator and every connection served under it,
and stands again. Consumers then stop fetching within their ownership lease
(docs/design.md#ownership-lease), and the successor, which starts no partition before that lease
has run out, can move them safely.

Connections are bound to the office as it was when they were accepted: when this broker takes or
loses office they are closed, and clients reconnect and find the coordinator afresh.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator
from typing import Protocol

import attrs
import trio
import trio_util

from broker import authorization
from broker.authorization import Access
from broker.dispatch import (
    REQUEST_QUEUE,
    DataPlane,
    add_partitions,
    cluster_metadata,
    create_topic,
    delete_topic,
    handle_connection,
)
from coordinator.config import CoordinatorConfig
from coordinator.group_coordinator import GroupCoordinator, open_group_coordinator
from coordinator.observer import NULL_OBSERVER, CoordinatorObserver
from coordinator.validation import LogEnd
from protocol import (
    ClusterMetadataRequest,
    ClusterMetadataResponse,
    CreatePartitionsRequest,
    CreatePartitionsResponse,
    CreateTopicRequest,
    CreateTopicResponse,
    DeleteGroupRequest,
    DeleteTopicRequest,
    DeleteTopicResponse,
    DescribeGroupRequest,
    ErrorCode,
    LeaveGroupRequest,
    ListGroupsRequest,
    OffsetCommitRequest,
    OffsetFetchRequest,
    RegisterConsumerRequest,
    RemoteProtocolError,
    Request,
    ResponseMessage,
    Role,
    error_response,
)
from protocol.types import BrokerInfo
from store import EpochFenced, MetadataStore, StoreUnavailable
from transport.channel import Channel, ReadBounds
from transport.security import Peer

__all__ = ["ElectionStore", "Elector", "handle_elected_connection", "open_elector"]

log = logging.getLogger(__name__)

#: What only the coordinator answers; a follower says NOT_COORDINATOR, sending the client to
#: ClusterMetadata to find it.
COORDINATOR_REQUESTS = (
    RegisterConsumerRequest,
    OffsetCommitRequest,
    OffsetFetchRequest,
    LeaveGroupRequest,
    ListGroupsRequest,
    DescribeGroupRequest,
    DeleteGroupRequest,
)

#: After the store failed while standing, wait this long before standing again.
STAND_AGAIN_BACKOFF = 1.0


class ElectionStore(MetadataStore, Protocol):
    """A store shared by several brokers, whose office can end without the holder asking."""

    async def wait_office_lost(self) -> None:
        """Return once this handle's office may be over; it then holds none."""
        ...


@attrs.define(eq=False)
class Elector:
    """This broker's standing: ``coordinator`` holds its group coordinator while in office."""

    store: ElectionStore
    config: CoordinatorConfig
    broker: BrokerInfo
    #: This broker's partition log ends, for checking offsets (coordinator.validation.LogEnd).
    log_end: LogEnd | None = None
    coordinator: trio_util.AsyncValue[GroupCoordinator | None] = attrs.Factory(
        lambda: trio_util.AsyncValue(None)
    )
    #: Told what each coordinator this broker runs sees (metrics): coordinator/observer.py.
    observer: CoordinatorObserver = NULL_OBSERVER

    async def _stand(self) -> None:
        """Forever: take office (waiting while another broker holds it), coordinate until the
        office is lost, and stand again."""
        while True:
            failed = False
            try:
                async with open_group_coordinator(
                    self.store,
                    self.config,
                    self.broker,
                    log_end=self.log_end,
                    observer=self.observer,
                ) as elected:
                    self.coordinator.value = elected
                    try:
                        await self.store.wait_office_lost()
                    finally:
                        self.coordinator.value = None
                log.warning("broker %d lost the coordinator office", self.broker.broker_id)
            except* EpochFenced as deposed:
                log.warning("broker %d was deposed: %s", self.broker.broker_id, _first(deposed))
            except* StoreUnavailable as unavailable:
                log.warning(
                    "broker %d cannot stand: %s", self.broker.broker_id, _first(unavailable)
                )
                failed = True
            if failed:
                await trio.sleep(STAND_AGAIN_BACKOFF)


def _first(group: BaseExceptionGroup[BaseException]) -> BaseException:
    """The first leaf of an exception group: what to tell the operator."""
    first: BaseException = group
    while isinstance(first, BaseExceptionGroup):
        first = first.exceptions[0]
    return first


@contextlib.asynccontextmanager
async def open_elector(
    store: ElectionStore,
    config: CoordinatorConfig,
    broker: BrokerInfo,
    *,
    log_end: LogEnd | None = None,
    observer: CoordinatorObserver = NULL_OBSERVER,
) -> AsyncIterator[Elector]:
    """Stand for coordinator for the duration of the block."""
    elector = Elector(store=store, config=config, broker=broker, log_end=log_end, observer=observer)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(elector._stand)
        try:
            yield elector
        finally:
            nursery.cancel_scope.cancel()


async def handle_elected_connection(
    elector: Elector,
    stream: trio.abc.Stream,
    data_plane: DataPlane | None = None,
    *,
    bounds: ReadBounds | None = None,
    peer: Peer | None = None,
    access: Access | None = None,
) -> None:
    """Serve one peer as the coordinator or as a follower, whichever this broker is now, until
    the peer leaves or the office changes hands; under ``bounds`` and ``access`` either way."""
    coordinator = elector.coordinator.value
    async with trio_util.move_on_when(
        elector.coordinator.wait_value, lambda now: now is not coordinator
    ):
        if coordinator is not None:
            await handle_connection(
                coordinator, stream, data_plane, bounds=bounds, peer=peer, access=access
            )
        else:
            await _handle_follower_connection(elector, stream, data_plane, bounds, peer, access)


async def _handle_follower_connection(
    elector: Elector,
    stream: trio.abc.Stream,
    data_plane: DataPlane | None,
    bounds: ReadBounds | None,
    peer: Peer | None,
    access: Access | None = None,
) -> None:
    channel = Channel.open(
        stream, Role.BROKER, max_frame_size=elector.config.max_frame_size, bounds=bounds
    )
    if peer is not None:
        channel.listener = peer.listener
        channel.principal = peer.principal
    send_requests, receive_requests = trio.open_memory_channel[Request](REQUEST_QUEUE)
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(
                _answer_as_follower, elector, channel, receive_requests, data_plane, access
            )
            with contextlib.suppress(RemoteProtocolError):  # Channel.run told the peer why
                await channel.run(send_requests.send)
            nursery.cancel_scope.cancel()
    except Exception:
        log.exception("serving %s failed; closing that connection", channel.peer)
    finally:
        with trio.CancelScope(shield=True):
            await channel.aclose()


async def _answer_as_follower(
    elector: Elector,
    channel: Channel,
    requests: trio.MemoryReceiveChannel[Request],
    data_plane: DataPlane | None,
    access: Access | None,
) -> None:
    async for request in requests:
        refused = (
            None
            if access is None
            else authorization.refusal(access.current, channel.principal, request.message)
        )
        if refused is not None:
            await channel.respond(request, refused)
            continue
        response = await _follower_answer(elector, request, data_plane, channel.listener)
        if response is not None and access is not None:
            response = authorization.visible(
                access.current, channel.principal, request.message, response
            )
        if response is not None:
            await channel.respond(request, response)


async def _follower_answer(
    elector: Elector, request: Request, data_plane: DataPlane | None, listener: str = ""
) -> ResponseMessage | None:
    store = elector.store
    try:
        match request.message:
            case ClusterMetadataRequest() as message:
                coordinator_id = await store.coordinator_id()
                holder = -1 if coordinator_id is None else coordinator_id
                return cluster_metadata(
                    message,
                    topics=await store.topics(),
                    brokers=await store.brokers(listener or None),
                    coordinator_id=holder,
                    coordinator_epoch=-1,  # the coordinator tells its epoch itself
                    limits=elector.config.limits,
                    # One office holds every slot (docs/design.md#coordinator-slots).
                    slot_holders=(holder,) * elector.config.coordinator_slots,
                )
            case CreateTopicRequest() as message:
                return CreateTopicResponse(
                    error_code=await create_topic(store, message, elector.config.limits)
                )
            case CreatePartitionsRequest() as message:
                return CreatePartitionsResponse(
                    error_code=await add_partitions(store, message, elector.config.limits)
                )
            case DeleteTopicRequest() as message:
                return DeleteTopicResponse(
                    error_code=await delete_topic(store, message, elector.config.limits)
                )
    except StoreUnavailable as exc:
        log.warning("cannot answer %s: %s", type(request.message).__name__, exc)
        if isinstance(request.message, ClusterMetadataRequest):
            return ClusterMetadataResponse(
                error_code=ErrorCode.COORDINATOR_NOT_AVAILABLE,
                coordinator_id=-1,
                coordinator_epoch=-1,
                brokers=(),
                topics=(),
            )
        return error_response(request.message, ErrorCode.COORDINATOR_NOT_AVAILABLE)
    if isinstance(request.message, COORDINATOR_REQUESTS):
        return error_response(request.message, ErrorCode.NOT_COORDINATOR)
    if data_plane is not None:
        return await data_plane(request)
    return error_response(request.message, ErrorCode.INVALID_REQUEST)
