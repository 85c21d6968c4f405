"""Characters a client may put in an id (the broker refuses only controls and line breaks in
ids) that a person cannot see where they are shown unescaped: the bidirectional overrides,
embeddings, isolates and marks, which reorder what follows them, and the zero-width characters,
which make two ids that look alike differ."""

BIDI = (
    "\u202a\u202b\u202c\u202d\u202e"  # embeddings, pop, overrides
    "\u2066\u2067\u2068\u2069"  # isolates
    "\u200e\u200f"  # left-to-right and right-to-left marks
)
ZERO_WIDTH = "\u200b\u200c\u200d\u2060\ufeff"
INVISIBLE = BIDI + ZERO_WIDTH
#: An id a client could choose that reads ``admin`` but is not, and reverses what follows it.
DISGUISED = "ad\u200bmin\u202egnp.exe"


def shown_escaped(text: str) -> str:
    """How ``text`` must appear: each invisible character as its ``\\uXXXX`` escape."""
    return "".join(f"\\u{ord(c):04x}" if c in INVISIBLE else c for c in text)
