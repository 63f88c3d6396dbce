"""Reading one small file as another process sees it, through /proc/PID/root.

A rank in a container or a namespace node has its own /etc/hosts (`ip netns
exec` bind-mounts /etc/netns/NS/hosts there). The daemon is root and the rank's
files belong to whoever started it: a hostile user can make /etc/hosts a
symlink to /etc/shadow (of the host, were it followed from here), a FIFO that
blocks the reader forever, a device, or a file of gigabytes; in its own user
and mount namespaces it can bind-mount any file it can name (/etc/shadow) over
its /etc/hosts without being able to read it. So:
* the path is resolved inside the rank's root only (openat2 RESOLVE_IN_ROOT:
  its symlinks as the rank would follow them, never out of its root; no /proc
  magic links); where openat2 is missing (Linux < 5.6) every component is
  opened with O_NOFOLLOW instead, so a symlink anywhere on the way is refused;
* it is opened O_PATH first, which opens nothing: no FIFO waits for a writer,
  no device driver's open runs;
* fstat of that: only a regular file goes on, and only one the rank's own user
  could read by its mode bits (`readable_by`: owner, group or other; no ACLs,
  no capabilities: a refusal, never a read the rank could not do itself);
* then it is reopened through /proc/self/fd (the same inode, no new path walk)
  read-only and non-blocking, and at most `limit` bytes are read.
Nothing read is ever used as a path. Nothing is executed in the rank's mount
namespace. `diagnose` reads through the same probe (probes/nshost.py).
"""
from __future__ import annotations

import ctypes
import errno
import os
import stat

SYS_OPENAT2 = 437  # the same number on every architecture (since Linux 5.6)
RESOLVE_NO_MAGICLINKS = 0x02
RESOLVE_IN_ROOT = 0x10
LIMIT = 256 * 1024  # a hosts file of a big cluster is tens of KiB


class _OpenHow(ctypes.Structure):
    _fields_ = [("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64),
                ("resolve", ctypes.c_uint64)]


class FileRefused(OSError):
    """The file is there but not read: not a regular file, or too big."""


_PATH_FLAGS = os.O_PATH | os.O_CLOEXEC
_READ_FLAGS = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY
_openat2_missing = False


def _openat2(root_fd: int, path: str) -> int:
    libc = ctypes.CDLL(None, use_errno=True)
    how = _OpenHow(_PATH_FLAGS, 0, RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS)
    fd = libc.syscall(SYS_OPENAT2, root_fd, path.encode(), ctypes.byref(how),
                      ctypes.sizeof(how))
    if fd < 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err), path)
    return fd


def _walk_nofollow(root_fd: int, parts: list[str]) -> int:
    fd = os.dup(root_fd)
    try:
        for part in parts[:-1]:
            nxt = os.open(part, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC,
                          dir_fd=fd)
            os.close(fd)
            fd = nxt
        return os.open(parts[-1], _PATH_FLAGS | os.O_NOFOLLOW, dir_fd=fd)
    finally:
        os.close(fd)


def open_in_root(root: str, path: str) -> int:
    """An O_PATH fd of `path` (absolute, our constant: never a rank's string)
    resolved inside the directory `root` as its root. O_PATH: nothing is opened
    yet (a FIFO's or a device's open never runs); fstat it before reading."""
    global _openat2_missing
    parts = [p for p in path.split("/") if p]
    if not parts or any(p in (".", "..") for p in parts):
        raise ValueError(f"not a plain absolute path: {path!r}")
    root_fd = os.open(root, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        if not _openat2_missing:
            try:
                return _openat2(root_fd, "/".join(parts))
            except OSError as err:
                if err.errno not in (errno.ENOSYS, errno.EPERM):  # EPERM: seccomp filters
                    raise
                _openat2_missing = True
        return _walk_nofollow(root_fd, parts)
    finally:
        os.close(root_fd)


Reader = tuple[int, frozenset[int]]  # (fs uid, its gids: primary and supplementary)


def readable_by(st: os.stat_result, reader: Reader) -> bool:
    """Whether a process of `reader`'s uid and gids may read a file of `st` by its
    mode bits (the kernel's generic_permission without ACLs or capabilities:
    the class that matches decides, owner before group before other). Root (uid
    0) reads anything itself, so anything is read for it."""
    uid, gids = reader
    if uid == 0:
        return True
    if st.st_uid == uid:
        return bool(st.st_mode & stat.S_IRUSR)
    if st.st_gid in gids:
        return bool(st.st_mode & stat.S_IRGRP)
    return bool(st.st_mode & stat.S_IROTH)


def reader_of(procfs: str, pid: int) -> Reader:
    """`pid`'s filesystem uid and its gids, from /proc/PID/status (OSError when
    gone, ValueError when unreadable as such)."""
    with open(f"{procfs}/{pid}/status") as f:
        fields = dict(line.partition(":")[::2] for line in f)
    uid = int(fields["Uid"].split()[3])  # real, effective, saved, filesystem
    gids = {int(fields["Gid"].split()[3])} | {int(g) for g in fields.get("Groups", "").split()}
    return uid, frozenset(gids)


def read_in_root(root: str, path: str, reader: Reader, limit: int = LIMIT) -> str:
    """The text of `path` under `root` (see the module's doc) for a process of
    `reader`'s user; FileRefused when it is not a regular file, not readable by
    that user, or holds more than `limit` bytes (a symlink where none is followed
    is no regular file); OSError when it cannot be opened (ELOOP: a symlinked
    directory on the way where none is followed)."""
    fd = open_in_root(root, path)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise FileRefused(errno.EINVAL, "not a regular file", path)
        if not readable_by(st, reader):
            raise FileRefused(errno.EACCES, "not readable by the process's own user", path)
        fd, path_fd = os.open(f"/proc/self/fd/{fd}", _READ_FLAGS), fd
        os.close(path_fd)
        again = os.fstat(fd)
        if (again.st_dev, again.st_ino) != (st.st_dev, st.st_ino):  # /proc not ours?
            raise FileRefused(errno.ESTALE, "changed while opened", path)
        data = b""
        while len(data) <= limit:
            chunk = os.read(fd, limit + 1 - len(data))
            if not chunk:
                break
            data += chunk
        if len(data) > limit:
            raise FileRefused(errno.EFBIG, f"larger than {limit} bytes", path)
        return data.decode("utf-8", "replace")
    finally:
        os.close(fd)
