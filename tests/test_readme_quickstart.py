"""The README's commands work in the order a new user types them: the first ``coordinator``
command comes after the line that puts it on PATH, and the Spark section says how to install
the ``spark`` extra it needs."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
SHELL_BLOCK = re.compile(r"```sh\n(.*?)```", re.DOTALL)
RUNS_COORDINATOR = re.compile(r"(^|\| *|&& *)coordinator ")
PUTS_ON_PATH = re.compile(r"export PATH=\$PWD/\.venv/bin:\$PATH")


def _shell_lines() -> list[str]:
    return [line for block in SHELL_BLOCK.findall(README) for line in block.splitlines()]


def test_the_first_coordinator_command_comes_after_the_path_line() -> None:
    lines = _shell_lines()
    first = next(i for i, line in enumerate(lines) if RUNS_COORDINATOR.search(line))
    assert any(PUTS_ON_PATH.search(line) for line in lines[:first]), lines[first]


def test_the_spark_section_gives_the_install_command_of_the_spark_extra() -> None:
    spark = README.split("\n## Spark\n", 1)[1].split("\n## ", 1)[0]
    assert re.search(r"pip install -e '\.\[spark\]'", spark)
    # and the extra it names is the project's
    assert re.search(r"^spark = \[", (ROOT / "pyproject.toml").read_text(), re.MULTILINE)
