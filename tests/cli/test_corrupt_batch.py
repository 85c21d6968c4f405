"""A batch stored corrupt (here: written into the segment behind the broker's back, as a broker
from before issue 30 would have acknowledged it): ``consume`` prints the records before it, then
one line naming topic, partition and offset and the command that skips it, and exits 1; that
command moves the group past it, and the next ``consume`` goes on after it."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from launch.processes import run_broker
from protocol.batches import encode_batch
from tests.cli.cli_process import bootstrap, run_cli

pytestmark = pytest.mark.realtime

FAST_GROUP = ("--initial-rebalance-delay", "0")


def poisoned(base_offset: int) -> bytes:
    """CRC-valid, one record whose value length runs past its section (the issue's case)."""
    batch = bytearray(
        encode_batch(
            struct.pack("<iii", 0, -1, 1000) + b"short",
            1,
            first_timestamp_ms=-1,
            max_timestamp_ms=-1,
        )
    )
    struct.pack_into(">q", batch, 0, base_offset)  # as the broker would have stamped it
    return bytes(batch)


async def test_consume_stops_at_a_corrupt_batch_in_one_line_and_the_named_command_skips_it(
    tmp_path: Path,
) -> None:
    data = tmp_path / "data"
    async with run_broker(data, *FAST_GROUP) as broker:
        at = ("--bootstrap", bootstrap(broker))
        assert (await run_cli("topics", "create", "t", "--partitions", "1", *at)).returncode == 0
        assert (await run_cli("produce", "t", *at, stdin=b"a\nb\nc\n")).returncode == 0
    (segment,) = sorted((data / "log" / "t-0").glob("*.log"))
    with open(segment, "ab") as f:
        f.write(poisoned(3))
    async with run_broker(data, *FAST_GROUP) as broker:
        at = ("--bootstrap", bootstrap(broker))
        assert (await run_cli("produce", "t", *at, stdin=b"e\nf\n")).returncode == 0

        consume = ("consume", "t", "--group", "g", "--from-beginning", *at)
        stopped = await run_cli(*consume)
        assert stopped.returncode == 1
        assert stopped.stdout.splitlines() == [b"a", b"b", b"c"]
        (line,) = stopped.stderr.decode().splitlines()
        assert line.startswith("coordinator: consume: t-0: the batch at offset 3 is corrupt (")
        skip = "coordinator groups reset-offsets g --topic t --partition 0 --to-offset 4"
        assert line.endswith(f"to skip it: {skip}")

        skipped = await run_cli(*skip.split()[1:], *at)
        assert skipped.returncode == 0, skipped.stderr
        assert "committed offset of t-0 set to 4" in skipped.stderr.decode()  # on the record
        rest = await run_cli(*consume, "--max-messages", "2")
        assert rest.returncode == 0, rest.stderr
        assert rest.stdout.splitlines() == [b"e", b"f"]
