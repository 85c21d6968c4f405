"""Produce and consume rates of one broker process, each next to a bare baseline from the same run.

Prints one JSON line per figure. The broker is a real ``python -m cli serve`` process on a
temporary data dir; the client (the producer, then a fetch loop) runs here. The baselines do the
same file work with nothing around it: appending the same encoded records to a file in batches of
the same size (with an fsync per batch when the broker's policy is ``always``), and reading them
back. Both processes share the machine's cores, as they would on a small host.

    python bench/throughput.py --records 200000 --fsync always
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import trio

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from consumer import ProducerConfig, open_producer
from protocol import CreateTopicRequest, FetchRequest, FetchResponse
from protocol.records import Record, decode_record, encode_record
from transport.connect import connect_any, open_channel
from transport.security import ClientSecurity

VALUE_BYTES = 100


def emit(**figure: object) -> None:
    print(json.dumps(figure), flush=True)


def baseline(path: Path, records: int, batch: int, fsync: bool) -> tuple[float, float, float]:
    """Records/s appending the encoded records to a file in batches, reading the bytes back, and
    reading them back as records (decoded and CRC-checked, as any reader of the files must)."""
    one = encode_record(Record(offset=0, timestamp_ms=0, key=None, value=b"x" * VALUE_BYTES))
    chunk = one * batch
    start = time.perf_counter()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    for _ in range(records // batch):
        os.write(fd, chunk)
        if fsync:
            os.fsync(fd)
    os.close(fd)
    write_rate = records / (time.perf_counter() - start)
    start = time.perf_counter()
    with open(path, "rb") as f:
        while f.read(1024 * 1024):
            pass
    read_rate = records / (time.perf_counter() - start)
    start = time.perf_counter()
    data = path.read_bytes()
    pos = 0
    while pos < len(data):
        _, pos = decode_record(data, pos)
    decoded_rate = records / (time.perf_counter() - start)
    return write_rate, read_rate, decoded_rate


def start_broker(data_dir: Path, fsync: str) -> tuple[subprocess.Popen[bytes], int]:
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "cli",
            "--log-level",
            "WARNING",
            "serve",
            "--port",
            "0",
            "--data-dir",
            str(data_dir),
            "--fsync",
            fsync,
        ],
        stdout=subprocess.PIPE,
        cwd=Path(__file__).resolve().parents[1],
    )
    assert process.stdout is not None
    line = process.stdout.readline().decode()
    match = re.search(r"serving on \S+:(\d+)", line)
    if match is None:
        process.kill()
        raise SystemExit(f"broker did not start: {line!r}")
    return process, int(match.group(1))


async def client_rates(
    port: int, records: int, batch: int, *, security: ClientSecurity | None = None
) -> tuple[float, float]:
    """(records/s produced, records/s fetched) by one client, connecting as ``security`` says."""
    address = ("127.0.0.1", port)
    connect = (security or ClientSecurity()).connector()
    stream, _ = await connect_any([address], connect=connect)
    async with open_channel(stream, client_id="bench") as channel:
        await channel.request(CreateTopicRequest(topic="bench", partitions=1))
        value = b"x" * VALUE_BYTES
        config = ProducerConfig(linger=0.02, max_batch_records=batch)
        start = time.perf_counter()
        async with open_producer([address], config=config, connect=connect) as producer:
            for _ in range(records):
                await producer.enqueue("bench", value)
            await producer.flush()
        produce_rate = records / (time.perf_counter() - start)

        start = time.perf_counter()
        offset = 0
        while offset < records:
            response = await channel.request(
                FetchRequest(topic="bench", partition=0, offset=offset, max_bytes=1024 * 1024)
            )
            assert isinstance(response, FetchResponse) and response.records
            offset = response.records[-1].offset + 1
        consume_rate = records / (time.perf_counter() - start)
    return produce_rate, consume_rate


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=100_000)
    parser.add_argument("--batch", type=int, default=2000, help="producer's max batch records")
    parser.add_argument("--fsync", choices=["always", "interval", "never"], default="always")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        write_rate, read_rate, decoded_rate = baseline(
            Path(tmp) / "baseline.log", args.records, args.batch, args.fsync == "always"
        )
        process, port = start_broker(Path(tmp) / "data", args.fsync)
        try:
            produce_rate, consume_rate = trio.run(client_rates, port, args.records, args.batch)
        finally:
            process.terminate()
            process.wait(10)
    common = {"records": args.records, "value_bytes": VALUE_BYTES, "fsync": args.fsync}
    emit(
        benchmark="throughput",
        figure="produce_records_per_s",
        value=round(produce_rate),
        unit="records/s",
        baseline=round(write_rate),
        baseline_is="appending the encoded records to a file",
        ratio=round(produce_rate / write_rate, 4),
        **common,
    )
    emit(
        benchmark="throughput",
        figure="consume_records_per_s",
        value=round(consume_rate),
        unit="records/s",
        baseline=round(read_rate),
        baseline_is="reading the file's bytes",
        ratio=round(consume_rate / read_rate, 4),
        **common,
    )
    emit(
        benchmark="throughput",
        figure="consume_records_per_s_vs_decoding_the_file",
        value=round(consume_rate),
        unit="records/s",
        baseline=round(decoded_rate),
        baseline_is="reading the file and decoding its records",
        ratio=round(consume_rate / decoded_rate, 4),
        **common,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
