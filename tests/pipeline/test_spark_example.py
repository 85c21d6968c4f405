"""The Spark example's last line points somewhere that still exists after it ends."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "spark_pipeline.py"


def _example() -> ModuleType:
    spec = importlib.util.spec_from_file_location("spark_pipeline_example", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_closing_hint_names_no_broker_the_example_stopped() -> None:
    example = _example()
    own = example.closing_hint("127.0.0.1:40123", own_broker=True)
    assert "127.0.0.1:40123" not in own
    assert "stopped" in own and "--bootstrap" in own and "scripts/serve.sh" in own
    theirs = example.closing_hint("10.0.0.5:9092", own_broker=False)
    assert theirs == "coordinator groups describe example-pipeline --bootstrap 10.0.0.5:9092"
