"""Where heartbeat records live. Shared by the writer (ranks) and readers (daemon)."""
from __future__ import annotations

import os
import stat
import tempfile

from .layout import FILE_SUFFIX

ENV_DIR = "DDPWATCH_DIR"
SHM_DIR = "/dev/shm/ddpwatch"


def default_dir() -> str:
    """`$DDPWATCH_DIR`, else /dev/shm/ddpwatch, else <tmp>/ddpwatch when /dev/shm is absent."""
    env = os.environ.get(ENV_DIR)
    if env:
        return env
    if os.path.isdir("/dev/shm"):
        return SHM_DIR
    return os.path.join(tempfile.gettempdir(), "ddpwatch")


def record_dirs(configured: str | None, named=()) -> tuple[str, ...]:
    """Where to look for records: the reader's own directory (`configured`, else
    the default), then the ones the ranks name in their DDPWATCH_DIR. A trainer
    started with its own DDPWATCH_DIR is still found by a daemon or a diagnose that
    was not told. A relative name is left out: it is relative to the rank's working
    directory, not the reader's."""
    dirs = [configured or default_dir()]
    seen = {os.path.realpath(dirs[0])}
    for name in sorted(set(named)):
        real = os.path.realpath(name)
        if os.path.isabs(name) and real not in seen:
            seen.add(real)
            dirs.append(name)
    return tuple(dirs)


def prepare_dir(directory: str | None) -> str:
    """Create the run directory 0700 if needed; refuse one another user owns."""
    directory = directory or default_dir()
    os.makedirs(directory, mode=0o700, exist_ok=True)
    st = os.stat(directory)
    if not stat.S_ISDIR(st.st_mode):
        raise NotADirectoryError(directory)
    if st.st_uid != os.getuid():
        raise PermissionError(f"{directory} is owned by uid {st.st_uid}, not {os.getuid()}; "
                              f"set {ENV_DIR} to a directory of your own")
    if st.st_mode & 0o077:
        os.chmod(directory, 0o700)
    return directory


def record_path(directory: str, rank: int, pid: int) -> str:
    return os.path.join(directory, f"rank{rank}-pid{pid}{FILE_SUFFIX}")
