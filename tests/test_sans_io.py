"""protocol/ and statemachine/ must be importable where there is no event loop, socket or clock,
so that third-party clients and the deterministic driver can reuse them (DESIGN.md)."""

import json
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
FORBIDDEN = ("trio", "kazoo", "socket", "threading", "time", "selectors", "asyncio")


def _sans_io_modules() -> list[str]:
    modules = []
    for package in ("protocol", "statemachine"):
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            modules.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return modules


def test_sans_io_packages_load_no_io_or_clock_module() -> None:
    modules = _sans_io_modules()
    assert "protocol.connection" in modules and "statemachine.member" in modules
    probe = (
        "import importlib, json, sys\n"
        f"before = set(sys.modules)\n"
        f"for name in {modules!r}: importlib.import_module(name)\n"
        f"print(json.dumps(sorted(set(sys.modules) - before)))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], cwd=ROOT, check=True, capture_output=True, text=True
    ).stdout
    loaded = set(json.loads(out))
    assert not loaded & set(FORBIDDEN), sorted(loaded & set(FORBIDDEN))
    assert not any(name.startswith(("trio.", "kazoo.")) for name in loaded)
