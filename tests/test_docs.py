"""The docs must not drift from the code: state diagrams rendered from the tables the code runs,
and citations of docs/design.md that name its headings."""

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_state_diagrams_match_the_transition_tables() -> None:
    result = subprocess.run(
        [sys.executable, "scripts/render_state_diagrams.py", "--check"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def _anchors(markdown: str) -> set[str]:
    """The anchors GitHub gives the headings of a Markdown page."""
    anchors: set[str] = set()
    for line in markdown.splitlines():
        if line.startswith("#"):
            title = line.lstrip("#").strip().lower()
            anchors.add(re.sub(r"[^\w\- ]", "", title).replace(" ", "-"))
    return anchors


def test_citations_of_the_design_name_its_headings() -> None:
    # Code and docs cite the design by anchor; a renamed heading must not leave them dangling.
    # The frozen copies of old code (tests/statemachine/reference_*) cite the design as it was.
    design = ROOT / "docs" / "design.md"
    anchors = _anchors(design.read_text())
    cited: list[tuple[str, str]] = [
        (design.name, anchor) for anchor in re.findall(r"\]\(#([\w-]+)\)", design.read_text())
    ]
    for path in ROOT.rglob("*"):
        if path.suffix not in {".py", ".md"} or {".venv", ".git"} & set(path.parts):
            continue
        if any(part.startswith("reference_") for part in path.parts):
            continue
        for anchor in re.findall(r"design\.md#([\w-]+)", path.read_text()):
            cited.append((str(path.relative_to(ROOT)), anchor))
    dangling = [(where, anchor) for where, anchor in cited if anchor not in anchors]
    assert cited
    assert dangling == []
