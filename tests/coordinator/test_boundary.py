"""Validation at the boundary, through a real broker (store, partition logs, coordinator, the
connection handler) on in-memory streams: every refused request gets its error code, and the
broker goes on serving everyone else (docs/limits.md; the numeric extremes too)."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from functools import partial
from pathlib import Path

import attrs
import pytest
import trio
import trio.testing

from broker.authorization import Access
from broker.data_plane import BrokerLog, open_broker_log
from broker.dispatch import handle_connection
from broker.log import FsyncPolicy, LogConfig
from coordinator.config import CoordinatorConfig
from coordinator.group_coordinator import GroupCoordinator, open_group_coordinator
from coordinator.limits import RequestLimits
from coordinator.validation import MAX_REPORTED_GENERATION
from protocol import (
    ClusterMetadataRequest,
    ClusterMetadataResponse,
    CreatePartitionsRequest,
    CreateTopicRequest,
    DescribeGroupRequest,
    ErrorCode,
    FetchRequest,
    FetchResponse,
    LeaveGroupRequest,
    ListGroupsRequest,
    ListGroupsResponse,
    ListOffsetsRequest,
    OffsetCommitRequest,
    OffsetFetchRequest,
    OffsetFetchResponse,
    PingRequest,
    PingResponse,
    ProduceRequest,
    Record,
    RegisterConsumerRequest,
    Request,
    ResponseMessage,
    Role,
    StartFetcherRequest,
    StartFetcherResponse,
    StopFetcherRequest,
    StopFetcherResponse,
)
from protocol.batches import records_from_batches
from protocol.messages import RequestMessage
from protocol.types import (
    BrokerInfo,
    PartitionOffset,
    Subscription,
    TopicPartition,
    TopicStreams,
)
from store import open_embedded_store
from transport.channel import Channel
from transport.security import Peer

INT32_MAX = 2**31 - 1
INT64_MAX = 2**63 - 1
LIMITS = RequestLimits(max_partitions_per_broker=200, max_group_size=3)
CONFIG = CoordinatorConfig(initial_rebalance_delay=0.0, limits=LIMITS)
#: Real time: the logs do their I/O in threads. Every wait below is on a condition, bounded.
DEADLINE = 30


@attrs.define(eq=False)
class Broker:
    coordinator: GroupCoordinator
    log: BrokerLog
    nursery: trio.Nursery

    def client(self, client_id: str = "test") -> AbstractAsyncContextManager[Channel]:
        return self.member(_refuse, client_id)

    @asynccontextmanager
    async def member(
        self,
        on_request: Callable[[Channel, Request], Awaitable[None]],
        client_id: str = "m",
        *,
        peer: Peer | None = None,
        access: Access | None = None,
    ) -> AsyncIterator[Channel]:
        """A connection whose requests from the broker go to ``on_request``; ``peer`` and
        ``access``: who it authenticated as and the rules it is held to (None: none)."""
        client_end, server_end = trio.testing.memory_stream_pair()
        self.nursery.start_soon(
            partial(
                handle_connection, self.coordinator, server_end, self.log, peer=peer, access=access
            )
        )
        channel = Channel.open(
            client_end, Role.CONSUMER, client_id=client_id, max_frame_size=CONFIG.max_frame_size
        )
        async with trio.open_nursery() as nursery:

            async def handle(request: Request) -> None:
                await on_request(channel, request)

            nursery.start_soon(channel.run, handle)
            try:
                yield channel
            finally:
                nursery.cancel_scope.cancel()
                with trio.CancelScope(shield=True):
                    await channel.aclose()

    async def request(self, message: RequestMessage, client_id: str = "test") -> ResponseMessage:
        async with self.client(client_id) as channel:
            with trio.fail_after(DEADLINE):
                return await channel.request(message)


async def _refuse(channel: Channel, request: Request) -> None:
    raise AssertionError(f"a plain client got {request}")


@asynccontextmanager
async def open_broker(tmp_path: Path, config: CoordinatorConfig = CONFIG) -> AsyncIterator[Broker]:
    info = BrokerInfo(broker_id=1, host="memory", port=9092)
    async with open_embedded_store(tmp_path / "metadata") as store:
        await store.register_broker(info)
        async with (
            open_broker_log(store, 1, tmp_path, LogConfig(fsync=FsyncPolicy.NEVER)) as log,
            open_group_coordinator(store, config, info, log_end=log.log_end_offset) as coordinator,
            trio.open_nursery() as nursery,
        ):
            yield Broker(coordinator=coordinator, log=log, nursery=nursery)
            nursery.cancel_scope.cancel()


def _register(
    subscription: Subscription | None = None,
    *,
    group_id: str = "g",
    consumer_id: str = "a",
    generation: int = -1,
) -> RegisterConsumerRequest:
    return RegisterConsumerRequest(
        group_id=group_id,
        consumer_id=consumer_id,
        subscription=subscription or Subscription(topics=(TopicStreams(topic="t", streams=1),)),
        auto_commit=True,
        auto_offset_reset="smallest",
        session_timeout_ms=6000,
        generation=generation,
        owned_partitions=(),
    )


async def _serving(broker: Broker) -> None:
    """The broker still answers, and a well-behaved consumer still gets a group."""
    response = await broker.request(ClusterMetadataRequest(group_id=None, topics=("t",)))
    assert response.error_code is ErrorCode.NONE
    started = trio.Event()

    async def member(channel: Channel, request: Request) -> None:
        await _answer(channel, request, offsets=())
        if isinstance(request.message, StartFetcherRequest):
            started.set()

    async with broker.member(member) as channel:
        with trio.fail_after(DEADLINE):
            answer = await channel.request(_register(group_id="healthy", consumer_id="ok"))
            assert answer.error_code is ErrorCode.NONE
            await started.wait()


async def _answer(
    channel: Channel, request: Request, *, offsets: tuple[PartitionOffset, ...]
) -> None:
    """A member that holds what it is given and reports ``offsets`` in every answer."""
    match request.message:
        case PingRequest(consumer_id=consumer_id):
            response: ResponseMessage = PingResponse(
                error_code=ErrorCode.NONE, consumer_id=consumer_id, offsets=offsets
            )
        case StopFetcherRequest(consumer_id=consumer_id):
            response = StopFetcherResponse(
                error_code=ErrorCode.NONE, consumer_id=consumer_id, offsets=offsets
            )
        case StartFetcherRequest(consumer_id=consumer_id):
            response = StartFetcherResponse(error_code=ErrorCode.NONE, consumer_id=consumer_id)
        case _:
            raise AssertionError(request)
    await channel.respond(request, response)


async def _create(broker: Broker, topic: str = "t", partitions: int = 4) -> None:
    response = await broker.request(CreateTopicRequest(topic=topic, partitions=partitions))
    assert response.error_code is ErrorCode.NONE


def _streams(n: int) -> Subscription:
    return Subscription(topics=(TopicStreams(topic="t", streams=n),))


# --- RegisterConsumer (cases 2-5, group size, generations) ----------------------------------


@pytest.mark.parametrize(
    ("request_", "client_id", "code"),
    [
        (_register(Subscription(pattern="(")), "c", ErrorCode.INVALID_REGULAR_EXPRESSION),
        (_register(Subscription(pattern=r"(a)\1")), "c", ErrorCode.INVALID_REGULAR_EXPRESSION),
        (
            _register(Subscription(pattern="a" * 1025)),
            "c",
            ErrorCode.INVALID_REGULAR_EXPRESSION,
        ),
        (_register(consumer_id="x" * 32_766), "c", ErrorCode.INVALID_REQUEST),
        (_register(consumer_id="a\nINFO forged"), "c", ErrorCode.INVALID_REQUEST),
        (_register(group_id="g" * 256), "c", ErrorCode.INVALID_GROUP_ID),
        (_register(group_id="é" * 128), "c", ErrorCode.INVALID_GROUP_ID),  # 256 UTF-8 bytes
        (_register(), "c" * 256, ErrorCode.INVALID_REQUEST),
        (_register(_streams(INT32_MAX)), "c", ErrorCode.INVALID_REQUEST),
        (_register(_streams(1001)), "c", ErrorCode.INVALID_REQUEST),
        (
            _register(Subscription(pattern="t.*", pattern_streams=INT32_MAX)),
            "c",
            ErrorCode.INVALID_REQUEST,
        ),
        (
            _register(
                Subscription(
                    topics=tuple(TopicStreams(topic=f"t{i}", streams=1) for i in range(1001))
                )
            ),
            "c",
            ErrorCode.INVALID_REQUEST,
        ),
        (
            _register(Subscription(topics=(TopicStreams(topic="t", streams=1),) * 2)),
            "c",
            ErrorCode.INVALID_REQUEST,
        ),
        (_register(generation=INT32_MAX), "c", ErrorCode.INVALID_REQUEST),
        (_register(generation=-2), "c", ErrorCode.INVALID_REQUEST),
    ],
    ids=[
        "case2-unbalanced-paren",
        "backreference",
        "pattern-over-1KiB",
        "case3-32766-byte-consumer-id",
        "newline-in-consumer-id",
        "256-byte-group-id",
        "256-utf8-byte-group-id",
        "256-byte-client-id",
        "case4-2147483647-streams",
        "1001-streams",
        "case4-pattern-streams",
        "1001-topics",
        "duplicate-topic",
        "generation-int32-max",
        "generation-minus-2",
    ],
)
async def test_a_bad_registration_is_refused_and_the_broker_serves_on(
    tmp_path: Path, request_: RegisterConsumerRequest, client_id: str, code: ErrorCode
) -> None:
    async with open_broker(tmp_path) as broker:
        await _create(broker)
        response = await broker.request(request_, client_id=client_id)
        assert response.error_code is code
        assert not broker.coordinator.groups.get(request_.group_id, None) or not (
            broker.coordinator.groups[request_.group_id].members
        )
        await _serving(broker)


async def test_the_highest_generation_allowed_still_rebalances(tmp_path: Path) -> None:
    """A member reporting the highest generation accepted gets the next one, encodable."""
    async with open_broker(tmp_path) as broker:
        await _create(broker)
        started: list[int] = []
        done = trio.Event()

        async def member(channel: Channel, request: Request) -> None:
            await _answer(channel, request, offsets=())
            if isinstance(request.message, StartFetcherRequest):
                started.append(request.message.generation)
                done.set()

        async with broker.member(member) as channel:
            with trio.fail_after(DEADLINE):
                response = await channel.request(_register(generation=MAX_REPORTED_GENERATION))
                assert response.error_code is ErrorCode.NONE
                await done.wait()
        assert started == [MAX_REPORTED_GENERATION + 1]


async def test_case5_a_backtracking_pattern_matches_in_linear_time(tmp_path: Path) -> None:
    """``(a+)+b`` against a 28-character topic name held Python's re for 7.7 s; RE2 answers
    at once, however long the name (249 here)."""
    async with open_broker(tmp_path) as broker:
        await _create(broker, "a" * 249, partitions=1)
        started = trio.Event()

        async def member(channel: Channel, request: Request) -> None:
            await _answer(channel, request, offsets=())
            if isinstance(request.message, StartFetcherRequest):
                started.set()

        began = time.perf_counter()
        async with broker.member(member) as channel:
            with trio.fail_after(DEADLINE):
                subscription = Subscription(pattern="(a+)+b")
                response = await channel.request(_register(subscription))
                assert response.error_code is ErrorCode.NONE
                await started.wait()
        assert time.perf_counter() - began < 5  # 2^249 steps with backtracking
        await _serving(broker)


async def test_a_full_group_refuses_another_member(tmp_path: Path) -> None:
    async with open_broker(tmp_path) as broker:
        await _create(broker)

        async def member(channel: Channel, request: Request) -> None:
            await _answer(channel, request, offsets=())

        async with (
            broker.member(member) as a,
            broker.member(member) as b,
            broker.member(member) as c,
            broker.member(member) as d,
        ):
            with trio.fail_after(DEADLINE):
                codes = [
                    (await channel.request(_register(consumer_id=name))).error_code
                    for name, channel in [("a", a), ("b", b), ("c", c), ("d", d)]
                ]
        assert codes == [ErrorCode.NONE] * 3 + [ErrorCode.GROUP_MAX_SIZE_REACHED]


async def test_a_group_refuses_streams_beyond_what_the_assignor_may_balance(
    tmp_path: Path,
) -> None:
    # 10,000 members of 1,000 streams each would be 10^7 threads for every rebalance to balance.
    limits = attrs.evolve(LIMITS, max_group_streams=25)
    async with open_broker(tmp_path, attrs.evolve(CONFIG, limits=limits)) as broker:
        await _create(broker)

        async def member(channel: Channel, request: Request) -> None:
            await _answer(channel, request, offsets=())

        wide = Subscription(topics=(TopicStreams(topic="t", streams=10),))
        by_pattern = Subscription(pattern="t", pattern_streams=10)
        async with broker.member(member) as a, broker.member(member) as b:
            with trio.fail_after(DEADLINE):
                first = await a.request(_register(wide, consumer_id="a"))
                second = await b.request(_register(by_pattern, consumer_id="b"))
                third = await broker.request(_register(wide, consumer_id="c"))
                narrow = await broker.request(_register(_streams(5), consumer_id="c"))
        assert [r.error_code for r in (first, second, third, narrow)] == [
            ErrorCode.NONE,
            ErrorCode.NONE,
            ErrorCode.GROUP_MAX_SIZE_REACHED,
            ErrorCode.NONE,
        ]


# --- topics (case 6) ------------------------------------------------------------------------


async def test_case6_partition_counts_are_bounded_per_topic_and_per_broker(
    tmp_path: Path,
) -> None:
    async with open_broker(tmp_path) as broker:

        async def create(topic: str, partitions: int) -> ErrorCode:
            message = CreateTopicRequest(topic=topic, partitions=partitions)
            return (await broker.request(message)).error_code

        async def grow(topic: str, total: int) -> ErrorCode:
            message = CreatePartitionsRequest(topic=topic, total_partitions=total)
            return (await broker.request(message)).error_code

        assert await create("huge", 100_000) is ErrorCode.INVALID_PARTITIONS
        assert await create("huge", INT32_MAX) is ErrorCode.INVALID_PARTITIONS
        assert await create("huge", 10_001) is ErrorCode.INVALID_PARTITIONS
        assert await create("none", 0) is ErrorCode.INVALID_PARTITIONS
        assert await create("bad/name", 1) is ErrorCode.INVALID_TOPIC_EXCEPTION
        # the broker holds at most 200 partitions (LIMITS)
        assert await create("first", 150) is ErrorCode.NONE
        assert await create("second", 51) is ErrorCode.POLICY_VIOLATION
        assert await create("second", 50) is ErrorCode.NONE
        assert await grow("second", 51) is ErrorCode.POLICY_VIOLATION
        assert await grow("second", 100_000) is ErrorCode.INVALID_PARTITIONS
        assert await grow("second", INT32_MAX) is ErrorCode.INVALID_PARTITIONS
        topics = await broker.coordinator.store.topics()
        assert {name: p.partition_count for name, p in topics.items()} == {
            "first": 150,
            "second": 50,
        }
        assert not (tmp_path / "log" / "huge-0").exists()


# --- offsets --------------------------------------------------------------------------------


async def _produce(broker: Broker, records: int, topic: str = "t", partition: int = 0) -> None:
    message = ProduceRequest(
        topic=topic,
        partition=partition,
        records=tuple(
            Record(offset=-1, timestamp_ms=-1, key=None, value=b"x") for _ in range(records)
        ),
    )
    assert (await broker.request(message)).error_code is ErrorCode.NONE


def _commit(offset: int, partition: int = 0, topic: str = "t") -> OffsetCommitRequest:
    return OffsetCommitRequest(
        group_id="g",
        consumer_id=None,
        generation=-1,
        offsets=(PartitionOffset(topic=topic, partition=partition, offset=offset),),
    )


async def _committed(broker: Broker) -> dict[TopicPartition, int]:
    return dict(await broker.coordinator.offsets.committed("g"))


async def test_a_commit_past_the_log_end_is_refused(tmp_path: Path) -> None:
    """Members only move an offset forward: without this check, one commit of 10^15 would pin
    the group's offset above everything later commits say."""
    async with open_broker(tmp_path) as broker:
        await _create(broker)
        await _produce(broker, 10)
        tp = TopicPartition(topic="t", partition=0)
        for offset, code in [
            (10**15, ErrorCode.OFFSET_OUT_OF_RANGE),
            (INT64_MAX, ErrorCode.OFFSET_OUT_OF_RANGE),
            (11, ErrorCode.OFFSET_OUT_OF_RANGE),
            (-1, ErrorCode.INVALID_REQUEST),
            (-(2**63), ErrorCode.INVALID_REQUEST),
            (10, ErrorCode.NONE),  # the log end itself: the next record to be written
            (3, ErrorCode.NONE),  # a reset may move back
        ]:
            assert (await broker.request(_commit(offset))).error_code is code, offset
        assert await _committed(broker) == {tp: 3}
        for message, code in [
            (_commit(0, partition=-1), ErrorCode.UNKNOWN_TOPIC_OR_PARTITION),
            (_commit(0, partition=4), ErrorCode.UNKNOWN_TOPIC_OR_PARTITION),
            (_commit(0, partition=INT32_MAX), ErrorCode.UNKNOWN_TOPIC_OR_PARTITION),
            (_commit(0, topic="nope"), ErrorCode.UNKNOWN_TOPIC_OR_PARTITION),
        ]:
            assert (await broker.request(message)).error_code is code, message
        assert await _committed(broker) == {tp: 3}


async def test_offsets_a_member_reports_past_the_log_end_are_dropped(tmp_path: Path) -> None:
    async with open_broker(tmp_path) as broker:
        await _create(broker, partitions=1)
        await _produce(broker, 5)
        reported = [PartitionOffset(topic="t", partition=0, offset=10**15)]
        started = trio.Event()
        pings: list[int] = []
        pinged = trio.lowlevel.ParkingLot()

        async def member(channel: Channel, request: Request) -> None:
            await _answer(channel, request, offsets=tuple(reported))
            if isinstance(request.message, StartFetcherRequest):
                started.set()
            if isinstance(request.message, PingRequest):
                pings.append(reported[0].offset)
                pinged.unpark_all()

        async with broker.member(member) as channel:
            with trio.fail_after(DEADLINE):
                assert (await channel.request(_register())).error_code is ErrorCode.NONE
                await started.wait()
                # Two Pings answered 10^15: Pings go out T/3 = 2 s apart, so the first answer
                # was read long before the second Ping arrived.
                while len(pings) < 2:
                    await pinged.park()
                assert await _committed(broker) == {}
                reported[0] = PartitionOffset(topic="t", partition=0, offset=4)
                while not await _committed(broker):
                    await pinged.park()
                    await trio.sleep(0.05)  # the answer is read after the member sent it
        assert pings[:2] == [10**15, 10**15]
        assert await _committed(broker) == {TopicPartition(topic="t", partition=0): 4}


async def test_offset_requests_are_bounded_and_answered_whole(tmp_path: Path) -> None:
    """One partition over the bound is refused; an OffsetFetch of the most partitions allowed, in
    reverse order and over two topics, is answered whole and sorted. (The answer is built a
    chunk at a time, so that it does not hold the event loop; at the bound of 10,000 a single
    step would take about 25 ms here, too little for a test to tell apart on a busy machine.)"""
    async with open_broker(tmp_path) as broker:
        await _create(broker, partitions=1)
        n = LIMITS.max_partitions_per_request
        too_many = tuple(TopicPartition(topic="t", partition=i) for i in range(n + 1))
        response = await broker.request(OffsetFetchRequest(group_id="g", partitions=too_many))
        assert response.error_code is ErrorCode.INVALID_REQUEST
        commit = OffsetCommitRequest(
            group_id="g",
            consumer_id=None,
            generation=-1,
            offsets=tuple(PartitionOffset(topic="t", partition=0, offset=0) for _ in range(n + 1)),
        )
        assert (await broker.request(commit)).error_code is ErrorCode.INVALID_REQUEST
        wanted = tuple(
            TopicPartition(topic=f"t{i % 2}", partition=i // 2) for i in reversed(range(n))
        )
        async with broker.client() as channel:
            with trio.fail_after(DEADLINE):
                answer = await channel.request(OffsetFetchRequest(group_id="g", partitions=wanted))
        assert isinstance(answer, OffsetFetchResponse)
        assert [(po.topic, po.partition) for po in answer.offsets] == sorted(
            (tp.topic, tp.partition) for tp in wanted
        )
        assert all(po.offset == -1 for po in answer.offsets)


# --- the data plane and metadata ------------------------------------------------------------


async def test_data_requests_at_their_extremes(tmp_path: Path) -> None:
    async with open_broker(tmp_path) as broker:
        await _create(broker)
        await _produce(broker, 3)
        unknown = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
        for partition in (-1, 4, INT32_MAX, -(2**31)):
            for message in (
                ProduceRequest(topic="t", partition=partition, records=()),
                FetchRequest(topic="t", partition=partition, offset=0, max_bytes=1024),
                ListOffsetsRequest(topic="t", partition=partition),
            ):
                assert (await broker.request(message)).error_code is unknown, message
        for offset in (-1, -(2**63), 4, INT64_MAX):
            fetch = FetchRequest(topic="t", partition=0, offset=offset, max_bytes=1024)
            assert (await broker.request(fetch)).error_code is ErrorCode.OFFSET_OUT_OF_RANGE
        for max_bytes in (0, -1, -(2**31), INT32_MAX):
            fetch = FetchRequest(topic="t", partition=0, offset=0, max_bytes=max_bytes)
            answer = await broker.request(fetch)
            assert isinstance(answer, FetchResponse)
            assert answer.error_code is ErrorCode.NONE
            assert [r.offset for r in records_from_batches(answer.batches)][:1] == [0], max_bytes
        await _serving(broker)


async def test_metadata_names_each_topic_once_and_bounds_the_count(tmp_path: Path) -> None:
    async with open_broker(tmp_path) as broker:
        await _create(broker, partitions=200)
        # 100,000 times a topic of 200 partitions would be a 160 MB answer
        asked = ClusterMetadataRequest(group_id=None, topics=("t",) * 100_000)
        answer = await broker.request(asked)
        assert isinstance(answer, ClusterMetadataResponse)
        assert [t.topic for t in answer.topics] == ["t"]
        assert len(answer.topics[0].partitions) == 200
        names = tuple(f"n{i}" for i in range(1001))
        answer = await broker.request(ClusterMetadataRequest(group_id=None, topics=names))
        assert answer.error_code is ErrorCode.INVALID_REQUEST
        answer = await broker.request(ClusterMetadataRequest(group_id=None, topics=names[:1000]))
        assert isinstance(answer, ClusterMetadataResponse)
        assert answer.error_code is ErrorCode.NONE
        assert len(answer.topics) == 1000


async def test_a_produce_of_many_version_0_records_is_stored_as_one_contiguous_run(
    tmp_path: Path,
) -> None:
    """Version-0 records are stored as batches; their offsets are one contiguous run, and a
    fetch from inside a batch starts with that whole batch."""
    async with open_broker(tmp_path) as broker:
        await _create(broker, partitions=1)
        await _produce(broker, 5000)
        await _produce(broker, 1)
        fetch = FetchRequest(topic="t", partition=0, offset=4990, max_bytes=1024)
        answer = await broker.request(fetch)
        assert isinstance(answer, FetchResponse)
        assert answer.high_watermark == 5001
        # the 5000 records' batch is over max_bytes, so it comes alone, and whole
        assert [r.offset for r in records_from_batches(answer.batches)] == list(range(5000))
        fetch = FetchRequest(topic="t", partition=0, offset=5000, max_bytes=1024)
        answer = await broker.request(fetch)
        assert isinstance(answer, FetchResponse)
        assert [r.offset for r in records_from_batches(answer.batches)] == [5000]


# --- what a stream of short-lived groups and queries leaves behind ------------------------------


async def test_groups_that_empty_before_their_first_rebalance_leave_nothing_behind(
    tmp_path: Path,
) -> None:
    # Every join waits 60 s for more members: each group empties long before its first attempt.
    config = CoordinatorConfig(initial_rebalance_delay=60.0, limits=LIMITS)
    async with open_broker(tmp_path, config) as broker:
        await _create(broker)
        coordinator = broker.coordinator
        tasks_before = len(coordinator.nursery.child_tasks)
        for i in range(200):
            async with broker.client(f"c{i}") as channel:
                with trio.fail_after(DEADLINE):
                    joined = await channel.request(_register(group_id=f"g{i}", consumer_id="a"))
                    assert joined.error_code is ErrorCode.NONE
                    left = await channel.request(
                        LeaveGroupRequest(group_id=f"g{i}", consumer_id="a", generation=-1)
                    )
                    assert left.error_code is ErrorCode.NONE
            fetched = await broker.request(OffsetFetchRequest(group_id=f"q{i}", partitions=None))
            assert fetched.error_code is ErrorCode.NONE
            described = await broker.request(DescribeGroupRequest(group_id=f"q{i}"))
            assert described.error_code is ErrorCode.GROUP_ID_NOT_FOUND
        listed = await broker.request(ListGroupsRequest())
        assert isinstance(listed, ListGroupsResponse) and listed.groups == ()
        assert coordinator.groups == {}
        # No driver task per group left waiting, and no offsets kept for groups only asked about.
        with trio.fail_after(DEADLINE):
            while len(coordinator.nursery.child_tasks) > tasks_before:
                await trio.sleep(0.01)
        assert coordinator.offsets._groups == {}  # the keeper's cache, inspected directly
