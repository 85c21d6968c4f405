"""The Spark pipeline over TLS with SCRAM: a real local Spark reads a topic from a broker whose
only listener is SASL_SSL, writes totals back through the sink, and commits the group's offsets,
each connecting with the options of ``pipeline.client_security``."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trio

from consumer import open_producer
from consumer.admin import open_admin
from pipeline import GroupOffsetCommitter, client_security, commit_group_offsets
from pipeline.local import local_broker, local_spark
from tests.security.conftest import Certificates
from transport.connect import parse_bootstrap
from transport.security import ClientSecurity

pytestmark = pytest.mark.realtime

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def spark() -> Iterator[Any]:
    session = local_spark("security-tests")
    yield session
    session.stop()


def test_the_spark_source_and_sink_run_over_tls_with_scram(
    tmp_path: Path, certificates: Certificates, spark: Any
) -> None:
    data_dir = tmp_path / "broker"
    subprocess.run(
        [sys.executable, "-m", "cli", "users", "add", "spark", "--data-dir", str(data_dir),
         "--password-stdin"],
        input=b"pw\n", check=True, timeout=60, cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )  # fmt: skip
    options = {
        "tls.ca": str(certificates.ca),
        "sasl.mechanism": "SCRAM-SHA-256",
        "sasl.user": "spark",
        "sasl.password": "pw",
    }
    security = client_security(options)
    assert security == ClientSecurity(
        ca=certificates.ca, sasl_mechanism="SCRAM-SHA-256", username="spark", password="pw"
    )
    with local_broker(
        data_dir,
        "--listener=SASL_SSL://127.0.0.1:0",
        *certificates.server_options,
        "--super-users=User:spark",
    ) as bootstrap:

        async def prepare() -> None:
            async with open_admin(parse_bootstrap(bootstrap), security=security) as admin:
                await admin.create_topic("events", 3)
                await admin.create_topic("copies", 1)
            async with open_producer(parse_bootstrap(bootstrap), security=security) as producer:
                for i in range(300):
                    await producer.enqueue("events", f"v{i}".encode(), f"k{i}".encode())

        trio.run(prepare)
        reader = spark.read.format("coordinator").option("bootstrap", bootstrap)
        for key, value in options.items():
            reader = reader.option(key, value)
        events = reader.option("topic", "events").load()
        values = sorted(row.value.decode() for row in events.collect())
        assert values == sorted(f"v{i}" for i in range(300))

        writer = events.select("key", "value").write.format("coordinator")
        for key, value in options.items():
            writer = writer.option(key, value)
        writer.option("bootstrap", bootstrap).option("topic", "copies").mode("append").save()
        copies = reader.option("topic", "copies").load()
        assert copies.count() == 300

        commit_group_offsets(bootstrap, "job", {"events": {"0": 1}}, security)
        GroupOffsetCommitter(bootstrap, "job", "q", security)  # takes the same settings

        async def committed() -> int:
            async with open_admin(parse_bootstrap(bootstrap), security=security) as admin:
                report = await admin.describe_group("job")
            return sum(p.committed for p in report.partitions if p.committed > 0)

        assert trio.run(committed) == 1
        # without the options the source cannot even plan the read
        with pytest.raises(Exception, match=r"closed the connection|ILLEGAL_SASL_STATE|refused"):
            spark.read.format("coordinator").option("bootstrap", bootstrap).option(
                "topic", "events"
            ).load().count()
