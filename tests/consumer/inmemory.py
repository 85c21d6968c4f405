"""The real coordinator in memory, for deterministic consumer tests on trio's MockClock.

Every connection the consumer opens is served by ``handle_connection`` over an in-memory stream,
with the real coordinator of :func:`simulation.open_simulated_cluster`. The data plane is
a stand-in (:class:`TickingLog`): the real broker log does its file I/O in worker threads, and
MockClock's autojump jumps while a thread works, so a test with the real log could not assert exact
instants. Tests that need the real log run against a real broker process instead.
"""

from __future__ import annotations

import math
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import attrs
import trio
import trio.testing

from broker.dispatch import handle_connection
from coordinator.config import CoordinatorConfig
from protocol import (
    ApiKey,
    ErrorCode,
    FetchRequest,
    FetchResponse,
    ListOffsetsRequest,
    ListOffsetsResponse,
    Request,
    ResponseMessage,
    error_response,
)
from protocol.batches import build_batch
from protocol.types import TopicPartition
from simulation import SimulatedCluster, open_simulated_cluster


@attrs.define(eq=False)
class TickingLog:
    """Every partition gains ``rate`` records per second of trio time from ``start``; Fetch returns
    at most ``batch`` of them. Each Fetch is logged with its instant, so tests can see exactly
    when a consumer fetched."""

    start: float
    rate: float = 10.0
    batch: int = 5
    fetches: list[tuple[float, TopicPartition, int]] = attrs.field(factory=list)
    listed: list[int] = attrs.field(factory=list)
    """The high watermark each ListOffsets answered."""

    def high_watermark(self) -> int:
        return max(0, math.floor((trio.current_time() - self.start) * self.rate))

    async def __call__(self, request: Request) -> ResponseMessage | None:
        match request.message:
            case ListOffsetsRequest():
                self.listed.append(self.high_watermark())
                return ListOffsetsResponse(
                    error_code=ErrorCode.NONE, log_start_offset=0, high_watermark=self.listed[-1]
                )
            case FetchRequest(topic=topic, partition=partition, offset=offset):
                now = trio.current_time()
                self.fetches.append((now, TopicPartition(topic=topic, partition=partition), offset))
                end = self.high_watermark()
                if offset > end:
                    return FetchResponse(
                        error_code=ErrorCode.OFFSET_OUT_OF_RANGE,
                        high_watermark=end,
                        log_start_offset=0,
                        records=(),
                    )
                values = [
                    f"{topic}/{partition}/{o}".encode()
                    for o in range(offset, min(end, offset + self.batch))
                ]
                return FetchResponse(
                    error_code=ErrorCode.NONE,
                    high_watermark=end,
                    log_start_offset=0,
                    records=(),
                    batches=build_batch(values, timestamps_ms=[0] * len(values), base_offset=offset)
                    if values
                    else b"",
                )
        return error_response(request.message, ErrorCode.INVALID_REQUEST)


class Line(trio.abc.Stream):
    """A client's end of an in-memory connection that the test can cut silently: once cut,
    nothing more arrives and nothing sent is delivered, as when the peer process is stopped."""

    def __init__(self, inner: trio.abc.Stream) -> None:
        self.inner = inner
        self.cut = False
        self.carries_registration = False
        self.aborted = False
        self._first = True

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        if self._first:
            self._first = False
            # frame: size:int32, kind:int8 (0 = request), api_key:int16
            self.carries_registration = bytes(
                data[4:7]
            ) == b"\x00" + ApiKey.REGISTER_CONSUMER.to_bytes(2, "big")
        if self.cut:
            await trio.lowlevel.checkpoint()
            return
        await self.inner.send_all(data)

    async def wait_send_all_might_not_block(self) -> None:
        await self.inner.wait_send_all_might_not_block()

    async def receive_some(self, max_bytes: int | None = None) -> bytes | bytearray:
        if self.cut:
            await trio.sleep_forever()
        data = await self.inner.receive_some(max_bytes)
        if self.cut:
            await trio.sleep_forever()
        return data

    async def aclose(self) -> None:
        await self.inner.aclose()

    def abort(self) -> None:
        """A reset (``Channel.abort``): in memory there is none, so the close is all there is."""
        self.aborted = True


@attrs.define(eq=False)
class InMemoryCluster:
    cluster: SimulatedCluster
    log: TickingLog
    nursery: trio.Nursery
    lines: list[Line] = attrs.field(factory=list)
    refusing: bool = False
    #: The connections the broker serves: a restart ends them.
    _serving: set[trio.CancelScope] = attrs.field(factory=set)

    async def connect(self, host: str, port: int) -> trio.abc.Stream:
        """The consumer's ``connect``: every address reaches the one simulated broker."""
        await trio.lowlevel.checkpoint()
        if self.refusing:
            raise ConnectionRefusedError(f"{host}:{port} refused (the test cut the network)")
        if not self.cluster.up:
            raise ConnectionRefusedError(f"{host}:{port} refused (the broker is restarting)")
        client, server = trio.testing.memory_stream_pair()
        self.nursery.start_soon(self._serve, server)
        line = Line(client)
        self.lines.append(line)
        return line

    async def _serve(self, server: trio.abc.Stream) -> None:
        with trio.CancelScope() as scope:
            self._serving.add(scope)
            try:
                await handle_connection(self.cluster.coordinator, server, self.log)
            finally:
                self._serving.discard(scope)

    async def restart_broker(self, *, down_for: float) -> None:
        """The broker restarts on its data dir: every connection it served closes, it refuses
        connections for ``down_for``, then serves again with a new coordinator."""
        self.refusing = True
        for scope in self._serving:
            scope.cancel()
        await self.cluster.restart_coordinator(down_for=down_for)
        self.refusing = False

    def silence_coordinator(self) -> None:
        """The coordinator goes silent for every registered consumer, and nobody can connect."""
        self.refusing = True
        for line in self.lines:
            if line.carries_registration:
                line.cut = True


@asynccontextmanager
async def open_in_memory_cluster(
    data_dir: Path, config: CoordinatorConfig, topics: dict[str, int]
) -> AsyncIterator[InMemoryCluster]:
    async with open_simulated_cluster(data_dir, config) as cluster, trio.open_nursery() as nursery:
        for name, partitions in topics.items():
            await cluster.create_topic(name, partitions=partitions)
        yield InMemoryCluster(
            cluster=cluster, log=TickingLog(start=trio.current_time()), nursery=nursery
        )
        nursery.cancel_scope.cancel()
