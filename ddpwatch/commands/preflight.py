"""`ddpwatch preflight --master ADDR:PORT [--nodes N] [--params N] [--json]`:
the network checklist, run with the same arguments on every node before a
multi-node launch. The node holding ADDR is the master; it meets the others on
PORT (the store port, or PORT+1 when something holds it), and every node
prints the whole table. Exit 0: all passed; 1: a check failed or could not
run; 2: usage."""
from __future__ import annotations

import ipaddress
import os
import socket

from .. import errors
from ..observe.probes.host import interface_of
from ..observe.probes.host import read_interfaces, resolve
from ..preflight import checks, facts as facts_mod, protocol, render
from ..preflight.exchange import run_master, run_worker
from ..preflight.holder import port_holder
from ..preflight.probe import ProbeListener


def parse_master(text: str) -> tuple[str, int]:
    """'10.0.0.1:29500', 'host:29500', '[fd00::1]:29500' -> (addr, port)."""
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65535:
        raise errors.UsageError(f"--master {text!r}: expected ADDR:PORT (PORT 1-65534)")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    elif ":" in host:
        raise errors.UsageError(f"--master {text!r}: write an IPv6 address as [ADDR]:PORT")
    return host, int(port)


def master_address(host: str) -> str:
    try:
        return str(ipaddress.ip_address(host))
    except ValueError:
        pass
    addrs = resolve(host, 3.0)
    if not addrs:
        raise errors.UsageError(f"--master {host}: does not resolve on this node")
    return next((a for a in addrs if ":" not in a), addrs[0])


MAX_SECRET = 4096


def read_secret(environ, secret_file: str | None) -> bytes:
    """The preflight secret: from --secret-file, else $DDPWATCH_PREFLIGHT_SECRET
    (never a flag: another user reads argv in /proc), else none."""
    if secret_file:
        try:
            with open(secret_file, "rb") as f:
                value = f.read(MAX_SECRET + 1).strip()
        except OSError as err:
            raise errors.NoInput(f"--secret-file {secret_file}: {err.strerror}") from err
        where = f"--secret-file {secret_file}"
    else:
        value = environ.get(protocol.SECRET_ENV, "").strip().encode()
        where = f"${protocol.SECRET_ENV}"
    if len(value) > MAX_SECRET:
        raise errors.UsageError(f"{where}: longer than {MAX_SECRET} bytes")
    if secret_file and not value:
        raise errors.UsageError(f"{where}: empty")
    return value


def main(args) -> int:
    host, port = parse_master(args.master)
    secret = read_secret(os.environ, getattr(args, "secret_file", None))
    if not 1 <= args.nodes <= 64:
        raise errors.UsageError(f"--nodes {args.nodes}: expected 1 to 64")
    if args.params is not None and args.params <= 0:
        raise errors.UsageError(f"--params {args.params}: expected a positive count")
    if args.wait <= 0:
        raise errors.UsageError(f"--wait {args.wait}: expected seconds > 0")
    addr = master_address(host)
    interfaces = read_interfaces()
    local = {a.partition("%")[0] for i in interfaces for a in i.addresses}
    is_master = addr in local
    family = socket.AF_INET6 if ":" in addr else socket.AF_INET
    facts = facts_mod.gather(dict(os.environ))
    pr = facts["port_range"] if facts["port_range_source"] == "GLOO_PORT_RANGE" else None
    try:
        listener = ProbeListener(tuple(pr) if pr else None, family)
    except OSError as err:
        listener = None
        facts["port_range_source"] += f" (no probe port: {err})"
    facts["probe_port"] = listener.port if listener else 0
    try:
        if is_master:
            facts.update(role="master", seen_addr=addr, route_addr=addr,
                         route_iface=interface_of(addr, interfaces)[0] or "")
            meeting = run_master(port, args.nodes, facts, args.wait, family, port_holder,
                                 secret)
        else:
            facts["role"] = "worker"
            meeting = run_worker(addr, port, facts, args.wait,
                                 lambda a: interface_of(a, interfaces)[0], secret)
    finally:
        if listener:
            listener.close()
    rows = checks.evaluate(meeting.nodes, meeting.probes, args.nodes, port, meeting.error,
                           args.params or 0, meeting.secret)
    if args.json:
        print(render.as_json(rows, meeting, f"{host}:{port}"))
    else:
        me = checks.label(meeting.nodes, meeting.me)
        print(render.text(rows, f"preflight for {host}:{port}, {args.nodes} nodes; this is {me}"))
    return render.exit_code(rows)
