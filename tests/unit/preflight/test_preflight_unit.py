"""The pure parts of `ddpwatch preflight`: parsers, the protocol's checks on hostile
input, the checks over facts, the holder's description, the exit code; and the
meeting on loopback with junk clients in the way."""
from __future__ import annotations

import errno
import json
import socket
import subprocess
import sys
import threading
import time

import pytest

from conftest import REPO
from ddpwatch.observe.probes.host import Interface
from ddpwatch.preflight import checks, exchange, facts, holder, probe, protocol, render


def test_parse_port_range():
    assert facts.parse_port_range("32768\t60999\n") == (32768, 60999)
    assert facts.parse_port_range("40000:40100") == (40000, 40100)
    assert facts.parse_port_range("40000-40100") == (40000, 40100)
    for bad in ("", "1", "5 4", "0 10", "1 70000", "a b", "1 2 3"):
        assert facts.parse_port_range(bad) is None, bad


def test_loopback_cause_names_the_line():
    hosts = "127.0.0.1 localhost\n# 127.0.1.1 nodeb\n127.0.1.1 nodeb.lan nodeb\n"
    assert facts.loopback_cause("nodeb", hosts, "") == "/etc/hosts:3: 127.0.1.1 nodeb.lan nodeb"
    ns = "passwd: files\nhosts: files myhostname dns\n"
    assert facts.loopback_cause("other", hosts, ns) == \
        "/etc/nsswitch.conf:2: hosts: files myhostname dns"
    assert facts.loopback_cause("other", hosts, "hosts: files dns\n") == ""
    assert facts.loopback_cause("nodeb", "10.0.0.2 nodeb\n", "hosts: files dns") == ""


def test_family_and_the_address_gloo_takes_for_an_interface():
    assert facts.family("10.0.0.1") == "IPv4" and facts.family("::ffff:10.0.0.1") == "IPv4"
    assert facts.family("fd00::2") == "IPv6" and facts.family("fe80::1%eth0") == "IPv6"
    assert facts.family("junk") == ""
    iface = Interface("eth0", ("fe80::1%eth0", "fd00::2", "10.0.0.2"), True, 1500, 0, "regular",
                      False)
    assert facts.pick_iface_addr(iface) == "10.0.0.2"
    v6 = Interface("v6", ("fe80::1%v6", "fd00::2"), True, 1500, 0, "regular", False)
    assert facts.pick_iface_addr(v6) == "fd00::2"


def test_gloo_choice_from_the_environment():
    ifaces = (Interface("eth0", ("10.0.0.2",), True, 1500, 0, "regular", False),
              Interface("tailscale0", ("100.64.0.2", "fd7a::2"), True, 1280, 0, "vpn", True))
    got = facts.gloo_choice({"GLOO_SOCKET_IFNAME": "tailscale0"}, "h", (), ifaces)
    assert got["gloo_addr"] == "100.64.0.2" and got["gloo_iface_kind"] == "vpn"
    missing = facts.gloo_choice({"GLOO_SOCKET_IFNAME": "wg9"}, "h", (), ifaces)
    assert "no interface 'wg9'" in missing["gloo_error"]
    fallback = facts.gloo_choice({}, "h", ("203.0.113.9",), ifaces)  # not ours: not bindable
    assert fallback["gloo_addr"] == "127.0.0.1" and "falls back to loopback" in fallback["gloo_source"]


def test_port_range_from_gloo_port_range_or_the_kernel(tmp_path):
    assert facts.port_range({"GLOO_PORT_RANGE": "40000:40100"}) == {
        "port_range": [40000, 40100], "port_range_source": "GLOO_PORT_RANGE"}
    bad = facts.port_range({"GLOO_PORT_RANGE": "lots"})
    assert bad["port_range"] == [] and "is not LOW:HIGH" in bad["port_range_source"]
    (tmp_path / "sys/net/ipv4").mkdir(parents=True)
    (tmp_path / "sys/net/ipv4/ip_local_port_range").write_text("32768\t60999\n")
    got = facts.port_range({}, procfs=str(tmp_path))
    assert got["port_range"] == [32768, 60999] and got["port_range_source"].endswith(
        "ip_local_port_range")


def test_probe_listener_in_a_given_range_counts_what_arrives():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        base = s.getsockname()[1]
    listener = probe.ProbeListener((base, base + 50))
    try:
        assert base <= listener.port <= base + 50
        got = probe.probe("127.0.0.1", listener.port)
        assert got["state"] == "open" and got["bytes"] > 0 and got["seconds"] > 0
    finally:
        listener.close()
    assert probe.probe("127.0.0.1", listener.port)["state"] == "refused"


def test_probes_dial_only_ip_literals_and_real_ports():
    nodes = [{"seen_addr": "10.0.0.1", "probe_port": 1},
             {"seen_addr": "evil.example", "probe_port": 40000},
             {"seen_addr": "10.0.0.3", "probe_port": -5}]
    got = exchange.probe_all(nodes, 0)
    assert [(r["dst"], r["state"]) for r in got] == [(1, "not run"), (2, "not run")]
    assert "no usable probe address" in got[0]["error"]


def test_classify_connect_errors():
    assert probe.classify_error(socket.timeout()) == "dropped"
    assert probe.classify_error(OSError(errno.ECONNREFUSED, "refused")) == "refused"
    assert probe.classify_error(OSError(errno.EHOSTUNREACH, "no")) == "unreachable"


def test_protocol_keeps_only_known_fields_of_the_right_type():
    msg = {"kind": "hello", "facts": {"hostname": "a\x1b[31mb" + "x" * 1000, "probe_port": "80",
                                      "torch": 2, "hostname_addrs": ["1.2.3.4", 5] * 50,
                                      "evil": {"x": 1}, "store_port": {"holder": "nope"},
                                      "gpu": 1, "port_range": [1, True, 3]}}
    got = protocol.parse(json.dumps(msg).encode(), "hello")["facts"]
    assert got["hostname"].startswith("a?[31mb") and len(got["hostname"]) == protocol.MAX_STR
    assert got["probe_port"] == 0 and got["torch"] == "" and got["gpu"] is False
    assert got["hostname_addrs"] == ["1.2.3.4"] * 8  # list cut to 16 entries, bad ones dropped
    assert "evil" not in got and got["store_port"]["holder"] is None
    assert got["port_range"] == [1, 3]


@pytest.mark.parametrize("line,kind", [
    (b"\xff\xfe", "hello"), (b"[1,2]", "hello"), (b'{"kind": "final"}', "hello"),
    (b'{"kind": "roster", "you": 0, "nodes": [{}]}', "roster"),
    (b'{"kind": "roster", "you": 1, "nodes": []}', "roster"),
    (b'{"kind": "probes", "results": 3}', "probes"), (b"NaN", "hello"),
])
def test_protocol_rejects_junk(line, kind):
    with pytest.raises(protocol.ProtocolError):
        protocol.parse(line, kind)


def test_protocol_unknown_probe_state_is_not_a_pass():
    got = protocol.parse(b'{"kind": "probes", "results": [{"src": 1, "dst": 0, "state": "great"}]}',
                     "probes")
    assert got["results"][0]["state"] == "not run"


def test_line_reader_bounds_size_and_time():
    a, b = socket.socketpair()
    with a, b:
        # from a thread: the socket buffer is smaller than the line
        threading.Thread(target=lambda: _send_quietly(a, b"x" * (protocol.MAX_LINE + 10)),
                         daemon=True).start()
        with pytest.raises(protocol.ProtocolError, match="longer"):
            protocol.LineReader(b).line(time.monotonic() + 5)
    a, b = socket.socketpair()
    with a, b:
        started = time.monotonic()
        with pytest.raises(protocol.ProtocolError, match="timed out"):
            protocol.LineReader(b).line(time.monotonic() + 0.3)
        assert time.monotonic() - started < 2


def _send_quietly(sock, data):
    try:
        sock.sendall(data)
    except OSError:
        pass


def node(role, addr, **kw):
    base = protocol.clean({}, protocol.FACTS)
    base.update(role=role, hostname=f"h{addr[-1]}", seen_addr=addr, route_addr=addr,
                route_iface="eth0", gloo_addr=addr, gloo_iface="eth0", gloo_iface_kind="regular",
                gloo_ifname="eth0", gloo_source="GLOO_SOCKET_IFNAME=eth0",
                hostname_addrs=[addr], port_range=[32768, 60999],
                port_range_source="/proc/sys/net/ipv4/ip_local_port_range", probe_port=40000,
                torch="2.13.0", python="3.11.7", cpu_flags_read=True, cpu_bf16=[])
    if role == "master":
        base["store_port"] = {"state": "free", "error": "", "holder": None, "port": 29500}
    else:
        base["store_reach"] = {"state": "open", "error": "", "port": 29500, "preflight": True}
    base.update(kw)
    return base


def pair_probes(state10="open"):
    return [{"src": 0, "dst": 1, "addr": "10.0.0.2", "port": 40000, "state": state10,
             "error": "", "bytes": 100_000_000, "seconds": 1.0},
            {"src": 1, "dst": 0, "addr": "10.0.0.1", "port": 40000, "state": "open",
             "error": "", "bytes": 50_000_000, "seconds": 1.0}]


def test_checks_healthy_pair_all_pass():
    nodes = [node("master", "10.0.0.1"), node("worker", "10.0.0.2")]
    rows = checks.evaluate(nodes, pair_probes(), 2, 29500, params=10_000_000)
    assert {r["status"] for r in rows} == {"pass"}, rows
    est = next(r for r in rows if r["check"] == "allreduce")["fact"]
    assert est.startswith("~1.60 s") and "50 MB/s" in est  # 80 MB over the slower direction
    assert render.exit_code(rows) == 0


def test_checks_dropped_direction_names_rule_and_range():
    nodes = [node("master", "10.0.0.1"), node("worker", "10.0.0.2")]
    rows = checks.evaluate(nodes, pair_probes("dropped"), 2, 29500)
    bad = [r for r in rows if r["status"] != "pass"]
    assert [r["check"] for r in bad] == ["gloo_ports"]
    assert "master h1 (10.0.0.1) -> worker 1 h2 (10.0.0.2)" in bad[0]["fact"]
    assert "32768-60999" in bad[0]["fact"] and "dropped silently" in bad[0]["fact"]
    assert "iptables -I INPUT -p tcp -s 10.0.0.1 --dport 32768:60999 -j ACCEPT" in bad[0]["fix"]
    assert "ufw allow from 10.0.0.1 to any port 32768:60999 proto tcp" in bad[0]["fix"]
    assert render.exit_code(rows) == 1


def test_a_check_that_could_not_run_is_never_a_pass():
    alone = [node("worker", "10.0.0.2", store_reach={"state": "dropped", "error": "timed out",
                                                     "port": 29500, "preflight": False})]
    rows = checks.evaluate(alone, [], 2, 29500, error="no preflight master answered")
    by = {r["check"]: r["status"] for r in rows}
    assert by["nodes"] == "fail" and by["store_port"] == "cannot" and by["store_reach"] == "fail"
    assert by["torch"] == "cannot" and render.exit_code(rows) == 1
    nodes = [node("master", "10.0.0.1"), node("worker", "10.0.0.2")]
    rows = checks.evaluate(nodes, pair_probes()[:1], 2, 29500, params=1000)
    missing = [r for r in rows if r["check"] == "gloo_ports" and r["status"] == "cannot"]
    assert len(missing) == 1 and "did not report" in missing[0]["fact"]
    assert render.exit_code(rows) == 1


def test_checks_family_loopback_vpn_versions_bf16():
    nodes = [node("master", "10.0.0.1", gpu=True),
             node("worker", "10.0.0.2", gloo_addr="fd00::2", gloo_iface="v6",
                  torch="2.12.0", python="3.10.1", cpu_bf16=["amx_bf16", "avx512_bf16"])]
    rows = checks.evaluate(nodes, pair_probes(), 2, 29500)
    get = {(r["check"], r["node"][:6]): r for r in rows}
    assert get[("gloo_iface", "worker")]["status"] == "fail"
    assert "uses IPv4 (10.0.0.1)" in get[("gloo_iface", "worker")]["fact"]
    assert get[("torch", "all")]["status"] == "fail" and "2.12.0 on worker" in get[("torch", "all")]["fact"]
    assert get[("python", "all")]["status"] == "fail"
    assert get[("bf16", "master")]["status"] == "warn"  # a GPU: the field's auto-detect trap
    assert "picks bfloat16" in get[("bf16", "worker")]["fact"]
    nodes = [node("master", "10.0.0.1", gloo_iface_kind="vpn", gloo_iface="tailscale0"),
             node("worker", "10.0.0.2", gloo_ifname="", gloo_addr="127.0.1.1",
                  gloo_iface="lo", gloo_iface_kind="loopback", hostname_addrs=["127.0.1.1"],
                  hostname_loopback_cause="/etc/hosts:2: 127.0.1.1 h2")]
    rows = checks.evaluate(nodes, pair_probes(), 2, 29500)
    get = {(r["check"], r["node"][:6]): r for r in rows}
    assert get[("gloo_iface", "master")]["status"] == "warn"
    assert "a VPN interface" in get[("gloo_iface", "master")]["fact"]
    assert get[("gloo_iface", "worker")]["status"] == "fail"
    assert get[("hostname", "worker")]["status"] == "fail"
    assert "/etc/hosts:2" in get[("hostname", "worker")]["fact"]


def test_holder_description():
    fact, fix = holder.describe({"pid": 42, "user": "ann", "command": "python train.py",
                                 "started": 0.0, "ppid": 1, "parent_alive": False}, 29500)
    assert "held by pid 42 (user ann, since 1970-01-01 00:00:00 UTC, parent gone" in fact
    assert fix == "kill 42"
    fact, fix = holder.describe({"pid": 0, "error": "run as root"}, 29500)
    assert "holder unknown: run as root" in fact and "ss -ltnp" in fix


def test_meeting_on_loopback_survives_junk_clients():
    """A silent client, a garbage line and an oversized line reach the master
    before the real worker: none is taken for a node, none delays the meeting."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    master_facts = {"role": "master", "hostname": "m", "seen_addr": "127.0.0.1"}
    result = {}
    t = threading.Thread(target=lambda: result.update(m=exchange.run_master(
        port, 2, master_facts, 20, socket.AF_INET, holder.port_holder)))
    t.start()
    junk = []
    deadline = time.monotonic() + 10
    while not junk and time.monotonic() < deadline:
        try:
            junk.append(socket.create_connection(("127.0.0.1", port), timeout=1))
        except OSError:
            time.sleep(0.05)
    for payload in (b"GET / HTTP/1.0\r\n\r\n", b"{" * (protocol.MAX_LINE + 2)):
        c = socket.create_connection(("127.0.0.1", port))
        try:
            c.sendall(payload)
        except OSError:
            pass
        junk.append(c)
    started = time.monotonic()
    worker = exchange.run_worker("127.0.0.1", port, {"hostname": "w", "role": "worker"}, 20,
                                 lambda a: "lo")
    t.join(30)
    for c in junk:
        c.close()
    assert worker.error == "" and result["m"].error == ""
    assert [n["hostname"] for n in worker.nodes] == ["m", "w"] and worker.me == 1
    assert time.monotonic() - started < 8  # the silent client held nobody up for HELLO_S


def _channels(secret: bytes):
    a, b = socket.socketpair()
    nonce = protocol.new_nonce()
    master = protocol.Channel(a, protocol.LineReader(a), "master", secret, nonce)
    worker = protocol.Channel(b, protocol.LineReader(b), "worker", secret, nonce)
    return master, worker


def test_a_signed_channel_carries_the_exchange_and_refuses_what_is_not_its_own():
    master, worker = _channels(b"s3cret")
    worker.send("hello", facts={"hostname": "w"})
    assert master.recv("hello", time.monotonic() + 2)["facts"]["hostname"] == "w"
    assert master.worker_nonce == worker.worker_nonce != ""  # binds every later message
    master.send("roster", you=1, nodes=[{"hostname": "m"}, {"hostname": "w"}])
    assert worker.recv("roster", time.monotonic() + 2)["you"] == 1
    # a line replayed into the same direction: its number is not the next one
    worker.send("probes", results=[])
    line = master.reader.sock.recv(65536)
    master.reader.buf = line + line
    master.recv("probes", time.monotonic() + 2)
    with pytest.raises(protocol.ProtocolError, match="not signed with the preflight secret"):
        master.recv("probes", time.monotonic() + 2)


@pytest.mark.parametrize("wrong", [b"", b"another-secret"])
def test_a_hello_without_the_secret_is_refused(wrong):
    a, b = socket.socketpair()
    master = protocol.Channel(a, protocol.LineReader(a), "master", b"s3cret", protocol.new_nonce())
    stranger = protocol.Channel(b, protocol.LineReader(b), "worker", wrong, master.master_nonce)
    stranger.send("hello", facts={"hostname": "x"})
    with pytest.raises(protocol.ProtocolError):
        master.recv("hello", time.monotonic() + 2)


def test_a_signed_message_is_worth_nothing_in_another_connection():
    one_master, one_worker = _channels(b"s3cret")
    one_worker.send("hello", facts={"hostname": "w"})
    line = one_master.reader.sock.recv(65536)
    other_master, _ = _channels(b"s3cret")  # another nonce of the master's
    other_master.reader.buf = line
    with pytest.raises(protocol.ProtocolError, match="not signed"):
        other_master.recv("hello", time.monotonic() + 2)


def test_greetings_say_whether_the_master_uses_a_secret():
    nonce = protocol.new_nonce()
    assert protocol.read_greeting(protocol.greeting("").rstrip(b"\n")) == ""
    assert protocol.read_greeting(protocol.greeting(nonce).rstrip(b"\n")) == nonce
    for junk in (b"SSH-2.0-OpenSSH", protocol.GREETING_AUTH + b"short",
                 protocol.GREETING_AUTH + b"Z" * 32):
        assert protocol.read_greeting(junk) is None


def _signed_master(port: int, wait_s: float) -> tuple[threading.Thread, dict]:
    """A master with the secret b"s3cret" meeting on loopback in a thread;
    its Meeting lands in the dict under "m"."""
    result: dict = {}
    t = threading.Thread(target=lambda: result.update(m=exchange.run_master(
        port, 2, {"role": "master", "hostname": "m", "seen_addr": "127.0.0.1"}, wait_s,
        socket.AF_INET, holder.port_holder, b"s3cret")))
    t.start()
    return t, result


def test_on_loopback_only_workers_with_the_secret_take_a_slot():
    """A stranger's hello, first in, takes no worker slot from the real worker;
    the master says how many it refused."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    t, result = _signed_master(port, 6)
    stranger = exchange.run_worker("127.0.0.1", port, {"hostname": "x", "role": "worker"}, 3,
                                   lambda a: "lo", b"a-guess")
    worker = exchange.run_worker("127.0.0.1", port, {"hostname": "w", "role": "worker"}, 20,
                                 lambda a: "lo", b"s3cret")
    t.join(30)
    assert "the exchange with the master failed" in stranger.error
    assert worker.error == "" and result["m"].error == "" and result["m"].refused == 1
    assert [n["hostname"] for n in result["m"].nodes] == ["m", "w"]
    # without the secret the worker is told so, and sends nothing
    t, lone = _signed_master(port, 3)
    plain = exchange.run_worker("127.0.0.1", port, {"hostname": "p", "role": "worker"}, 2,
                                lambda a: "lo")
    t.join(30)
    assert "wants the preflight secret" in plain.error and lone["m"].refused == 0


def test_cli_usage_errors_exit_2():
    for argv in (["--master", "nohost"], ["--master", "1.2.3.4:99999"],
                 ["--master", "fd00::1:29500"], ["--master", "127.0.0.1:29500", "--nodes", "0"]):
        done = subprocess.run([sys.executable, "-m", "ddpwatch", "preflight", *argv],
                              capture_output=True, text=True, cwd=REPO, timeout=60)
        assert done.returncode == 2, (argv, done.stderr)
        assert "Traceback" not in done.stderr and "ddpwatch preflight: --" in done.stderr


def test_a_secret_file_that_cannot_be_used_is_named(tmp_path):
    empty = tmp_path / "empty"
    empty.write_text("\n")
    for argv, code, said in (
            (["--secret-file", str(tmp_path / "missing")], 66, "No such file"),
            (["--secret-file", str(empty)], 2, "empty")):
        done = subprocess.run([sys.executable, "-m", "ddpwatch", "preflight", "--master",
                               "127.0.0.1:29500", *argv], capture_output=True, text=True,
                              cwd=REPO, timeout=60)
        assert done.returncode == code, (argv, done.stderr)
        assert said in done.stderr and "--secret-file" in done.stderr
        assert "Traceback" not in done.stderr


def test_a_fake_master_with_a_well_formed_greeting_learns_nothing_of_the_worker():
    """A program on the store port that copies the signed greeting (a nonce is
    anyone's to make) and answers whatever it likes: the worker's hostname,
    versions, addresses, interfaces and port range never reach it, since the
    master must prove the secret before the worker sends its facts
    (preflight/protocol.py)."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(4)
    port = server.getsockname()[1]
    heard = bytearray()

    def fake_master():
        conn, _ = server.accept()
        with conn:
            conn.sendall(protocol.greeting(protocol.new_nonce()))
            conn.settimeout(1.0)
            try:
                heard.extend(conn.recv(65536))  # the hello
                # a "proven" it cannot sign, then whatever else comes
                conn.sendall(b"0" * 64 + b' {"kind":"proven"}\n')
                while chunk := conn.recv(65536):
                    heard.extend(chunk)
            except OSError:
                pass
    t = threading.Thread(target=fake_master)
    t.start()
    facts = {"role": "worker", "hostname": "secret-host-w7", "torch": "2.9.9+secret",
             "python": "3.11.99", "gloo_addr": "10.66.77.88", "gloo_ifname": "ethsecret",
             "port_range": [41000, 41999], "hostname_addrs": ["10.66.77.88"]}
    worker = exchange.run_worker("127.0.0.1", port, facts, 4, lambda a: "lo", b"s3cret")
    t.join(30)
    server.close()
    assert heard and "the exchange with the master failed" in worker.error, (heard, worker.error)
    assert "not signed with the preflight secret" in worker.error
    for secret in ("secret-host-w7", "2.9.9", "3.11.99", "10.66.77.88", "ethsecret", "41000",
                   "127.0.0.1", "route_"):
        assert secret.encode() not in heard, (secret, bytes(heard))
