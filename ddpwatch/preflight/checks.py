"""Every node's facts and probes -> one row per check: pass / fail / warn, or
`cannot` (the check could not run; never shown as passed). Pure: the same
input gives every node the same table.

A row: {"check", "node", "status", "fact", "fix"}. Node 0 is the master.
"""
from __future__ import annotations

from ..observe.probes.host import SUSPECT_KINDS
from ..observe.probes.host import is_loopback
from .facts import family
from .holder import describe
from .probe import CONNECT_TIMEOUT_S

# the kinds host.interface_kind gives and gloo_iface suspects, in words
WORDS = {"vpn": "a VPN interface", "bridge": "a bridge (docker/libvirt/k8s)",
         "veth": "a container's veth end"}


def row(check, node, status, fact, fix=""):
    return {"check": check, "node": node, "status": status, "fact": fact, "fix": fix}


def label(nodes: list[dict], i: int) -> str:
    n = nodes[i]
    who = "master" if i == 0 and n.get("role") == "master" else f"worker {i}" if i else "this node"
    addr = n.get("seen_addr") or n.get("route_addr") or "?"
    return f"{who} {n.get('hostname') or '?'} ({addr})"


def evaluate(nodes: list[dict], probes: list[dict], expected: int, port: int,
             error: str = "", params: int = 0, secret: bool | None = None) -> list[dict]:
    rows = [check_nodes(nodes, expected, error)]
    if secret is not None:
        rows.append(check_exchange(secret))
    rows += check_store(nodes, port)
    rows += check_gloo_ports(nodes, probes)
    rows += check_interfaces(nodes)
    rows += check_hostnames(nodes)
    rows += check_versions(nodes)
    rows += [check_bf16(nodes, i) for i in range(len(nodes))]
    if params:
        rows.append(check_allreduce(nodes, probes, params))
    return rows


def check_nodes(nodes, expected, error):
    if len(nodes) >= expected and not error:
        return row("nodes", "all", "pass", f"{len(nodes)} of {expected} nodes took part")
    return row("nodes", "all", "fail", error or f"{len(nodes)} of {expected} nodes took part",
               "run `ddpwatch preflight` with the same --master on every node, "
               "and see the rows below for what stopped the others")


def check_exchange(secret: bool) -> dict:
    """Whether this table can be trusted: without the secret, whoever reached the
    store port first could have played master (protocol.py)."""
    if secret:
        return row("exchange", "all", "pass", "every message signed with the preflight secret")
    return row("exchange", "all", "warn",
               "not authenticated: whoever listens on the store port first plays master "
               "(takes this node's facts, names what it probes, writes this table)",
               "export DDPWATCH_PREFLIGHT_SECRET=<the same random value> on every node "
               "(e.g. `openssl rand -hex 16`)")


def _fix_open(dst_addr: str, src_addr: str, ports: str) -> str:
    ipt_ports = ports.replace("-", ":")
    src = f"-s {src_addr} " if src_addr else ""
    ufw_from = src_addr or "any"
    return (f"on {dst_addr or 'that node'}: `iptables -I INPUT -p tcp {src}--dport {ipt_ports} "
            f"-j ACCEPT` (or `ufw allow from {ufw_from} to any port {ipt_ports} proto tcp`)")


def _answer(state: str, error: str, listening: bool = True) -> str:
    """How a connect was answered, in words. `listening`: the port was known to
    listen (a probe port), so a refusal can only be a rule."""
    refused = ("refused: an RST or ICMP came back though the port listened: a REJECT rule"
               if listening else "refused: an RST came back (nothing listening, or a REJECT rule)")
    return {"open": "open", "refused": refused,
            "dropped": f"dropped silently: no answer within {CONNECT_TIMEOUT_S:.0f}s "
                       "(a DROP rule or a default-deny policy; Gloo would hang at rendezvous)",
            "unreachable": f"unreachable ({error}; a REJECT rule with icmp-host-prohibited, "
                           "or no route)"}.get(state, f"{state} ({error})")


def check_store(nodes, port):
    master = nodes[0]
    if master.get("role") != "master":
        out = [row("store_port", "master", "cannot",
                   "the master did not take part: whether its store port is free is unknown")]
    else:
        sp = master.get("store_port") or {}
        state = sp.get("state")
        if state == "free":
            out = [row("store_port", label(nodes, 0), "pass", f"port {port} free on the master")]
        elif state == "held":
            fact, fix = describe(sp.get("holder") or {}, port)
            out = [row("store_port", label(nodes, 0), "fail", fact + " (EADDRINUSE at launch)", fix)]
        else:
            out = [row("store_port", label(nodes, 0), "cannot",
                       f"could not listen on port {port}: {sp.get('error') or 'unknown'}")]
    for i in range(len(nodes)):
        reach = nodes[i].get("store_reach")
        if nodes[i].get("role") == "master":
            continue
        if not reach:
            out.append(row("store_reach", label(nodes, i), "cannot", "the worker did not say"))
            continue
        fact = f"worker -> master port {reach['port']}: {_answer(reach['state'], reach['error'], False)}"
        if reach["state"] == "open":
            out.append(row("store_reach", label(nodes, i), "pass", fact))
        else:
            out.append(row("store_reach", label(nodes, i), "fail", fact,
                           _fix_open("the master", nodes[i].get("route_addr", ""), str(reach["port"]))))
    return out


def _ports(n: dict) -> str:
    pr = n.get("port_range") or []
    return f"{pr[0]}-{pr[1]}" if len(pr) == 2 else ""


def _rate(p: dict) -> float:
    return p["bytes"] / p["seconds"] if p.get("bytes") and p.get("seconds") else 0.0


def check_gloo_ports(nodes, probes):
    """Each node accepts connections from every other on the ports Gloo will
    use (docs/design.md "A firewall that drops Gloo's data connections": the
    worker's firewall dropped the master's connections to the ephemeral ports,
    a silent hang)."""
    out = []
    by_pair = {(p["src"], p["dst"]): p for p in probes}
    for dst in range(len(nodes)):
        ports = _ports(nodes[dst])
        src_of = nodes[dst].get("port_range_source", "")
        for src in range(len(nodes)):
            if src == dst:
                continue
            where = f"{label(nodes, src)} -> {label(nodes, dst)}"
            p = by_pair.get((src, dst))
            if not ports:
                out.append(row("gloo_ports", label(nodes, dst), "cannot",
                               f"{where}: port range unknown ({src_of})"))
                continue
            if p is None or p["state"] == "not run":
                why = (p or {}).get("error") or "the node did not report this probe"
                out.append(row("gloo_ports", label(nodes, dst), "cannot", f"{where}: not probed: {why}"))
                continue
            fact = (f"{where}, Gloo's ports {ports} (from {src_of}), probed on {p['port']}: "
                    f"{_answer(p['state'], p['error'])}")
            if p["state"] == "open":
                rate = _rate(p)
                out.append(row("gloo_ports", label(nodes, dst), "pass",
                               fact + (f", {rate / 1e6:.0f} MB/s" if rate else "")))
            else:
                out.append(row("gloo_ports", label(nodes, dst), "fail", fact,
                               _fix_open(nodes[dst].get("seen_addr", ""),
                                         nodes[src].get("seen_addr", ""), ports)))
    return out


def _ifname_fix(n: dict) -> str:
    iface = n.get("route_iface")
    iface = "" if iface == "lo" else iface
    return (f"export GLOO_SOCKET_IFNAME={iface} (the interface this node reaches the master "
            "from) on this node" if iface else
            "export GLOO_SOCKET_IFNAME=<the LAN interface> on this node")


def check_interfaces(nodes):
    out = []
    families = [family(n.get("gloo_addr", "")) for n in nodes]
    for i, n in enumerate(nodes):
        name = label(nodes, i)
        if n.get("gloo_error"):
            out.append(row("gloo_iface", name, "fail", n["gloo_error"], _ifname_fix(n)))
            continue
        addr, iface, kind = n.get("gloo_addr", ""), n.get("gloo_iface") or "?", n.get("gloo_iface_kind")
        fact = f"Gloo would use {addr} on {iface} ({families[i]}, {n.get('gloo_source', '')})"
        others = [(j, f) for j, f in enumerate(families) if j != i and f and f != families[i]]
        if kind == "loopback" or is_loopback(addr):
            out.append(row("gloo_iface", name, "fail" if len(nodes) > 1 else "warn",
                           fact + ": loopback; peers told to connect there reach themselves",
                           _ifname_fix(n)))
        elif others:
            j, f = others[0]
            out.append(row("gloo_iface", name, "fail",
                           f"{fact}, but {label(nodes, j)} uses {f} "
                           f"({nodes[j].get('gloo_addr')}): Gloo fails with "
                           f"`ss1.ss_family == ss2.ss_family`", _ifname_fix(n)))
        elif kind in SUSPECT_KINDS:
            out.append(row("gloo_iface", name, "warn", f"{fact}: {WORDS.get(kind, kind)}",
                           _ifname_fix(n) + " unless this is the network you mean"))
        else:
            out.append(row("gloo_iface", name, "pass", fact))
    return out


def check_hostnames(nodes):
    out = []
    for i, n in enumerate(nodes):
        name, host = label(nodes, i), n.get("hostname", "?")
        addrs = ", ".join(n.get("hostname_addrs") or [])
        cause = n.get("hostname_loopback_cause", "")
        loop = any(is_loopback(a) for a in n.get("hostname_addrs") or [])
        if n.get("hostname_error"):
            status = "pass" if n.get("gloo_ifname") else "warn"
            out.append(row("hostname", name, status, n["hostname_error"] +
                           (": unused, GLOO_SOCKET_IFNAME decides" if status == "pass" else ""),
                           "" if status == "pass" else _ifname_fix(n)))
        elif loop and n.get("gloo_ifname"):
            out.append(row("hostname", name, "pass", f"{host} resolves to {addrs} (loopback"
                           f"{'; ' + cause if cause else ''}), unused: GLOO_SOCKET_IFNAME="
                           f"{n['gloo_ifname']} decides"))
        elif loop:
            out.append(row("hostname", name, "fail" if len(nodes) > 1 else "warn",
                           f"{host} resolves to {addrs}, loopback, by "
                           f"{cause or 'an unknown source (DNS?)'}: Gloo would listen there",
                           f"map {host} to its LAN address in /etc/hosts (or drop `myhostname` "
                           f"from nsswitch's hosts line), or {_ifname_fix(n)}"))
        else:
            out.append(row("hostname", name, "pass", f"{host} resolves to {addrs}"))
    return out


def check_versions(nodes):
    if len(nodes) < 2:
        why = "no other node took part to compare with"
        return [row("torch", "all", "cannot", why), row("python", "all", "cannot", why)]
    out = []
    torches = [n.get("torch", "") for n in nodes]
    listing = ", ".join(f"{t or 'none'} on {label(nodes, i)}" for i, t in enumerate(torches))
    if not all(torches):
        out.append(row("torch", "all", "fail", f"torch not installed on a node: {listing}",
                       "install the same torch on every node"))
    elif len(set(torches)) > 1:
        out.append(row("torch", "all", "fail", f"torch versions differ: {listing}",
                       f"install torch=={torches[0]} (the master's) on every node"))
    else:
        out.append(row("torch", "all", "pass", f"torch {torches[0]} on every node"))
    pys = [n.get("python", "") for n in nodes]
    listing = ", ".join(f"{p or '?'} on {label(nodes, i)}" for i, p in enumerate(pys))
    minors = {".".join(p.split(".")[:2]) for p in pys}
    if len(set(pys)) == 1:
        out.append(row("python", "all", "pass", f"Python {pys[0]} on every node"))
    else:
        out.append(row("python", "all", "fail" if len(minors) > 1 else "warn",
                       f"Python versions differ: {listing}",
                       f"use Python {pys[0]} (the master's) on every node"))
    return out


def check_bf16(nodes, i):
    """Said plainly, as trainer/dtype.py decides from the training device; and
    the field's trap: an auto-detect asking torch.cuda.is_available()."""
    n, name = nodes[i], label(nodes, i)
    if not n.get("cpu_flags_read"):
        return row("bf16", name, "cannot", "CPU flags unreadable (/proc/cpuinfo)")
    flags = n.get("cpu_bf16") or []
    if "amx_bf16" in flags:
        fact = "CPU has amx_bf16: bf16 matmuls are faster than float32; auto-detect on CPU picks bfloat16"
    elif flags:
        fact = ("CPU has avx512_bf16 but no AMX: bf16 is not faster than float32; "
                "auto-detect on CPU picks float32")
    else:
        fact = ("CPU has no avx512_bf16/amx_bf16: bf16 would be emulated, many times slower; "
                "auto-detect on CPU picks float32")
    if n.get("gpu") and "amx_bf16" not in flags:
        return row("bf16", name, "warn", fact + "; but a GPU is installed, and an auto-detect "
                   "that asks torch.cuda.is_available() picks bfloat16 for a CPU run",
                   "force float32 for CPU training (decide the dtype from the training device)")
    return row("bf16", name, "pass", fact)


def check_allreduce(nodes, probes, params):
    measured = [p for p in probes if _rate(p) > 0]
    size = 2 * params * 4
    if not measured:
        return row("allreduce", "all", "cannot",
                   f"no link between nodes was measured; {size / 1e6:.0f} MB per step to move")
    slow = min(measured, key=_rate)
    rate = _rate(slow)
    return row("allreduce", "all", "pass",
               f"~{size / rate:.2f} s of all-reduce per step for {params:,} params "
               f"({size / 1e6:.0f} MB ≈ 2×P×4 bytes at {rate / 1e6:.0f} MB/s, the slowest "
               f"measured link, {label(nodes, slow['src'])} -> {label(nodes, slow['dst'])}); "
               "a second node helps only if a step's compute takes much longer")
