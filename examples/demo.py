"""The whole system in one command, with the CLI a user would type: a broker, a topic, a group of
three consumers, one of them killed with SIGKILL, and the rebalance that follows.

    python examples/demo.py [--data-dir DIR] [--records N] [--partitions N]

It narrates each step, prints ``groups describe`` before and after the kill and the time from the
kill until the group is Stable with two members, then stops everything cleanly. Exit status 0
means every step happened as described; otherwise one line says what did not.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path

import trio

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # run from a checkout

from consumer.admin import AdminError, open_admin  # noqa: E402
from transport.connect import Address  # noqa: E402

CLI = (sys.executable, "-m", "cli")
ENV = {**os.environ, "PYTHONPATH": str(REPO)}
TOPIC = "demo"
GROUP = "demo-group"
#: Bounds on each wait; the demo takes well under 30 s on a quiet machine.
STEP_DEADLINE = 20.0
POLL = 0.05
SESSION_TIMEOUT = "6"


class DemoFailed(Exception):
    """A step did not happen as the narrative says it should."""


def say(text: str) -> None:
    print(f"\n== {text}", flush=True)


async def cli(*args: str, stdin: bytes = b"") -> str:
    """``coordinator ARGS...``; its stdout, or DemoFailed with its one-line error."""
    with trio.move_on_after(STEP_DEADLINE):
        done = await trio.run_process(
            [*CLI, *args],
            stdin=stdin,
            capture_stdout=True,
            capture_stderr=True,
            check=False,
            env=ENV,
        )
        if done.returncode != 0:
            raise DemoFailed(f"coordinator {' '.join(args)}: {done.stderr.decode().strip()}")
        return done.stdout.decode()
    raise DemoFailed(f"coordinator {' '.join(args)} took more than {STEP_DEADLINE:g} s")


async def stop(process: trio.Process, what: str) -> None:
    """SIGTERM and a bounded wait: a clean exit is part of the demo (SIGKILL only as cleanup)."""
    if process.returncode is None:
        process.terminate()
        with trio.move_on_after(STEP_DEADLINE):
            await process.wait()
    if process.returncode is None:
        process.kill()
        await process.wait()
        raise DemoFailed(f"{what} did not stop within {STEP_DEADLINE:g} s of SIGTERM")


@asynccontextmanager
async def running(
    command: Sequence[str], log: Path, stdout: Path | None = None
) -> AsyncIterator[trio.Process]:
    """A background process for the block's span (stdout to a file, or a pipe when None), killed
    if it is still running when the block ends."""
    with open(log, "ab") as err, open(stdout or os.devnull, "wb") as out:
        process = await trio.lowlevel.open_process(
            list(command),
            stdin=subprocess.DEVNULL,
            stdout=out if stdout else subprocess.PIPE,
            stderr=err,
            env=ENV,
        )
    try:
        yield process
    finally:
        with trio.CancelScope(shield=True):
            if process.returncode is None:
                process.kill()
                await process.wait()
            if process.stdout is not None:
                await process.stdout.aclose()


async def start_broker(
    stack: AsyncExitStack, data_dir: Path, work: Path
) -> tuple[trio.Process, str]:
    command = [
        *CLI,
        "serve",
        "--port",
        "0",
        "--data-dir",
        str(data_dir),
        "--initial-rebalance-delay",
        "1",
    ]
    broker = await stack.enter_async_context(running(command, work / "broker.log"))
    assert broker.stdout is not None
    seen = b""
    with trio.move_on_after(STEP_DEADLINE):
        while b"\n" not in seen:
            chunk = await broker.stdout.receive_some(4096)
            if not chunk:
                break
            seen += chunk
    line = seen.decode(errors="replace").strip()
    if not line.startswith("serving on "):
        log = (work / "broker.log").read_text(errors="replace").strip().splitlines()
        raise DemoFailed(f"the broker did not start: {log[-1] if log else line or 'no output'}")
    return broker, line.split()[2]


async def group_state(bootstrap: Address) -> tuple[str, int]:
    async with open_admin([bootstrap]) as admin:
        report = await admin.describe_group(GROUP)
    return report.state, len(report.members)


async def wait_stable(bootstrap: Address, members: int) -> float:
    """Seconds until the group is Stable with ``members`` members."""
    started = trio.current_time()
    with trio.move_on_after(STEP_DEADLINE):
        while True:
            state = None
            try:
                state = await group_state(bootstrap)
            except* AdminError:
                pass  # the group does not exist until its first member registers
            if state == ("Stable", members):
                return trio.current_time() - started
            await trio.sleep(POLL)
    raise DemoFailed(f"the group was not Stable with {members} members after {STEP_DEADLINE:g} s")


def lines_in(paths: Sequence[Path]) -> list[str]:
    return [line for path in paths for line in path.read_text().split("\n")[:-1]]


async def wait_printed(outputs: Sequence[Path], expected: set[str]) -> None:
    with trio.move_on_after(STEP_DEADLINE):
        while not expected <= set(lines_in(outputs)):
            await trio.sleep(POLL)
        return
    missing = len(expected - set(lines_in(outputs)))
    raise DemoFailed(f"{missing} records were never printed by the group")


async def demo(data_dir: Path, work: Path, records: int, partitions: int) -> None:
    async with AsyncExitStack() as stack:
        say(f"starting a broker on the embedded store in {data_dir}")
        broker, bootstrap = await start_broker(stack, data_dir, work)
        host, port = bootstrap.rsplit(":", 1)
        address = (host, int(port))
        print(f"broker serving on {bootstrap}")
        client = ("--bootstrap", bootstrap)

        say(f"coordinator topics create {TOPIC} --partitions {partitions}")
        print(
            await cli("topics", "create", TOPIC, "--partitions", str(partitions), *client), end=""
        )

        say(f"seq 0 {records - 1} | coordinator produce {TOPIC}")
        first = [str(i) for i in range(records)]
        await cli("produce", TOPIC, *client, stdin="".join(f"{v}\n" for v in first).encode())
        print(await cli("topics", "describe", TOPIC, *client), end="")

        say(f"three consumers: coordinator consume {TOPIC} --group {GROUP} --from-beginning")
        outputs = [work / f"consumer{i}.out" for i in range(3)]
        consumers = [
            await stack.enter_async_context(
                running(
                    [
                        *CLI,
                        "consume",
                        TOPIC,
                        "--group",
                        GROUP,
                        "--from-beginning",
                        "--session-timeout",
                        SESSION_TIMEOUT,
                        *client,
                    ],
                    out.with_suffix(".log"),
                    out,
                )
            )
            for out in outputs
        ]
        await wait_stable(address, 3)
        print("the group is Stable with 3 members (after a 1 s wait for more to join)")
        await wait_printed(outputs, set(first))
        counts = ", ".join(str(len(lines_in([out]))) for out in outputs)
        print(f"all {records} records printed (per consumer: {counts})")
        print(await cli("groups", "describe", GROUP, *client), end="")

        victim = consumers[0]
        say(f"kill -9 {victim.pid} (consumer 0): its connection closes, so it is dead at once")
        victim.kill()
        await victim.wait()
        killed_at = trio.current_time()
        await wait_stable(address, 2)
        print(f"kill -9 -> Stable with 2 members: {trio.current_time() - killed_at:.2f} s")
        print(await cli("groups", "describe", GROUP, *client), end="")

        say("200 more records: the survivors now own every partition")
        more = [str(i) for i in range(records, records + 200)]
        await cli("produce", TOPIC, *client, stdin="".join(f"{v}\n" for v in more).encode())
        await wait_printed(outputs[1:], set(more))
        print("all 200 printed by the two survivors")

        say("SIGTERM to the survivors: they commit their offsets and leave the group")
        for i, consumer in enumerate(consumers[1:], start=1):
            await stop(consumer, f"consumer {i}")
            if consumer.returncode != 0:
                raise DemoFailed(f"consumer {i} exited with status {consumer.returncode}")
        print(await cli("groups", "describe", GROUP, *client), end="")
        async with open_admin([address]) as admin:
            report = await admin.describe_group(GROUP)
        lag = sum(p.lag or 0 for p in report.partitions)
        if lag:
            raise DemoFailed(f"the group left {lag} records unconsumed")

        say("SIGTERM to the broker")
        await stop(broker, "the broker")
        if broker.returncode != 0:
            raise DemoFailed(f"the broker exited with status {broker.returncode}")
    say("done: nothing lost, lag 0, everything stopped cleanly")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--data-dir", type=Path, help="the broker's data (default: a temp dir)")
    parser.add_argument("--records", type=int, default=3000)
    parser.add_argument("--partitions", type=int, default=6)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="coordinator-demo-") as temp:
        work = Path(temp)
        data_dir = args.data_dir or work / "data"
        try:
            trio.run(demo, data_dir, work, args.records, args.partitions)
        except DemoFailed as exc:
            print(f"demo: {exc}", file=sys.stderr)
            return 1
        except KeyboardInterrupt:
            print("demo: interrupted", file=sys.stderr)
            return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
