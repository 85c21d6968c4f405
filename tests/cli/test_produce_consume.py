"""``produce`` and ``consume`` on their fast paths: lines go out in record batches (compressed
with ``--compression``) and come back a batch at a time, and ``--max-messages`` that ends inside
a batch reports exactly the lines it printed."""

from __future__ import annotations

from pathlib import Path

import pytest

from launch.processes import run_broker
from protocol.batches import Compression, read_batches
from tests.cli.cli_process import bootstrap, run_cli

pytestmark = pytest.mark.realtime

FAST_GROUP = ("--initial-rebalance-delay", "0")


@pytest.mark.parametrize("compression", ["zstd", "lz4"])
async def test_compressed_lines_come_back_in_order_and_max_messages_resumes_mid_batch(
    tmp_path: Path, compression: str
) -> None:
    lines = [b'{"n": %d, "user": "user-%d", "event": "click"}' % (i, i % 7) for i in range(3000)]
    data = tmp_path / "data"
    async with run_broker(data, *FAST_GROUP) as broker:
        at = ("--bootstrap", bootstrap(broker))
        done = await run_cli("topics", "create", "t", "--partitions", "1", *at)
        assert done.returncode == 0, done.stderr
        done = await run_cli(
            "produce", "t", "--compression", compression, *at, stdin=b"\n".join(lines) + b"\n"
        )
        assert done.returncode == 0, done.stderr
        assert done.stderr.decode().strip() == "produced 3000 records to t"
        (segment,) = sorted((data / "log" / "t-0").glob("*.log"))
        assert {b.compression for b in read_batches(segment.read_bytes())} == {
            Compression[compression.upper()]
        }

        consume = ("consume", "t", "--group", "g", "--from-beginning", *at)
        first = await run_cli(*consume, "--max-messages", "1234")
        assert first.returncode == 0, first.stderr
        assert first.stdout.splitlines() == lines[:1234]
        rest = await run_cli(*consume, "--max-messages", str(3000 - 1234))
        assert rest.returncode == 0, rest.stderr
        assert rest.stdout.splitlines() == lines[1234:]
