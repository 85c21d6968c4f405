"""The channel over a real TCP connection on loopback: frames sent while the peer does not read
(more than the kernel's buffers hold, so part goes to the socket at once and the rest through the
writer task) arrive whole and in order, and every request gets its answer or None exactly once."""

from __future__ import annotations

import pytest
import trio
import trio.testing

from protocol import (
    AssignedPartition,
    AssignedStream,
    ErrorCode,
    Request,
    ResponseMessage,
    Role,
    StartFetcherRequest,
    StartFetcherResponse,
)
from transport.channel import Channel

pytestmark = pytest.mark.realtime

MAX_FRAME = 4 << 20
REQUESTS = 40
PARTITIONS = 2000  # ~60 KB a frame: 40 of them are well over loopback's socket buffers


def start_fetcher(generation: int) -> StartFetcherRequest:
    partitions = tuple(
        AssignedPartition(topic="t", partition=p, offset=generation * p, broker_id=1)
        for p in range(PARTITIONS)
    )
    return StartFetcherRequest(
        coordinator_epoch=1,
        generation=generation,
        consumer_id="c",
        streams=(AssignedStream(stream_id="c-0", partitions=partitions),),
        brokers=(),
    )


async def open_pair(nursery: trio.Nursery) -> tuple[Channel, Channel]:
    accepted: trio.MemorySendChannel[trio.SocketStream]
    accepted, streams = trio.open_memory_channel[trio.SocketStream](1)

    async def handler(stream: trio.SocketStream) -> None:
        await accepted.send(stream)
        await trio.sleep_forever()

    listeners = await nursery.start(trio.serve_tcp, handler, 0)
    client = await trio.testing.open_stream_to_socket_listener(listeners[0])
    server = await streams.receive()
    broker = Channel.open(server, Role.BROKER, max_frame_size=MAX_FRAME)
    consumer = Channel.open(client, Role.CONSUMER, max_frame_size=MAX_FRAME)
    return broker, consumer


async def test_requests_queued_while_the_peer_does_not_read_arrive_whole_in_order() -> None:
    answers: list[ResponseMessage | None] = []
    received: list[int] = []
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            broker, consumer = await open_pair(nursery)
            for generation in range(REQUESTS):  # nobody reads or writes yet: no task runs
                broker.request_nowait(start_fetcher(generation), answers.append)
            nursery.start_soon(broker.run, _refuse)

            async def answer(request: Request) -> None:
                assert request.message == start_fetcher(len(received))
                received.append(request.message.generation)
                await consumer.respond(
                    request, StartFetcherResponse(error_code=ErrorCode.NONE, consumer_id="c")
                )

            nursery.start_soon(consumer.run, answer)
            while len(answers) < REQUESTS:
                await trio.sleep(0.01)
            nursery.cancel_scope.cancel()
    assert received == list(range(REQUESTS))
    assert answers == [StartFetcherResponse(error_code=ErrorCode.NONE, consumer_id="c")] * REQUESTS


async def test_unanswered_requests_get_none_once_when_the_peer_closes() -> None:
    answers: list[ResponseMessage | None] = []
    late: list[ResponseMessage | None] = []
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            broker, consumer = await open_pair(nursery)
            abandoned = broker.request_nowait(start_fetcher(0), late.append)
            broker.request_nowait(start_fetcher(1), answers.append)
            broker.abandon(abandoned)  # its deadline passed: an answer must not reach it
            nursery.start_soon(broker.run, _refuse)
            requests: list[Request] = []

            async def collect(request: Request) -> None:
                requests.append(request)

            nursery.start_soon(consumer.run, collect)
            while len(requests) < 2:
                await trio.sleep(0.01)
            await consumer.respond(
                requests[0], StartFetcherResponse(error_code=ErrorCode.NONE, consumer_id="c")
            )
            await consumer.aclose()
            while not broker.closed:
                await trio.sleep(0.01)
            nursery.cancel_scope.cancel()
    assert late == []
    assert answers == [None]


async def _refuse(request: Request) -> None:
    raise AssertionError(f"unexpected {request}")


@pytest.mark.parametrize("abort", [False, True])
async def test_abort_resets_the_connection_where_a_close_ends_the_stream(abort: bool) -> None:
    """The coordinator takes an end of stream as proof that a member stopped fetching; a
    consumer that gives up its connection while still fetching resets it instead
    (docs/design.md#ownership-lease)."""
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            broker, consumer = await open_pair(nursery)
            await (consumer.abort() if abort else consumer.aclose())
            if abort:
                with pytest.raises(trio.BrokenResourceError):
                    await broker.stream.receive_some()
            else:
                assert await broker.stream.receive_some() == b""
            nursery.cancel_scope.cancel()
