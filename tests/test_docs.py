"""The state diagrams in docs/ are rendered from the tables the code runs; they must not drift."""

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
