"""A rank's own node as its namespaces show it: the pure parts of
probes/nshost.py, the safe reader of a rank's files (observe/system/rootfile.py) on a
tree made here, and the host signals judging with the rank's view."""
import dataclasses
import os

import pytest
from conftest import TESTS

from ddpwatch.judge.signals import host as host_signals
from ddpwatch.judge.signals import interfaces as iface_signals
from ddpwatch.observe.probes.host import Host, Interface
from ddpwatch.observe.probes.nshost import (NsView, NsViews, hosts_addrs, hosts_sources,
                                            resolution)
from ddpwatch.observe.system import rootfile
from ddpwatch.observe.system.rootfile import FileRefused, read_in_root
from ddpwatch.observe.snapshot import load, save
from ddpwatch.publish import page

ME = (os.getuid(), frozenset(os.getgroups()) | {os.getgid()})  # who reads (rootfile.readable_by)
HOSTS = """127.0.0.1 localhost
127.0.1.1   Node1 node1.lan # Debian's line
10.0.0.2 node0
# 10.9.9.9 node1
"""


def test_hosts_file_answers_with_every_matching_line_in_order():
    assert hosts_addrs(HOSTS, "node1") == ("127.0.1.1",)
    assert hosts_addrs(HOSTS + "10.0.0.1 node1\n", "NODE1") == ("127.0.1.1", "10.0.0.1")
    assert hosts_addrs(HOSTS, "node9") == ()
    assert hosts_addrs("not-an-address node1\n" + HOSTS, "node1") == ("127.0.1.1",)
    many = "".join(f"10.1.{i // 256}.{i % 256} node1\n" for i in range(5000))
    assert len(hosts_addrs(many, "node1")) == 16


def test_nsswitch_sources_without_actions():
    assert hosts_sources("passwd: files\nhosts:  files [NOTFOUND=return] mdns4_minimal dns\n") \
        == ("files", "mdns4_minimal", "dns")
    assert hosts_sources("passwd: files\n") is None


def test_resolution_is_whole_only_when_files_answer_first():
    assert resolution("node1", HOSTS, "hosts: files dns\n") == (("127.0.1.1",), True, "")
    addrs, whole, unseen = resolution("node1", HOSTS, "hosts: myhostname files dns\n")
    assert addrs == ("127.0.1.1",) and not whole and "myhostname before /etc/hosts" in unseen
    addrs, whole, unseen = resolution("node9", HOSTS, "hosts: files myhostname dns\n")
    assert addrs == () and not whole
    assert unseen == ("node9 is not in its /etc/hosts; what myhostname, dns answer in its "
                      "namespace was not looked up")
    # no nsswitch.conf: glibc asks dns first
    addrs, whole, unseen = resolution("node1", HOSTS, None)
    assert addrs == ("127.0.1.1",) and not whole and "glibc then asks dns" in unseen
    assert "could not be read (none there)" in resolution("node1", None, None, "none there")[2]


@pytest.fixture(params=["openat2", "nofollow-walk"])
def root(tmp_path, request, monkeypatch):
    """A rank's root: /etc/hosts, and a secret beside it, outside the root. Read
    with openat2, and as on a kernel without it (every component O_NOFOLLOW)."""
    monkeypatch.setattr(rootfile, "_openat2_missing", request.param == "nofollow-walk")
    (tmp_path / "secret").write_text("outside\n")
    r = tmp_path / "root"
    (r / "etc").mkdir(parents=True)
    (r / "etc" / "hosts").write_text(HOSTS)
    return r


def test_reads_the_ranks_file(root):
    assert read_in_root(str(root), "/etc/hosts", ME) == HOSTS


def test_a_symlink_out_of_the_root_stays_inside_it(root, tmp_path):
    os.remove(root / "etc" / "hosts")
    os.symlink(str(tmp_path / "secret"), root / "etc" / "hosts")  # absolute: the host's
    with pytest.raises(OSError):  # resolved in the root (no such file) or refused
        read_in_root(str(root), "/etc/hosts", ME)
    os.remove(root / "etc" / "hosts")
    os.symlink("../../secret", root / "etc" / "hosts")  # .. stops at the root
    with pytest.raises(OSError):
        read_in_root(str(root), "/etc/hosts", ME)
    os.rename(root / "etc", root / "real")
    os.symlink(str(tmp_path), root / "etc")  # a directory on the way
    with pytest.raises(OSError):
        read_in_root(str(root), "/etc/secret", ME)


def test_a_fifo_or_a_huge_file_is_refused_without_blocking(root):
    os.remove(root / "etc" / "hosts")
    os.mkfifo(root / "etc" / "hosts")
    with pytest.raises(FileRefused, match="not a regular file"):
        read_in_root(str(root), "/etc/hosts", ME)
    os.remove(root / "etc" / "hosts")
    (root / "etc" / "hosts").write_text("x" * 2000)
    with pytest.raises(FileRefused, match="larger than 1000 bytes"):
        read_in_root(str(root), "/etc/hosts", ME, limit=1000)
    with pytest.raises(ValueError):
        read_in_root(str(root), "/etc/../secret", ME)


class _Snap:
    """What the host signals read of a snapshot."""

    def __init__(self, views):
        lo = Interface("lo", ("127.0.0.1",), True, 65536, 0, "loopback", False)
        self.host = Host(0.0, "vm", ("127.0.0.1",), True, _Cpu(), None, (lo,), ())
        self.ns_hosts = NsViews(0.0, tuple(views))
        self.sockets = None
        self.job = type("J", (), {"rank_pids": (7,)})()


def _signals(view):
    s = {"pid": 7}
    host_signals.measure(s, _Snap([view]))
    return s


class _Cpu:
    logical_cores, flags, model_name = 2, (), "AMD EPYC"


ETH = Interface("eth0", ("10.0.0.1",), True, 1500, 0, "regular", False)


def test_the_ranks_own_node_not_the_watchers():
    s = _signals(NsView(7, "uts:[1] net:[2] mnt:[3]", "node1", ("127.0.1.1",), True, "",
                        (ETH,)))
    assert s["node"] == "node1" and s["hostname_addrs"] == "127.0.1.1" and s["ns_unseen"] == ""


def test_what_was_not_looked_up_is_said_never_the_watchers_answer():
    unseen = "node1 is not in its /etc/hosts; what dns answer in its namespace was not looked up"
    s = _signals(NsView(7, "uts:[1] mnt:[3]", "node1", (), False, unseen, None))
    assert s["node"] == "node1" and "127.0.0.1" not in s["hostname_addrs"]
    assert s["hostname_addrs"] == f"nothing by its /etc/hosts ({unseen})"
    assert s["ns_unseen"] == unseen


def test_interfaces_of_the_ranks_network_namespace():
    snap = _Snap([NsView(7, "net:[2]", "", (), False, "", (ETH,))])
    assert iface_signals._interfaces(snap, 7) == (ETH,)
    # not read there: unknown, not the watcher's
    snap = _Snap([NsView(7, "net:[2]", "", (), False, "its interfaces could not be read",
                         None)])
    assert iface_signals._interfaces(snap, 7) == ()
    assert iface_signals._interfaces(_Snap([]), 7)[0].name == "lo"


def test_the_page_says_what_was_not_seen_in_the_ranks_namespaces():
    unseen = "node1 is not in its /etc/hosts; what dns answer in its namespace <was> not looked up"
    html = page._findings([{"rank": 1, "verdict": "healthy", "role": "none", "confidence": 1,
                            "signals": {"ns_unseen": unseen}}])
    assert "not seen in its namespaces: node1 is not in its /etc/hosts" in html
    assert "&lt;was&gt;" in html  # the rank's hostname is its claim: text, not markup
    assert "not seen" not in page._findings([{"rank": 1, "signals": {"ns_unseen": ""}}])


def test_a_snapshot_keeps_the_ranks_view_and_older_ones_load_without_it(tmp_path):
    fixture = os.path.join(TESTS, "fixtures", "snapshots",
                           "two_nodes_lone_node0.json")
    history = load(fixture)  # saved before the nshost probe: not looked
    assert all(s.ns_hosts is None for s in history)
    view = NsViews(1.0, (NsView(7, "uts:[1] mnt:[3]", "node1", ("127.0.1.1",), True, "",
                                (ETH,)),))
    path = str(tmp_path / "h.json")
    save([dataclasses.replace(history[-1], ns_hosts=view)], path)
    assert load(path)[-1].ns_hosts == view


def test_replayed_host_view_of_node1_is_node1s_and_without_it_the_watchers():
    """The snapshot a host-namespace diagnose saved of node 1's rank: judged with
    node 1's view; with that view taken out, the evidence falls back to the
    watcher's own hostname, which is what the probe is for."""
    from ddpwatch.judge import signals
    history = load(os.path.join(TESTS, "fixtures", "snapshots",
                                "two_nodes_nsview_outside.json"))
    (rank1,) = signals.measure(history)
    assert rank1["node"] == "node1" and rank1["hostname_addrs"] == "127.0.1.1"
    blind = tuple(dataclasses.replace(s, ns_hosts=None) for s in history)
    (rank1,) = signals.measure(blind)
    assert rank1["node"] == history[-1].host.hostname != "node1"
