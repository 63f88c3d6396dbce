"""The table of launchers (ddpwatch/launchers.py): each entry's conventions as
discovery reads them, the same environment read alike by discovery and by a rank
itself (rank/identity.py), and the allow-list of variables read from other users'
processes. A new launcher is its entry and its case here."""
from __future__ import annotations

import pytest

from ddpwatch import launchers as T
from ddpwatch.observe.jobs import discovery as D
from ddpwatch.observe.jobs import launchers as L
from ddpwatch.observe.jobs.discovery import ProcInfo as P
from ddpwatch.observe.probes import process as PR
from ddpwatch.rank.identity import launcher_identity

PY = "/venv/bin/python3.11"

# Each launcher process's argv: what makes it one (first: the one the jobs below use),
# and near misses that do not.
LAUNCHER_ARGV = {
    "torchrun": ([("/venv/bin/torchrun", "--nproc-per-node=2", "train.py"),
                  (PY, "/venv/bin/torchrun", "--standalone", "train.py"),
                  (PY, "-u", "-m", "torch.distributed.run", "--nnodes=1", "train.py"),
                  (PY, "-m", "torch.distributed.launch", "--use-env", "train.py"),
                  ("python -m torch.distributed.run --nproc 2 train.py",)],  # retitled
                 [("timeout", "30", "torchrun", "train.py"), ("torchrun",),
                  (PY, "train.py", "torchrun"), ("bash", "-c", "torchrun train.py")]),
    "accelerate": ([(PY, "/venv/bin/accelerate", "launch", "--multi_gpu", "train.py"),
                    ("/venv/bin/accelerate", "launch", "train.py"),
                    ("accelerate-launch", "train.py"),
                    (PY, "-m", "accelerate.commands.launch", "train.py"),
                    (PY, "-m", "accelerate.commands.accelerate_cli", "launch", "train.py")],
                   [("/venv/bin/accelerate", "config"), ("bash", "accelerate", "launch")]),
    "deepspeed": ([(PY, "-u", "-m", "deepspeed.launcher.launch", "--world_info=e30=",
                    "--node_rank=0", "train.py")],
                  [("/venv/bin/deepspeed", "train.py"),  # the runner: it starts the launcher
                   (PY, "-m", "deepspeed.launcher.runner", "train.py")]),
    "mpirun": ([("mpirun", "-np", "2", PY, "train.py"), ("/usr/bin/orted", "-mca", "x"),
                ("/usr/bin/hydra_pmi_proxy", "--control-port", "h:1"),
                ("mpiexec.hydra", "-n", "2", "train.py")],
               [(PY, "mpirun"), ("srun", "mpirun")]),
}


def test_every_launcher_process_has_its_case_and_the_kinds_are_distinct():
    kinds = [e.kind for e in T.TABLE]
    assert len(set(kinds)) == len(kinds)
    assert set(LAUNCHER_ARGV) == {e.kind for e in T.TABLE if e.argv}
    assert D.KINDS == tuple(kinds) + ("wire", "none")


@pytest.mark.parametrize("kind", sorted(LAUNCHER_ARGV))
def test_a_launcher_process_is_known_by_its_argv(kind):
    yes, no = LAUNCHER_ARGV[kind]
    for argv in yes:
        assert L.launcher_kind(argv) == kind, argv
        assert D.is_launcher(argv)
    for argv in no:
        assert L.launcher_kind(argv) == "", argv


def test_which_launcher_an_argv_naming_two_is():
    """torchrun's own test first, then argv[0] alone (mpirun's), then the leftmost
    launcher words (ddpwatch/launchers.py `Argv`)."""
    assert L.launcher_kind((PY, "-m", "deepspeed.launcher.launch", "accelerate-launch")) == \
        "deepspeed"
    assert L.launcher_kind((PY, "accelerate-launch", "-m", "deepspeed.launcher.launch")) == \
        "accelerate"
    assert L.launcher_kind((PY, "accelerate-launch", "torchrun", "train.py")) == "torchrun"
    assert L.launcher_kind(("mpirun", "accelerate-launch", "train.py")) == "mpirun"


def test_launcher_words_fit_what_discovery_keeps_of_a_non_python_argv():
    """A process neither Python nor a launcher keeps argv[:OTHER_ARGS] in discovery's
    cache: a launcher's words must lie within them to be seen at all."""
    for e in T.TABLE:
        for words in (e.argv.words if e.argv else ()):
            assert len(words) <= D.OTHER_ARGS, (e.kind, words)


def test_every_shape_has_its_code_in_discovery():
    for e in T.TABLE:
        if e.shape == "peers":
            assert e.argv is None and e.peers and e.env, e.kind
        else:
            assert e.shape in D.SHAPES, e.kind
        assert e.launcher_rank in ("never", "always", "claimed"), e.kind
        if e.shape in ("spawned", "reexecuted"):  # their ranks are known by the entry's test
            assert e.rank_argv or e.rank_env, e.kind
    assert sum(e.adopts for e in T.TABLE) == 1


def test_whose_world_is_all_on_one_node_is_the_tables_to_say():
    """judge/signals/launch.py asks the table, never a list of kinds of its own:
    one parent starts all of spawn's and Lightning's ranks; a closed group found on
    the wire is all here; a torchrun-like job's other nodes share no process table."""
    assert {k for k in D.KINDS if T.world_local(k)} == {"spawn", "lightning", "wire"}
    assert not T.world_local("no such launcher")


# ---------------------------------------------------- the variables of the ranks

RANKED = [(e, names) for e in T.TABLE for names in e.env if names.rank]


def test_envs_are_the_tables_in_order_of_precedence():
    assert T.ENVS[0] == T.TORCH  # what torch's env:// reads comes first
    # MPI's before SLURM's: an mpirun inside a SLURM job passes the step's
    # SLURM_PROCID on to all its ranks
    assert [n.rank for n in T.ENVS if n.rank] == [
        "RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID"]


@pytest.mark.parametrize("names", [n for n in T.ENVS if n.rank], ids=lambda n: n.rank)
def test_discovery_and_the_rank_itself_read_each_launchers_variables_alike(names):
    env = {names.rank: "5", names.local_rank: "1", names.world_size: "8"}
    assert L.env_rank(env) == (5, 8, names.rank)
    assert L.says_rank(env)
    assert launcher_identity(env) == {"rank": 5, "local_rank": 1, "world_size": 8}
    # no world of its own: torch's WORLD_SIZE, on both sides
    env = {names.rank: "5", names.local_rank: "1", "WORLD_SIZE": "6"}
    assert L.env_rank(env)[:2] == (5, 6)
    assert launcher_identity(env) == {"rank": 5, "local_rank": 1, "world_size": 6}
    for junk in ("", "-1", "+1", "1e3", "0x1", "99999999"):  # another user's claim
        assert L.env_rank({**env, names.rank: junk})[0] == -1, junk


def test_the_first_set_of_variables_in_table_order_wins_on_both_sides():
    ranked = [n for n in T.ENVS if n.rank]
    for i, first in enumerate(ranked):
        for later in ranked[i + 1:]:
            env = {later.rank: "6", later.world_size: "9", first.rank: "2",
                   first.world_size: "4"}
            assert L.env_rank(env)[:2] == (2, 4), (first, later)
            assert launcher_identity(env)["rank"] == 2, (first, later)


def _job_of(entry, names):
    """Two ranks of `entry` carrying `names`, under its launcher process (the first
    argv of its case) or, launcherless, under a shell."""
    extra = {n: "x" for n in (entry.needs or entry.peers)}
    envs = [{**extra, names.rank: str(i), names.local_rank: str(i), names.world_size: "2"}
            for i in (0, 1)]
    parent = (P(400, 100, LAUNCHER_ARGV[entry.kind][0][0], {}, 10) if entry.argv
              else P(400, 100, ("bash",), {}, 10))
    table = {p.pid: p for p in (P(100, 1, ("bash",), {}, 5), parent,
                                *(P(401 + i, 400, (PY, "train.py"), envs[i], 20)
                                  for i in (0, 1)))}
    return table, envs


@pytest.mark.parametrize("entry, names", RANKED, ids=lambda v: getattr(v, "kind", None)
                         or getattr(v, "rank", None))
def test_each_env_launchers_job_is_numbered_as_its_ranks_number_themselves(entry, names):
    table, envs = _job_of(entry, names)
    job = D.find_job(402, table)
    assert job.launcher_kind == entry.kind
    assert job.launcher_pid == (400 if entry.argv else -1)
    assert job.rank_pids == (401, 402) and job.ranks == (0, 1) and job.world_size == 2
    for i, env in enumerate(envs):
        assert launcher_identity(env) == {"rank": i, "local_rank": i, "world_size": 2}


def test_peers_are_grouped_by_their_entrys_variables():
    for e in T.TABLE:
        if e.shape == "peers":
            env = {n: "7" for n in (*e.needs, *e.peers)}
            assert L.peers_of(env) is e
            assert L.group_key(env) == (e.kind,) + tuple("7" for _ in e.peers)
            for missing in e.needs or e.peers:
                assert L.group_key({k: v for k, v in env.items() if k != missing}) != \
                    L.group_key(env), (e.kind, missing)


def test_spawn_and_lightning_ranks_are_numbered_as_they_number_themselves():
    spawn = ("-c", T.SPAWN_MAIN + "(tracker_fd=5, pipe_handle=7)", "--multiprocessing-fork")
    table = {p.pid: p for p in (P(100, 1, ("bash",), {}, 5),
                                P(200, 100, (PY, "spawn.py"), {"MASTER_PORT": "1"}, 10),
                                *(P(201 + i, 200, (PY,) + spawn, {}, 20 + i) for i in (0, 1)))}
    job = D.find_job(201, table)
    assert (job.launcher_kind, job.ranks, job.world_size) == ("spawn", (0, 1), 2)
    for i in (0, 1):
        assert launcher_identity({}, spawn_index=i, init_world_size=2)["rank"] == i
    rank1 = {"MASTER_ADDR": "h", "MASTER_PORT": "2", "NODE_RANK": "0", "LOCAL_RANK": "1",
             "WORLD_SIZE": "2"}
    table = {p.pid: p for p in (P(100, 1, ("bash",), {}, 5), P(300, 100, (PY, "l.py"), {}, 10),
                                P(301, 300, (PY, "/w/l.py"), rank1, 20))}
    job = D.find_job(301, table)
    assert (job.launcher_kind, job.rank_pids, job.ranks, job.world_size) == (
        "lightning", (300, 301), (0, 1), 2)
    assert launcher_identity({}, lightning=True) == {"rank": 0, "local_rank": 0,
                                                      "world_size": -1}
    assert launcher_identity(rank1, lightning=True) == {"rank": 1, "local_rank": 1,
                                                         "world_size": 2}


# ------------------------------------------------------------ the allow-list

# ENV_ALLOW as it was before the table: what the judge and the publishers read
# (LOCAL_WORLD_SIZE: judge/signals/process.py; TORCHELASTIC_RUN_ID: the run id).
# The table may add to it, never take away.
BEFORE_THE_TABLE = {
    "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "ROLE_RANK",
    "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID", "TORCHELASTIC_RESTART_COUNT",
    "GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME", "OMP_NUM_THREADS", "CUDA_VISIBLE_DEVICES",
    "DDPWATCH_DIR", "TORCH_DISTRIBUTED_DEBUG", "NODE_RANK", "SLURM_PROCID", "SLURM_LOCALID",
    "SLURM_NTASKS", "SLURM_JOB_ID", "SLURM_STEP_ID", "OMPI_COMM_WORLD_RANK",
    "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK", "PMI_RANK", "PMI_SIZE"}


def test_the_allow_list_holds_every_variable_of_the_table_and_all_it_held_before():
    assert BEFORE_THE_TABLE <= PR.ENV_ALLOW
    assert T.ENV_VARS <= PR.ENV_ALLOW
    assert PR.ENV_ALLOW - BEFORE_THE_TABLE <= T.ENV_VARS  # (MPI_LOCALRANKID: PMI's local rank)
    for e in T.TABLE:
        for names in e.env:
            assert set(names.names) <= PR.ENV_ALLOW, e.kind
        assert set(e.peers) | set(e.needs) | set(e.reads) <= PR.ENV_ALLOW, e.kind
    env = PR.parse_environ(b"".join(f"{n}=1\0".encode() for n in sorted(T.ENV_VARS))
                           + b"SECRET=x\0")
    assert set(env) == T.ENV_VARS


def test_lightning_is_told_from_torchrun_by_a_rank_the_allow_list_lets_through():
    """Lightning's re-executions have no RANK; torchrun's workers do. RANK must pass
    the allow-list, or every torchrun worker with NODE_RANK would read as
    Lightning's (its entry `reads` it)."""
    raw = b"RANK=1\0LOCAL_RANK=1\0NODE_RANK=0\0MASTER_PORT=2\0WORLD_SIZE=2\0"
    assert not T.is_lightning_child(PR.parse_environ(raw))
    assert T.is_lightning_child(PR.parse_environ(raw.replace(b"RANK=1\0", b"", 1)))
