"""Whatever one connection sends, it can close that connection and nothing else, and what it makes
the broker hold is bounded: the idle and frame deadlines, the read budget shared by all
connections, a pipelining peer that never reads (ConnectionLimits, docs/limits.md)."""

from __future__ import annotations

import struct
import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import partial
from pathlib import Path
from typing import cast

import attrs
import pytest
import trio
import trio.testing

from broker.dispatch import COMMITS_IN_FLIGHT, handle_connection
from broker.election import Elector
from coordinator.config import CoordinatorConfig
from protocol import (
    ClusterMetadataRequest,
    ClusterMetadataResponse,
    Connection,
    ConnectionClosed,
    DescribeGroupRequest,
    ErrorCode,
    FetchRequest,
    ListGroupsRequest,
    ListGroupsResponse,
    OffsetCommitRequest,
    OffsetFetchRequest,
    PeerError,
    ProduceRequest,
    Request,
    RequestMessage,
    ResponseMessage,
    Role,
)
from protocol.records import Record
from protocol.types import BrokerInfo, TopicPartition
from simulation import SimulatedCluster, open_simulated_cluster
from simulation.network import ReplayedConnection
from store import StoreUnavailable
from store.zookeeper import ZooKeeperStore
from transport.channel import DECODE_OFF_LOOP, ReadBounds
from transport.limits import ConnectionLimits

MAX_FRAME = 64 * 1024
CONFIG = CoordinatorConfig(initial_rebalance_delay=1.0, max_frame_size=MAX_FRAME)
LIMITS = ConnectionLimits(idle_timeout=60.0, frame_timeout=10.0)


def frames(*messages: RequestMessage) -> bytes:
    """The bytes a client sends for ``messages``, in order."""
    connection = Connection(Role.CONSUMER, max_frame_size=MAX_FRAME)
    return b"".join(connection.send(connection.new_request(m)) for m in messages)


async def read_until_closed(
    stream: trio.abc.Stream, connection: Connection | None = None
) -> list[object]:
    """The events the broker sends until it closes the connection, up to its error frame or
    anything this connection did not expect (an answer to a request it did not send)."""
    connection = connection or Connection(Role.CONSUMER, max_frame_size=MAX_FRAME)
    received = b""
    while chunk := await stream.receive_some(65536):
        received += chunk
    connection.receive_data(received)
    connection.receive_data(b"")
    events: list[object] = []
    try:
        while True:
            event = connection.next_event()
            if isinstance(event, ConnectionClosed):
                return events
            events.append(event)
            if isinstance(event, PeerError):
                return events
    except Exception:
        return events


async def closed_at(stream: trio.abc.Stream) -> float:
    """The virtual time the broker closes ``stream`` (reading and dropping what it sends)."""
    while await stream.receive_some(65536):
        pass
    return trio.current_time()


@asynccontextmanager
async def bounded_cluster(
    tmp_path: Path, limits: ConnectionLimits = LIMITS
) -> AsyncIterator[SimulatedCluster]:
    async with open_simulated_cluster(tmp_path, CONFIG) as cluster:
        cluster.bounds = ReadBounds.of(limits, threads=False)
        yield cluster


async def assert_still_serving(cluster: SimulatedCluster) -> None:
    async with cluster.open_client() as client:
        with trio.fail_after(1):
            response = await client.request(ListGroupsRequest())
    assert isinstance(response, ListGroupsResponse)
    assert response.error_code is ErrorCode.NONE


# --- case 1: nothing a connection does escapes its task ----------------------------------------


async def test_a_request_then_a_malformed_frame_closes_only_that_connection(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with open_simulated_cluster(tmp_path, CONFIG) as cluster:
        await cluster.create_topic("events", partitions=4)
        a = await cluster.start_consumer("a", group="g", topics={"events": 1})
        with trio.fail_after(30):
            generation = await cluster.wait_stable("g", members=1)
        stream = await cluster.connect()
        client = Connection(Role.CONSUMER, max_frame_size=MAX_FRAME)
        request = client.send(client.new_request(DescribeGroupRequest(group_id="g")))
        await stream.send_all(request + b"\xff\xff\xff\xff")
        # the answer to the valid request may come first, then the refusal, then the close
        events = await read_until_closed(stream, client)
        assert isinstance(events[-1], PeerError)
        assert events[-1].error_code is ErrorCode.MALFORMED_FRAME
        await trio.sleep(30)  # pings go on; nobody rebalances
        assert cluster.coordinator.groups["g"].machine.generation == generation
        assert a.fetching
        await assert_still_serving(cluster)
        cluster.ledger.check()


async def test_an_answer_too_large_for_a_frame_is_refused_with_an_error_code(
    tmp_path: Path, autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    # Each unknown topic's answer is 6 bytes longer than its name in the request: 1,000 names
    # of 60 characters (as many as a request may name) fit a 64 KiB request, their answer does
    # not fit a 64 KiB frame.
    names = tuple(f"t{i:059d}" for i in range(1000))
    async with open_simulated_cluster(tmp_path, CONFIG) as cluster, cluster.open_client() as c:
        for _ in range(3):
            with trio.fail_after(1):
                response = await c.request(ClusterMetadataRequest(group_id=None, topics=names))
            assert isinstance(response, ClusterMetadataResponse)
            assert response.error_code is ErrorCode.RESPONSE_TOO_LARGE
            assert response.topics == ()
        with trio.fail_after(1):  # the same connection goes on
            listed = await c.request(ListGroupsRequest())
        assert isinstance(listed, ListGroupsResponse) and listed.error_code is ErrorCode.NONE
    lines = [r for r in caplog.records if "RESPONSE_TOO_LARGE" in r.getMessage()]
    assert len(lines) == 1  # at most one line per 10 s for the whole broker
    assert all(r.levelname == "WARNING" and r.exc_info is None for r in lines)


# --- idle and frame deadlines ------------------------------------------------------------------


async def test_a_connection_that_sends_nothing_is_closed_at_the_idle_timeout(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with bounded_cluster(tmp_path) as cluster:
        start = trio.current_time()
        silent = await cluster.connect()
        talker = await cluster.connect()
        with trio.fail_after(200):
            async with trio.open_nursery() as nursery:
                times: dict[str, float] = {}

                async def watch(name: str, stream: trio.abc.Stream) -> None:
                    times[name] = await closed_at(stream)

                nursery.start_soon(watch, "silent", silent)
                nursery.start_soon(watch, "talker", talker)
                await trio.sleep(25)
                await talker.send_all(frames(ListGroupsRequest()))
        assert times == {"silent": start + 60, "talker": start + 25 + 60}


async def test_a_registered_member_is_never_idle(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    # Pings every 2 s (T = 6 s) leave the member silent longer than a 1 s idle timeout.
    limits = attrs.evolve(LIMITS, idle_timeout=1.0)
    async with bounded_cluster(tmp_path, limits) as cluster:
        await cluster.create_topic("events", partitions=2)
        a = await cluster.start_consumer("a", group="g", topics={"events": 1}, rejoin=False)
        with trio.fail_after(30):
            generation = await cluster.wait_stable("g", members=1)
        await trio.sleep(60)
        assert a.alive and a.fetching
        assert cluster.coordinator.groups["g"].machine.generation == generation
        assert set(cluster.coordinator.groups["g"].members) == {"a"}


async def test_a_frame_not_finished_within_the_frame_timeout_closes_its_connection(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with bounded_cluster(tmp_path) as cluster:
        frame = frames(ListGroupsRequest())
        stream = await cluster.connect()
        await trio.sleep(3)
        began = trio.current_time()
        # one byte a second: never idle, but the frame takes longer than 10 s
        async with trio.open_nursery() as nursery:

            async def dribble() -> None:
                for byte in frame[:-1]:
                    await stream.send_all(bytes([byte]))
                    await trio.sleep(1)

            nursery.start_soon(dribble)
            with trio.fail_after(60):
                events = await read_until_closed(stream)
            assert trio.current_time() == began + 10
            nursery.cancel_scope.cancel()
        assert len(frame) > 12
        assert isinstance(events[-1], PeerError)
        assert events[-1].error_code is ErrorCode.REQUEST_TIMED_OUT
        await assert_still_serving(cluster)


# --- the read budget -----------------------------------------------------------------------------


async def test_unfinished_frames_share_one_budget_and_the_frame_deadline_frees_it(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    limits = attrs.evolve(LIMITS, max_buffered_request_bytes=10_000)
    names = tuple(f"topic-{i:04d}" for i in range(600))  # a ~7 KB request
    request = frames(ClusterMetadataRequest(group_id=None, topics=names))
    assert 6000 < len(request) < 10_000
    async with bounded_cluster(tmp_path, limits) as cluster:
        bounds = cluster.bounds
        assert bounds is not None
        start = trio.current_time()
        hog = await cluster.connect()
        await hog.send_all(request[:100])  # and never the rest
        await trio.sleep(1)
        assert bounds.budget.used == len(request)
        # a second such frame does not fit beside the first: its connection reads no more of it
        # until the hog's frame deadline closes the hog
        second, link = cluster.open_link()
        await second.send_all(request[:100])
        await trio.sleep(1)
        await second.send_all(request[100:])
        await trio.sleep(1)
        assert len(link.to_server.data) == len(request) - 100  # not read
        assert bounds.budget.used == len(request)
        with trio.fail_after(60):
            events = await read_until_closed(hog)
        assert trio.current_time() == start + 10
        assert isinstance(events[-1], PeerError)
        assert events[-1].error_code is ErrorCode.REQUEST_TIMED_OUT
        await trio.sleep(0)
        assert not link.to_server.data  # read at once
        assert bounds.budget.used == 0
        await assert_still_serving(cluster)


async def test_many_connections_with_unfinished_frames_hold_at_most_the_budget(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    limits = attrs.evolve(LIMITS, max_buffered_request_bytes=100_000)
    # each frame claims 60,000 bytes by its size field, and sends 50,000 of them
    header = struct.pack(">i", 60_000 - 4)
    async with bounded_cluster(tmp_path, limits) as cluster:
        bounds = cluster.bounds
        assert bounds is not None
        links = []
        for _ in range(20):
            stream, link = cluster.open_link()
            await stream.send_all(header + bytes(50_000 - 4))
            links.append(link)
        await trio.sleep(1)
        read = sum(50_000 - len(link.to_server.data) for link in links)
        assert bounds.budget.used <= 100_000
        # one frame's claim plus the first read of each waiting connection
        assert read <= 60_000 + 19 * 65536
        await trio.sleep(10)  # every frame deadline has passed: all closed, nothing held
        assert bounds.budget.used == 0
        await assert_still_serving(cluster)


# --- pipelining without reading ------------------------------------------------------------------


def task_count() -> int:
    def count(task: trio.lowlevel.Task) -> int:
        return 1 + sum(count(t) for n in task.child_nurseries for t in n.child_tasks)

    root = trio.lowlevel.current_root_task()
    assert root is not None
    return count(root)


@attrs.define(eq=False)
class Feed(trio.abc.ReceiveStream):
    """What a client has sent and the broker not yet read, counting what the broker took."""

    data: bytearray = attrs.field(factory=bytearray)
    taken: int = 0
    _lot: trio.lowlevel.ParkingLot = attrs.field(factory=trio.lowlevel.ParkingLot)

    def feed(self, data: bytes) -> None:
        self.data += data
        self._lot.unpark_all()

    async def receive_some(self, max_bytes: int | None = None) -> bytes:
        await trio.lowlevel.checkpoint()
        while not self.data:
            await self._lot.park()
        chunk = bytes(self.data[: max_bytes or 65536])
        del self.data[: len(chunk)]
        self.taken += len(chunk)
        return chunk

    async def aclose(self) -> None:
        await trio.lowlevel.checkpoint()


async def test_a_peer_that_pipelines_and_never_reads_costs_bounded_memory(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    commit = OffsetCommitRequest(group_id="g", consumer_id="nobody", generation=3, offsets=())
    pipelined = frames(*[commit] * 100_000)
    async with bounded_cluster(tmp_path) as cluster:
        bounds = cluster.bounds
        feed = Feed()
        feed.feed(pipelined)
        # the broker's answers go to a peer that never reads them: every send waits
        unread, _never_read = trio.testing.lockstep_stream_one_way_pair()
        stream = trio.StapledStream(send_stream=unread, receive_stream=feed)
        start = trio.current_time()
        async with trio.open_nursery() as nursery:

            async def serve() -> None:
                await handle_connection(cluster.coordinator, stream, bounds=bounds)
                nursery.cancel_scope.cancel()

            tasks = task_count()
            nursery.start_soon(serve)
            await trio.sleep(5)
            # The broker stopped reading once HIGH_WATER of answers waited: what it holds is
            # those answers, a few requests and a few tasks, not a task per request.
            assert feed.taken < len(pipelined)
            assert task_count() <= tasks + COMMITS_IN_FLIGHT + 4
            await assert_still_serving(cluster)
            with trio.fail_after(200):
                await trio.sleep_forever()  # until the idle timeout closes the hog
        assert trio.current_time() == start + 60


async def test_big_requests_are_not_read_ahead_while_an_answer_is_pending(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    # A slow first request holds the worker; 50 KB requests pipelined behind it are read only
    # while those not yet answered fit one frame (without the bound: the request queue's 64).
    record = Record(offset=-1, timestamp_ms=0, key=None, value=bytes(50_000))
    produce = ProduceRequest(topic="t", partition=0, records=(record,))
    slow = FetchRequest(topic="t", partition=0, offset=0, max_bytes=1)
    pipelined = frames(slow, *[produce] * 200)
    never = trio.Event()

    async def data_plane(request: Request) -> ResponseMessage | None:
        await never.wait()
        return None

    async with bounded_cluster(tmp_path) as cluster:
        feed = Feed()
        feed.feed(pipelined)
        stream = trio.StapledStream(
            send_stream=trio.testing.MemorySendStream(), receive_stream=feed
        )
        async with trio.open_nursery() as nursery:
            nursery.start_soon(
                partial(handle_connection, data_plane=data_plane, bounds=cluster.bounds),
                cluster.coordinator,
                stream,
            )
            await trio.sleep(5)
            assert feed.taken <= 2 * MAX_FRAME + 65536
            await assert_still_serving(cluster)
            nursery.cancel_scope.cancel()


async def test_a_follower_brokers_connections_have_the_same_bounds(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with bounded_cluster(tmp_path) as cluster:
        # A follower (it never stands) on the cluster's store, served as a ZooKeeper broker's
        # listener serves every connection.
        follower = Elector(
            store=cast(ZooKeeperStore, cluster.store),
            config=CONFIG,
            broker=BrokerInfo(broker_id=2, host="f", port=1),
        )
        start = trio.current_time()
        with trio.fail_after(200):
            async with trio.open_nursery() as nursery:
                silent, server = trio.testing.memory_stream_pair()
                nursery.start_soon(
                    partial(handle_connection, bounds=cluster.bounds), follower, server
                )
                slow, server = trio.testing.memory_stream_pair()
                nursery.start_soon(
                    partial(handle_connection, bounds=cluster.bounds), follower, server
                )
                await slow.send_all(frames(ListGroupsRequest())[:5])
                events = await read_until_closed(slow)
                assert trio.current_time() == start + 10
                assert isinstance(events[-1], PeerError)
                assert events[-1].error_code is ErrorCode.REQUEST_TIMED_OUT
                assert await closed_at(silent) == start + 60


# --- large frames ------------------------------------------------------------------------------


async def test_a_large_frame_is_decoded_off_the_event_loop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Decoding costs about 55 ns a byte: a 4 MiB frame decoded on the event loop would stall
    # every other connection for a quarter of a second (and an OffsetFetch naming 250,000
    # partitions, handled on the loop, would block it for 10 s). Where each of the broker's frames
    # was decoded:
    decoded: list[tuple[int, bool]] = []
    real = Connection.next_event

    def next_event(connection: Connection) -> object:
        event = real(connection)
        # The simulated wire's observer decodes every frame too, on the loop: not the broker.
        replayed = isinstance(connection, ReplayedConnection)
        if connection.our_role is Role.BROKER and isinstance(event, Request) and not replayed:
            on_loop = threading.current_thread() is threading.main_thread()
            decoded.append((connection.last_frame_bytes, on_loop))
        return event

    monkeypatch.setattr(Connection, "next_event", next_event)
    big = OffsetFetchRequest(
        group_id="g",
        partitions=tuple(TopicPartition(topic="events", partition=p) for p in range(10_000)),
    )
    async with open_simulated_cluster(tmp_path, CoordinatorConfig()) as cluster:
        cluster.bounds = ReadBounds.of(ConnectionLimits())  # as a broker process serves them
        await cluster.create_topic("events", partitions=10_000)
        async with cluster.open_client() as client:
            with trio.fail_after(30):
                fetched = await client.request(big)
                listed = await client.request(ListGroupsRequest())
    assert fetched.error_code is ErrorCode.NONE and listed.error_code is ErrorCode.NONE
    (big_size, big_on_loop), (small_size, small_on_loop) = decoded
    assert big_size > DECODE_OFF_LOOP and not big_on_loop
    assert small_size < DECODE_OFF_LOOP and small_on_loop


async def test_a_store_that_fails_under_one_request_closes_only_that_connection(
    tmp_path: Path,
    autojump_clock: trio.testing.MockClock,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    async with bounded_cluster(tmp_path) as cluster:

        async def unavailable(store: object, group_id: str) -> object:
            raise StoreUnavailable("injected: the store is out of reach")

        # An injected store failure, for OffsetFetch's read of a group not in memory only.
        inner: object = cluster.coordinator.offsets.store
        while hasattr(inner, "inner"):  # the simulation's wrappers, down to the real store
            inner = inner.inner
        monkeypatch.setattr(type(inner), "fetch_offsets", unavailable)
        stream = await cluster.connect()
        await stream.send_all(frames(OffsetFetchRequest(group_id="g", partitions=None)))
        with trio.fail_after(5):
            assert await read_until_closed(stream) == []  # closed, no answer
        monkeypatch.undo()
        await assert_still_serving(cluster)
    (line,) = [r for r in caplog.records if "closing that connection" in r.getMessage()]
    assert line.levelname == "WARNING" and line.exc_info is None
    assert "out of reach" in line.getMessage()
