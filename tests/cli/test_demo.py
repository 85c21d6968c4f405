"""``examples/demo.py`` runs from start to end as the README says: a smoke test of the whole CLI."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from launch.processes import REPO
from tests.cli.cli_process import ENV

pytestmark = pytest.mark.realtime

DEMO = REPO / "examples" / "demo.py"
#: The demo takes well under 30 s on a quiet machine; CI has two busy cores.
DEMO_TIMEOUT = 120.0


def run_demo(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(DEMO), *args],
        capture_output=True,
        text=True,
        timeout=DEMO_TIMEOUT,
        cwd=REPO,
        env=ENV,
        check=False,
    )


def test_demo_tells_the_story_and_exits_0(tmp_path: Path) -> None:
    done = run_demo("--data-dir", str(tmp_path / "data"), "--records", "1200")
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stderr == ""
    out = done.stdout
    assert "all 1200 records printed" in out
    assert re.search(r"kill -9 -> Stable with 2 members: \d+\.\d\d s", out)
    assert re.search(r"group demo-group: Stable, generation \d+, 3 members", out)
    assert re.search(r"group demo-group: Stable, generation \d+, 2 members", out)
    assert "all 200 printed by the two survivors" in out
    assert out.rstrip().endswith("done: nothing lost, lag 0, everything stopped cleanly")
    assert (tmp_path / "data").is_dir()


def test_demo_fails_with_one_line(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    done = run_demo("--data-dir", str(blocker / "data"))
    assert done.returncode == 1
    assert re.fullmatch(r"demo: the broker did not start: .*Not a directory.*\n", done.stderr)
