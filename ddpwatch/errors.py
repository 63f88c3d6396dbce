"""Exit codes (sysexits-style, so scripts can tell them apart) and the errors
that carry them to the CLI boundary, where they become one clear line."""
from __future__ import annotations

OK = 0
PROBLEM_FOUND = 1
USAGE = 2
DATA = 65           # EX_DATAERR: `rules check` of a rule comparing a signal with a value
                    # it never takes (elsewhere a bad rule file, CONFIG)
NO_INPUT = 66       # EX_NOINPUT: an input file or directory that cannot be used
UNKNOWN = 67        # EX_NOUSER: a name nothing holds (`rules explain` of no rule's id)
UNAVAILABLE = 69    # EX_UNAVAILABLE: pid gone, not a Python process, nothing to judge
CANT_CREATE = 73    # EX_CANTCREAT: an output file that cannot be written
PROTOCOL = 76       # EX_PROTOCOL: what answered did not prove the token (signed/auth.py)
NO_PERMISSION = 77  # EX_NOPERM
CONFIG = 78         # EX_CONFIG: bad rules or config file


class DdpwatchError(Exception):
    """An error meant for the user: `str(err)` says what and where."""
    exit_code = PROBLEM_FOUND


class UsageError(DdpwatchError):
    exit_code = USAGE


class NoInput(DdpwatchError):
    exit_code = NO_INPUT


class Unknown(DdpwatchError):
    exit_code = UNKNOWN


class Unavailable(DdpwatchError):
    exit_code = UNAVAILABLE


class CantCreate(DdpwatchError):
    exit_code = CANT_CREATE


class Unproven(DdpwatchError):
    exit_code = PROTOCOL


class NoPermission(DdpwatchError):
    exit_code = NO_PERMISSION


class ConfigError(DdpwatchError):
    exit_code = CONFIG


class UndeclaredValue(ConfigError):
    """A rule compares a string signal with a value its declaration does not list
    (judge/signals/spec.py `one_of`): the rule could never match as written. A bad
    rule file to the daemon (CONFIG: the systemd unit's RestartPreventExitStatus);
    `rules check` tells it apart (DataError)."""


class DataError(DdpwatchError):
    exit_code = DATA
