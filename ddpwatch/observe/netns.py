"""Doing one thing inside another process's network namespace (issue 18).

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


def net_ns(procfs: str, pid: int | str) -> str:
    """"net:[inode]" of `pid` ("" if unreadable)."""
    try:
        return os.readlink(f"{procfs}/{pid}/ns/net")
    except OSError:
        return ""


def run_in_net_ns(procfs: str, pid: int, make):
    """`make()` run in `pid`'s network namespace; its exceptions (and OSError
    when the namespace cannot be entered) raised here."""
    out: dict = {}

    def work():
        try:
            fd = os.open(f"{procfs}/{pid}/ns/net", os.O_RDONLY | os.O_CLOEXEC)
            try:
                libc = ctypes.CDLL(None, use_errno=True)
                if libc.setns(fd, CLONE_NEWNET) != 0:
                    err = ctypes.get_errno()
                    raise OSError(err, f"setns into pid {pid}'s network namespace: "
                                       f"{os.strerror(err)}")
            finally:
                os.close(fd)
            out["value"] = make()
        except BaseException as err:  # handed to the caller's thread
            out["error"] = err
    thread = threading.Thread(target=work, name="ddpwatch-netns", daemon=True)
    thread.start()
    thread.join()
    if "error" in out:
        raise out["error"]
    return out["value"]
