"""The event loop the library runs on: trio, and a clear error on any other."""

from __future__ import annotations

import itertools
import logging
import random
import signal
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import Any

import attrs
import sniffio
import trio

__all__ = [
    "NotAwaited",
    "Stop",
    "Unawaited",
    "WrongEventLoop",
    "busy_wait",
    "first_cause",
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


class NotAwaited(RuntimeError):
    """A call of the library that returns a coroutine (``producer.send``, ``consumer.commit``...)
    was never awaited, so it did nothing: raised when its block ends (or at ``flush``) instead of
    losing the record or the commit with only Python's "never awaited" warning."""


@attrs.define(eq=False)
class Unawaited:
    """The coroutines a producer or a consumer handed out that have not started: each removes
    itself as it starts (awaited, or started as a task), so :meth:`check` finds the forgotten
    ``await``. They stay real coroutines, so mypy's ``unused-coroutine`` flags the mistake too,
    and ``nursery.start_soon(producer.send_and_wait, ...)`` works."""

    owner: str
    """How the fix is spelled in the error: ``producer``, ``consumer``."""
    _waiting: dict[int, tuple[str, str, Coroutine[Any, Any, Any]]] = attrs.field(factory=dict)
    _calls: itertools.count[int] = attrs.field(factory=itertools.count)

    def track(
        self, name: str, what: str, run: Callable[..., Awaitable[Any]], *args: Any
    ) -> Coroutine[Any, Any, Any]:
        """``run(*args)``, an async function, as a coroutine that is an error to forget: the
        error names the method ``name`` (``send``) and the call, ``what`` (``send to 't'``)."""
        call = next(self._calls)

        async def started() -> Any:
            self._waiting.pop(call, None)
            return await run(*args)

        coroutine = started()
        self._waiting[call] = (name, what, coroutine)
        return coroutine

    def check(self) -> None:
        """Raise :class:`NotAwaited` if a tracked coroutine never started (and close them, so
        Python does not warn a second time)."""
        forgotten, self._waiting = self._waiting, {}
        if forgotten:
            for _, _, coroutine in forgotten.values():
                coroutine.close()
            name, what, _ = next(iter(forgotten.values()))
            raise NotAwaited(
                f"{len(forgotten)} {self.owner} call(s) were never awaited (e.g. {what}), so they "
                f"did nothing: write `await {self.owner}.{name}(...)`"
            )


def first_cause(group: BaseExceptionGroup[BaseException]) -> BaseException:
    """The first leaf of an exception group (nested groups included): what to tell the
    operator of a task that a nursery's group ended."""
    first: BaseException = group
    while isinstance(first, BaseExceptionGroup):
        first = first.exceptions[0]
    return first


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
