"""Where a client command (`status`, `diagnose --peer`) takes the daemon's token
from: a file (`--token-file`) or $DDPWATCH_TOKEN, never the command line, which
every user of the node reads (`ps`, /proc/PID/cmdline); the daemon reads its own
from its config file or the same variable (config.py ENV)."""
from __future__ import annotations

import os

from .. import errors

ON_ARGV = ("--token puts the token on the command line, where every user of this node "
           "reads it (ps, /proc/PID/cmdline): put it in a file only you can read and give "
           "--token-file FILE, or set $DDPWATCH_TOKEN")


def token(args) -> str:
    """The token to sign with ('' for none); UsageError (exit 2) when one was
    given on the command line, NoInput (exit 66) for a file that cannot be read."""
    if getattr(args, "token", None) is not None:
        raise errors.UsageError(ON_ARGV)
    path = getattr(args, "token_file", None)
    if path:
        try:
            with open(path, encoding="utf-8") as f:
                text = f.read(4096)
        except (OSError, UnicodeDecodeError) as err:
            raise errors.NoInput(f"--token-file {path}: cannot read it "
                                 f"({getattr(err, 'strerror', None) or err})") from err
        value = text.strip()
        if not value or "\n" in value:
            raise errors.NoInput(f"--token-file {path}: wants the token alone on one line")
        return value
    return os.environ.get("DDPWATCH_TOKEN", "")
