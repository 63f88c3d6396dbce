"""Host probe: cpuinfo/loadavg parsers on saved files, interface classification
(Gloo binding a docker bridge or a VPN hangs a job: docs/design.md "Gloo on the
wrong interface"), and the live probe."""
from __future__ import annotations

import json
import os
import shutil
import socket
import threading
import time
from types import SimpleNamespace

import pytest
from conftest import TESTS

from ddpwatch import codec
from ddpwatch.observe.probes import Look, Pass, ProbeContext, load_all, make, run_probe
from ddpwatch.observe.probes import host as H

CPUINFO = os.path.join(TESTS, "fixtures", "cpuinfo")


def cpuinfo(name):
    with open(os.path.join(CPUINFO, name)) as f:
        return f.read()


def test_parse_cpuinfo_x86():
    cpu = H.parse_cpuinfo(cpuinfo("amd_epyc_2vcpu.txt"))
    assert cpu.model_name == "AMD EPYC"
    assert (cpu.logical_cores, cpu.physical_cores, cpu.sockets) == (2, 2, 1)
    assert {"avx2", "avx512f", "avx512_bf16"} <= set(cpu.flags) and cpu.bf16_native
    assert list(cpu.flags) == sorted(cpu.flags)


def test_parse_cpuinfo_without_bf16_and_hyperthreads():
    text = "".join(
        f"processor\t: {i}\nmodel name\t: Intel(R) Core(TM) i9\nflags\t\t: fpu avx2 avx512f\n"
        f"physical id\t: 0\ncore id\t\t: {i // 2}\n\n" for i in range(4))
    cpu = H.parse_cpuinfo(text)
    assert (cpu.logical_cores, cpu.physical_cores, cpu.sockets) == (4, 2, 1)
    assert not cpu.bf16_native  # avx512f alone: bf16 is emulated, many times slower


def test_parse_cpuinfo_arm_features_and_trailing_model():
    cpu = H.parse_cpuinfo(cpuinfo("aarch64_rpi4_handwritten.txt"))
    assert cpu.model_name == "Raspberry Pi 4 Model B Rev 1.1"
    assert "asimd" in cpu.flags and cpu.logical_cores == 2
    assert (cpu.physical_cores, cpu.sockets, cpu.bf16_native) == (-1, -1, False)
    assert H.parse_cpuinfo("") == H.CpuInfo("", (), 0, -1, -1, False)


def test_parse_loadavg():
    assert H.parse_loadavg("0.06 0.07 0.03 2/345 4540\n") == H.LoadAvg(0.06, 0.07, 0.03, 2, 345)


@pytest.mark.parametrize("name, kind", [
    ("lo", "loopback"), ("eth0", "regular"), ("enp3s0", "regular"), ("wlp2s0", "regular"),
    ("tailscale0", "vpn"), ("wg0", "vpn"), ("tun0", "vpn"), ("zt5u4y", "vpn"),
    ("docker0", "bridge"), ("br-3f2a9c", "bridge"), ("virbr0", "bridge"), ("cni0", "bridge"),
    ("veth1a2b3c", "veth"),
])
def test_interface_kind(name, kind):
    assert H.interface_kind(name) == kind


def test_build_interfaces_flags_suspects():
    addr = lambda fam, a: SimpleNamespace(family=fam, address=a)
    addrs = {
        "eth0": [addr(socket.AF_INET, "192.168.1.10"), addr(socket.AF_PACKET, "aa:bb:cc:dd:ee:ff"),
                 addr(socket.AF_INET6, "fe80::1%eth0")],
        "tailscale0": [addr(socket.AF_INET, "100.64.0.2"), addr(socket.AF_INET6, "fd7a::2")],
        "docker0": [addr(socket.AF_INET, "172.17.0.1")],
    }
    stat = lambda up, mtu, speed: SimpleNamespace(isup=up, mtu=mtu, speed=speed)
    stats = {"eth0": stat(True, 1500, 1000), "tailscale0": stat(True, 1280, 0),
             "docker0": stat(False, 1500, 0)}
    docker, eth, ts = H.build_interfaces(addrs, stats)
    assert eth == H.Interface("eth0", ("192.168.1.10", "fe80::1%eth0"), True, 1500, 1000,
                              "regular", False)
    assert ts.suspect and ts.kind == "vpn" and ts.addresses == ("100.64.0.2", "fd7a::2")
    assert docker.suspect and not docker.is_up
    assert H.build_interfaces({}, {"ifb0": stat(False, 1500, 0)})[0].addresses == ()


def test_is_loopback():
    assert H.is_loopback("127.0.1.1") and H.is_loopback("::1")
    assert not H.is_loopback("192.168.1.2") and not H.is_loopback("fe80::1%eth0")
    assert not H.is_loopback("not-an-ip")


def test_run_with_fixture_procfs(tmp_path):
    shutil.copy(os.path.join(CPUINFO, "amd_epyc_2vcpu.txt"), tmp_path / "cpuinfo")
    (tmp_path / "loadavg").write_text("1.50 0.50 0.25 3/120 999\n")
    data = H.read(ProbeContext(procfs=str(tmp_path), clock=lambda: 3.0, timeout_s=10))
    assert data.taken_at == 3.0 and data.cpu.model_name == "AMD EPYC"
    assert data.loadavg.runnable == 3 and data.hostname == socket.gethostname()
    assert any(i.kind == "loopback" for i in data.interfaces)
    assert data.hostname_loopback == any(H.is_loopback(a) for a in data.hostname_addrs)
    assert H.from_json(json.loads(json.dumps(codec.to_json(data)))) == data


def test_missing_parts_are_errors_not_failures(tmp_path):
    data = H.read(ProbeContext(procfs=str(tmp_path), timeout_s=10))
    assert data.cpu.logical_cores == -1 and data.loadavg.one == -1.0
    assert [e.split(":")[0] for e in data.errors[:2]] == ["cpuinfo", "loadavg"]


def test_slow_resolver_does_not_stall(monkeypatch):
    release = threading.Event()
    monkeypatch.setattr(socket, "getaddrinfo", lambda *a, **k: release.wait(30) and [])
    start = time.monotonic()
    assert H.resolve("nowhere.invalid", 0.2) is None
    assert time.monotonic() - start < 5
    release.set()


def test_live_run_probe():
    spec = load_all()["host"]
    assert spec.look == Look.GLANCE and not spec.budgeted  # cheap: every tick
    result = run_probe(make("host"), ProbeContext(timeout_s=10), Pass(), ())
    assert result.ok, result.error
    assert result.data.cpu.logical_cores == os.cpu_count()
    assert result.data.loadavg.tasks > 0
