"""Host probe: the node itself — CPU flags and cores, load, hostname, interfaces.

Why each part: bf16 on a CPU without avx512_bf16/amx_bf16 is many times slower
than fp32 (docs/design.md "bf16 picked for a CPU run"); cores bound
`oversubscribed`; Gloo may bind a docker bridge or a VPN interface, and a hostname
resolving to loopback sends peers to 127.0.0.1 — both leave ranks unable to meet.

READ: `read`, `read_interfaces`, `resolve`; `HostProbe` keeps what it read.
PARSE (pure): `parse_cpuinfo`, `parse_loadavg`, `interface_kind`, `build_interfaces`.
"""
from __future__ import annotations

import functools
import ipaddress
import os
import socket
import threading
from dataclasses import dataclass

import psutil

from ... import codec
from . import Pass, Probe, ProbeContext, register


@dataclass(frozen=True)
class CpuInfo:
    model_name: str
    flags: tuple[str, ...]  # x86 "flags" / arm "Features", sorted
    logical_cores: int
    physical_cores: int  # distinct (physical id, core id); -1 if cpuinfo can't tell
    sockets: int  # distinct physical ids; -1 if unknown
    bf16_native: bool  # avx512_bf16 / amx_bf16 (x86) or bf16 (arm)


@dataclass(frozen=True)
class LoadAvg:
    one: float
    five: float
    fifteen: float
    runnable: int  # tasks runnable right now (4th field, before the '/')
    tasks: int


@dataclass(frozen=True)
class Interface:
    name: str
    addresses: tuple[str, ...]  # IPv4/IPv6 (link-local with %scope), no MAC
    is_up: bool
    mtu: int
    speed_mbps: int  # 0 when the driver does not say (virtual devices)
    kind: str  # "loopback" | "vpn" | "bridge" | "veth" | "regular"
    suspect: bool  # a likely wrong choice for Gloo/NCCL to bind (vpn/bridge/veth)


@dataclass(frozen=True)
class Host:
    taken_at: float
    hostname: str
    hostname_addrs: tuple[str, ...]  # what peers resolving our hostname would get
    hostname_loopback: bool  # any of them loopback (nsswitch `myhostname`, /etc/hosts)
    cpu: CpuInfo
    loadavg: LoadAvg
    interfaces: tuple[Interface, ...]
    errors: tuple[str, ...]  # parts that could not be read; the rest is still valid
    # GPUs the node's drivers know (NVIDIA's /proc/driver/nvidia/gpus, AMD's /dev/kfd);
    # -1: not looked (older snapshots). A rank on a node without any computes on its
    # CPU: what a bf16 frame in its stack needs to mean bf16 on the CPU
    gpus: int = -1


# ---------------------------------------------------------------- PARSE (pure)

BF16_FLAGS = frozenset(("avx512_bf16", "amx_bf16", "bf16"))


def parse_cpuinfo(text: str) -> CpuInfo:
    """/proc/cpuinfo: blank-line separated blocks, one per logical CPU."""
    blocks: list[dict[str, str]] = []
    current: dict[str, str] = {}
    for line in text.splitlines() + [""]:
        if not line.strip():
            if current:
                blocks.append(current)
            current = {}
            continue
        key, sep, value = line.partition(":")
        if sep:
            current[key.strip()] = value.strip()
    cpus = [b for b in blocks if "processor" in b and b["processor"].isdigit()]
    first = cpus[0] if cpus else {}
    flags = first.get("flags") or first.get("Features") or ""
    # arm puts "Model"/"Hardware" in a trailing block without "processor"
    extra = {k: v for b in blocks if b not in cpus for k, v in b.items()}
    model = first.get("model name") or extra.get("Model") or extra.get("Hardware") or ""
    cores = {(b.get("physical id"), b.get("core id")) for b in cpus}
    known = all(b.get("core id") is not None for b in cpus) and cpus
    ids = {b.get("physical id") for b in cpus}
    flag_set = frozenset(flags.split())
    return CpuInfo(model, tuple(sorted(flag_set)), len(cpus),
                   len(cores) if known else -1,
                   len(ids) if cpus and None not in ids else -1,
                   bool(flag_set & BF16_FLAGS))


def parse_loadavg(text: str) -> LoadAvg:
    """'0.06 0.07 0.03 2/345 4540'."""
    f = text.split()
    runnable, _, tasks = f[3].partition("/")
    return LoadAvg(float(f[0]), float(f[1]), float(f[2]), int(runnable), int(tasks))


# First match wins. Names from docs/design.md "Gloo on the wrong interface" plus
# the usual suspects:
# tailscale0, wg0, tun0/tap0, zt* (ZeroTier), utun; docker0, br-<id> (compose),
# virbr0 (libvirt), cni0/flannel/cali (k8s); veth* (container ends).
_KINDS = (
    ("vpn", ("tailscale", "wg", "tun", "tap", "zt", "utun", "ppp", "ipsec", "nordlynx")),
    ("bridge", ("docker", "br-", "virbr", "cni", "flannel", "cali", "lxdbr", "podman",
                "vmnet", "vboxnet")),
    ("veth", ("veth",)),
)
# Kinds a rank's Gloo is likely wrong to bind: only one node has them (a VPN's
# address, a docker bridge) or they lead nowhere off the node (a container's veth).
SUSPECT_KINDS = ("vpn", "bridge", "veth")
IFACE_KINDS = ("loopback", *(k for k, _ in _KINDS), "regular")  # interface_kind's answers


def interface_kind(name: str) -> str:
    if name == "lo" or name.startswith("lo:"):
        return "loopback"
    for kind, prefixes in _KINDS:
        if name.startswith(prefixes):
            return kind
    return "regular"


def build_interfaces(addrs: dict, stats: dict) -> tuple[Interface, ...]:
    """From psutil.net_if_addrs() / net_if_stats() shaped dicts (duck-typed, so
    tests pass plain namespaces)."""
    out = []
    for name in sorted(set(addrs) | set(stats)):
        ips = []
        for a in addrs.get(name, ()):
            if a.family in (socket.AF_INET, socket.AF_INET6):
                ips.append(a.address)
        st = stats.get(name)
        kind = interface_kind(name)
        out.append(Interface(name, tuple(ips), bool(st and st.isup),
                             int(st.mtu) if st else 0, int(st.speed) if st else 0,
                             kind, kind in SUSPECT_KINDS))
    return tuple(out)


@functools.lru_cache(maxsize=1024)  # asked per rank per judgement of a few addresses
def is_loopback(addr: str) -> bool:
    try:
        return ipaddress.ip_address(addr.partition("%")[0]).is_loopback
    except ValueError:
        return False


def plain_addr(addr: str) -> str:
    """'::ffff:10.0.0.1' (an IPv4 peer on an IPv6 socket) as '10.0.0.1'."""
    return addr[7:] if addr.startswith("::ffff:") else addr


def interface_of(addr: str, interfaces: tuple[Interface, ...]) -> tuple[str | None, str | None]:
    """(name, kind) of the interface holding `addr`, (None, None) when none of
    `interfaces` does (a rank in another network namespace, not read on a lean
    pass). All of 127/8 is loopback though `lo` lists only 127.0.0.1."""
    plain = plain_addr(addr)
    for iface in interfaces:
        if plain in (a.partition("%")[0] for a in iface.addresses):
            return iface.name, iface.kind
    return ("lo", "loopback") if is_loopback(plain) else (None, None)


# ---------------------------------------------------------------- READ (impure)

def read_interfaces() -> tuple[Interface, ...]:
    return build_interfaces(psutil.net_if_addrs(), psutil.net_if_stats())


def resolve(hostname: str, timeout_s: float) -> tuple[str, ...] | None:
    """getaddrinfo(hostname) as peers would do it; None on timeout (a DNS server
    that never answers must not stall the tick: the lookup runs in a daemon thread)."""
    result: list[tuple[str, ...]] = []

    def lookup():
        try:
            infos = socket.getaddrinfo(hostname, None, proto=socket.IPPROTO_TCP)
            result.append(tuple(dict.fromkeys(i[4][0] for i in infos)))
        except OSError:
            result.append(())

    worker = threading.Thread(target=lookup, name="ddpwatch-resolve", daemon=True)
    worker.start()
    worker.join(timeout_s)
    return result[0] if result else None


def read_gpus(procfs: str, dev: str = "/dev") -> int:
    try:
        nvidia = len(os.listdir(f"{procfs}/driver/nvidia/gpus"))
    except FileNotFoundError:
        nvidia = 0  # no NVIDIA driver loaded
    return nvidia + os.path.exists(f"{dev}/kfd")  # ROCm: one node for all AMD GPUs


MAX_AGE_S = 60.0  # CPU flags and interfaces change rarely; resolution may


# cpu flags/cores, loadavg, hostname resolution, interfaces (flags VPN/bridge/veth ones)
@register("host", scope="node")
class HostProbe(Probe):
    """Keeps the facts it read and when: a pass reads them again at most every
    MAX_AGE_S, and stands on the last ones in between (or when a read failed)."""

    def __init__(self):
        self.facts: Host | None = None
        self.read_at = -1e18

    def due(self, now: float) -> bool:
        return now - self.read_at >= MAX_AGE_S

    def kept(self) -> Host | None:
        return self.facts

    def run(self, ctx: ProbeContext, seen: Pass, pids: tuple[int, ...]) -> Host:
        facts = read(ctx)
        self.facts, self.read_at = facts, ctx.clock()
        return facts


def read(ctx: ProbeContext) -> Host:
    taken_at, errors = ctx.clock(), []
    cpu = CpuInfo("", (), -1, -1, -1, False)
    load = LoadAvg(-1.0, -1.0, -1.0, -1, -1)
    interfaces: tuple[Interface, ...] = ()
    try:
        with open(f"{ctx.procfs}/cpuinfo") as f:
            cpu = parse_cpuinfo(f.read())
    except OSError as err:
        errors.append(f"cpuinfo: {err}")
    try:
        with open(f"{ctx.procfs}/loadavg") as f:
            load = parse_loadavg(f.read())
    except (OSError, ValueError, IndexError) as err:
        errors.append(f"loadavg: {err}")
    try:
        interfaces = read_interfaces()
    except OSError as err:
        errors.append(f"interfaces: {err}")
    gpus = -1
    try:
        gpus = read_gpus(ctx.procfs)
    except OSError as err:
        errors.append(f"gpus: {err}")
    hostname = socket.gethostname()
    addrs = resolve(hostname, ctx.timeout_s)
    if addrs is None:
        errors.append(f"resolving {hostname!r} timed out after {ctx.timeout_s}s")
        addrs = ()
    return Host(taken_at, hostname, addrs, any(is_loopback(a) for a in addrs), cpu,
                load, interfaces, tuple(errors), gpus)


def from_json(obj) -> Host:
    return codec.from_json(Host, obj)
