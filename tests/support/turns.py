"""How often other tasks ran while one piece of work went on: a bound on how long that work
holds the event loop, counted in checkpoints rather than measured in time."""

from __future__ import annotations

from collections.abc import Awaitable
from typing import TypeVar

import trio

T = TypeVar("T")


async def turns_during(work: Awaitable[T]) -> tuple[T, int]:
    """``work``'s result, and how many times another task ran while it was awaited."""
    turns = 0
    done = False

    async def other_client() -> None:
        nonlocal turns
        while not done:
            turns += 1
            await trio.lowlevel.checkpoint()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(other_client)
        await trio.lowlevel.checkpoint()  # it is running
        before = turns
        result = await work
        done = True
    return result, turns - before
