"""Text for a person's terminal, from fields other users control.

Run ids, hostnames, command lines and paths come from ranks other users own:
printed raw, an ESC sequence in a run id moves the cursor or rewrites what a
person reads. Every command that prints such text passes it here."""
from __future__ import annotations

import unicodedata


def printable(text: str) -> str:
    """`text` safe for a terminal: control and format characters (ESC, CR, BEL,
    newlines, bidi overrides...) shown escaped."""
    return "".join(c if not unicodedata.category(c).startswith("C") else
                   (f"\\x{ord(c):02x}" if ord(c) < 0x100 else f"\\u{ord(c):04x}")
                   for c in text)


def printable_lines(text: str) -> str:
    """Multi-line `text` with each line made printable (its own newlines kept)."""
    return "\n".join(printable(line) for line in text.split("\n"))
