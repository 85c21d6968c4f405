"""Count the events per key until Ctrl-C or SIGTERM, then commit and leave the group cleanly.

python examples/count_events.py [HOST:PORT]
"""

import collections
import sys

import trio

from consumer import ConsumerSettings, open_consumer, stop_on_signals


async def main(bootstrap: str) -> None:
    counts: collections.Counter[str] = collections.Counter()
    settings = ConsumerSettings(auto_offset_reset="earliest")
    async with (
        open_consumer(bootstrap, "counters", topics=["events"], settings=settings) as consumer,
        stop_on_signals() as stop,  # SIGINT or SIGTERM ends this block, not the program
    ):
        print("consuming", flush=True)
        async for record in consumer:
            key = record.key.decode() if record.key else "-"
            counts[key] += 1
            print(key, counts[key], flush=True)
    # Leaving open_consumer's block stopped the fetchers, committed what was counted (each
    # record is finished once the loop asks for the next) and left the group.
    print(f"stopped by signal {stop.signal}: {counts.total()} events, {len(counts)} keys")


if __name__ == "__main__":
    trio.run(main, sys.argv[1] if len(sys.argv) > 1 else "127.0.0.1:9092")
