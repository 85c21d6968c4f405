"""protocol/ and statemachine/ must be usable where there is no event loop, socket or clock, so that
third-party clients and the deterministic driver can reuse them."""

import ast
import json
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
NEVER_LOADED = ("trio", "kazoo", "socket", "selectors", "asyncio", "ssl")
NEVER_IMPORTED = (*NEVER_LOADED, "threading", "time", "datetime", "random", "os")
SANS_IO_FILES = sorted(
    p for pkg in ("protocol", "statemachine") for p in (ROOT / pkg).rglob("*.py")
)


def _module_name(path: pathlib.Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def test_no_sans_io_module_imports_io_or_a_clock() -> None:
    offenders = []
    for path in SANS_IO_FILES:
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [node.module]
            offenders += [f"{path.name}: {n}" for n in names if n.split(".")[0] in NEVER_IMPORTED]
    assert offenders == []


def test_loading_every_sans_io_module_loads_no_event_loop_or_socket() -> None:
    modules = [_module_name(p) for p in SANS_IO_FILES]
    assert "protocol.connection" in modules and "statemachine.member" in modules
    probe = (
        "import importlib, json, sys\n"
        f"for name in {modules!r}: importlib.import_module(name)\n"
        "print(json.dumps(sorted(sys.modules)))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], cwd=ROOT, check=True, capture_output=True, text=True
    ).stdout
    loaded = {name.split(".")[0] for name in json.loads(out)}
    assert not loaded & set(NEVER_LOADED), sorted(loaded & set(NEVER_LOADED))
