"""What one node can say about itself before a launch: hostname resolution and
why it lands on loopback, the interface and address Gloo will choose, the port
range Gloo's data connections use, torch/Python versions, the CPU's bf16.

READ: `gather` and the small readers. PARSE (pure): `parse_port_range`,
`loopback_cause`, `pick_iface_addr`, `family`.
"""
from __future__ import annotations

import importlib.metadata
import ipaddress
import os
import platform
import socket

from ..observe.probes.host import interface_of
from ..observe.probes.host import Interface, is_loopback, parse_cpuinfo, read_interfaces, resolve

BF16_FLAGS = ("avx512_bf16", "amx_bf16")


# ---------------------------------------------------------------- PARSE (pure)

def parse_port_range(text: str) -> tuple[int, int] | None:
    """'32768\t60999' (ip_local_port_range) or '40000:40100' / '40000-40100'
    (GLOO_PORT_RANGE); None when it is not two ports low <= high."""
    parts = text.replace(":", " ").replace("-", " ").split()
    if len(parts) != 2 or not all(p.isdigit() for p in parts):
        return None
    lo, hi = int(parts[0]), int(parts[1])
    return (lo, hi) if 0 < lo <= hi <= 65535 else None


def loopback_cause(hostname: str, hosts_text: str, nsswitch_text: str,
                   hosts_path: str = "/etc/hosts",
                   nsswitch_path: str = "/etc/nsswitch.conf") -> str:
    """The line that makes `hostname` resolve to a loopback address: an
    /etc/hosts entry (Debian writes `127.0.1.1 <hostname>`), else nsswitch's
    `myhostname` (systemd answers the own hostname with local addresses, and
    127.0.0.2 when no interface has one). '' when neither says so."""
    for number, line in enumerate(hosts_text.splitlines(), 1):
        fields = line.partition("#")[0].split()
        if len(fields) >= 2 and hostname in fields[1:] and is_loopback(fields[0]):
            return f"{hosts_path}:{number}: {line.strip()}"
    for number, line in enumerate(nsswitch_text.splitlines(), 1):
        fields = line.partition("#")[0].split()
        if fields and fields[0] == "hosts:" and "myhostname" in fields:
            return f"{nsswitch_path}:{number}: {line.strip()}"
    return ""


def family(addr: str) -> str:
    """'IPv4' / 'IPv6' / '' for an address string (an IPv4-mapped one is IPv4)."""
    try:
        ip = ipaddress.ip_address(addr.partition("%")[0])
    except ValueError:
        return ""
    if ip.version == 6 and ip.ipv4_mapped is None:
        return "IPv6"
    return "IPv4"


def pick_iface_addr(iface: Interface) -> str:
    """The address Gloo takes for GLOO_SOCKET_IFNAME: the first of the interface's
    that getifaddrs lists, IPv4 ones before IPv6 ones (Gloo's lookupAddrForIface
    takes the first AF_INET/AF_INET6 entry); a link-local IPv6 only when nothing
    else is there."""
    v4 = [a for a in iface.addresses if family(a) == "IPv4"]
    v6 = [a for a in iface.addresses if family(a) == "IPv6"]
    v6_global = [a for a in v6 if not a.lower().startswith("fe80")]
    for group in (v4, v6_global, v6):
        if group:
            return group[0]
    return ""


# ---------------------------------------------------------------- READ (impure)

def _read(path: str) -> str:
    try:
        with open(path, errors="replace") as f:
            return f.read(1 << 20)
    except OSError:
        return ""


def bindable(addr: str) -> bool:
    """What torch's doesHostnameResolveToUsableAddress asks: can we bind there."""
    fam = socket.AF_INET6 if family(addr) == "IPv6" and ":" in addr else socket.AF_INET
    try:
        with socket.socket(fam, socket.SOCK_STREAM) as s:
            s.bind((addr.partition("%")[0], 0))
        return True
    except OSError:
        return False


def gloo_choice(env: dict, hostname: str, hostname_addrs: tuple[str, ...],
                interfaces: tuple[Interface, ...]) -> dict:
    """Where this node's Gloo will listen and tell its peers to connect:
    GLOO_SOCKET_IFNAME's address, else the first bindable address the hostname
    resolves to (torch's createDefaultDevice), else loopback (its fallback)."""
    ifname = env.get("GLOO_SOCKET_IFNAME", "")
    out = {"gloo_ifname": ifname, "gloo_addr": "", "gloo_iface": "", "gloo_iface_kind": "",
           "gloo_error": "", "gloo_source": ""}
    if ifname:
        # a comma-separated list means one device per name; the first decides the family
        first = ifname.split(",")[0]
        iface = next((i for i in interfaces if i.name == first), None)
        if iface is None:
            out["gloo_error"] = f"GLOO_SOCKET_IFNAME={ifname}: no interface {first!r} on this node"
            return out
        addr = pick_iface_addr(iface)
        if not addr:
            out["gloo_error"] = f"GLOO_SOCKET_IFNAME={ifname}: {first} has no IP address"
            return out
        out.update(gloo_addr=addr, gloo_iface=iface.name, gloo_iface_kind=iface.kind,
                   gloo_source=f"GLOO_SOCKET_IFNAME={ifname}")
        return out
    addr = next((a for a in hostname_addrs if bindable(a)), "127.0.0.1")
    name, kind = interface_of(addr, interfaces)
    source = (f"hostname {hostname} resolves to it" if addr in hostname_addrs else
              f"hostname {hostname} resolves to no local address: torch falls back to loopback")
    out.update(gloo_addr=addr, gloo_iface=name or "", gloo_iface_kind=kind or "",
               gloo_source=source)
    return out


def port_range(env: dict, procfs: str = "/proc") -> dict:
    """The ports Gloo's data connections listen on: GLOO_PORT_RANGE when set,
    else the kernel's ephemeral range (Gloo binds port 0)."""
    text = env.get("GLOO_PORT_RANGE", "")
    if text:
        parsed = parse_port_range(text)
        if parsed is None:
            return {"port_range": [], "port_range_source": f"GLOO_PORT_RANGE={text[:40]!r} "
                    "is not LOW:HIGH"}
        return {"port_range": list(parsed), "port_range_source": "GLOO_PORT_RANGE"}
    path = f"{procfs}/sys/net/ipv4/ip_local_port_range"
    parsed = parse_port_range(_read(path))
    return {"port_range": list(parsed) if parsed else [],
            "port_range_source": path if parsed else f"{path} unreadable"}


def torch_version() -> str:
    """From the installed distribution's metadata: importing torch takes seconds."""
    try:
        return importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        return ""


def gather(env: dict, procfs: str = "/proc", timeout_s: float = 3.0) -> dict:
    hostname = socket.gethostname()
    addrs = resolve(hostname, timeout_s)
    facts: dict = {"hostname": hostname, "hostname_addrs": list(addrs or ()),
                   "hostname_error": "" if addrs else
                   (f"resolving {hostname} timed out after {timeout_s}s" if addrs is None
                    else f"{hostname} does not resolve"),
                   "hostname_loopback_cause": ""}
    if any(is_loopback(a) for a in addrs or ()):
        facts["hostname_loopback_cause"] = loopback_cause(
            hostname, _read("/etc/hosts"), _read("/etc/nsswitch.conf"))
    try:
        interfaces = read_interfaces()
    except OSError:
        interfaces = ()
    facts.update(gloo_choice(env, hostname, tuple(addrs or ()), interfaces))
    facts.update(port_range(env, procfs))
    cpu = parse_cpuinfo(_read(f"{procfs}/cpuinfo"))
    facts.update(torch=torch_version(), python=platform.python_version(),
                 cpu_model=cpu.model_name, cpu_bf16=[f for f in BF16_FLAGS if f in cpu.flags],
                 cpu_flags_read=bool(cpu.flags),
                 # an NVIDIA GPU makes torch.cuda.is_available() true: the field's auto-detect
                 gpu=os.path.exists("/dev/nvidia0") or os.path.exists(f"{procfs}/driver/nvidia"))
    return facts
