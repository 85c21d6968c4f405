"""Looking for the coordinator, registering with it, reading its requests and answering them."""

from __future__ import annotations

import collections
import contextlib
import logging
from collections.abc import Sequence

import trio

from protocol import (
    AssignedStream,
    ErrorCode,
    LeaveGroupRequest,
    LeaveGroupResponse,
    OffsetCommitRequest,
    OffsetCommitResponse,
    PingRequest,
    RegisterConsumerRequest,
    RegisterConsumerResponse,
    RemoteProtocolError,
    Request,
    ResponseMessage,
    Role,
    StartFetcherRequest,
    StopFetcherRequest,
)
from protocol.types import TopicPartition
from statemachine import consumer as sm
from transport.channel import Channel, ChannelClosed, acknowledged_frames
from transport.refusals import Refused, final_refusal, refusal

from .core import _DiscoveryRun, _Session, log
from .offsets import OffsetCommits
from .settings import _WIRE_OFFSET_RESETS


class CoordinatorSession(OffsetCommits):
    """Discovery and the coordinator session: each turns what it hears into inputs of the
    consumer machine, sent with the source they came from."""

    __slots__ = ()

    async def _discover(self, run: _DiscoveryRun, delay: float) -> None:
        with run.scope:
            await trio.sleep(delay)
            found = await self._discovery.find(leased=self._machine.leased(trio.current_time()))
            now = trio.current_time()
            if self._discovery.refused is not None:
                self._failure = self._discovery.refused
            if found is None:
                failed = sm.DiscoveryFailed(
                    now=now,
                    error_code=self._discovery.last_code,
                    retry_after=self._discovery.retry_after,
                )
                await self._send.send((run, failed))
                return
            self._brokers.update(found.brokers)
            event = sm.CoordinatorFound(now=now, coordinator=found.coordinator, epoch=found.epoch)
            await self._send.send((run, event))

    async def _run_session(self, session: _Session, register: sm.Register) -> None:
        with session.scope:
            async with trio.open_nursery() as nursery:
                event = await self._register(session, register, nursery)
                await self._send.send((session, event))
                session.registered.set()  # lets the reader pass on coordinator requests

    async def _register(
        self, session: _Session, register: sm.Register, nursery: trio.Nursery
    ) -> sm.Input:
        coordinator = register.coordinator
        with trio.move_on_after(self.settings.request_timeout):
            try:
                stream = await self._connect(coordinator.host, coordinator.port)
            except OSError as exc:
                self._refused_by(exc)
                log.info("%s: cannot reach the coordinator: %s", self.member_id, exc)
                return sm.ConnectionLost(now=trio.current_time())
            channel = session.channel = Channel.open(
                stream,
                Role.CONSUMER,
                client_id=self.settings.client_id,
                max_frame_size=self.settings.max_frame_size,
            )
            nursery.start_soon(self._read, session, channel)
            request = RegisterConsumerRequest(
                group_id=self.group_id,
                consumer_id=self.member_id,
                subscription=self.subscription,
                auto_commit=self.settings.auto_commit,
                auto_offset_reset=_WIRE_OFFSET_RESETS[self.settings.auto_offset_reset],
                session_timeout_ms=round(self.settings.session_timeout * 1000),
                generation=register.generation,
                owned_partitions=register.owned,
                instance_id=register.instance_id,
            )
            # The request is queued before request() first yields: this is its queue time.
            queued = trio.current_time()
            try:
                response = await channel.request(request)
            except ChannelClosed as exc:
                self._refused_by(exc)
                return sm.ConnectionLost(now=trio.current_time())
            assert isinstance(response, RegisterConsumerResponse)
            now = trio.current_time()
            if response.error_code is ErrorCode.NONE:
                log.info("%s: registered with broker %d", self.member_id, coordinator.broker_id)
                return sm.Registered(
                    now=now,
                    anchor=queued,
                    generation=response.generation,
                    epoch=response.coordinator_epoch,
                )
            code = response.error_code
            self._refused_by(self._registration_refusal(code))
            if self._failure is None:
                # Retried: said once per answer, not at every retry.
                level = logging.DEBUG if code is self._machine.last_error else logging.WARNING
                log.log(level, "%s: registration refused: %s; retrying", self.member_id, code.name)
            return sm.RegistrationRejected(
                now=now, error_code=code, retry_after=response.throttle_time_ms / 1000
            )
        log.info("%s: no registration answer in time", self.member_id)
        return sm.ConnectionLost(now=trio.current_time())

    def _refused_by(self, exc: BaseException | None) -> None:
        """The consumer ends with ``exc`` if it is a refusal it does not retry."""
        self._failure = final_refusal(exc) or self._failure

    def _registration_refusal(self, code: ErrorCode) -> Refused | None:
        """What a RegisterConsumer answer ``code`` refuses, if it is a refusal: the group, or
        the subscription's topics (the answer does not say which)."""
        if code is ErrorCode.GROUP_AUTHORIZATION_FAILED:
            return refusal(code, f"group {self.group_id!r}", operation="read", name=self.group_id)
        if code is not ErrorCode.TOPIC_AUTHORIZATION_FAILED:
            return refusal(code, f"register in group {self.group_id!r}")
        topics = [entry.topic for entry in self.subscription.topics]
        if len(topics) == 1:
            return refusal(code, f"topic {topics[0]!r}", operation="read", name=topics[0])
        return refusal(code, f"topics {', '.join(map(repr, topics))}", operation="read")

    async def _read(self, session: _Session, channel: Channel) -> None:
        async def on_request(request: Request) -> None:
            now = trio.current_time()
            # Looked up as the request is read: a later one forgets the frames before its own.
            anchor = channel.sent_at(acknowledged_frames(request.message))
            await session.registered.wait()
            session.requests[request.correlation_id] = request
            await self._send.send((session, self._coordinator_input(request, now, anchor)))

        try:
            await channel.run(on_request)
        except RemoteProtocolError as exc:
            log.warning("%s: the coordinator broke the protocol: %s", self.member_id, exc)
        await self._send.send((session, sm.ConnectionLost(now=trio.current_time())))

    def _coordinator_input(self, request: Request, now: float, anchor: float | None) -> sm.Input:
        message = request.message
        if not isinstance(message, PingRequest | StopFetcherRequest | StartFetcherRequest):
            raise AssertionError(f"the protocol let {message!r} through to a consumer")
        topic_partitions = 0
        if isinstance(message, StartFetcherRequest):
            self._brokers.update(message.brokers)
            topic_partitions = self._topic_partitions(message.streams)
        elif isinstance(message, StopFetcherRequest) and message.reason is ErrorCode.BROKER_BUSY:
            log.warning(
                "%s: the coordinator is too busy to keep its group; registering again in %.1f s",
                self.member_id,
                message.throttle_time_ms / 1000,
            )
        return sm.coordinator_input(
            message,
            correlation_id=request.correlation_id,
            now=now,
            anchor=anchor,
            topic_partitions=topic_partitions,
        )

    async def _respond(self, correlation_id: int, message: ResponseMessage) -> None:
        session = self._session
        assert session is not None and session.channel is not None
        request = session.requests.pop(correlation_id)
        with contextlib.suppress(ChannelClosed):  # the reader reports the lost connection
            await session.channel.respond(request, message)

    async def _close_session(self, *, reset: bool = False) -> None:
        """``reset``: the fetchers run on, so the coordinator must not read an end of stream,
        its proof that the member stopped (docs/design.md#ownership-lease)."""
        session, self._session = self._session, None
        if session is None:
            return
        if session.channel is not None and not reset:
            # An answer just given (a fenced member's StopFetcher answer) leaves first, while the
            # writer still runs: cancelled in the middle of a write, it would lose the frame.
            await session.channel.flush()
        session.scope.cancel()
        if session.channel is not None:
            with trio.CancelScope(shield=True):
                if reset:
                    await session.channel.abort()
                else:
                    await session.channel.aclose()

    async def _commit_and_leave(
        self, generation: int, partitions: tuple[TopicPartition, ...], *, leave: bool
    ) -> None:
        """The final commit, then LeaveGroup unless a static member's (``leave`` False), whose
        clean close after stopping frees its partitions just as well (SPEC.md §11.9)."""
        session = self._session
        if session is None or session.channel is None:
            return
        channel = session.channel
        offsets = self._reported(partitions)
        with trio.move_on_after(self.settings.request_timeout):
            try:
                if offsets:
                    commit = OffsetCommitRequest(
                        group_id=self.group_id,
                        consumer_id=self.member_id,
                        generation=generation,
                        offsets=offsets,
                    )
                    response = await channel.request(commit)
                    assert isinstance(response, OffsetCommitResponse)
                    if response.error_code is not ErrorCode.NONE:
                        log.warning(
                            "%s: final commit refused: %s",
                            self.member_id,
                            response.error_code.name,
                        )
                if not leave:
                    return
                request = LeaveGroupRequest(
                    group_id=self.group_id, consumer_id=self.member_id, generation=generation
                )
                answer = await channel.request(request)
                assert isinstance(answer, LeaveGroupResponse)
                if answer.error_code is not ErrorCode.NONE:
                    log.warning("%s: LeaveGroup: %s", self.member_id, answer.error_code.name)
            except ChannelClosed:
                log.info("%s: the coordinator connection closed while leaving", self.member_id)

    def _topic_partitions(self, streams: Sequence[AssignedStream]) -> int:
        """The partitions of the assigned topics as discovery last counted them (a topic it never
        counted contributes what is assigned of it): the machine's estimate of the group's size
        comes from it."""
        counts = self._discovery.partition_counts
        assigned: collections.Counter[str] = collections.Counter(
            p.topic for stream in streams for p in stream.partitions
        )
        return sum(max(counts.get(topic, 0), n) for topic, n in assigned.items())
