"""docs/testing.md shows tests/simulation/test_example.py verbatim; the two must not drift."""

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MARKER = "<!-- example: tests/simulation/test_example.py -->\n```python\n"


def test_the_documented_example_is_the_tested_one() -> None:
    doc = (ROOT / "docs" / "testing.md").read_text()
    assert MARKER in doc
    shown = doc.split(MARKER, 1)[1].split("```\n", 1)[0]
    assert shown == (ROOT / "tests" / "simulation" / "test_example.py").read_text()
