"""How much of an answer the broker builds between two checkpoints.

A request of a few bytes can ask for an answer as large as the cluster (ClusterMetadata for every
topic, OffsetFetch or DescribeGroup of a group with offsets on 100,000 partitions), and every
connection shares one event loop: an answer built in one step holds every other connection for as
long. Each such answer is built, and filtered for what its principal may see, a chunk of work at a
time with a checkpoint between chunks.
"""

from __future__ import annotations

import attrs
import trio

__all__ = ["ANSWER_CHUNK", "Pace"]

#: Entries of an answer handled between two checkpoints (about a millisecond of work).
ANSWER_CHUNK = 1000


@attrs.define
class Pace:
    """The work done since the last checkpoint, counted in entries of an answer."""

    done: int = 0

    async def did(self, entries: int) -> None:
        """Count ``entries`` more; a checkpoint once they reach :data:`ANSWER_CHUNK`."""
        self.done += entries
        if self.done >= ANSWER_CHUNK:
            self.done = 0
            await trio.lowlevel.checkpoint()
