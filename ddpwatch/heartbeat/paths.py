"""Where heartbeat records live. Shared by the writer (ranks) and readers (daemon).

By default every user writes in a directory of their own, `/dev/shm/ddpwatch/<uid>`,
under a shared parent that is root's (made by a root daemon or rank, or by
systemd-tmpfiles: `d /dev/shm/ddpwatch 1777 root root`), sticky and world-writable
like /tmp: nobody but root and its owner can remove or rename a user's
directory there. Names can still be taken first, in a sticky directory as in
/tmp: a parent that is a symlink or another user's directory (planted before
root made it) is refused, and the user's records go to `/dev/shm/ddpwatch-<uid>`
instead; a user's name taken by someone else (a link, their directory) makes
the writer use its own `<name>.<random>` beside it (mkdtemp: a name nobody can
guess first), and reuse it later. The readers list all of these, each only
when it is a real directory owned by the uid its name says (`user_dirs`).
Every directory is made without following links (O_NOFOLLOW|O_DIRECTORY),
must be its writer's own, and is set 0700 through its descriptor (fchmod), so
a link or a directory planted under its name is never written in nor chmodded.
"""
from __future__ import annotations

import os
import stat
import tempfile

from .layout import FILE_SUFFIX

ENV_DIR = "DDPWATCH_DIR"
SHM_DIR = "/dev/shm/ddpwatch"


def shared_parent() -> str:
    """/dev/shm/ddpwatch, else <tmp>/ddpwatch when /dev/shm is absent."""
    if os.path.isdir("/dev/shm"):
        return SHM_DIR
    return os.path.join(tempfile.gettempdir(), "ddpwatch")


def default_dir() -> str:
    """`$DDPWATCH_DIR`, else this user's directory under the shared parent."""
    env = os.environ.get(ENV_DIR)
    if env:
        return env
    return os.path.join(shared_parent(), str(os.getuid()))


MAX_USER_DIRS = 256  # users with records on one node; beyond, a directory is not listed


def user_dirs(parent: str | None = None) -> tuple[str, ...]:
    """The per-user record directories a reader lists: `<parent>/<uid>`, the
    fallback `<parent>-<uid>`, and either's `.<random>` stand-ins, each only if
    it is a real directory (not a link) owned by the uid its name says and
    writable by nobody else."""
    parent = parent or shared_parent()
    out = []
    for base, prefix in ((parent, ""), (os.path.dirname(parent),
                                        os.path.basename(parent) + "-")):
        try:
            names = os.listdir(base)
        except OSError:
            continue
        for name in sorted(names):
            uid = name[len(prefix):].partition(".")[0]
            if not (name.startswith(prefix) and uid.isdigit() and len(uid) < 11):
                continue
            path = os.path.join(base, name)
            try:
                st = os.lstat(path)
            except OSError:
                continue
            if stat.S_ISDIR(st.st_mode) and st.st_uid == int(uid) and not st.st_mode & 0o022:
                out.append(path)
                if len(out) >= MAX_USER_DIRS:
                    return tuple(out)
    return tuple(out)


def record_dirs(configured: str | None, named=()) -> tuple[str, ...]:
    """Where to look for records: the reader's own directory (`configured`, else
    the default), then the ones the ranks name in their DDPWATCH_DIR. A trainer
    started with its own DDPWATCH_DIR is still found by a daemon or a diagnose that
    was not told. A relative name is left out: it is relative to the rank's working
    directory, not the reader's."""
    if configured:
        dirs = [configured]
    else:  # the shared parent itself (records of older writers), then every user's
        dirs = [shared_parent(), *user_dirs()]
    seen = {os.path.realpath(d) for d in dirs}
    for name in sorted(set(named)):
        real = os.path.realpath(name)
        if os.path.isabs(name) and real not in seen:
            seen.add(real)
            dirs.append(name)
    return tuple(dirs)


class SquattedError(PermissionError):
    """A directory of ours by name is a link, or someone else's."""


_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def _own_dir(path: str) -> None:
    """Make `path` a 0700 directory of this user, never following a link at its
    end: one planted there raises SquattedError naming it."""
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    try:
        fd = os.open(path, _DIR_FLAGS)
    except OSError as err:  # ELOOP: a symlink; ENOTDIR: a file
        raise SquattedError(f"{path} is not a directory of ours ({err.strerror}); set "
                            f"{ENV_DIR} to a directory of your own") from err
    try:
        st = os.fstat(fd)
        if st.st_uid != os.getuid():
            raise SquattedError(f"{path} is owned by uid {st.st_uid}, not {os.getuid()}; "
                                f"set {ENV_DIR} to a directory of your own")
        if stat.S_IMODE(st.st_mode) != 0o700:
            os.fchmod(fd, 0o700)
    finally:
        os.close(fd)


def _shared_parent_fd(parent: str) -> int:
    """An fd of the shared parent, made root's-or-ours, sticky and world-writable
    when missing; SquattedError when it is a link or another user's, or writable
    by others without the sticky bit (they could rename our directory away)."""
    try:
        os.mkdir(parent, 0o700)  # opened to everyone below, once it is known to be ours
    except FileExistsError:
        pass
    try:
        fd = os.open(parent, _DIR_FLAGS)
    except OSError as err:
        raise SquattedError(f"{parent} is not a directory ({err.strerror})") from err
    st = os.fstat(fd)
    if st.st_uid == os.getuid() and stat.S_IMODE(st.st_mode) == 0o700 and not os.listdir(fd):
        os.fchmod(fd, 0o1777)  # just made (or never used): open it to every user's directory
        st = os.fstat(fd)
    if st.st_uid not in (0, os.getuid()) or (st.st_mode & 0o022 and not st.st_mode & stat.S_ISVTX):
        os.close(fd)
        raise SquattedError(f"{parent} is owned by uid {st.st_uid} (mode "
                            f"{stat.S_IMODE(st.st_mode):o}): not a shared parent to trust")
    return fd


def prepare_dir(directory: str | None) -> str:
    """Make the run directory safely (the module's doc) and return its path:
    `directory` (or $DDPWATCH_DIR) as given, else this user's directory under the
    shared parent, or beside it when the parent is squatted. SquattedError
    (a PermissionError) when the directory is a link or another user's."""
    directory = directory or os.environ.get(ENV_DIR)
    if directory:  # the user's choice of place: its parents are made as asked
        os.makedirs(os.path.dirname(os.path.abspath(directory)), mode=0o700, exist_ok=True)
        _own_dir(directory)
        return directory
    parent, uid = shared_parent(), str(os.getuid())
    try:
        os.close(_shared_parent_fd(parent))
    except SquattedError:
        return _user_dir(os.path.dirname(parent), f"{os.path.basename(parent)}-{uid}")
    return _user_dir(parent, uid)


def _user_dir(base: str, name: str) -> str:
    """`base/name` made ours, or, when someone took that name, our own
    `base/name.<random>` (an earlier one reused)."""
    path = os.path.join(base, name)
    try:
        _own_dir(path)
        return path
    except SquattedError:
        pass
    for other in sorted(os.listdir(base)):
        if other.startswith(name + ".") and _ours(os.path.join(base, other)):
            return os.path.join(base, other)
    return tempfile.mkdtemp(prefix=name + ".", dir=base)  # 0700, ours, a fresh name


def _ours(path: str) -> bool:
    try:
        st = os.lstat(path)
    except OSError:
        return False
    return stat.S_ISDIR(st.st_mode) and st.st_uid == os.getuid() and not st.st_mode & 0o077


def record_path(directory: str, rank: int, pid: int) -> str:
    return os.path.join(directory, f"rank{rank}-pid{pid}{FILE_SUFFIX}")
