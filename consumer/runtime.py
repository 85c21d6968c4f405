"""The event loop the library runs on: trio, and a clear error on any other."""

from __future__ import annotations

import logging
import random
import signal
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager

import attrs
import sniffio
import trio

__all__ = [
    "Stop",
    "WrongEventLoop",
    "busy_wait",
    "require_trio",
    "stop_on_signals",
    "unwrap_single",
]

log = logging.getLogger(__name__)

#: What spreads the clients a busy broker refused together (:func:`busy_wait`).
_JITTER = random.Random()


def busy_wait(throttle_time_ms: int, backoff: float = 0.0, jitter: float = 0.5) -> float:
    """How long to wait after a BROKER_BUSY answer (SPEC.md §11.7): its hint or ``backoff``,
    whichever is longer, lengthened at random by up to ``jitter`` of it, so the clients a busy
    broker refused together do not all come back together. The consumer machine computes the
    same for consumers (``statemachine.consumer``)."""
    wait = max(throttle_time_ms / 1000, backoff)
    return wait * (1 + _JITTER.uniform(0, jitter))


class WrongEventLoop(RuntimeError):
    """The library was entered from an event loop other than trio's (asyncio, say)."""


def require_trio(what: str) -> None:
    """Raise :class:`WrongEventLoop` unless running under ``trio.run``: the library is written
    for trio, and under asyncio it would fail deep in trio's internals."""
    try:
        library = sniffio.current_async_library()
    except sniffio.AsyncLibraryNotFoundError:
        library = "no event loop"
    if library != "trio":
        raise WrongEventLoop(
            f"{what} runs under trio (trio.run(main)), not {library}; "
            "asyncio code can call it through trio-asyncio or a trio thread"
        )


@contextmanager
def unwrap_single() -> Iterator[None]:
    """Re-raise the one exception of a group that holds exactly one (nested groups included).

    ``open_consumer`` and ``open_producer`` run the application's block inside their nursery, so
    trio would hand a KeyboardInterrupt or an application error back wrapped in an exception
    group; an application catches ``except KeyboardInterrupt`` / ``except ValueError`` as it
    wrote them. Several exceptions at once stay a group."""
    try:
        yield
    except BaseExceptionGroup as group:
        single: BaseException = group
        while isinstance(single, BaseExceptionGroup) and len(single.exceptions) == 1:
            single = single.exceptions[0]
        if single is group:
            raise
        raise single from single.__cause__


@attrs.define(eq=False)
class Stop:
    """What :func:`stop_on_signals` yields: ``signal`` is the one that stopped the block."""

    signal: int | None = None


@asynccontextmanager
async def stop_on_signals(
    *signals: int, handled: tuple[int, ...] = (signal.SIGINT, signal.SIGTERM)
) -> AsyncIterator[Stop]:
    """Run the block until SIGINT (Ctrl-C) or SIGTERM (or ``signals``), then cancel it, so
    that the blocks around it end normally: an ``open_consumer`` block then commits and leaves
    its group, an ``open_producer`` block waits for what was sent. No KeyboardInterrupt, no
    traceback::

        async with open_consumer(...) as consumer, stop_on_signals() as stop:
            async for record in consumer:
                ...
        print("stopped by", stop.signal)

    Only the main thread receives signals, so this must run in the thread of ``trio.run``.
    """
    stop = Stop()
    with trio.open_signal_receiver(*(signals or handled)) as received, unwrap_single():
        async with trio.open_nursery() as nursery:

            async def watch() -> None:
                async for signum in received:
                    stop.signal = signum
                    log.info("%s: stopping", signal.Signals(signum).name)
                    nursery.cancel_scope.cancel()
                    return

            nursery.start_soon(watch)
            try:
                yield stop
            finally:
                nursery.cancel_scope.cancel()
