"""diagnose on real 2-rank jobs of the bundled trainer (heartbeats, stacks, /proc,
sockets): every fault named with its culprit, and its victims. Each job also
shows, through its records, that the trainer's fault does what it names (one job
per fault serves both: jobs are the suite's cost)."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import psutil
import pytest
from conftest import REPO, free_port, need, trainer, wait_until
from diag import (by_hand, by_rank, cpu_has_bf16, diagnose, env_rank, launcher_pid, pin,
                  python_pid, rank_pids, until_verdict, until_verdict_with, verdicts)

pytestmark = pytest.mark.usefixtures("need_py_spy")

HEALTHY = {0: ("healthy", "none"), 1: ("healthy", "none")}
TIMEOUT = 60


def findings(report: dict) -> dict[int, set[str]]:
    return {r["rank"]: {f["id"] for f in r["findings"]} for r in report["ranks"]}


def records(hb_dir: str) -> dict:
    """rank -> its heartbeat record, as the ranks wrote it."""
    from ddpwatch.heartbeat import read_dir
    recs, skipped = read_dir(hb_dir)
    assert skipped == []
    return {r.rank: r for r in recs}


def test_healthy(start_job, hb_dir):
    job = start_job(trainer())
    rank_pids(job, 2)
    # diagnose is not told the directory: it reads where the ranks' DDPWATCH_DIR says.
    # (Until the ranks have written their records, they are judged from CPU alone.)
    def from_heartbeats():
        report = diagnose(launcher_pid(job))[1]
        rules = [r["rule"] for r in report["ranks"]]
        return report if rules == ["healthy-heartbeat"] * 2 else None
    report = wait_until(from_heartbeats, TIMEOUT, what="healthy, judged from heartbeats")
    assert report["job"]["verdict"] == "healthy" and report["job"]["culprits"] == []
    assert report["job"]["launcher_kind"] == "torchrun"
    for r in report["ranks"]:
        assert r["rule"] == "healthy-heartbeat" and r["findings"] == []
        assert r["signals"]["hb_step"] >= 2 and r["signals"]["compute_dtype"] == "float32"


def test_rank_hung_outside_collectives(start_job, hb_dir):
    job = start_job(trainer("--fault=hang:rank=1:step=10"))
    r0, _ = rank_pids(job, 2)
    report = until_verdict(r0, {0: ("blocked_in_collective", "victim"),
                                1: ("hung_outside_collective", "culprit")}, TIMEOUT, hb_dir=hb_dir)
    assert report["job"]["culprits"] == [1]
    ranks = by_rank(report)
    assert "faults.py" in ranks[1]["stack"]  # its stack says where it idles: hang()
    assert ranks[1]["signals"]["hb_step"] == 10
    assert ranks[0]["signals"]["waiting_in"] == "ddp_bucket_all_reduce"
    recs = records(hb_dir)  # the fault did what it names: rank 1 idles outside
    assert recs[1].step == 10 and recs[1].phase == "outside"
    assert recs[0].phase == "inside" and recs[0].op == "ddp_bucket_all_reduce"
    assert recs[0].collective_seq > recs[1].collective_seq


def test_rank_stopped(start_job, hb_dir):
    job = start_job(trainer("--fault=stop:rank=1:step=10"))
    r0, r1 = rank_pids(job, 2)
    try:
        report = until_verdict(r0, {0: ("blocked_in_collective", "victim"),
                                    1: ("stopped", "culprit")}, TIMEOUT, hb_dir=hb_dir)
        assert report["job"]["verdict"] == "stopped" and report["job"]["culprits"] == [1]
        assert f"kill -CONT {r1}" in by_rank(report)[1]["remedy"]
        assert psutil.Process(r1).status() == psutil.STATUS_STOPPED
        assert records(hb_dir)[1].step == 10
    finally:
        os.kill(r1, signal.SIGCONT)  # never leave a stopped process behind
    until_verdict(r0, HEALTHY, TIMEOUT, hb_dir=hb_dir)  # and the job goes on


def test_rank_leaves_the_loop_early(start_job, hb_dir):
    """Rank 1 leaves the loop and waits in barrier() while rank 0 waits in the DDP
    bucket all-reduce: a desync whose deviant (an op it never called) is rank 1."""
    job = start_job(trainer("--fault=exit:rank=1:step=10"))
    r0, _ = rank_pids(job, 2)
    report = until_verdict(r0, {0: ("desync", "victim"), 1: ("desync", "culprit")}, TIMEOUT,
                           hb_dir=hb_dir)
    assert report["job"]["culprits"] == [1]
    ranks = by_rank(report)
    assert ranks[1]["rule"] == "desync-deviant" and ranks[1]["signals"]["hb_op"] == "barrier"
    assert ranks[1]["signals"]["hb_op_novel"] is True
    assert ranks[0]["signals"]["waiting_in"] == "ddp_bucket_all_reduce"
    recs = records(hb_dir)
    assert (recs[1].phase, recs[1].op, recs[1].step) == ("inside", "barrier", 10)
    assert recs[0].op == "ddp_bucket_all_reduce"


def test_straggler_by_injected_slowdown(start_job, hb_dir):
    job = start_job(trainer("--fault=slow:rank=1:factor=4"))
    r0, _ = rank_pids(job, 2)
    report = until_verdict(r0, {0: ("waiting_on_peer", "victim"), 1: ("straggler", "culprit")},
                           TIMEOUT, hb_dir=hb_dir)
    assert report["job"]["verdict"] == "straggler" and report["job"]["culprits"] == [1]
    ranks = by_rank(report)
    assert ranks[1]["signals"]["hb_comm_share"] < ranks[0]["signals"]["hb_comm_share"]
    recs = records(hb_dir)  # the slow rank waits least in the collectives
    share = {k: r.collective_seconds / r.step_seconds for k, r in recs.items()}
    assert share[1] < share[0] / 2, share


def test_desync(start_job, hb_dir):
    job = start_job(trainer("--fault=desync:rank=1:step=10"))
    r0, _ = rank_pids(job, 2)
    report = until_verdict(r0, {0: ("desync", "victim"), 1: ("desync", "culprit")}, TIMEOUT,
                           hb_dir=hb_dir)
    assert report["job"]["verdict"] == "desync" and report["job"]["culprits"] == [1]
    assert by_rank(report)[1]["signals"]["hb_op"] == "all_gather_into_tensor"
    recs = records(hb_dir)
    assert recs[0].phase == recs[1].phase == "inside" and recs[0].op != recs[1].op


def test_bf16_on_cpu_only_without_bf16_support(start_job, hb_dir):
    """The finding depends on this CPU: none where avx512_bf16/amx_bf16 exist (bf16
    is native there); test_replay covers the other CPU with a derived snapshot."""
    job = start_job(trainer("--fault=bf16"))
    r0, _ = rank_pids(job, 2)
    report = until_verdict_with(r0, HEALTHY, "compute_dtype", TIMEOUT, hb_dir=hb_dir)
    expected = set() if cpu_has_bf16() else {"bf16_on_cpu"}
    assert findings(report) == {0: expected, 1: expected}
    for r in report["ranks"]:
        assert r["signals"]["compute_dtype"] == "bfloat16"
        assert r["signals"]["cpu_bf16"] is cpu_has_bf16()


def test_data_mismatch(start_job, hb_dir, tmp_path):
    """Rank 1 misses the last shard: the fingerprints differ from the first step on
    (both ranks carry the finding), and when rank 1 runs out of batches it is the
    culprit of the hang."""
    from trainer.data import write_shards
    shards = str(tmp_path / "shards")
    write_shards(shards, 4, 256 * 300 + 1, 512)  # 300 batches of 4x64 tokens per shard
    job = start_job(trainer(f"--data={shards}", "--fault=data-mismatch:rank=1"))
    r0, _ = rank_pids(job, 2)
    both = {0: {"data_parity"}, 1: {"data_parity"}}
    running = until_verdict_with(r0, HEALTHY, "data_fp", TIMEOUT, hb_dir=hb_dir)
    assert findings(running) == both
    recs = records(hb_dir)  # rank 1 reads one shard less: another fingerprint
    assert recs[0].data_fingerprint != recs[1].data_fingerprint
    assert recs[0].data_shards == 2 and recs[1].data_shards == 1
    hung = until_verdict(r0, {0: ("desync", "victim"), 1: ("desync", "culprit")}, TIMEOUT,
                         hb_dir=hb_dir)
    assert hung["job"]["culprits"] == [1] and findings(hung) == both
    assert by_rank(hung)[1]["signals"]["hb_op"] == "barrier"


def test_compile_is_warm_up_not_a_hang(start_job, hb_dir, tmp_path):
    """Each rank compiles alone for tens of seconds (a cold inductor cache, 2 cores):
    from launch until both train, no diagnose finds a culprit or a victim; while
    both compile (dynamo/inductor frames, step 0) both are warming up, and while
    one compiles and the other waits for it, a pause of kind compile (paused, exit
    1 as any pause: rules compiling-while-peers-wait, waits-for-compiling-peer)."""
    job = start_job(trainer("--compile"), env={"TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "ind")})
    r0, _ = rank_pids(job, 2)
    reports = []

    def trained():
        code, report = diagnose(r0, hb_dir=hb_dir)
        reports.append((code, report))
        return verdicts(report) == HEALTHY
    # a cold compile is ~20 s per rank here, on both cores at once; 2-3x on a slower CPU
    wait_until(trained, 4 * TIMEOUT, interval=0.2, what="the compiled job to train")
    # (a rank still in init_process_group as the job starts waits at rendezvous:
    # start-up too, though diagnose reports it; the daemon pages it after 60 s)
    compile_pause = {"compiling-while-peers-wait", "waits-for-compiling-peer"}
    for code, report in reports:
        paused = {r["rule"] for r in report["ranks"] if r["verdict"] == "paused"}
        assert report["job"]["culprits"] == [] and (
            code == 0 or report["job"]["verdict"] == "rendezvous_wait"
            or (report["job"]["verdict"] == "paused" and paused <= compile_pause)), \
            report["job"]["summary"]
        assert all(r["role"] == "none" for r in report["ranks"]), [
            (r["rank"], r["verdict"], r["rule"], r["evidence"]) for r in report["ranks"]]
    compiling = [report for _, report in reports
                 if verdicts(report) == {0: ("warming_up", "none"), 1: ("warming_up", "none")}
                 and all(r["signals"].get("stack") == "compile" for r in report["ranks"])]
    assert compiling, [verdicts(r) for _, r in reports]
    assert all(r["signals"]["hb_step"] == 0 for r in compiling[0]["ranks"])
    assert compiling[0]["job"]["verdict"] == "warming_up"


# --- a rank killed with SIGKILL (no daemon) ---------------------------------------------
def test_killed_rank_under_torchrun(start_job, hb_dir):
    """torchrun tears the whole job down within a second of a worker's death, so
    there is nothing left to diagnose; the heartbeat records stay and name the rank
    that went without a clean exit."""
    job = start_job(trainer())
    r0, r1 = rank_pids(job, 2)
    agent = launcher_pid(job)
    until_verdict(r0, HEALTHY, TIMEOUT, hb_dir=hb_dir)
    os.kill(r1, signal.SIGKILL)
    assert job.wait(TIMEOUT) != 0
    assert not psutil.pid_exists(r0)
    gone = subprocess.run([sys.executable, "-m", "ddpwatch", "diagnose", str(agent)],
                          capture_output=True, text=True, timeout=60, check=False,
                          env=dict(os.environ, PYTHONPATH=REPO, DDPWATCH_DIR=hb_dir))
    assert gone.returncode == 69 and "no such process" in gone.stderr
    out = subprocess.run([sys.executable, "-m", "ddpwatch", "ranks", "--all", "--json"],
                         capture_output=True, text=True, timeout=60, check=True,
                         env=dict(os.environ, PYTHONPATH=REPO, DDPWATCH_DIR=hb_dir))
    rows = {r["rank"]: r for r in json.loads(out.stdout)["ranks"]}
    assert rows[1]["pid"] == r1 and rows[1]["state"] == "gone" and rows[1]["step"] >= 2


def test_killed_rank_whose_node_goes_silent(start_job, hb_dir, netns):
    """Rank 1 on a second node (a network namespace) dies with its node: no RST
    reaches rank 0, which waits in its collective (Gloo: for 30 minutes). Rank 1's
    record outlives it: dead culprit; rank 0 blocked on a dead peer."""
    port = free_port()
    r0 = python_pid(by_hand(start_job, 0, netns["host_addr"], port,
                            env={"GLOO_SOCKET_IFNAME": netns["host_if"]}))
    r1 = python_pid(by_hand(start_job, 1, netns["host_addr"], port,
                            env={"GLOO_SOCKET_IFNAME": netns["peer_if"]}, prefix=netns["exec"]))
    until_verdict(r0, HEALTHY, TIMEOUT, hb_dir=hb_dir)
    subprocess.run([*netns["exec"], "iptables", "-A", "OUTPUT", "-j", "DROP"], check=True)
    os.kill(r1, signal.SIGKILL)
    report = until_verdict(r0, {0: ("blocked_in_collective", "victim"), 1: ("dead", "culprit")},
                           TIMEOUT, hb_dir=hb_dir)
    assert report["job"]["verdict"] == "dead" and report["job"]["culprits"] == [1]
    assert report["job"]["launcher_kind"] == "env"  # started by hand: MASTER_ADDR:PORT alone
    ranks = by_rank(report)
    assert ranks[1]["pid"] == r1 and ranks[0]["rule"] == "blocked-on-dead-peer"


def test_firewall_that_opens_only_the_master_port(start_job, hb_dir, netns):
    """docs/design.md "A firewall that drops Gloo's data connections". Rendezvous
    needs only MASTER_PORT, but Gloo's data connections go to ports the ranks pick
    at run time: for each pair of ranks,
    the one with the higher address connects to the other (this torch's Gloo).
    Here the master's node (this host, the lower address on the veth) accepts
    connects from the second node to MASTER_PORT only: the store works, and both
    ranks sit in init_process_group, silently, for Gloo's 30 minutes. diagnose
    on the master's node sees rank 1's SYNs arrive there and go unanswered: this
    node's firewall is the culprit, and rank 1, whose connect sits in SYN-SENT
    toward the master's address on another port, its victim."""
    port = free_port()
    drop = ["INPUT", "-i", netns["host_if"], "-p", "tcp", "--syn", "!", "--dport", str(port),
            "-j", "DROP"]
    subprocess.run(["iptables", "-A", *drop], check=True)  # only our own veth's traffic
    try:
        python_pid(by_hand(start_job, 0, netns["host_addr"], port,
                           env={"GLOO_SOCKET_IFNAME": netns["host_if"]}))
        r1 = python_pid(by_hand(start_job, 1, netns["host_addr"], port,
                                env={"GLOO_SOCKET_IFNAME": netns["peer_if"]},
                                prefix=netns["exec"]))
        report = until_verdict(r1, {0: ("unreachable_peer", "culprit"),
                                    1: ("unreachable_peer", "victim")}, TIMEOUT, hb_dir=hb_dir)
    finally:
        subprocess.run(["iptables", "-D", *drop], check=False)
    rank0, rank1 = by_rank(report)[0], by_rank(report)[1]
    assert rank1["rule"] == "unreachable-peer-dropped-there" and rank1["signals"]["syn_sent_data"]
    host, _, target_port = rank1["signals"]["syn_sent_to"].rpartition(":")
    assert host == netns["host_addr"] and int(target_port) != port  # not the store's port
    assert rank1["signals"]["syn_sent_dropped_by"] == 0
    assert rank0["rule"] == "dropped-inbound"
    assert rank0["signals"]["syn_in_from"] == netns["peer_addr"]
    assert rank0["signals"]["syn_in_port"] == int(target_port)
    assert rank0["signals"]["syn_in_iface"] == netns["host_if"]
    assert f"iptables -I INPUT -s {netns['peer_addr']}" in rank0["remedy"]
    assert report["job"]["verdict"] == "unreachable_peer" and report["job"]["culprits"] == [0]


# A second node whose hostname resolves to loopback, as Debian's /etc/hosts makes it
# (127.0.1.1): its own UTS namespace, named "localhost", inside the network namespace.
HOSTNAME_LOOPBACK = ["unshare", "--uts", "bash", "-c", 'hostname localhost && exec "$@"', "uts"]


@pytest.mark.parametrize("netns", ["198.18"], indirect=True)
def test_hostname_that_resolves_to_loopback(start_job, hb_dir, netns):
    """docs/design.md "A hostname that resolves to loopback": without
    GLOO_SOCKET_IFNAME, Gloo listens on what the hostname resolves to and tells
    the peers to connect there. On the second node that is
    127.0.0.1. The master's rank, on a LAN address above 127/8 (as 192.168 is),
    connects to it: to its own loopback, refused until Gloo gives up and the rank
    exits. diagnose of rank 1 says why, while rank 0 waits and after it is gone.
    (Were the LAN below 127/8, rank 1 would connect and the job would train: then
    no finding, see test_interfaces_unit.py.)"""
    port = free_port()
    r0 = python_pid(by_hand(start_job, 0, netns["host_addr"], port,
                            env={"GLOO_SOCKET_IFNAME": netns["host_if"]}))
    r1 = python_pid(by_hand(start_job, 1, netns["host_addr"], port,
                            prefix=[*netns["exec"], *HOSTNAME_LOOPBACK]))

    report = until_verdict(r1, {1: ("unreachable_peer", "culprit")}, TIMEOUT, hb_dir=hb_dir)
    rank1 = by_rank(report)[1]
    assert rank1["rule"] == "unreachable-loopback-address"
    (finding,) = [f for f in rank1["findings"] if f["id"] == "wrong_interface"]
    assert finding["severity"] == "critical"
    assert rank1["signals"]["gloo_addr"] == "127.0.0.1" and rank1["signals"]["gloo_ifname"] == ""
    assert "GLOO_SOCKET_IFNAME" in finding["remedy"] and "127.0.0.1" in finding["evidence"]
    assert report["job"]["culprits"] == [1]
    assert "Critical: rank 1: wrong interface" in report["job"]["summary"]
    # Gloo gives up on rank 0's refused connects and rank 0 exits: a victim of rank 1.
    wait_until(lambda: not psutil.pid_exists(r0), TIMEOUT, what="rank 0 to give up")
    report = until_verdict(r1, {0: ("dead", "victim"), 1: ("unreachable_peer", "culprit")},
                           TIMEOUT, hb_dir=hb_dir)
    assert by_rank(report)[0]["rule"] == "exited-at-start-loopback-peer"
    assert by_rank(report)[1]["signals"]["master_route_addr"] == netns["peer_addr"]


def test_gloo_on_a_docker_bridge(start_job, hb_dir, netns):
    """Rank 1's GLOO_SOCKET_IFNAME names the second node's docker bridge, which the
    master's node cannot reach: as on a LAN, where such an address leads nowhere
    from another node, it is routed here via a gateway that does not exist, so
    nothing is ever sent (the second node never sees the attempts). Rank 0's Gloo
    connect sits in SYN-SENT, which
    alone looks like a firewall at rank 1; diagnose on the second node (which
    knows its interfaces) names rank 1's interface instead, and rank 0 its victim.
    So does diagnose from the first, as a watcher on a host whose ranks run in
    containers: it reads rank 1's interfaces inside rank 1's namespace."""
    bridge = f"10.230.{netns['host_addr'].split('.')[2]}.1"  # below the veth: dialled
    nowhere = netns["host_addr"].rpartition(".")[0] + ".99"  # no one answers its ARP
    for cmd in ([*netns["exec"], "ip", "link", "add", "docker0", "type", "bridge"],
                [*netns["exec"], "ip", "addr", "add", f"{bridge}/24", "dev", "docker0"],
                [*netns["exec"], "ip", "link", "set", "docker0", "up"],
                ["ip", "route", "add", f"{bridge}/32", "via", nowhere, "dev", netns["host_if"]]):
        subprocess.run(cmd, check=True, capture_output=True)
    port = free_port()
    python_pid(by_hand(start_job, 0, netns["host_addr"], port,
                       env={"GLOO_SOCKET_IFNAME": netns["host_if"]}))
    r1 = python_pid(by_hand(start_job, 1, netns["host_addr"], port,
                            env={"GLOO_SOCKET_IFNAME": "docker0"}, prefix=netns["exec"]))
    expected = {0: ("unreachable_peer", "victim"), 1: ("unreachable_peer", "culprit")}
    report = until_verdict(r1, expected, TIMEOUT, hb_dir=hb_dir, prefix=netns["exec"])
    rank0, rank1 = by_rank(report)[0], by_rank(report)[1]
    assert rank1["rule"] == "unreachable-gloo-address"
    assert rank1["signals"]["gloo_iface"] == "docker0"
    assert rank1["signals"]["gloo_iface_kind"] == "bridge"
    assert f"{bridge}:{rank1['signals']['gloo_port']}" in rank1["evidence"]
    assert "wrong_interface" in findings(report)[1]
    assert rank0["rule"] == "unreachable-peer-off-route" and rank0["signals"]["syn_sent_to_rank"] == 1
    assert report["job"]["culprits"] == [1]
    from_host = until_verdict(r1, expected, TIMEOUT, hb_dir=hb_dir)
    assert by_rank(from_host)[1]["rule"] == "unreachable-gloo-address"
    assert by_rank(from_host)[1]["signals"]["gloo_iface"] == "docker0"


def test_killed_rank_on_the_same_host(start_job, hb_dir):
    """Same host, no torchrun: the kernel resets rank 1's sockets, Gloo fails rank
    0's collective ('Connection reset by peer') and rank 0 exits a second or two
    later. While it still exists, diagnose of rank 0 names rank 1 (and never blames
    rank 0: depending on the moment it is still advancing, blocked on the dead peer,
    or exiting after it)."""
    for attempt in range(3):
        port = free_port()
        r0 = python_pid(by_hand(start_job, 0, "127.0.0.1", port))
        r1 = python_pid(by_hand(start_job, 1, "127.0.0.1", port))
        until_verdict(r0, HEALTHY, TIMEOUT, hb_dir=hb_dir)
        os.kill(r1, signal.SIGKILL)
        seen, deadline = [], time.monotonic() + TIMEOUT
        while psutil.pid_exists(r0) and time.monotonic() < deadline:
            try:
                seen.append(diagnose(r0, "--window=0.3", "--no-stacks", hb_dir=hb_dir)[1])
            except AssertionError:  # exit 69: rank 0 went away while being looked at
                break
        seen = [rep for rep in seen if 1 in by_rank(rep) and by_rank(rep)[1]["verdict"] == "dead"]
        if seen:
            break
    else:
        pytest.fail("rank 0 never outlived rank 1 long enough to be diagnosed")
    for rep in seen:
        assert rep["job"]["culprits"] == [1] and by_rank(rep)[1]["role"] == "culprit"
        assert by_rank(rep)[0]["role"] != "culprit"


# --- the states test_diagnose_plain.py also covers, here with heartbeats on ------------



def test_straggler_starved_by_a_cpu_burner_on_its_core(start_job, hb_dir):
    need(os.cpu_count() >= 2, "needs 2 CPUs to pin the ranks apart")
    job = start_job(trainer())
    r0, r1 = rank_pids(job, 2)
    until_verdict(r0, HEALTHY, TIMEOUT, hb_dir=hb_dir)
    burner = start_job([sys.executable, "-c", "while True: pass"], name="burner")
    pin(r0, {0})
    pin(r1, {1})
    pin(burner.proc.pid, {1})
    report = until_verdict(r0, {1: ("straggler", "culprit")}, TIMEOUT, hb_dir=hb_dir)
    assert report["job"]["culprits"] == [1]
    assert by_rank(report)[0]["role"] in ("victim", "none")




def test_bare_env_rendezvous_rank_waits_for_its_peer(start_job, hb_dir):
    job = start_job([sys.executable, "-m", "trainer", "--steps=0"], env=env_rank(free_port(), 0))
    report = until_verdict(job.proc.pid, {0: ("rendezvous_wait", "none")}, TIMEOUT, hb_dir=hb_dir)
    assert report["job"]["verdict"] == "rendezvous_wait"


def test_torchrun_agent_alone_at_rendezvous(start_job, hb_dir):
    job = start_job([sys.executable, "-m", "torch.distributed.run", "--nnodes=2",
                     "--nproc_per_node=1", "--rdzv-backend=c10d",
                     f"--rdzv-endpoint=127.0.0.1:{free_port()}", "-m", "trainer", "--steps=0"])
    report = until_verdict(job.proc.pid, {-1: ("rendezvous_wait", "none")}, TIMEOUT,
                           hb_dir=hb_dir)
    assert report["ranks"][0]["pid"] == job.proc.pid


def test_oversubscribed_threads(start_job, hb_dir):
    job = start_job(trainer(), env={"OMP_NUM_THREADS": str(os.cpu_count() * 2)})
    r0, _ = rank_pids(job, 2)
    report = until_verdict(r0, HEALTHY, TIMEOUT, hb_dir=hb_dir)
    assert all("oversubscribed" in f for f in findings(report).values())


def test_orphan_rank_holding_the_master_port(start_job, hb_dir):
    shell = start_job(["sh", "-c", f'"{sys.executable}" -m trainer --steps=0 & echo $!'],
                      env=env_rank(free_port(), 0), name="orphan")
    assert shell.wait(30) == 0
    pid = int(wait_until(lambda: shell.output().strip().splitlines()[-1:] and
                         shell.output().strip().splitlines()[-1].isdigit() and
                         shell.output().strip().splitlines()[-1], 30, what="orphan pid"))
    report = until_verdict(pid, {0: ("rendezvous_wait", "none")}, TIMEOUT, hb_dir=hb_dir)
    orphan = next(f for f in report["ranks"][0]["findings"] if f["id"] == "orphan")
    assert "True" in orphan["evidence"]  # it listens on the master port
