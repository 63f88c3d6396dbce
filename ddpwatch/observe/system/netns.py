"""Doing one thing inside another process's network namespace.

A rank on a "node" that is a network namespace of this host (a container, `ip
netns`) has its own interfaces and its own wire: a packet socket opened in the
watcher's namespace never sees the connects that arrive for it. A socket stays
in the namespace it was made in, so it is enough to make it there: a short-lived
thread enters the rank's network namespace (setns(2) changes the calling thread
only), runs `make`, and ends; no other thread of ours ever leaves its own.
"""
from __future__ import annotations

import ctypes
import os
import threading

CLONE_NEWNET = 0x40000000
CLONE_NEWUTS = 0x04000000  # the hostname (observe/nsview.py)
NS_FLAGS = {"net": CLONE_NEWNET, "uts": CLONE_NEWUTS}


def net_ns(procfs: str, pid: int | str) -> str:
    """"net:[inode]" of `pid` ("" if unreadable)."""
    try:
        return os.readlink(f"{procfs}/{pid}/ns/net")
    except OSError:
        return ""


def run_in_net_ns(procfs: str, pid: int, make):
    """`make()` run in `pid`'s network namespace; its exceptions (and OSError
    when the namespace cannot be entered) raised here."""
    return run_in_ns(procfs, pid, "net", make)


def run_in_ns(procfs: str, pid: int, kind: str, make):
    """`make()` run in `pid`'s namespace of `kind` ("net" or "uts": both may be
    entered by one thread of a threaded process, unlike "mnt", which is never
    entered: a rank's files are read through /proc/PID/root)."""
    out: dict = {}

    def work():
        try:
            fd = os.open(f"{procfs}/{pid}/ns/{kind}", os.O_RDONLY | os.O_CLOEXEC)
            try:
                libc = ctypes.CDLL(None, use_errno=True)
                if libc.setns(fd, NS_FLAGS[kind]) != 0:
                    err = ctypes.get_errno()
                    raise OSError(err, f"setns into pid {pid}'s {kind} namespace: "
                                       f"{os.strerror(err)}")
            finally:
                os.close(fd)
            out["value"] = make()
        except BaseException as err:  # handed to the caller's thread
            out["error"] = err
    thread = threading.Thread(target=work, name=f"ddpwatch-{kind}ns", daemon=True)
    thread.start()
    thread.join()
    if "error" in out:
        raise out["error"]
    return out["value"]
