"""Every program the docs show under ``<!-- example: PATH -->`` is the file at PATH word for word,
and that file runs in the suite (a test, or an example a test runs): the docs cannot drift."""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MARKER = re.compile(r"<!-- example: (\S+) -->\n```python\n(.*?)```\n", re.DOTALL)
DOCS = sorted((ROOT / "docs").glob("*.md"))


def shown(doc: Path) -> list[tuple[str, str]]:
    return MARKER.findall(doc.read_text())


def test_the_docs_show_the_examples_that_run() -> None:
    paths = {path for doc in DOCS for path, _ in shown(doc)}
    assert {
        "tests/simulation/test_example.py",
        "tests/simulation/test_user_code.py",
        "examples/produce_events.py",
        "examples/count_events.py",
    } <= paths


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_each_shown_example_is_the_file_itself(doc: Path) -> None:
    for path, code in shown(doc):
        assert code == (ROOT / path).read_text(), f"{doc.name} shows {path} differently"
