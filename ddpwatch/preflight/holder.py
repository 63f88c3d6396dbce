"""Who holds a TCP port: the field's EADDRINUSE on 29500 was orphaned torchrun
and trainer processes (parent gone, PPID 1) from an earlier launch.

READ: `port_holder` (psutil; other users' sockets need root). PARSE (pure):
`describe`.
"""
from __future__ import annotations

import time

import psutil


def port_holder(port: int) -> dict:
    """{pid, user, command, started (epoch s), ppid, parent_alive} of the process
    listening on `port`, or {"error": why} when it cannot be told."""
    try:
        conns = psutil.net_connections(kind="tcp")
    except (psutil.AccessDenied, PermissionError) as err:
        return {"error": f"cannot list sockets ({err.__class__.__name__}): run as root"}
    pids = [c.pid for c in conns if c.status == psutil.CONN_LISTEN and c.laddr
            and c.laddr.port == port]
    if not pids:
        return {"error": "no listening socket on it in this network namespace"}
    if pids[0] is None:
        return {"error": "its owner is not visible to this user: run as root"}
    try:
        proc = psutil.Process(pids[0])
        with proc.oneshot():
            ppid = proc.ppid()
            out = {"pid": proc.pid, "user": proc.username(),
                   "command": " ".join(proc.cmdline())[:300] or proc.name(),
                   "started": proc.create_time(), "ppid": ppid}
    except psutil.Error as err:
        return {"error": f"pid {pids[0]}: {err.__class__.__name__}"}
    out["parent_alive"] = ppid > 1 and psutil.pid_exists(ppid)
    return out


def describe(holder: dict, port: int) -> tuple[str, str]:
    """(fact, fix) for a port `holder` holds. Pure."""
    if not holder.get("pid"):
        return (f"port {port} is in use; holder unknown: {holder.get('error', '?')}",
                f"find it with `ss -ltnp 'sport = :{port}'` and stop it")
    started = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(holder["started"]))
    parent = (f"parent {holder['ppid']} alive" if holder["parent_alive"] else
              f"parent gone (ppid {holder['ppid']}): an orphan of an earlier launch")
    fact = (f"port {port} held by pid {holder['pid']} (user {holder['user']}, "
            f"since {started}, {parent}): {holder['command']}")
    fix = f"kill {holder['pid']}"
    if holder["parent_alive"]:
        fix += f" (or stop its launcher, pid {holder['ppid']}), or pick another --master port"
    return fact, fix
