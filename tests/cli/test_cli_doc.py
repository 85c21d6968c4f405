"""docs/cli.md lists every verb and option of ``coordinator``, each with its default, and names
none that the parser does not take: the argument parser is walked, not a list kept by hand.

A verb is a ``### `coordinator VERB` `` section; its table's first column names its options
(and its positional arguments in capitals); "Takes the [client options]" or "[offline store
options]" adds the options of those shared sections. The global options are in their own.
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

from cli.main import _parser

DOC = Path(__file__).resolve().parents[2] / "docs" / "cli.md"
SECTION = re.compile(r"^#{2,3} (.+)$", re.MULTILINE)
NAMED = re.compile(r"`(--?[\w-]+|[A-Z][A-Z_]*)`")
#: argparse's own, on every parser; the global options are checked where they are defined.
EVERYWHERE = {"--help", "-h", "--log-level"}


def _names(action: argparse.Action) -> set[str]:
    if action.option_strings:
        return set(action.option_strings)
    return {str(action.metavar or action.dest).upper()}


def _leaves(
    parser: argparse.ArgumentParser, path: tuple[str, ...] = ()
) -> dict[str, argparse.ArgumentParser]:
    found: dict[str, argparse.ArgumentParser] = {}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                found |= _leaves(sub, (*path, name)) or {" ".join((*path, name)): sub}
    return found


def _taken(parser: argparse.ArgumentParser) -> set[str]:
    names: set[str] = set()
    for action in parser._actions:
        if not isinstance(action, argparse._SubParsersAction):
            names |= _names(action)
    return names - EVERYWHERE


def _sections() -> dict[str, str]:
    text = DOC.read_text()
    heads = list(SECTION.finditer(text))
    return {
        head.group(1): text[head.end() : nxt.start() if nxt else len(text)]
        for head, nxt in zip(heads, [*heads[1:], None], strict=True)
    }


def _rows(section: str) -> list[list[str]]:
    rows = [line.split(" | ") for line in section.splitlines() if line.startswith("| `")]
    for row in rows:
        assert len(row) == 4, f"option | default | what it does | Kafka; rpk: {row}"
        assert all(cell.strip(" |") for cell in row), f"an empty cell: {row}"
    return rows


def _documented(section: str, shared: dict[str, set[str]]) -> set[str]:
    names = {name for row in _rows(section) for name in NAMED.findall(row[0])}
    for title, options in shared.items():
        if f"[{title}]" in section:
            names |= options
    return names


def test_the_doc_lists_every_verb_and_every_option_and_no_other() -> None:
    sections = _sections()
    shared = {
        title.lower(): _documented(sections[title], {})
        for title in ("Client options", "Offline store options")
    }
    parser = _parser()
    verbs = _leaves(parser)
    documented_verbs = {
        m.group(1) for title in sections if (m := re.fullmatch(r"`coordinator (.+)`", title))
    }
    assert documented_verbs == set(verbs), "docs/cli.md's verbs differ from the parser's"
    for verb, sub in verbs.items():
        section = sections[f"`coordinator {verb}`"]
        documented = _documented(section, shared)
        taken = _taken(sub)
        assert documented - taken == set(), f"{verb}: documented, not taken"
        assert taken - documented == set(), f"{verb}: taken, not documented"
    assert _documented(sections["Global options"], {}) == _taken(parser) | {"--log-level"}


def test_every_option_says_what_it_does_and_its_default() -> None:
    """In the parser too: ``--help`` shows what docs/cli.md shows."""
    for verb, sub in {"": _parser(), **_leaves(_parser())}.items():
        for action in sub._actions:
            if isinstance(action, argparse._SubParsersAction) or action.dest == "help":
                continue
            assert action.help, f"coordinator {verb} {sorted(_names(action))} has no help"
