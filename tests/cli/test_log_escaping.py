"""Ids and names in log lines are escaped: a newline in a member id cannot forge a record. The CLI's
logging setup, in-process, with the coordinator's own registration line."""

from __future__ import annotations

import io
import logging
from collections.abc import Iterator

import pytest

from cli.logformat import EscapingFormatter, configure_logging
from cli.main import main
from tests.support.invisible import DISGUISED, INVISIBLE, shown_escaped


@pytest.fixture
def cli_log() -> Iterator[io.StringIO]:
    """What ``coordinator serve`` writes to stderr, for the span of a test."""
    stream = io.StringIO()
    root = logging.getLogger()
    level = root.level
    handler = configure_logging("INFO", stream)
    try:
        yield stream
    finally:
        root.removeHandler(handler)
        root.setLevel(level)


def test_a_newline_in_a_member_id_does_not_forge_a_log_line(cli_log: io.StringIO) -> None:
    member_id = "x\nINFO forged line"
    # The line GroupCoordinator.register logs when a member joins.
    logging.getLogger("coordinator.group_coordinator").info("group %s: %s joined", "g", member_id)
    lines = cli_log.getvalue().splitlines()
    assert len(lines) == 1
    assert lines[0].endswith(
        r"INFO coordinator.group_coordinator: group g: x\nINFO forged line joined"
    )


def test_other_invisible_characters_are_escaped_and_printable_ones_kept(
    cli_log: io.StringIO,
) -> None:
    logging.getLogger("coordinator").warning(
        "%s|%s|%s", "\x1b[2Jcleared\r", "a\u202eb\u2028c", r"größe\d+ ✓"
    )
    (line,) = cli_log.getvalue().splitlines()
    assert line.endswith(r"\x1b[2Jcleared\r|a\u202eb\u2028c|größe\d+ ✓")


def test_bidirectional_and_zero_width_characters_are_escaped(cli_log: io.StringIO) -> None:
    logging.getLogger("coordinator").info("group %s: %s joined", DISGUISED, INVISIBLE)
    (line,) = cli_log.getvalue().splitlines()
    assert [c for c in INVISIBLE if c in line] == []
    assert line.endswith(f"group {shown_escaped(DISGUISED)}: {shown_escaped(INVISIBLE)} joined")


def test_a_traceback_keeps_its_lines_and_cannot_forge_one(cli_log: io.StringIO) -> None:
    try:
        raise ValueError("boom for m\n2026-01-01 INFO forged line")
    except ValueError:
        logging.getLogger("coordinator").exception("member %s failed", "m\n1")
    first, *traceback = cli_log.getvalue().splitlines()
    assert first.endswith(r"member m\n1 failed")
    assert traceback[0] == "  Traceback (most recent call last):"
    assert traceback[-2:] == ["  ValueError: boom for m", "  2026-01-01 INFO forged line"]
    # Every record starts at column 0; nothing a traceback carries does.
    assert all(line.startswith("  ") for line in traceback)


def test_the_cli_logs_through_the_escaping_formatter() -> None:
    root = logging.getLogger()
    before, level = list(root.handlers), root.level
    try:
        assert main(["groups", "list", "--bootstrap", "127.0.0.1:1"]) == 1  # nobody listens
        added = [handler for handler in root.handlers if handler not in before]
        assert [type(handler.formatter) for handler in added] == [EscapingFormatter]
    finally:
        for handler in root.handlers[:]:
            if handler not in before:
                root.removeHandler(handler)
        root.setLevel(level)


def test_an_error_line_shows_invisible_characters_escaped(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A verb's error may carry an id the broker or the user gave: its one line is escaped."""

    async def refused(args: object) -> None:
        raise ValueError(f"no group {DISGUISED}\nforged line")

    monkeypatch.setattr("cli.main.run_admin", refused)
    root = logging.getLogger()
    before, level = list(root.handlers), root.level
    try:
        assert main(["groups", "describe", "g"]) == 2
    finally:
        for handler in root.handlers[:]:
            if handler not in before:
                root.removeHandler(handler)
        root.setLevel(level)
    assert capsys.readouterr().err == (
        f"coordinator: no group {shown_escaped(DISGUISED)}\\nforged line\n"
    )
