"""Send 100 JSON events keyed by user, then one more, waiting for its acknowledgement.

python examples/produce_events.py [HOST:PORT]
"""

import json
import sys

import trio

from consumer import open_producer


async def main(bootstrap: str) -> None:
    async with open_producer(
        bootstrap,
        key_serializer=str.encode,
        value_serializer=lambda value: json.dumps(value).encode(),
    ) as producer:
        for n in range(100):
            # enqueue: the record joins its partition's batch; the Delivery says when it is stored
            delivery = await producer.enqueue("events", {"n": n}, key=f"user-{n % 10}")
        partition, offset = await delivery.wait()
        print(f"event 99 is stored at partition {partition}, offset {offset}")
        # send_and_wait: one record, answered once the broker has it
        partition, offset = await producer.send_and_wait("events", {"n": 100}, key="user-0")
        print(f"event 100 is stored at partition {partition}, offset {offset}")
    # leaving the block waited for every record sent


if __name__ == "__main__":
    trio.run(main, sys.argv[1] if len(sys.argv) > 1 else "127.0.0.1:9092")
