"""The bare baseline of the benchmarks (:mod:`bench.loadgen`'s ``bare-serve`` and ``bare``
commands): a trio server and clients exchanging length-prefixed frames of the protocol's sizes
with no decoding, no state machine and no timers on the server, the limit trio itself sets on one
core; and the line protocol every worker process reads its commands in.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import struct
from typing import Any

import attrs
import trio

from bench.measure import now, percentile, rounded

#: Connections a worker opens at once (the listen backlog caps at 4096).
CONNECT_CONCURRENCY = 200
#: How often a worker asked when its joins are over looks again (the answer carries the time
#: the last one ended, not the time it was seen).
SETTLE_POLL = 0.05
_SIZE = struct.Struct(">i")


# --- bare frames: size:int32, kind:1 byte, reply size:int32, padding ----------------------------

_BARE_HEADER = struct.Struct(">icI")


def bare_frame(kind: bytes, size: int, reply_size: int = 0) -> bytes:
    """A frame of exactly ``size`` bytes on the wire (at least 9)."""
    size = max(size, _BARE_HEADER.size)
    return _BARE_HEADER.pack(size - 4, kind, reply_size) + bytes(size - _BARE_HEADER.size)


class FrameReader:
    """Length-prefixed frames from a stream: the least a bare peer must do."""

    def __init__(self, stream: trio.abc.Stream) -> None:
        self.stream = stream
        self.buffer = bytearray()

    async def next(self) -> tuple[bytes, int] | None:
        """(kind, reply size) of the next frame; None at end of stream."""
        while True:
            if len(self.buffer) >= 4:
                (length,) = _SIZE.unpack_from(self.buffer)
                if len(self.buffer) >= 4 + length:
                    _, kind, reply_size = _BARE_HEADER.unpack_from(self.buffer)
                    del self.buffer[: 4 + length]
                    return kind, reply_size
            data = await self.stream.receive_some(65536)
            if not data:
                return None
            self.buffer += data


# --- the bare server ----------------------------------------------------------------------------


@attrs.define(eq=False)
class _BarePeer:
    stream: trio.abc.Stream
    replied: trio.Event = attrs.field(factory=trio.Event)


async def bare_serve(host: str) -> None:
    """Echo 'E' frames with a frame of the size they ask for; on a 'B' control frame, send every
    hello'd peer an 'S' frame and await its 'R' reply, twice, and report the seconds it took."""
    peers: set[_BarePeer] = set()

    async def round_trip_all(request_size: int, reply_size: int) -> None:
        frame = bare_frame(b"S", request_size, reply_size)

        async def one(peer: _BarePeer) -> None:
            peer.replied = trio.Event()
            try:
                await peer.stream.send_all(frame)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                return
            await peer.replied.wait()

        async with trio.open_nursery() as nursery:
            for peer in list(peers):
                nursery.start_soon(one, peer)

    async def handle(stream: trio.SocketStream) -> None:
        peer = _BarePeer(stream=stream)
        reader = FrameReader(stream)
        try:
            while (frame := await reader.next()) is not None:
                kind, reply_size = frame
                if kind == b"E":
                    await stream.send_all(bare_frame(b"e", reply_size))
                elif kind == b"R":
                    peer.replied.set()
                elif kind == b"H":
                    peers.add(peer)
                elif kind == b"B":
                    # The control frame's reply size packs the two rounds' request sizes.
                    sizes = BROADCAST_SIZES
                    started = trio.current_time()
                    await round_trip_all(*sizes[0])
                    await round_trip_all(*sizes[1])
                    elapsed = trio.current_time() - started
                    await stream.send_all(
                        bare_frame(b"b", 16, reply_size) + struct.pack(">d", elapsed)
                    )
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        finally:
            peers.discard(peer)
            peer.replied.set()

    listeners = await trio.open_tcp_listeners(0, host=host, backlog=4096)
    port = listeners[0].socket.getsockname()[1]
    print(f"serving on {host}:{port}", flush=True)
    await trio.serve_listeners(handle, listeners)


#: Request and reply sizes of the two broadcast rounds (set from the command line).
BROADCAST_SIZES: list[tuple[int, int]] = [(64, 64), (64, 64)]


class LineReader:
    def __init__(self, stream: trio.abc.ReceiveStream) -> None:
        self.stream = stream
        self.buffer = b""

    async def next(self) -> str | None:
        while b"\n" not in self.buffer:
            data = await self.stream.receive_some(65536)
            if not data:
                return None
            self.buffer += data
        line, _, self.buffer = self.buffer.partition(b"\n")
        return line.decode().strip()


async def run_bare_worker(args: argparse.Namespace) -> None:
    """Bare clients: each sends an 'E' frame every ``interval`` seconds (0: never) and answers the
    server's 'S' frames; round trips and their times are counted for the parent.

    With ``--join-sizes`` a client first joins as a consumer does on the wire, with no protocol:
    a connection of its own for one round trip of ClusterMetadata's sizes, closed, then its
    connection and one round trip of RegisterConsumer's sizes."""
    round_trips = 0
    rtts: list[float] = []
    connected = 0
    dropped = 0
    started = 0
    last_settled = now()
    limiter = trio.CapacityLimiter(CONNECT_CONCURRENCY)

    async def discover(request_size: int, reply_size: int) -> bool:
        async with await trio.open_tcp_stream(args.host, args.port) as stream:
            await stream.send_all(bare_frame(b"E", request_size, reply_size))
            return await FrameReader(stream).next() is not None

    async def client() -> None:
        nonlocal round_trips, connected, dropped, last_settled
        first = (args.request_size, args.reply_size)
        async with limiter:
            if args.join_sizes:
                first = args.join_sizes[2], args.join_sizes[3]
                if not await discover(*args.join_sizes[:2]):
                    dropped += 1
                    return
            stream = await trio.open_tcp_stream(args.host, args.port)
            await stream.send_all(bare_frame(b"H", 9))
            # One round trip before the next client connects, as a consumer registers before
            # the next: a connect returns once the handshake is in the server's accept queue,
            # and a flood overflows that queue into the kernel's SYN-ACK retry backoff.
            reader = FrameReader(stream)
            await stream.send_all(bare_frame(b"E", *first))
            if await reader.next() is None:
                dropped += 1
                return
        connected += 1
        last_settled = now()
        try:
            if args.interval > 0:
                request = bare_frame(b"E", args.request_size, args.reply_size)
                next_at = trio.current_time() + random.uniform(0, args.interval)
                while True:
                    await trio.sleep_until(next_at)
                    sent = trio.current_time()
                    await stream.send_all(request)
                    frame = await reader.next()
                    if frame is None:
                        break
                    rtts.append(trio.current_time() - sent)
                    round_trips += 1
                    next_at = max(sent + args.interval, trio.current_time())
            else:
                while (frame := await reader.next()) is not None:
                    if frame[0] == b"S":
                        await stream.send_all(bare_frame(b"R", frame[1]))
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        dropped += 1

    def start(count: int) -> None:
        nonlocal started
        started += count
        for _ in range(count):
            nursery.start_soon(client)

    async with trio.open_nursery() as nursery:
        start(args.count)
        lines = LineReader(trio.lowlevel.FdStream(os.dup(0)))
        while (line := await lines.next()) is not None:
            verb, _, arg = line.partition(" ")
            reply: dict[str, Any]
            if verb == "join":
                reply = {"t0": now()}
                start(int(arg))
            elif verb == "settled":
                # Every client started has connected and made its first round trip, or failed
                # (a client that failed before connecting counts as dropped).
                while connected + dropped < started:
                    await trio.sleep(SETTLE_POLL)
                reply = {"t": last_settled, "connected": connected, "dropped": dropped}
            elif line == "stats":
                reply = {
                    "connected": connected,
                    "dropped": dropped,
                    "round_trips": round_trips,
                    "rtt_p50": rounded(percentile(rtts, 50)),
                    "rtt_p99": rounded(percentile(rtts, 99)),
                }
            elif line == "reset":
                round_trips = 0
                rtts.clear()
                reply = {}
            else:
                break
            print(json.dumps(reply), flush=True)
        nursery.cancel_scope.cancel()
