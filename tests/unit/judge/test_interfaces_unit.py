"""The interfaces signal family (judge/signals/interfaces.py): where a rank's Gloo listens against where it reaches the
master from, over hand-built snapshots (pure code; the real jobs are in
test_diagnose_trainer.py and the hostname_loopback replay fixture)."""
from __future__ import annotations

import pytest

from ddpwatch.observe.probes.host import CpuInfo, Host, Interface, LoadAvg
from ddpwatch.observe.probes.process import ProcessObs, Processes
from ddpwatch.observe.probes.sockets import PidSockets, Sockets, TcpSocket
from ddpwatch.judge.signals.interfaces import measure as interface_signals
from ddpwatch.observe.snapshot import Job, Snapshot

PID, MASTER = 4242, 29500
ENV = {"MASTER_ADDR": "192.168.1.10", "MASTER_PORT": str(MASTER), "WORLD_SIZE": "2",
       "RANK": "1"}


def iface(name, kind, *addrs):
    return Interface(name, addrs, True, 1500, 1000, kind, kind in ("vpn", "bridge", "veth"))


HOST = Host(0.0, "node-b", ("127.0.1.1",), True, CpuInfo("", (), 2, 2, 1, False),
            LoadAvg(0, 0, 0, 1, 1),
            (iface("lo", "loopback", "127.0.0.1", "::1"),
             iface("eth0", "regular", "192.168.1.11"),
             iface("docker0", "bridge", "172.17.0.1"),
             iface("tailscale0", "vpn", "100.64.0.2", "fd7a:115c:a1e0::2")), ())


def sock(state, local, lport, peer="0.0.0.0", pport=0):
    return TcpSocket(1, "tcp6" if ":" in local else "tcp", state, local, lport, peer, pport,
                     0, 0, 0)


def snap(socks, env=ENV, host=HOST) -> tuple[Snapshot, ...]:
    procs = Processes(0.0, 100.0, 100, (ProcessObs(PID, state="S", env=dict(env)),))
    s = Snapshot(1, 0.0, 0.0, Job(PID, -1, "none", (PID,), ""), procs,
                 Sockets(0.0, (PidSockets(PID, sockets=tuple(socks)),)), None, host, None, ())
    return (s,)


def store(local="192.168.1.11"):
    return sock("ESTABLISHED", local, 40000, "192.168.1.10", MASTER)


def test_hostname_on_loopback_not_connected():
    s = interface_signals(snap([sock("LISTEN", "127.0.1.1", 41000), store()]), PID)
    assert s["gloo_addr"] == "127.0.1.1" and s["gloo_loopback"] is True
    assert (s["gloo_iface"], s["gloo_iface_kind"]) == ("lo", "loopback")  # all of 127/8
    assert s["master_route_addr"] == "192.168.1.11" and s["master_route_iface"] == "eth0"
    assert s["gloo_unconnected"] == 1 and s["gloo_off_route"] is False  # loopback: its own rule


def test_connected_to_every_peer_is_not_suspect_whatever_it_binds():
    data = sock("ESTABLISHED", "127.0.0.1", 41000, "127.0.0.1", 50000)
    s = interface_signals(snap([sock("LISTEN", "127.0.0.1", 41000), store("127.0.0.1"), data]),
                          PID)
    assert s["gloo_unconnected"] == 0


@pytest.mark.parametrize("listen, ifname, off", [
    ("192.168.1.11", "", False),        # the master's route: right
    ("100.64.0.2", "", True),           # the hostname resolved to the VPN (MagicDNS)
    ("172.17.0.1", "docker0", True),    # a docker bridge, even when chosen by name
    ("100.64.0.2", "tailscale0", True),  # a VPN while the master is reached over the LAN
    ("fd7a:115c:a1e0::2", "tailscale0", True),  # IPv6 against the master's IPv4
    ("10.0.0.5", "ib0", False),         # a deliberate data network: regular, same family
])
def test_off_the_master_route(listen, ifname, off):
    env = dict(ENV, GLOO_SOCKET_IFNAME=ifname) if ifname else ENV
    host = HOST if listen != "10.0.0.5" else Host(
        *[getattr(HOST, f) for f in ("taken_at", "hostname", "hostname_addrs",
                                     "hostname_loopback", "cpu", "loadavg")],
        HOST.interfaces + (iface("ib0", "regular", "10.0.0.5"),), ())
    s = interface_signals(snap([sock("LISTEN", listen, 41000), store()], env, host), PID)
    assert s["gloo_off_route"] is off and s["gloo_ifname"] == ifname


def test_master_port_and_wildcard_listeners_are_not_gloo():
    """Rank 0 of a launch without torchrun hosts the store on MASTER_PORT; a
    script's own server binds the wildcard. Neither is the Gloo address."""
    s = interface_signals(snap([sock("LISTEN", "192.168.1.11", MASTER),
                                sock("LISTEN", "0.0.0.0", 8080), store()]), PID)
    assert "gloo_addr" not in s and "gloo_off_route" not in s


def test_address_of_another_namespace_is_unknown_not_guessed():
    s = interface_signals(snap([sock("LISTEN", "10.9.9.9", 41000), store()]), PID)
    assert s["gloo_iface"] is None and s["gloo_iface_kind"] is None
    assert s["gloo_off_route"] is True  # picked by the hostname, off the master's route


def test_nothing_without_sockets_or_process():
    procs = Processes(0.0, 100.0, 100, ())
    s = Snapshot(1, 0.0, 0.0, Job(PID, -1, "none", (PID,), ""), procs, None, None, HOST, None, ())
    assert interface_signals((s,), PID) == {}
