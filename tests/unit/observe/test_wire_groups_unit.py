"""The daemon's wire-groups probe (observe/probes/wire_groups.py) on a procfs
tree built here: lone torch processes become one "wire" job, what it costs is
kept down across passes (libtorch looked for once per process, rechecked at most
every TORCH_RECHECK_S), a group never spans two users, and a bound that leaves
processes out is said in the probe's status."""
from __future__ import annotations

import dataclasses
import ipaddress
import os
import sys

import pytest

from ddpwatch.observe.jobs import discovery, tcp_discovery
from ddpwatch.observe.jobs.discovery import ProcInfo
from ddpwatch.observe.probes import ProbeContext, wire_groups
from ddpwatch.observe.probes.sockets import TCP_STATES, TableEntry
from ddpwatch.observe.probes.wire_groups import WireWatch
from ddpwatch.observe.sampler import Sampler
from socket_tables import NS, est, listen, pair_job, server_and_client

PY = ("/usr/bin/python3", "train.py")
STATE = {name: code for code, name in TCP_STATES.items()}


def _hex(addr: str) -> str:
    packed = ipaddress.ip_address(addr).packed
    return int.from_bytes(packed, "big").to_bytes(4, sys.byteorder).hex().upper()


def tcp_text(entries) -> str:
    """/proc/net/tcp as the kernel writes it."""
    lines = ["  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt"
             "   uid  timeout inode"]
    for i, e in enumerate(entries):
        lines.append(f"{i:4}: {_hex(e.local_addr)}:{e.local_port:04X} "
                     f"{_hex(e.peer_addr)}:{e.peer_port:04X} {STATE[e.state]:02X} "
                     f"00000000:00000000 00:00000000 00000000     0        0 {e.inode} 1 0")
    return "\n".join(lines) + "\n"


class Node:
    """A procfs tree: per pid its maps (libtorch or not), its fds, its network
    namespace; one TCP table for the namespace (every pid's copy the same)."""

    def __init__(self, root):
        self.root, self.table, self.entries = str(root), {}, []

    def add(self, pid, entries, torch=True, uid=1000, start=None, cmdline=PY):
        d = os.path.join(self.root, str(pid))
        os.makedirs(f"{d}/fd")
        os.makedirs(f"{d}/net")
        os.makedirs(f"{d}/ns")
        os.symlink(NS, f"{d}/ns/net")
        self.set_torch(pid, torch)
        for fd, e in enumerate(entries, 3):
            os.symlink(f"socket:[{e.inode}]", f"{d}/fd/{fd}")
        self.entries += list(entries)
        self.table[pid] = ProcInfo(pid, 1000, cmdline, {}, start=start or pid * 10, uid=uid)
        self._write_tables()

    def set_torch(self, pid, torch):
        lib = "libtorch_cpu.so" if torch else "libpython3.11.so.1.0"
        with open(os.path.join(self.root, str(pid), "maps"), "w") as f:
            f.write(f"7f0000000000-7f0000001000 r-xp 00000000 08:01 42 /usr/lib/{lib}\n")

    def _write_tables(self):
        for pid in self.table:
            with open(os.path.join(self.root, str(pid), "net", "tcp"), "w") as f:
                f.write(tcp_text(self.entries))


def node_with(tmp_path, sockets, torch=(), **kw) -> Node:
    node = Node(tmp_path)
    for pid, (_, entries) in sockets.items():
        node.add(pid, entries, torch=pid in torch if torch else True, **kw)
    return node


@pytest.fixture
def counted(monkeypatch):
    """pids whose /proc/PID/maps were read."""
    reads = []
    real = tcp_discovery.uses_torch

    def uses_torch(procfs, pid):
        reads.append(pid)
        return real(procfs, pid)
    monkeypatch.setattr(tcp_discovery, "uses_torch", uses_torch)
    return reads


def test_a_store_pair_of_lone_torch_processes_is_one_wire_job(tmp_path):
    node = node_with(tmp_path, pair_job())
    found = WireWatch().scan(node.root, node.table, frozenset(), 0.0)
    (job,) = found.jobs
    assert (job.launcher_kind, job.rank_pids, job.ranks, job.world_size) == (
        "wire", (10, 11), (0, 1), 2)
    assert job.launcher_pid == -1 and found.candidates == 3 and found.torch == 3
    assert found.note == ""


def test_a_server_and_its_client_are_no_job(tmp_path):
    node = node_with(tmp_path, server_and_client())
    assert WireWatch().scan(node.root, node.table, frozenset(), 0.0).jobs == ()


def test_libtorch_is_looked_for_once_per_process_and_rechecked_at_most_every_10s(
        tmp_path, counted):
    node = node_with(tmp_path, pair_job(), torch=(10,))
    watch = WireWatch()
    assert watch.scan(node.root, node.table, frozenset(), 0.0).jobs == ()
    assert sorted(counted) == [10, 11, 12]
    counted.clear()
    watch.scan(node.root, node.table, frozenset(), 5.0)
    assert counted == []  # 10 maps it (for good), 11 and 12 were read 5 s ago
    node.set_torch(11, True)  # rank 1 has imported torch by now
    assert watch.scan(node.root, node.table, frozenset(), 9.9).jobs == ()
    assert counted == []
    (job,) = watch.scan(node.root, node.table, frozenset(), wire_groups.TORCH_RECHECK_S).jobs
    assert sorted(counted) == [11, 12] and job.rank_pids == (10, 11)


def test_a_process_that_never_imports_torch_is_looked_at_less_and_less_often(
        tmp_path, counted):
    """10 s, 20 s, 40 s ... up to 5 min between reads of an idle Python process's
    maps: a user's hundreds of them cost a read each every few minutes."""
    node = node_with(tmp_path, pair_job(), torch=(99,))  # none of them maps it
    watch = WireWatch()
    reads = []
    for second in range(0, 1500):
        counted.clear()
        watch.scan(node.root, node.table, frozenset(), float(second))
        if 10 in counted:
            reads.append(second)
    gaps = [b - a for a, b in zip(reads, reads[1:])]
    assert gaps[:5] == [10, 20, 40, 80, 160] and set(gaps[5:]) == {300}, gaps
    node.set_torch(10, True)
    node.set_torch(11, True)
    found = []
    for second in range(1500, 1801):  # imports torch late: found within 5 min
        if watch.scan(node.root, node.table, frozenset(), float(second)).jobs:
            found.append(second)
            break
    assert found, "never found"


def test_a_new_process_under_a_reused_pid_is_looked_at_again(tmp_path, counted):
    node = node_with(tmp_path, pair_job(), torch=(10, 11))
    watch = WireWatch()
    watch.scan(node.root, node.table, frozenset(), 0.0)
    counted.clear()
    node.table[10] = dataclasses.replace(node.table[10], start=12345)
    watch.scan(node.root, node.table, frozenset(), 1.0)
    assert counted == [10]


def test_processes_in_a_job_and_other_programs_are_not_looked_at(tmp_path, counted):
    node = node_with(tmp_path, pair_job())
    node.add(30, (), cmdline=("/usr/bin/bash", "-c", "sleep 1"))
    found = WireWatch().scan(node.root, node.table, frozenset({11}), 0.0)
    assert sorted(counted) == [10, 12] and found.jobs == ()


def test_a_launcher_is_no_rank_of_a_wire_job(tmp_path):
    """A torchrun agent discovery did not claim (it hosts its job's store, its
    worker is a client): not grouped, though it maps torch."""
    node = node_with(tmp_path, pair_job())
    node.table[10] = dataclasses.replace(node.table[10], cmdline=(
        "/usr/bin/python3", "-m", "torch.distributed.run", "--nproc_per_node=1", "t.py"))
    assert WireWatch().scan(node.root, node.table, frozenset(), 0.0).jobs == ()


def test_a_group_never_spans_two_users(tmp_path):
    node = node_with(tmp_path, pair_job())
    node.table[11] = dataclasses.replace(node.table[11], uid=1001)
    assert WireWatch().scan(node.root, node.table, frozenset(), 0.0).jobs == ()


def test_a_process_with_too_many_files_is_left_out(tmp_path, monkeypatch):
    node = node_with(tmp_path, pair_job())
    for fd in range(20, 30):
        os.symlink("/dev/null", os.path.join(node.root, "11", "fd", str(fd)))
    monkeypatch.setattr(tcp_discovery, "FD_LIMIT", 10)
    assert WireWatch().scan(node.root, node.table, frozenset(), 0.0).jobs == ()


def test_a_rank_whose_peer_died_stays_in_its_job(tmp_path):
    node = node_with(tmp_path, pair_job())
    watch = WireWatch()
    watch.scan(node.root, node.table, frozenset(), 0.0)
    del node.table[11]  # gone: rank 0's connections to it are closed, rank 0 alone
    os.remove(os.path.join(node.root, "10", "fd", "4"))
    (job,) = watch.scan(node.root, node.table, frozenset(), 1.0).jobs
    assert (job.rank_pids, job.ranks, job.world_size) == ((10,), (0,), 2)


def test_the_bound_is_said_in_the_status_and_the_known_ranks_stay_in(tmp_path, monkeypatch):
    """More Python processes of one user than the bound: the torch processes
    known from earlier passes first, then the oldest; the rest left out, said in
    /status's probe errors (a failed wire_groups status) and its jobs still found."""
    node = node_with(tmp_path, pair_job())
    for pid in (40, 41, 42):  # older than the ranks, no torch
        node.add(pid, (), torch=False, start=1)
    monkeypatch.setattr(tcp_discovery, "MAX_CANDIDATES", 3)
    monkeypatch.setattr(discovery.TableReader, "read", lambda self, hot=(): node.table)
    enabled = lambda name: name not in ("traffic", "exits", "host")  # noqa: E731
    with Sampler(ProbeContext(procfs=node.root), enabled) as sampler:
        first = sampler.survey(wire=True)
        # the oldest three first: the ranks were not looked at yet
        assert [j.launcher_kind for j in first.jobs()] == []
        (status,) = [p for p in first.probes if p.name == "wire_groups"]
        assert not status.ok and "3 Python process(es) of uid 1000 not looked at" in status.error
        # the rest are looked at only as the known ones' places allow: none here
        # (40-42 are no torch, and stay first by age); not found, and said so
        assert sampler.survey(wire=True).jobs() == []
    monkeypatch.setattr(tcp_discovery, "MAX_CANDIDATES", 5)
    with Sampler(ProbeContext(procfs=node.root), enabled) as sampler:
        sampler.survey(wire=True)
        for pid in (40, 41, 42):
            node.table[pid] = dataclasses.replace(node.table[pid], start=10 ** 6)
        monkeypatch.setattr(tcp_discovery, "MAX_CANDIDATES", 2)
        # 10 and 11 known to map torch: they keep their places ahead of anything
        (job,) = sampler.survey(wire=True).jobs()
        assert job.launcher_kind == "wire" and job.rank_pids == (10, 11)


def test_the_probe_can_be_switched_off(tmp_path, monkeypatch):
    node = node_with(tmp_path, pair_job())
    monkeypatch.setattr(discovery.TableReader, "read", lambda self, hot=(): node.table)
    with Sampler(ProbeContext(procfs=node.root),
                 lambda name: name not in ("traffic", "exits", "host", "wire_groups")) as s:
        survey = s.survey(wire=True)
    assert survey.jobs() == [] and "wire_groups" not in [p.name for p in survey.probes]


def test_without_wire_the_survey_is_discovery_alone(tmp_path, monkeypatch, counted):
    node = node_with(tmp_path, pair_job())
    monkeypatch.setattr(discovery.TableReader, "read", lambda self, hot=(): node.table)
    with Sampler(ProbeContext(procfs=node.root),
                 lambda name: name not in ("traffic", "exits", "host")) as s:
        assert s.survey().jobs() == [] and counted == []
