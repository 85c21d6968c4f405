"""Log lines that a client cannot forge.

Group, member and client ids, topic names and patterns come from the network and end up in log
messages. A newline in one would start what looks like a new record (``x\\nINFO forged line``), and
other control or invisible characters (an ANSI escape, a right-to-left override, U+2028) can hide
or rewrite what an operator reads. Escaping every log call would need every call site to get it
right, in code several people edit; the formatter escapes instead, once, for every record: after
the message is interpolated, any character that is not printable is written as ``repr`` writes it
(a newline as ``\\n``, ESC as ``\\x1b``: :mod:`protocol.shown`, as on the status page and in the
CLI's tables). So one record is one line, except a traceback, which the formatter appends after
the escaped line with every one of its lines indented: an exception message that carries a
client's id may still hold a newline, but what follows it cannot start at column 0, where every
record starts. Backslashes are left alone (regex patterns stay readable), so a literal
backslash-n in an id looks like an escaped newline but cannot start a line.

The CLI installs it (``configure_logging``). A program that embeds the coordinator, or a test that
wants the same lines, puts :class:`EscapingFormatter` on its own handler:
``handler.setFormatter(EscapingFormatter(LOG_FORMAT))``. ``caplog.records`` keep the raw
arguments, which is what a test asserting on an id wants.
"""

from __future__ import annotations

import logging
from types import TracebackType
from typing import TextIO, TypeAlias

from protocol.shown import escape_unprintable

_ExcInfo: TypeAlias = (
    tuple[type[BaseException], BaseException, TracebackType | None] | tuple[None, None, None]
)

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class EscapingFormatter(logging.Formatter):
    """A Formatter whose line (message and every other field) has no unprintable character."""

    def formatMessage(self, record: logging.LogRecord) -> str:
        # Formatter.format appends the traceback and stack after this, so they stay as they are.
        return escape_unprintable(super().formatMessage(record))

    def format(self, record: logging.LogRecord) -> str:
        # Another handler may have cached its own rendering of the traceback on the record.
        cached, record.exc_text = record.exc_text, None
        try:
            return super().format(record)
        finally:
            record.exc_text = cached

    def formatException(self, ei: _ExcInfo) -> str:
        return _indent(super().formatException(ei))

    def formatStack(self, stack_info: str) -> str:
        return _indent(super().formatStack(stack_info))


def _indent(text: str) -> str:
    return "\n".join("  " + escape_unprintable(line) for line in text.split("\n"))


def configure_logging(level: str, stream: TextIO) -> logging.Handler:
    """What the CLI does for every command: one handler on the root logger, escaping. Returns
    the handler (a test removes it again)."""
    handler = logging.StreamHandler(stream)
    handler.setFormatter(EscapingFormatter(LOG_FORMAT))
    root = logging.getLogger()
    root.addHandler(handler)
    root.setLevel(level)
    return handler
