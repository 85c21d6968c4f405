"""A consumer-side channel keeps the trio time it queued each of its frames until a coordinator
request names a later one, and never more than SENT_TIMES_KEPT of them: the consumer's lease runs
from the queue time of the frame a request names (docs/design.md#ownership-lease)."""

from __future__ import annotations

import trio
import trio.testing

from protocol import (
    ErrorCode,
    OffsetCommitRequest,
    PingRequest,
    PingResponse,
    Request,
    ResponseMessage,
    Role,
)
from transport.channel import SENT_TIMES_KEPT, Channel, acknowledged_frames

COMMIT = OffsetCommitRequest(group_id="g", consumer_id="c", generation=1, offsets=())


def ping(acknowledged: int) -> PingRequest:
    return PingRequest(
        coordinator_epoch=1,
        generation=1,
        consumer_id="c",
        num_retries=0,
        acknowledged_frames=acknowledged,
    )


def open_pair() -> tuple[Channel, Channel]:
    consumer_end, broker_end = trio.testing.memory_stream_pair()
    consumer = Channel.open(consumer_end, Role.CONSUMER, max_frame_size=1 << 20)
    broker = Channel.open(broker_end, Role.BROKER, max_frame_size=1 << 20)
    return consumer, broker


def ignore(_: ResponseMessage | None) -> None:
    pass


async def test_a_request_naming_frame_n_forgets_the_frames_before_it(
    autojump_clock: trio.testing.MockClock,
) -> None:
    consumer, broker = open_pair()
    seen: list[tuple[int, float | None, float | None, float | None]] = []
    commits: list[Request] = []

    async def on_ping(request: Request) -> None:
        n = acknowledged_frames(request.message)
        seen.append((n, consumer.sent_at(n - 1), consumer.sent_at(n), consumer.sent_at(n + 1)))
        await consumer.respond(
            request, PingResponse(error_code=ErrorCode.NONE, consumer_id="c", offsets=())
        )

    async def on_commit(request: Request) -> None:
        commits.append(request)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(consumer.run, on_ping)
        nursery.start_soon(broker.run, on_commit)
        for at in (1.0, 2.0, 3.0):
            await trio.sleep_until(at)
            consumer.request_nowait(COMMIT, ignore)
        assert [consumer.sent_at(n) for n in (-1, 0, 1, 2, 3, 4)] == [
            None,
            None,
            1.0,
            2.0,
            3.0,
            None,
        ]
        await trio.sleep_until(4.0)
        assert broker.frames_received == 3
        broker.request_nowait(ping(2), ignore)  # frames 1 and 2 had arrived when it was built
        await trio.sleep_until(5.0)
        assert seen == [(2, None, 2.0, 3.0)]
        # its answer is the consumer's frame 4, queued at 4.0; a Ping naming 2 again finds it
        broker.request_nowait(ping(2), ignore)
        await trio.sleep_until(6.0)
        assert seen[-1] == (2, None, 2.0, 3.0)
        assert consumer.sent_at(4) == 4.0
        assert consumer.frames_sent == 5 and broker.frames_received == 5
        nursery.cancel_scope.cancel()


async def test_a_peer_that_never_acknowledges_holds_at_most_the_cap(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """The oldest queue times go first: a request naming one of them renews nothing (None), the
    newest are all still there."""
    consumer, _ = open_pair()
    for _frame in range(SENT_TIMES_KEPT + 10):
        consumer.request_nowait(COMMIT, ignore)
        await trio.sleep(1.0)
    assert len(consumer._sent_times) == SENT_TIMES_KEPT
    assert [consumer.sent_at(n) for n in (1, 10)] == [None, None]
    assert consumer.sent_at(11) == 10.0
    assert consumer.sent_at(SENT_TIMES_KEPT + 10) == SENT_TIMES_KEPT + 9.0


async def test_the_broker_side_keeps_no_queue_times(autojump_clock: trio.testing.MockClock) -> None:
    """Only a consumer receives coordinator requests, so only its channel needs the times."""
    _, broker = open_pair()
    broker.request_nowait(ping(0), ignore)
    assert broker.frames_sent == 1
    assert broker.sent_at(1) is None
