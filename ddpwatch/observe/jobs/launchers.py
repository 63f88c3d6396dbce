"""Who launched a process, and what rank that makes it, as discovery reads the
table of launchers (ddpwatch/launchers.py, where each launcher's conventions and
the traces it leaves are). Pure over command lines and allow-listed
environments (probes/process.py ENV_ALLOW); discovery.py puts them together.

Everything here is a claim of another user's process: numbers are parsed
strictly (`number`: digits only, bounded), anything else is "unknown" (-1).
"""
from __future__ import annotations

import os

from ... import launchers as T
from ...launchers import (MAX_RANK, SPAWN_MAIN, is_lightning_child, is_python,
                          is_spawn_child, number)

__all__ = ["MAX_RANK", "SPAWN_MAIN", "is_lightning_child", "is_python", "is_spawn_child",
           "number", "is_python_exe", "MP_HELPERS", "is_mp_helper", "launcher_of",
           "launcher_kind", "env_rank", "says_rank", "local_rank_arg", "peers_of", "group_key"]

# multiprocessing's own helpers: children of a spawning parent that are no rank
MP_HELPERS = ("multiprocessing.resource_tracker", "multiprocessing.semaphore_tracker",
              "multiprocessing.forkserver")

_BY_TEST = tuple(e for e in T.TABLE if e.argv and e.argv.test)
_BY_PROGRAM = tuple(e for e in T.TABLE if e.argv and e.argv.programs and not e.argv.words)
_BY_WORDS = tuple(e for e in T.TABLE if e.argv and e.argv.words)
# console scripts run by name (`exec -a`, a frozen binary): their words count as a Python
# process's do
_SCRIPTS = frozenset(p for e in _BY_WORDS for p in e.argv.programs)
_WINDOW = 4  # launcher words lie within argv's first four arguments
_RANK_ENV_TESTS = tuple(e.rank_env for e in T.TABLE if e.rank_env)
_PEERS = tuple(e for e in T.TABLE if e.shape == "peers")


def is_python_exe(exe: str) -> bool:
    """The executable (/proc/PID/exe's target) is a Python interpreter: python,
    python3, python3.11, python3.13t, a venv's copy of one."""
    return os.path.basename(exe).startswith(("python", "pypy"))


def launcher_of(cmdline: tuple[str, ...]) -> T.Launcher | None:
    """The table's entry whose launcher process this command line is, else None
    (ddpwatch/launchers.py `Argv` says in which order they are asked)."""
    if not cmdline:
        return None
    for entry in _BY_TEST:
        if entry.argv.test(cmdline):
            return entry
    base0 = os.path.basename(cmdline[0])
    for entry in _BY_PROGRAM:
        if base0 in entry.argv.programs:
            return entry
    if not (is_python(cmdline) or base0 in _SCRIPTS):
        return None
    head = cmdline[:_WINDOW]
    for i in range(len(head)):
        for entry in _BY_WORDS:
            if any(_words_at(head, i, words) for words in entry.argv.words):
                return entry
    return None


def _words_at(head: tuple[str, ...], i: int, words: tuple[str, ...]) -> bool:
    if i + len(words) > len(head):
        return False
    first = head[i] if words[0].startswith("-") else os.path.basename(head[i])
    return first == words[0] and head[i + 1:i + len(words)] == words[1:]


def launcher_kind(cmdline: tuple[str, ...]) -> str:
    """"torchrun", "accelerate", "deepspeed", "mpirun"... (the table's kind) for
    the launcher process itself (not `timeout 30 torchrun ...` or a shell around
    it), else ""."""
    entry = launcher_of(cmdline)
    return entry.kind if entry else ""


def is_mp_helper(cmdline: tuple[str, ...]) -> bool:
    return is_python(cmdline) and any(h in a for a in cmdline[1:4] for h in MP_HELPERS)


def env_rank(env: dict[str, str]) -> tuple[int, int, str]:
    """(rank, world size, source) from the first of the table's sets of variables
    that numbers a rank in the exec-time environment, (-1, -1, "") if none does.
    The world is that set's own, else torch's WORLD_SIZE."""
    for names in T.ENVS:
        rank = number(env.get(names.rank)) if names.rank else -1
        if rank >= 0:
            world = number(env.get(names.world_size))
            if world < 0:
                world = number(env.get(T.TORCH.world_size))
            return rank, world, names.rank
    return -1, -1, ""


def says_rank(env: dict[str, str]) -> bool:
    """The environment names a rank by any launcher's convention."""
    return env_rank(env)[0] >= 0 or any(test(env) for test in _RANK_ENV_TESTS)


def local_rank_arg(cmdline: tuple[str, ...],
                   flags: tuple[str, ...] = T.entry("deepspeed").rank_flags) -> int:
    """`--local_rank=i` / `--local-rank i` (DeepSpeed's launcher, torch.distributed.launch)."""
    for i, arg in enumerate(cmdline[1:], 1):
        name, eq, value = arg.partition("=")
        if name in flags:
            return number(value if eq else (cmdline[i + 1] if i + 1 < len(cmdline) else None))
    return -1


def peers_of(env: dict[str, str]) -> T.Launcher | None:
    """The launcherless entry ("peers" shape) whose variables this environment
    carries: srun's step, else a master's address and world size."""
    for entry in _PEERS:
        if all(name in env for name in entry.needs or entry.peers):
            return entry
    return None


def group_key(env: dict[str, str]) -> tuple | None:
    """What the ranks of one job started by hand or by a scheduler share in their
    environment (`peers_of`'s variables), with its kind first."""
    entry = peers_of(env)
    return None if entry is None else (entry.kind,) + tuple(env.get(n, "") for n in entry.peers)
