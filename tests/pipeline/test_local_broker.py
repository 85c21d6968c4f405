"""The local broker the Spark example starts (``examples/spark_pipeline.py --out DIR``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipeline.local import local_broker

pytestmark = pytest.mark.realtime


def test_it_starts_under_a_directory_that_does_not_exist_yet(tmp_path: Path) -> None:
    out = tmp_path / "not" / "yet"
    with local_broker(out / "broker") as address:
        host, port = address.rsplit(":", 1)
        assert host == "127.0.0.1" and int(port) > 0
    assert (out / "broker.log").exists()
