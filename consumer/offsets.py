"""The consumer's offsets: what it commits and what it reports to the coordinator."""

from __future__ import annotations

from collections.abc import Coroutine, Mapping, Sequence
from typing import Any

import trio

from protocol import (
    ErrorCode,
    OffsetCommitRequest,
    OffsetCommitResponse,
    OffsetFetchRequest,
    OffsetFetchResponse,
    ResponseMessage,
)
from protocol.types import PartitionOffset, TopicPartition
from statemachine import consumer as sm
from transport.channel import ChannelClosed

from .core import ConsumerCore, _Session
from .settings import CommitFailed, PartitionNotAssigned
from .streams import InstanceFenced


class OffsetCommits(ConsumerCore):
    """Commits: asked by the application, and what Ping and StopFetcher answers report."""

    __slots__ = ()

    def commit(
        self, offsets: Mapping[TopicPartition, int] | None = None
    ) -> Coroutine[Any, Any, None]:
        """``await consumer.commit()``: OffsetCommit the consumed offsets now (or exactly
        ``offsets``, ``{partition: the next offset to read}``), answered once durable at the
        coordinator.

        A no-op when nothing is assigned (and no ``offsets`` are given). With ``auto_commit``
        the consumer goes on reporting its consumed offsets, which may overwrite ``offsets``:
        commit explicit offsets with ``auto_commit=False``.

        Raises CommitFailed when not registered, or when the coordinator refuses
        (ILLEGAL_GENERATION / UNKNOWN_MEMBER_ID after a rebalance moved on; NOT_COORDINATOR,
        which also sends the consumer looking for the coordinator), and InstanceFenced when a
        newer process took this consumer's instance id (which ends it); PartitionNotAssigned (a
        CommitFailed and a ValueError) when refused for ``offsets`` of partitions this consumer
        does not own. Not awaiting it is an error when the ``open_consumer`` block ends
        (:class:`~consumer.runtime.NotAwaited`), as for the producer's ``send``."""
        return self._not_awaited.track("commit", "commit", self._commit, offsets)

    async def _commit(self, offsets: Mapping[TopicPartition, int] | None) -> None:
        if self._machine.state is sm.ConsumerState.FENCED:
            raise InstanceFenced(self.instance_id)
        if offsets is None:
            held = [tp for tp, claim in self._claims.items() if claim.active]
            listed = self._offsets([*held, *self._revoking])
        else:
            listed = tuple(
                PartitionOffset(topic=tp.topic, partition=tp.partition, offset=offset)
                for tp, offset in sorted(offsets.items())
            )
        if not listed:
            return
        session = self._registered_session()
        assert session.channel is not None
        request = OffsetCommitRequest(
            group_id=self.group_id,
            consumer_id=self.member_id,
            generation=self._machine.generation,
            offsets=listed,
        )
        response: ResponseMessage | None = None
        with trio.move_on_after(self.settings.request_timeout):
            try:
                response = await session.channel.request(request)
            except ChannelClosed as exc:
                raise CommitFailed(ErrorCode.COORDINATOR_NOT_AVAILABLE, str(exc)) from exc
        if response is None:
            raise CommitFailed(ErrorCode.COORDINATOR_NOT_AVAILABLE, "no answer in time")
        assert isinstance(response, OffsetCommitResponse)
        code = response.error_code
        if code in (ErrorCode.NOT_COORDINATOR, ErrorCode.COORDINATOR_LOAD_IN_PROGRESS):
            moved = sm.CoordinatorMoved(now=trio.current_time(), error_code=code)
            await self._send.send((session, moved))
        if code is ErrorCode.FENCED_INSTANCE_ID:
            await self._send.send((session, sm.Fenced(now=trio.current_time())))
            raise InstanceFenced(self.instance_id)
        if code is ErrorCode.ILLEGAL_GENERATION and offsets is not None:
            owned = {tp for tp, claim in self._claims.items() if claim.active}
            owned.update(self._revoking)
            foreign = sorted(set(offsets) - owned)
            if foreign:
                raise PartitionNotAssigned(foreign, owned)
        if code is not ErrorCode.NONE:
            raise CommitFailed(code)

    async def committed(self, tp: TopicPartition) -> int | None:
        """The group's committed offset of ``tp`` (the next offset to read), None if it has
        none; asked of the coordinator. Raises CommitFailed when not registered or refused."""
        session = self._registered_session()
        response: ResponseMessage | None = None
        with trio.move_on_after(self.settings.request_timeout):
            try:
                response = await session.channel.request(  # type: ignore[union-attr]
                    OffsetFetchRequest(group_id=self.group_id, partitions=(tp,))
                )
            except ChannelClosed as exc:
                raise CommitFailed(ErrorCode.COORDINATOR_NOT_AVAILABLE, str(exc)) from exc
        if response is None:
            raise CommitFailed(ErrorCode.COORDINATOR_NOT_AVAILABLE, "no answer in time")
        assert isinstance(response, OffsetFetchResponse)
        if response.error_code is not ErrorCode.NONE:
            raise CommitFailed(response.error_code)
        found = [po.offset for po in response.offsets if po.topic_partition == tp]
        return found[0] if found and found[0] >= 0 else None

    def _registered_session(self) -> _Session:
        session = self._session
        if session is None or session.channel is None or not session.registered.is_set():
            raise CommitFailed(ErrorCode.COORDINATOR_NOT_AVAILABLE, "not registered")
        return session

    def _offsets(self, partitions: Sequence[TopicPartition]) -> tuple[PartitionOffset, ...]:
        offsets = []
        for tp in sorted(partitions):
            claim = self._claims.get(tp)
            if claim is not None and claim.consumed is not None:
                offsets.append(
                    PartitionOffset(topic=tp.topic, partition=tp.partition, offset=claim.consumed)
                )
        return tuple(offsets)

    def _reported(self, partitions: Sequence[TopicPartition]) -> tuple[PartitionOffset, ...]:
        """What Ping and StopFetcher responses carry: nothing without auto-commit."""
        return self._offsets(partitions) if self.settings.auto_commit else ()
