"""Who else could take the daemon's port while it is down, and giving up the one
capability a privileged port needed once it is held.

A daemon that binds its port itself leaves it free whenever it is down (a crash,
a container or pod restart, a rollout, boot), and any local user who binds it
first answers for the daemon: the kubelet's probes, Prometheus' scrapes. Two
things close that window: a socket held across restarts (systemd/ddpwatch.socket,
sdnotify.listen_socket), or a port below net.ipv4.ip_unprivileged_port_start
(1024 unless lowered), which only a process with CAP_NET_BIND_SERVICE may bind
in that network namespace, whatever runs or does not. The container
deployments (deploy/image/run.sh, deploy/kubernetes/) take the second: a
restart of the whole container is no window either (tests/deploy/test_deploy.py
test_nobody_takes_the_containers_port_while_it_restarts).

PARSE/DECIDE: `takeable` and `warning` are pure (tests/unit/publish/test_port_guard_unit.py).
READ: `read_unprivileged_start`. ACT: `drop_bind_service`.
"""
from __future__ import annotations

import ctypes
import os

UNPRIVILEGED_START = "sys/net/ipv4/ip_unprivileged_port_start"  # under procfs; per netns
KERNEL_DEFAULT_START = 1024
CAP_NET_BIND_SERVICE = 10  # linux/capability.h
_CAP_VERSION_3 = 0x20080522  # _LINUX_CAPABILITY_VERSION_3: two 32-bit words per set


def read_unprivileged_start(procfs: str = "/proc") -> int | None:
    """The first port any user may bind in this process's network namespace, or
    None when it cannot be read (an old kernel has no such sysctl: 1024 then)."""
    try:
        with open(os.path.join(procfs, UNPRIVILEGED_START), encoding="ascii") as f:
            return int(f.read().strip())
    except FileNotFoundError:
        return KERNEL_DEFAULT_START
    except (OSError, ValueError):
        return None


def takeable(port: int, unprivileged_start: int | None) -> bool | None:
    """Whether a user without CAP_NET_BIND_SERVICE may bind `port` (None: unknown)."""
    if unprivileged_start is None:
        return None
    return port >= unprivileged_start


def warning(listen: str, port: int, unprivileged_start: int | None) -> str | None:
    """The start-up line for a port the daemon binds itself, or None when nobody
    else may bind it."""
    verdict = takeable(port, unprivileged_start)
    if verdict is False:
        return None
    if verdict is None:
        why = "net.ipv4.ip_unprivileged_port_start could not be read"
    else:
        why = (f"port {port} is at or above net.ipv4.ip_unprivileged_port_start "
               f"({unprivileged_start})")
    return (f"listen {listen}: {why}: while this daemon is down (a crash, a restart) any "
            f"local user may bind the port and answer its probes and scrapes. Hold it "
            f"with systemd/ddpwatch.socket, or listen on a port below "
            f"{unprivileged_start if verdict else KERNEL_DEFAULT_START} (the container "
            f"deployments use 195; README \"Running the daemon\")")


class _Header(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _Data(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32),
                ("inheritable", ctypes.c_uint32)]


def drop_bind_service() -> bool:
    """Give up CAP_NET_BIND_SERVICE (effective, permitted, inheritable; the ambient
    bit goes with the permitted one) once the port is held, so the daemon keeps
    only the unit's five capabilities. Capabilities belong to a thread: called
    before the daemon starts any, every later thread inherits the drop, and with
    no_new_privs (podman --security-opt=no-new-privileges, Kubernetes'
    allowPrivilegeEscalation: false) no child of it gets the bit back at exec.
    Returns whether it was held and is now dropped."""
    libc = ctypes.CDLL(None, use_errno=True)
    header = _Header(_CAP_VERSION_3, 0)
    data = (_Data * 2)()
    if libc.capget(ctypes.byref(header), data) != 0:
        return False
    word, bit = divmod(CAP_NET_BIND_SERVICE, 32)
    mask = 1 << bit
    if not (data[word].permitted | data[word].effective) & mask:
        return False
    for field in ("effective", "permitted", "inheritable"):
        setattr(data[word], field, getattr(data[word], field) & ~mask)
    if libc.capset(ctypes.byref(header), data) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))
    return True
