"""Two ``consume`` processes in one group, on different topics, against a real broker: the second
one joining, and later leaving, rebalances the group. The incremental protocol (the broker's
default) leaves the first alone, since neither rebalance moves its partitions: it is never
stopped, prints on while records keep coming, and prints each record once.

What a user would check: the output (every record, once) and the consumer's own log at INFO (one
assignment, one stop: at its own shutdown).
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import trio

from consumer import open_producer
from consumer.admin import AdminError, open_admin
from launch.processes import BrokerProcess, run_broker
from tests.cli.cli_process import bootstrap, open_cli, stop

pytestmark = pytest.mark.realtime

WAIT = 60.0
"""Bound on each wait below: generous, since CI has two busy cores."""
POLL = 0.05
GROUP = "g"


def printed(path: Path) -> list[str]:
    """The whole lines in ``path`` so far."""
    return path.read_bytes().decode().split("\n")[:-1]


async def until(condition: Callable[[], bool], what: str) -> None:
    with trio.move_on_after(WAIT):
        while not condition():
            await trio.sleep(POLL)
        return
    raise AssertionError(f"not within {WAIT} s: {what}")


async def until_stable(broker: BrokerProcess, members: int) -> None:
    async def stable() -> bool:
        found = False
        try:
            async with open_admin([broker.address]) as admin:
                report = await admin.describe_group(GROUP)
            found = report.state == "Stable" and len(report.members) == members
        except* AdminError:
            pass  # no such group until its first member registers
        return found

    with trio.fail_after(WAIT):
        while not await stable():
            await trio.sleep(POLL)


async def test_a_rebalance_that_does_not_touch_a_consumers_partitions_leaves_its_output_whole(
    tmp_path: Path,
) -> None:
    async with run_broker(tmp_path / "broker", "--initial-rebalance-delay", "0.2") as broker:
        address = bootstrap(broker)
        async with open_admin([broker.address]) as admin:
            await admin.create_topic("a", 2)
            await admin.create_topic("b", 4)
        out, err = tmp_path / "steady.out", tmp_path / "steady.err"
        consume = ("consume", "--group", GROUP, "--from-beginning", "--session-timeout", "6")
        steady = await open_cli(
            "--log-level",
            "INFO",
            consume[0],
            "a",
            *consume[1:],
            "--bootstrap",
            address,
            stdout=out,
            stderr=err,
        )
        joiner: trio.Process | None = None
        sent: list[str] = []
        tried: list[str] = []
        gaps: list[float] = []
        try:
            async with open_producer([broker.address]) as producer, trio.open_nursery() as nursery:

                async def produce_steadily() -> None:
                    for i in itertools.count():
                        tried.append(str(i))  # a send cancelled at the end may still land
                        await producer.send_and_wait(
                            "a", str(i).encode()
                        )  # round robin over a-0, a-1
                        sent.append(str(i))
                        await trio.sleep(0.005)

                async def watch_the_output() -> None:
                    """The longest pause in the steady consumer's output, for the record."""
                    lines, since = 0, time.monotonic()  # real-clock: what a user sees
                    while True:
                        await trio.sleep(POLL)
                        now_lines = len(printed(out))
                        if now_lines > lines:
                            gaps.append(time.monotonic() - since)
                            lines, since = now_lines, time.monotonic()

                nursery.start_soon(produce_steadily)
                await until_stable(broker, members=1)
                await until(lambda: len(printed(out)) >= 100, "the steady consumer prints")
                nursery.start_soon(watch_the_output)
                joiner = await open_cli(
                    consume[0],
                    "b",
                    *consume[1:],
                    "--bootstrap",
                    address,
                    stdout=tmp_path / "joiner.out",
                    stderr=tmp_path / "joiner.err",
                )
                await until_stable(broker, members=2)
                so_far = len(printed(out))
                await until(lambda: len(printed(out)) >= so_far + 100, "it prints on")
                assert await stop(joiner) == 0  # a clean leave: another rebalance
                await until_stable(broker, members=1)
                so_far = len(printed(out))
                await until(lambda: len(printed(out)) >= so_far + 100, "it prints on")
                nursery.cancel_scope.cancel()
            await until(lambda: set(printed(out)) >= set(sent), "everything sent is printed")
            assert await stop(steady) == 0
        finally:
            await stop(steady)
            if joiner is not None:
                await stop(joiner)

    lines = printed(out)
    assert len(lines) == len(set(lines))  # nothing twice ...
    assert set(sent) <= set(lines) <= set(tried)  # ... and every record acknowledged
    log = err.read_text()
    assignments = [line for line in log.splitlines() if ": generation " in line]
    stops = [line for line in log.splitlines() if "stopped fetching" in line]
    assert len(assignments) == 1, log  # assigned once: neither rebalance sent it anything
    assert len(stops) == 1 and "0 go on" in stops[0], log  # stopped once: at its shutdown
    print(f"MEASURED longest pause in the steady consumer's output: {max(gaps):.3f} s")
