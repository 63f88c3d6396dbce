"""Process probe: parsers on saved /proc files, the probe on the fixture tree, and
a few live processes (a SIGSTOPped sleep must read as state T)."""
from __future__ import annotations

import json
import os
import shutil
import signal
import sys

import pytest

from conftest import TESTS, need, wait_until
from ddpwatch import codec
from ddpwatch.observe.jobs.discovery import ProcInfo
from ddpwatch.observe.probes import (Look, Outcome, Pass, ProbeContext, failure, load_all, make,
                                     outcome, run_probe)
from ddpwatch.observe.probes import process as P

FX = os.path.join(TESTS, "fixtures", "proc")
CTX = ProbeContext(procfs=FX, clock=lambda: 100.0)


def fx(*parts, binary=False):
    with open(os.path.join(FX, *map(str, parts)), "rb" if binary else "r") as f:
        return f.read()


# ------------------------------------------------------------------ parsers

def test_parse_stat_comm_with_spaces_and_parens_stopped():
    st = P.parse_stat(fx(8465, "stat"), clk_tck=100)
    assert st.comm == "a) S (b c) 1 2"  # a naive split on ' ' or the first ')' breaks
    assert st.state == "T"
    assert (st.pid, st.ppid, st.pgrp) == (8465, 8463, 8463)
    assert st.num_threads == 1
    assert st.start_time_s == pytest.approx(562.26)
    assert st.cpu_seconds == pytest.approx(0.02)


def test_parse_stat_zombie_and_edge_comms():
    assert P.parse_stat(fx(8506, "stat")).state == "Z"
    tail = " S 1 1 1 0 -1 0 0 0 0 0 7 3 0 0 20 0 5 0 4200 0 0"
    st = P.parse_stat("42 ())) ()" + tail, clk_tck=100)
    assert (st.comm, st.state, st.ppid) == ("))) (", "S", 1)
    assert st.cpu_seconds == pytest.approx(0.10)
    assert st.num_threads == 5 and st.processor == -1  # short line: no processor field


def test_parse_status_and_cpu_list():
    status = P.parse_status(fx(5072, "status"))
    assert status["State"].startswith("S")
    assert status["Uid"].split()[0] == "0"
    assert P.parse_cpu_list(status["Cpus_allowed_list"]) == (0, 1)
    assert P.parse_cpu_list("0-3,8,10-11") == (0, 1, 2, 3, 8, 10, 11)
    assert P.parse_cpu_list("") == ()


def test_parse_schedstat():
    s = P.parse_schedstat(fx(5072, "task", 5072, "schedstat"))
    assert s == P.SchedStat(0.85277908, 0.00533061, 223)


def test_parse_cmdline():
    assert P.parse_cmdline(fx(4987, "cmdline", binary=True)) == (
        "/root/.pyenv/versions/3.11.7/bin/python3.11", "/root/.pyenv/versions/3.11.7/bin/torchrun",
        "--standalone", "--nproc_per_node=2", "hang_collective.py")
    assert P.parse_cmdline(b"") == ()  # kernel threads, zombies
    assert P.parse_cmdline(b"retitled proc") == ("retitled proc",)  # setproctitle
    assert P.parse_cmdline(b"a\0\0b\0") == ("a", "", "b")  # an empty argument survives


def test_parse_environ_allow_list_only():
    env = P.parse_environ(fx(5072, "environ", binary=True))
    assert env["RANK"] == "0" and env["LOCAL_RANK"] == "0" and env["WORLD_SIZE"] == "2"
    assert env["MASTER_PORT"] == "33121"
    assert "PATH" not in env and "HOME" not in env  # never leaves the host
    env = P.parse_environ(b"RANK=1\0SECRET=x\0MASTER_ADDR=a=b\0OMP_NUM_THREADS=\xff\0junk\0")
    assert env == {"RANK": "1", "MASTER_ADDR": "a=b", "OMP_NUM_THREADS": "\ufffd"}


@pytest.mark.parametrize("argv, expected", [
    (("/usr/bin/python3.11", "/usr/bin/torchrun", "--standalone", "--nproc_per_node=2",
      "train.py", "--lr", "3"),
     {"standalone": "1", "nproc_per_node": "2", "script": "train.py"}),
    (("torchrun", "--nproc-per-node", "4", "--master-port", "29511", "--master_addr=10.0.0.1",
      "--node-rank", "1", "--nnodes", "2", "train.py", "--master_port", "1"),
     {"nproc_per_node": "4", "master_port": "29511", "master_addr": "10.0.0.1",
      "node_rank": "1", "nnodes": "2", "script": "train.py"}),
    (("python", "-m", "torch.distributed.run", "--rdzv-endpoint", "[fd00::1]:29400",
      "--rdzv_backend=c10d", "--nproc", "2", "-m", "trainer.train"),
     {"rdzv_endpoint": "[fd00::1]:29400", "rdzv_backend": "c10d", "nproc_per_node": "2",
      "module": "1", "script": "trainer.train"}),
    (("python", "-m", "torch.distributed.launch", "--use-env", "--nproc_per_node", "2", "t.py"),
     {"use_env": "1", "nproc_per_node": "2", "script": "t.py"}),
    (("torchrun --standalone --nproc-per-node=2 t.py",),  # rewritten, one string
     {"standalone": "1", "nproc_per_node": "2", "script": "t.py"}),
    (("python", "train.py", "--nproc-per-node", "2"), {}),  # not a launcher
    ((), {}),
])
def test_torchrun_args(argv, expected):
    assert P.torchrun_args(argv) == expected


def test_env_from_cmdline():
    assert P.env_from_cmdline(("torchrun", "--nproc-per-node=2", "--rdzv-endpoint",
                               "[fd00::1]:29400", "--rdzv-id", "job7", "t.py")) == {
        "LOCAL_WORLD_SIZE": "2", "MASTER_ADDR": "fd00::1", "MASTER_PORT": "29400",
        "TORCHELASTIC_RUN_ID": "job7"}
    assert P.env_from_cmdline(("torchrun", "--rdzv-endpoint=node0", "t.py")) == {
        "MASTER_ADDR": "node0"}  # no port given: torchrun's default, not a guess
    assert P.env_from_cmdline(("torchrun", "--master_addr", "a", "--master_port", "7",
                               "--rdzv-endpoint", "b:9", "t.py")) == {
        "MASTER_ADDR": "a", "MASTER_PORT": "7"}
    # what torch.distributed.launch passes a worker without --use-env
    assert P.env_from_cmdline(("python", "t.py", "--local-rank=3")) == {"LOCAL_RANK": "3"}
    assert P.env_from_cmdline(("python", "t.py", "--local_rank", "1")) == {"LOCAL_RANK": "1"}
    assert P.env_from_cmdline(("python", "t.py")) == {}


# ------------------------------------------------------------------ fixture tree

def test_discovery_helpers():
    pids = P.all_pids(FX)
    assert {4987, 5072, 5073, 8465, 8506} <= set(pids)
    assert pids == tuple(sorted(pids))
    parents = P.ppid_map(FX)
    assert parents[5072] == parents[5073] == 4987 and parents[8506] == 8465


def test_run_on_fixture_tree():
    data = P.run(CTX, Pass(), (4987, 5072, 5073, 8465, 8506, 424242))
    assert data.taken_at == 100.0 and data.uptime_s > 0
    agent, r0, r1, stopped, zombie, gone = data.procs
    assert agent.children == (5072, 5073)
    assert agent.torchrun == {"standalone": "1", "nproc_per_node": "2",
                              "script": "hang_collective.py"}
    assert r0.comm == "python3.11" and r0.state == "S" and r0.ppid == 4987
    assert r0.env["RANK"] == "0" and r0.env_source == "environ"
    assert r0.num_threads == len(r0.threads) == 4
    assert r0.rss_bytes > 100 * 2**20 and r0.cpus_allowed == (0, 1)
    main = r0.threads[0]
    assert (main.tid, main.wchan) == (5072, "futex_do_wait")  # blocked in all_reduce
    assert main.sched.run_s > 0.8 and main.sched.timeslices == 223
    comms = {t.comm for t in r0.threads}
    assert {"gloo_tcp_loop", "pt_gloo_runloop"} <= comms
    assert r1.threads[0].wchan == "hrtimer_nanosleep"  # the sleeping culprit
    assert stopped.state == "T" and stopped.threads[0].wchan == "do_signal_stop"
    assert stopped.comm == "a) S (b c) 1 2" and stopped.children == (8506,)
    assert zombie.state == "Z" and zombie.cmdline == () and zombie.env_source == "none"
    assert zombie.error == ""  # a zombie is observed, not an error
    assert gone == P.ProcessObs(424242, error="gone")


def test_env_falls_back_to_cmdline(tmp_path):
    shutil.copytree(os.path.join(FX, "4987"), tmp_path / "4987", symlinks=True)
    (tmp_path / "4987" / "environ").write_bytes(b"")  # unreadable/empty
    obs = P.read_process(str(tmp_path), 4987)
    assert obs.env_source == "cmdline" and obs.env == {"LOCAL_WORLD_SIZE": "2"}
    (tmp_path / "4987" / "environ").unlink()
    assert P.read_process(str(tmp_path), 4987).env_source == "cmdline"


def test_missing_files_degrade_per_thread(tmp_path):
    shutil.copytree(os.path.join(FX, "5072"), tmp_path / "5072", symlinks=True)
    (tmp_path / "5072" / "task" / "5075" / "schedstat").unlink()
    (tmp_path / "5072" / "task" / "5076" / "stat").unlink()  # thread exited mid-read
    obs = P.read_process(str(tmp_path), 5072)
    assert [t.tid for t in obs.threads] == [5072, 5075, 5078]
    assert obs.threads[1].sched == P.NO_SCHEDSTAT
    (tmp_path / "5072" / "stat").write_text("garbage")
    torn = P.read_process(str(tmp_path), 5072).error
    assert outcome(torn) is Outcome.FAILED and torn.startswith("failed: ")
    (tmp_path / "5072" / "stat").unlink()
    assert outcome(P.read_process(str(tmp_path), 5072).error) is Outcome.GONE


def test_os_errors_become_typed_outcomes_at_the_boundary():
    assert failure(FileNotFoundError(2, "No such file")) == "gone"
    assert failure(PermissionError(13, "Permission denied")) == "denied: Permission denied"
    assert outcome(failure(PermissionError(13, "Permission denied"))) is Outcome.DENIED
    assert outcome(failure(ValueError("bad"))) is Outcome.FAILED
    assert outcome("") is Outcome.OBSERVED and outcome("???") is Outcome.FAILED


def test_a_pids_outcome_is_carried_and_saved_as_its_text():
    """The Outcome is made once, where the OS error is caught, and travels with
    the text; a snapshot saves the text alone (its JSON as before)."""
    import copy
    obs = P.ProcessObs(5072, error=failure(PermissionError(13, "Permission denied")))
    assert obs.error.outcome is Outcome.DENIED and outcome(obs.error) is Outcome.DENIED
    assert copy.deepcopy(obs).error.outcome is Outcome.DENIED
    saved = json.loads(json.dumps(codec.to_json(obs)))
    assert saved["error"] == "denied: Permission denied"
    replayed = codec.from_json(P.ProcessObs, saved)  # the text alone: read back
    assert replayed == obs and outcome(replayed.error) is Outcome.DENIED


def test_lean_read_keeps_schedstat_and_takes_exec_data_from_the_caller():
    """The daemon's pass over a healthy job: thread schedstat only (the straggler
    rules' run-queue wait), command line and environment as discovery read them."""
    detailed = P.run(CTX, Pass(), (5072,)).procs[0]
    table = {5072: ProcInfo(5072, 4987, ("python3", "x.py"), {"RANK": "7"})}
    lean = P.run(CTX, Pass(table, look=Look.GLANCE), (5072,)).procs[0]
    assert [t.sched for t in lean.threads] == [t.sched for t in detailed.threads]
    assert {(t.state, t.wchan, t.cpu_seconds, t.processor) for t in lean.threads} == {
        ("", "", -1.0, -1)}  # unknown, never a made-up "running"
    assert lean.cmdline == ("python3", "x.py") and lean.env == {"RANK": "7"}
    assert (lean.state, lean.cpu_seconds) == (detailed.state, detailed.cpu_seconds)


def test_lean_read_degrades_per_thread(tmp_path, monkeypatch):
    shutil.copytree(os.path.join(FX, "5072"), tmp_path / "5072", symlinks=True)
    (tmp_path / "5072" / "task" / "5075" / "schedstat").unlink()  # no CONFIG_SCHED_INFO
    (tmp_path / "5072" / "task" / "5078" / "schedstat").write_text("garbage")
    scandir = os.scandir

    class ListedThenThreadExits:
        """The task directory's listing, taken before thread 5076 exits."""
        def __init__(self, path):
            with scandir(path) as entries:
                self.entries = list(entries)
            if str(path).endswith("/task"):
                shutil.rmtree(tmp_path / "5072" / "task" / "5076")

        def __enter__(self):
            return iter(self.entries)

        def __exit__(self, *exc):
            return False
    monkeypatch.setattr(P.os, "scandir", ListedThenThreadExits)
    obs = P.read_process(str(tmp_path), 5072, thread_detail=False)
    assert [t.tid for t in obs.threads] == [5072, 5075, 5078]
    assert obs.threads[1].sched == obs.threads[2].sched == P.NO_SCHEDSTAT
    assert obs.threads[0].sched.timeslices == 223


def test_json_round_trip():
    data = P.run(CTX, Pass(), (4987, 5072, 8465, 8506, 424242))
    saved = json.loads(json.dumps(codec.to_json(data)))
    assert P.from_json(saved) == data


def test_registered_and_run_probe():
    spec = load_all()["process"]
    assert spec.look == Look.GLANCE and not spec.budgeted  # cheap: every tick
    result = run_probe(make("process"), CTX, Pass(), (5072,))
    assert result.ok and result.data.procs[0].env["RANK"] == "0"


# ------------------------------------------------------------------ live

def test_live_stopped_sleep_reads_as_T(start_job):
    job = start_job(["sleep", "300"], name="sleep")
    pid = job.proc.pid
    ctx = ProbeContext()
    wait_until(lambda: P.run(ctx, Pass(), (pid,)).procs[0].comm == "sleep", 30,
               what="sleep exec'd")
    os.kill(pid, signal.SIGSTOP)  # the start_job finalizer sends SIGCONT then SIGKILL
    obs = wait_until(lambda: (o := P.run(ctx, Pass(), (pid,)).procs[0]).state == "T" and o,
                     30, what="state T")
    assert obs.threads[0].state == "T" and obs.threads[0].wchan == "do_signal_stop"
    assert obs.cmdline == ("sleep", "300") and obs.error == ""
    os.kill(pid, signal.SIGCONT)
    wait_until(lambda: P.run(ctx, Pass(), (pid,)).procs[0].state == "S", 30,
               what="state S again")


def test_live_self_and_children(start_job):
    job = start_job([sys.executable, "-c", "import time; time.sleep(300)"],
                    env={"RANK": "5", "NOT_ALLOWED": "x"}, name="py")
    ctx = ProbeContext()
    obs = wait_until(lambda: (o := P.run(ctx, Pass(), (job.proc.pid,)).procs[0]).env.get("RANK")
                     and o, 30, what="child env")
    assert obs.env_source == "environ" and "NOT_ALLOWED" not in obs.env
    assert obs.env["DDPWATCH_DIR"] and obs.ppid == os.getpid()
    me = P.run(ctx, Pass(), (os.getpid(),)).procs[0]
    assert job.proc.pid in me.children
    assert me.cpu_seconds > 0 and me.start_time_s > 0
    # (not threads[0]: once pids wrap, a later thread can have a lower tid)
    assert os.getpid() in [t.tid for t in me.threads]


def test_record_directories_named_by_processes_are_trusted_only_when_theirs(tmp_path):
    """The daemon runs as root and reads the directories ranks name in DDPWATCH_DIR:
    only a directory of the naming process's user, writable by no one else."""
    from ddpwatch.observe.jobs.discovery import ProcInfo, heartbeat_dirs
    need(os.geteuid() == 0, "needs root to give a directory to another user")
    own, shared, foreign = tmp_path / "own", tmp_path / "shared", tmp_path / "foreign"
    for d in (own, shared, foreign):
        d.mkdir(mode=0o700)
    shared.chmod(0o777)
    os.chown(foreign, 65534, -1)  # nobody
    python = (sys.executable, "train.py")
    table = {n: ProcInfo(os.getpid(), 1, python, {"DDPWATCH_DIR": str(d)})
             for n, d in enumerate((own, shared, foreign, tmp_path / "missing"))}
    table[9] = ProcInfo(os.getpid(), 1, ("bash",), {"DDPWATCH_DIR": str(own / "x")})
    assert heartbeat_dirs(table) == (str(own),)


def test_the_status_keys_read_alone_are_what_the_whole_parse_gives():
    """read_process reads four keys of a rank's status every tick (parse_status
    with keys): the same values as the whole file's parse, first line and last
    line too, and nothing for a key the file lacks."""
    import glob
    texts = [open(p).read() for p in glob.glob(os.path.join(TESTS, "fixtures", "proc", "*",
                                                           "status"))]
    texts.append(open(f"/proc/{os.getpid()}/status").read())
    texts += ["Uid:\t5\t5\t5\t5\nVmRSS:\t  12 kB", "TracerPid:\t0", "Name:\tx\nCpus_allowed:\tf\n"]
    assert len(texts) >= 4
    for text in texts:
        whole = P.parse_status(text)
        keys = P.STATUS_KEYS + ("Name", "NoSuchKey")
        assert P.parse_status(text, keys) == {k: whole[k] for k in keys if k in whole}


def test_a_file_is_read_whole_whether_it_fills_the_buffer_or_not(tmp_path):
    """process._read stops after one read that did not fill its buffer (a /proc
    file of one record is whole at the first read) and reads on past one that
    did: a file of exactly one buffer, and of several, come back whole."""
    from ddpwatch.observe.probes import process
    for size in (0, 17, process._CHUNK - 1, process._CHUNK, process._CHUNK + 1,
                 3 * process._CHUNK + 5):
        path = tmp_path / f"f{size}"
        data = bytes(i % 251 for i in range(size))
        path.write_bytes(data)
        assert process._read(str(path), binary=True) == data, size
    assert process._read("/proc/self/stat").startswith(f"{os.getpid()} (")
