"""Namespace host probe: the node as a rank in another namespace sees it.

The host probe reads the watcher's node: its hostname, what that resolves to,
its interfaces. A rank in a container or a namespace node (its own UTS, network
and mount namespaces) has its own: Gloo listens where *its* hostname resolves
through *its* /etc/hosts. Judged with the watcher's, a rank on node1 (hosts:
`127.0.1.1 node1`) was said to run on "vm", which "resolves to 127.0.0.1".

For each rank whose UTS, network or mount namespace is not the watcher's:
its hostname (uname in a thread that entered its UTS namespace), its
interfaces (psutil in a thread in its network namespace), and its hostname
resolved the part we can do safely: its /etc/hosts and /etc/nsswitch.conf read
through /proc/PID/root (observe/system/rootfile.py), never a binary run there. What
resolution would do beyond its hosts file (DNS, nss-myhostname in its
namespace) is not done: `unseen` says so, and the addresses are only those of
its hosts file, never the watcher's answer.

A namespace's view changes rarely: the probe's object keeps it per namespace
for MAX_AGE_S, and reads interfaces through the sockets probe's object, which
keeps them too. READ: `NsHostProbe`, `read_view`. PARSE (pure): `hosts_addrs`,
`hosts_sources`, `resolution`.
"""
from __future__ import annotations

import ipaddress
import os
import socket
import subprocess
from dataclasses import dataclass
from functools import cached_property

import psutil

from ... import codec
from ..system.netns import run_in_ns
from ..system.rootfile import read_in_root, reader_of
from . import Look, Pass, Probe, ProbeContext, register
from .host import Interface, build_interfaces
from .sockets import LeftOut, SocketsProbe

KINDS = ("uts", "net", "mnt")
MAX_AGE_S = 60.0  # as the host probe's facts (host.MAX_AGE_S)


@dataclass(frozen=True)
class NsView:
    """What one rank's namespaces show, where they are not the watcher's."""
    pid: int
    namespaces: str                # "uts:[..] net:[..] mnt:[..]", the ones not ours
    hostname: str                  # its UTS namespace's ("" when not read)
    hostname_addrs: tuple[str, ...]  # what its /etc/hosts maps the hostname to
    resolved: bool                 # that is the whole answer (nsswitch asks files first)
    unseen: str                    # what could not be seen there, for people ("" none)
    interfaces: tuple[Interface, ...] | None  # its network namespace's (None: ours/unread)


@dataclass(frozen=True)
class NsViews:
    taken_at: float
    pids: tuple[NsView, ...]       # only ranks in a namespace other than the watcher's
    errors: tuple[str, ...] = ()

    @cached_property
    def by_pid(self) -> dict[int, NsView]:
        """pid -> its first view (judge/signals/host.py ns_view, once per rank)."""
        return {v.pid: v for v in reversed(self.pids)}


# ---------------------------------------------------------------- PARSE (pure)

MAX_ADDRS = 16  # the file is the rank owner's: a page shows a few, not thousands


def hosts_addrs(text: str, hostname: str) -> tuple[str, ...]:
    """The addresses /etc/hosts `text` gives `hostname`, in file order (glibc's
    files backend returns every matching line), names compared without case;
    lines whose first field is no address are skipped, as glibc skips them."""
    name, out = hostname.lower(), {}
    for line in text.splitlines():
        fields = line.partition("#")[0].split()
        if len(fields) >= 2 and name in (f.lower() for f in fields[1:]) and _addr(fields[0]):
            out[fields[0]] = None
            if len(out) == MAX_ADDRS:
                break
    return tuple(out)


def _addr(text: str) -> bool:
    try:
        ipaddress.ip_address(text.partition("%")[0])
        return True
    except ValueError:
        return False


def hosts_sources(text: str) -> tuple[str, ...] | None:
    """The sources of nsswitch.conf's `hosts:` line, actions left out; None when
    it has none (glibc then asks dns before files)."""
    for line in text.splitlines():
        fields = line.partition("#")[0].split()
        if fields and fields[0] == "hosts:":
            return tuple(f for f in fields[1:] if not f.startswith("["))
    return None


def resolution(hostname: str, hosts_text: str | None, nsswitch_text: str | None,
               hosts_error: str = "") -> tuple[tuple[str, ...], bool, str]:
    """(addresses from its hosts file, whether that is the whole answer, what
    was not seen) for `hostname` resolved as the rank's nsswitch would."""
    if hosts_text is None:
        return (), False, f"its /etc/hosts could not be read ({hosts_error or 'unknown'})"
    addrs = hosts_addrs(hosts_text, hostname)
    sources = hosts_sources(nsswitch_text) if nsswitch_text is not None else None
    order = sources if sources is not None else ("dns", "files")
    before = [s for s in order[:order.index("files")]] if "files" in order else list(order)
    if addrs and "files" in order and not before:
        return addrs, True, ""
    if not addrs:
        others = [s for s in order if s != "files"]
        return (), False, (f"{hostname} is not in its /etc/hosts; what "
                           f"{', '.join(others) or 'nothing else'} answer in its namespace "
                           "was not looked up")
    if "files" not in order:
        return addrs, False, (f"its nsswitch.conf does not ask /etc/hosts ({' '.join(order)});"
                              " those were not looked up in its namespace")
    if sources is None:
        return addrs, False, ("no nsswitch.conf hosts line read there (glibc then asks dns "
                              "before /etc/hosts); dns not looked up in its namespace")
    return addrs, False, (f"its nsswitch.conf asks {', '.join(before)} before /etc/hosts; "
                          "not looked up in its namespace")


# ---------------------------------------------------------------- READ (impure)

def _ns(procfs: str, pid, kind: str) -> str:
    try:
        return os.readlink(f"{procfs}/{pid}/ns/{kind}")
    except OSError:
        return ""


def _text(root: str, path: str, reader) -> tuple[str | None, str]:
    try:
        return read_in_root(root, path, reader), ""
    except FileNotFoundError:
        return None, "none there"
    except OSError as err:
        return None, f"{type(err).__name__}: {err.strerror or err}"


def read_view(procfs: str, pid: int, differs: dict[str, bool], addresses) -> tuple:
    """(hostname, addrs, resolved, unseen, interfaces) of `pid`'s namespaces;
    the parts of namespaces that are ours are not read here (the host probe has them).
    `addresses()` gives its interfaces' addresses (SocketsProbe.namespace_addresses:
    `ip -o addr`, at most MAX_ADDRESSES lines): psutil would build all of them,
    and any user may give a namespace of theirs 20 000 (tests/hostile/test_hostile_second.py)."""
    unseen = []
    hostname = ""  # "": the watcher's hostname and resolution stand (the host probe's)
    if differs["uts"]:
        try:
            hostname = run_in_ns(procfs, pid, "uts", lambda: os.uname().nodename)
        except OSError as err:
            unseen.append(f"its hostname could not be read: {err.strerror or err}")
    elif differs["mnt"]:  # our hostname, but its own /etc/hosts
        hostname = os.uname().nodename
    interfaces = None
    if differs["net"]:
        try:
            listed = addresses()  # LeftOut goes to the caller: read on a later pass
            stats = run_in_ns(procfs, pid, "net", psutil.net_if_stats)
            interfaces = build_interfaces(
                {i.name: [_Addr(a) for a in i.addresses] for i in listed}, stats)
        except (OSError, RuntimeError, subprocess.SubprocessError) as err:
            unseen.append(f"its interfaces could not be read: "
                          f"{getattr(err, 'strerror', None) or err}")
    addrs, resolved = (), False
    if hostname:
        root = f"{procfs}/{pid}/root"
        try:  # read only what the rank's own user could read (rootfile.readable_by)
            reader = reader_of(procfs, pid)
        except (OSError, ValueError, KeyError, IndexError):
            reader = None
        if reader is None:
            hosts, error, nsswitch = None, "its user could not be told", None
        else:
            hosts, error = _text(root, "/etc/hosts", reader)
            nsswitch, _ = _text(root, "/etc/nsswitch.conf", reader)
        addrs, resolved, missing = resolution(hostname, hosts, nsswitch, error)
        if missing:
            unseen.append(missing)
    return hostname, addrs, resolved, "; ".join(unseen), interfaces


# A rank's own hostname, its /etc/hosts answer for it and its interfaces, when its
# UTS/network/mount namespace is not ours. With the sockets (where Gloo listens is
# judged against these): from DETAIL on, at a glance for a job without heartbeats
@register("nshost", field="ns_hosts", look=Look.DETAIL, sooner_if_silent=Look.GLANCE,
          uses=("sockets",))
class NsHostProbe(Probe):
    """Keeps each namespace's view (`views`: namespaces -> (read at, view)) for
    MAX_AGE_S; reads interfaces through `sockets` (SocketsProbe.namespace_addresses),
    whose kept `ip addr` both probes stand on."""

    def __init__(self, sockets: SocketsProbe | None = None):
        self.sockets = sockets if sockets is not None else SocketsProbe()
        self.views: dict = {}

    def run(self, ctx: ProbeContext, seen: Pass, pids: tuple[int, ...]) -> NsViews:
        taken_at = ctx.clock()
        ours = {k: _ns(ctx.procfs, "self", k) for k in KINDS}
        if not all(ours.values()):  # a procfs without self (a fixture tree): nothing to compare
            return NsViews(taken_at, ())
        cache = self.views
        for key in [k for k, (at, _) in cache.items() if taken_at - at >= MAX_AGE_S]:
            del cache[key]
        out, errors = [], []
        for pid in pids:
            theirs = {k: _ns(ctx.procfs, pid, k) for k in KINDS}
            if not all(theirs.values()):
                continue  # gone, or not ours to read: the process probe says which
            differs = {k: theirs[k] != ours[k] for k in KINDS}
            if not any(differs.values()):
                continue
            key = tuple(theirs[k] for k in KINDS)
            if key not in cache:
                try:
                    cache[key] = (taken_at, read_view(
                        ctx.procfs, pid, differs,
                        lambda: self.sockets.namespace_addresses(ctx, seen.budget, pid,
                                                                 theirs["net"])))
                except LeftOut:
                    continue  # its user's `ip` runs for this pass are spent: a later pass
                except Exception as err:  # one rank's view failing leaves the others'
                    errors.append(f"pid {pid}: {type(err).__name__}: {err}")
                    continue
            hostname, addrs, resolved, unseen, interfaces = cache[key][1]
            out.append(NsView(pid, " ".join(theirs[k] for k in KINDS if differs[k]), hostname,
                              addrs, resolved, unseen, interfaces))
        return NsViews(taken_at, tuple(out), tuple(errors))


class _Addr:
    """One address as psutil.net_if_addrs lists it (what build_interfaces reads)."""
    __slots__ = ("family", "address")

    def __init__(self, address: str):
        self.family = socket.AF_INET6 if ":" in address else socket.AF_INET
        self.address = address


def from_json(obj) -> NsViews:
    return codec.from_json(NsViews, obj)
