"""A log directory's identity (``log-dir.metadata``): made once, kept, and made anew when the
directory is wiped, so that a replica on a wiped disk is not taken for the one that held the
records."""

from __future__ import annotations

import shutil
import uuid
from pathlib import Path

import pytest

from broker.log import LogFormatError, check_log_format, log_dir_id
from broker.log import format as format_module


def test_a_new_directory_gets_an_identity_it_keeps(tmp_path: Path) -> None:
    directory = tmp_path / "data" / "log"
    made = log_dir_id(directory)
    assert made.version == 4
    assert (directory / "log-dir.metadata").read_text() == f"directory.id={made}\n"
    assert log_dir_id(directory) == made
    assert log_dir_id(directory) == made


def test_a_wiped_directory_gets_a_new_identity(tmp_path: Path) -> None:
    directory = tmp_path / "data" / "log"
    check_log_format(directory)
    before = log_dir_id(directory)
    (directory / "t-0").mkdir()
    shutil.rmtree(tmp_path / "data")
    check_log_format(directory)
    after = log_dir_id(directory)
    assert after != before
    assert log_dir_id(directory) == after


def test_a_directory_made_before_identities_gets_one_and_keeps_its_format(tmp_path: Path) -> None:
    directory = tmp_path / "log"
    check_log_format(directory)
    (directory / "t-0").mkdir()
    (directory / "t-0" / f"{0:020d}.log").write_bytes(b"")
    made = log_dir_id(directory)
    assert log_dir_id(directory) == made
    # the format marker means what it meant: the identity is a file beside it
    assert (directory / "log-format").read_text() == "3\n"
    assert check_log_format(directory) == 3
    # and an empty directory that has an identity is still a new log to the format check
    fresh = tmp_path / "fresh"
    log_dir_id(fresh)
    assert check_log_format(fresh) == 3


@pytest.mark.parametrize("text", ["", "directory.id=\n", "directory.id=not-a-uuid\n", "\xff"])
def test_a_damaged_identity_refuses_the_start_with_what_to_do(tmp_path: Path, text: str) -> None:
    (tmp_path / "log-dir.metadata").write_text(text, encoding="latin-1")
    with pytest.raises(LogFormatError, match=r"delete it to give .* a new identity"):
        log_dir_id(tmp_path)
    assert (tmp_path / "log-dir.metadata").read_text(encoding="latin-1") == text


def test_a_crash_while_making_the_identity_leaves_none_or_the_whole_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def killed(path: Path, data: bytes) -> None:
        # what replace_atomically leaves if the process dies before its rename
        path.with_name(path.name + ".tmp").write_bytes(data[:7])
        raise OSError("killed")

    monkeypatch.setattr(format_module, "replace_atomically", killed)
    with pytest.raises(OSError, match="killed"):
        log_dir_id(tmp_path)
    monkeypatch.undo()
    assert not (tmp_path / "log-dir.metadata").exists()
    made = log_dir_id(tmp_path)  # the next start makes it whole
    assert (
        uuid.UUID((tmp_path / "log-dir.metadata").read_text().removeprefix("directory.id=").strip())
        == made
    )
    assert log_dir_id(tmp_path) == made
