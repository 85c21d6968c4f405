"""The event loop the library runs on: trio, and a clear error on any other."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import sniffio

__all__ = ["WrongEventLoop", "require_trio", "unwrap_single"]


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
