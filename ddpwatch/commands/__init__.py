"""One module per CLI command: each gathers its inputs, calls the pure code and prints."""
from __future__ import annotations

import sys


def load_rules(command: str, files) -> list:
    """The shipped rules with a command's `--rules` files on top; a file of the
    old format (`priority:`) loads, and stderr says what replaces it."""
    from ..judge import rules
    return rules.load_default(files or (), warn=lambda note: print(
        f"ddpwatch {command}: warning: {note}", file=sys.stderr))
