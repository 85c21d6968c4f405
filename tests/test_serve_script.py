"""``scripts/serve.sh`` installs what the README says it does: the project alone into .venv,
nothing from Debian and no extras, even as root on a machine without the test suite's packages.

The script runs for real, in a copy of scripts/ and pyproject.toml, with every command that
would install something replaced by one that records how it was called: ``.venv/bin/python``
(pip), ``apt-get``, and ``id`` saying we are root; PATH holds nothing else but the few tools
the scripts read with, so neither java nor chromium is there to be found.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from launch.processes import REPO

RECORDER = """#!/bin/bash
echo "$(basename "$0") $*" >> "{calls}"
"""
TOOLS = ("bash", "cat", "sha1sum", "cut", "dirname", "touch", "basename")


def test_serve_sh_installs_the_project_alone_and_no_debian_package(tmp_path: Path) -> None:
    checkout = tmp_path / "checkout"
    shutil.copytree(REPO / "scripts", checkout / "scripts")
    shutil.copy(REPO / "pyproject.toml", checkout)
    calls = tmp_path / "calls"
    recorder = RECORDER.format(calls=calls)
    bin_dir = tmp_path / "bin"
    venv_bin = checkout / ".venv" / "bin"
    for directory, names in ((bin_dir, ("apt-get",)), (venv_bin, ("python", "coordinator"))):
        directory.mkdir(parents=True)
        for name in names:
            (directory / name).write_text(recorder)
            (directory / name).chmod(0o755)
    (bin_dir / "id").write_text("#!/bin/bash\necho 0\n")
    (bin_dir / "id").chmod(0o755)
    for tool in TOOLS:
        found = shutil.which(tool)
        assert found is not None, tool
        os.symlink(found, bin_dir / tool)

    done = subprocess.run(
        [str(bin_dir / "bash"), "scripts/serve.sh", "--port", "0"],
        cwd=checkout,
        env={"PATH": str(bin_dir), "HOME": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )

    assert done.returncode == 0, done.stderr
    assert calls.read_text().splitlines() == [
        "python -m pip install -q --upgrade pip",
        "python -m pip install -q -e .",
        "coordinator serve --port 0",
    ]
