"""How a string a client chose is shown to a person: in a log line, a CLI table, the status page.

Group, member and client ids, hosts and patterns come from the network. The broker refuses ids
with control characters and line breaks (coordinator/validation.py), but not every string is an
id, and an id may still hold characters a person cannot see: a right-to-left override (U+202E) or
isolate (U+2066-U+2069) reorders what follows it, a zero-width space or joiner (U+200B-U+200D,
U+2060, U+FEFF) makes two ids that look alike differ. Every character ``str.isprintable`` refuses
(the control, format, separator and unassigned categories, which hold all of these) is written as
``repr`` writes it, ``\\u202e``, so a person sees that it is there. Backslashes are left alone
(regex patterns stay readable).
"""

from __future__ import annotations

__all__ = ["escape_unprintable"]


def escape_unprintable(text: str) -> str:
    """``text`` with every non-printable character escaped as ``repr`` escapes it."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)
