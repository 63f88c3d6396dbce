"""Reading one small file as another process sees it, through /proc/PID/root.

A rank in a container or a namespace node has its own /etc/hosts (`ip netns
exec` bind-mounts /etc/netns/NS/hosts there). The daemon is root and the rank's
files belong to whoever started it: a hostile user can make /etc/hosts a
symlink to /etc/shadow (of the host, were it followed from here), a FIFO that
blocks the reader forever, or a file of gigabytes. So the path is resolved
inside the rank's root only (openat2 RESOLVE_IN_ROOT: its symlinks as the rank
would follow them, never out of its root; no /proc magic links), opened
non-blocking, read only if it is a regular file, and at most `limit` bytes.
Where openat2 is missing (Linux < 5.6) every component is opened with
O_NOFOLLOW instead, so a symlink anywhere on the way is refused. Nothing read
is ever used as a path. Nothing is executed in the rank's mount namespace.
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


_FLAGS = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY
_openat2_missing = False


def _openat2(root_fd: int, path: str) -> int:
    libc = ctypes.CDLL(None, use_errno=True)
    how = _OpenHow(_FLAGS, 0, RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS)
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
        return os.open(parts[-1], _FLAGS | os.O_NOFOLLOW, dir_fd=fd)
    finally:
        os.close(fd)


def open_in_root(root: str, path: str) -> int:
    """A read-only fd of `path` (absolute, our constant: never a rank's string)
    resolved inside the directory `root` as its root."""
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


def read_in_root(root: str, path: str, limit: int = LIMIT) -> str:
    """The text of `path` under `root` (see the module's doc); FileRefused when it
    is not a regular file or holds more than `limit` bytes, OSError when it
    cannot be opened (ELOOP: a symlink where none is followed)."""
    fd = open_in_root(root, path)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise FileRefused(errno.EINVAL, "not a regular file", path)
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
