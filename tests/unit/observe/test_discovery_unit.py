"""Discovery of every launch topology without heartbeats, on
synthetic process tables shaped like the real ones (command lines and
environments as read from /proc for each launcher; see tests/jobs/thirdparty)."""
from ddpwatch.observe.jobs import discovery as D
from ddpwatch.observe.jobs import launchers as L
from ddpwatch.observe.jobs.discovery import ProcInfo as P

PY = "/venv/bin/python"
SPAWN = ("-B", "-c", "from multiprocessing.spawn import spawn_main; "
         "spawn_main(tracker_fd=5, pipe_handle=7)", "--multiprocessing-fork")
TRACKER = (PY, "-B", "-c", "from multiprocessing.resource_tracker import main;main(4)")


def table(*procs):
    return {p.pid: p for p in procs}


def shell():
    return P(100, 1, ("bash",), {}, 10)


def spawn_table(starts=(50, 51), pids=(202, 203), parent_env=None):
    env = parent_env if parent_env is not None else {"MASTER_PORT": "29500"}
    return table(shell(), P(200, 100, (PY, "spawn_ddp.py"), env, 40),
                 P(201, 200, TRACKER, env, 49),
                 *(P(pid, 200, (PY,) + SPAWN, env, start) for pid, start in zip(pids, starts)))


def test_mp_spawn_children_are_the_ranks_by_spawn_index_and_the_parent_is_none():
    t = spawn_table()
    for target in (200, 202, 203):
        job = D.find_job(target, t)
        assert job.launcher_kind == "spawn" and job.launcher_pid == 200
        assert job.rank_pids == (202, 203) and job.ranks == (0, 1) and job.world_size == 2
    assert D.find_job(201, t).launcher_kind == "none"  # the resource tracker is no rank
    (job,) = D.all_jobs(t)
    assert job.rank_pids == (202, 203)


def test_mp_spawn_index_follows_the_start_order_not_the_pid_and_ambiguity_is_unknown():
    # the pid counter wrapped between the two spawns: start order decides
    assert D.find_job(200, spawn_table(starts=(50, 51), pids=(900, 30))).ranks == (1, 0)
    # wrapped within one clock tick: no honest index
    assert D.find_job(200, spawn_table(starts=(50, 50), pids=(40000, 30))).ranks == (-1, -1)


def test_a_spawn_family_without_any_sign_of_torch_is_no_job_for_the_daemon():
    t = spawn_table(parent_env={})
    assert D.all_jobs(t) == []
    assert D.find_job(202, t).rank_pids == (202, 203)  # asked for by a person: judged


def lightning_table(node_rank="0", world="2", extra=()):
    child_env = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29731", "NODE_RANK": node_rank,
                 "LOCAL_RANK": "1", "WORLD_SIZE": world}
    return table(shell(), P(300, 100, (PY, "-m", "pytest", "x"), {}, 20),
                 P(301, 300, (PY, "lightning_ddp.py"), {"NODE_RANK": node_rank}
                   if node_rank != "0" else {}, 30),
                 P(302, 301, (PY, "/w/lightning_ddp.py"), child_env, 60), *extra)


def test_lightning_rank0_is_the_users_process_and_its_reexecutions_the_others():
    t = lightning_table()
    for target in (301, 302):
        job = D.find_job(target, t)
        assert job.launcher_kind == "lightning" and job.launcher_pid == -1
        assert job.rank_pids == (301, 302) and job.ranks == (0, 1) and job.world_size == 2
    (job,) = D.all_jobs(t)
    assert job.rank_pids == (301, 302)  # pytest, the parent of rank 0, is no part of it


def test_lightning_on_node_1_numbers_node_rank_times_local_world_plus_local_rank():
    job = D.find_job(301, lightning_table(node_rank="1", world="4"))
    assert job.ranks == (2, 3) and job.world_size == 4


def test_lightning_rank0_whose_shell_is_gone_is_still_rank_0():
    t = lightning_table()
    t[301] = P(301, 1, (PY, "lightning_ddp.py"), {}, 30)
    assert D.find_job(301, t).ranks == (0, 1)


def torchrun_like(launcher_cmd, worker_env=lambda i: {"RANK": str(i), "LOCAL_RANK": str(i),
                                                      "WORLD_SIZE": "2"}, worker_cmd=None):
    return table(shell(), P(400, 100, launcher_cmd, {}, 10),
                 *(P(401 + i, 400, worker_cmd(i) if worker_cmd else (PY, "-u", "train.py"),
                     worker_env(i), 20) for i in range(2)))


def test_accelerate_launch_runs_the_agent_in_its_own_process():
    for cmd in ((PY, "/venv/bin/accelerate", "launch", "--multi_gpu", "train.py"),
                ("/venv/bin/accelerate", "launch", "train.py"),
                (PY, "-m", "accelerate.commands.launch", "train.py")):
        job = D.find_job(402, torchrun_like(cmd))
        assert (job.launcher_kind, job.launcher_pid, job.rank_pids, job.ranks) == (
            "accelerate", 400, (401, 402), (0, 1)), cmd


def test_deepspeed_launcher_and_its_local_rank_argument():
    t = torchrun_like((PY, "-u", "-m", "deepspeed.launcher.launch", "--world_info=e30=",
                       "--node_rank=0", "train.py"), worker_env=lambda i: {},
                      worker_cmd=lambda i: (PY, "-u", "train.py", f"--local_rank={i}"))
    job = D.find_job(400, t)
    assert job.launcher_kind == "deepspeed" and job.ranks == (0, 1)
    t[400] = P(400, 100, t[400].cmdline[:-2] + ("--node_rank", "1", "train.py"), {}, 10)
    assert D.find_job(400, t).ranks == (-1, -1)  # node 1's numbering is in --world_info


def test_slurm_tasks_are_one_job_by_their_step():
    env = lambda i, job="77": {"SLURM_JOB_ID": job, "SLURM_STEP_ID": "0", "SLURM_PROCID": str(i),
                               "SLURM_LOCALID": str(i), "SLURM_NTASKS": "4"}
    t = table(P(500, 1, ("slurmstepd: [77.0]",), {}, 5),
              P(501, 500, (PY, "train.py"), env(2), 9), P(502, 500, (PY, "train.py"), env(3), 9),
              P(503, 500, (PY, "train.py"), env(0, "78"), 9))
    job = D.find_job(501, t)
    assert job.launcher_kind == "slurm" and job.rank_pids == (501, 502)
    assert job.ranks == (2, 3) and job.world_size == 4
    assert sorted(j.rank_pids for j in D.all_jobs(t)) == [(501, 502), (503,)]


def test_mpirun_open_mpi_and_mpich():
    ompi = lambda i: {"OMPI_COMM_WORLD_RANK": str(i), "OMPI_COMM_WORLD_SIZE": "2"}
    t = torchrun_like(("mpirun", "-np", "2", PY, "train.py"), worker_env=ompi)
    job = D.find_job(401, t)
    assert (job.launcher_kind, job.ranks, job.world_size) == ("mpirun", (0, 1), 2)
    pmi = lambda i: {"PMI_RANK": str(i), "PMI_SIZE": "2"}
    t = torchrun_like(("/usr/bin/hydra_pmi_proxy", "--control-port", "x:1"), worker_env=pmi)
    assert D.find_job(402, t).ranks == (0, 1)


def test_mpirun_inside_a_slurm_job_numbers_by_mpi_not_the_step():
    """An mpirun in a batch script (or an srun step) passes the step's
    variables on to every rank it starts: SLURM_PROCID is the same for all of
    them on a node, and the job is mpirun's, numbered as MPI numbers it."""
    step = {"SLURM_JOB_ID": "77", "SLURM_STEP_ID": "0", "SLURM_PROCID": "0",
            "SLURM_LOCALID": "0", "SLURM_NTASKS": "1"}
    ompi = lambda i: {**step, "OMPI_COMM_WORLD_RANK": str(i), "OMPI_COMM_WORLD_SIZE": "2"}
    t = torchrun_like(("mpirun", "-np", "2", PY, "train.py"), worker_env=ompi)
    job = D.find_job(402, t)
    assert (job.launcher_kind, job.ranks, job.world_size) == ("mpirun", (0, 1), 2)
    pmi = lambda i: {**step, "SLURM_PROCID": "3", "PMI_RANK": str(4 + i), "PMI_SIZE": "8"}
    t = torchrun_like(("/usr/bin/hydra_pmi_proxy", "--control-port", "x:1"), worker_env=pmi)
    assert D.find_job(402, t).ranks == (4, 5) and D.find_job(402, t).world_size == 8


def test_torchrun_keeps_every_child_as_a_worker():
    t = torchrun_like(("/venv/bin/torchrun", "--nproc-per-node=2", "train.py"))
    job = D.find_job(401, t)
    assert (job.launcher_kind, job.launcher_pid, job.ranks, job.world_size) == (
        "torchrun", 400, (0, 1), 2)


def test_ranks_started_by_hand_share_master_and_world():
    env = lambda i: {"RANK": str(i), "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1",
                     "MASTER_PORT": "29500"}
    t = table(shell(), P(601, 100, (PY, "a.py"), env(1), 9), P(602, 100, (PY, "a.py"), env(0), 9))
    job = D.find_job(601, t)
    # the shell has both as children: a spawner of its own would have to be python
    assert (job.launcher_kind, job.launcher_pid) == ("env", -1)
    assert job.rank_pids == (601, 602) and job.ranks == (1, 0)


def test_hostile_numbers_are_unknown_not_ranks():
    for junk in ("", "-1", "+1", "1e3", "٣", "99999999", "0x1", " 1"):
        assert L.number(junk) == -1, junk
        assert L.env_rank({"RANK": junk}) == (-1, -1, "")
    assert not L.is_lightning_child({"LOCAL_RANK": "1", "NODE_RANK": "x", "MASTER_PORT": "1",
                                     "WORLD_SIZE": "2"})
    assert L.local_rank_arg(("python", "t.py", "--local_rank")) == -1


def test_a_ranks_dataloader_workers_are_no_ranks_however_they_were_started():
    """A DataLoader's workers inherit their rank's environment: forked (Linux's
    default: the rank's command line and environment) or spawned (a copy of its
    RANK and MASTER_*). They are the rank's, not ranks of a second job (the soak's
    DataLoader job was judged two dead jobs of workers: tests/daemon/test_soak.py)."""
    agent = P(400, 100, (PY, "-m", "torch.distributed.run", "--nproc_per_node=2", "t.py"), {}, 20)
    envs = [{"RANK": str(r), "LOCAL_RANK": str(r), "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1",
             "MASTER_PORT": "29500", "TORCHELASTIC_RUN_ID": "none"} for r in (0, 1)]
    ranks = [P(401 + r, 400, (PY, "-u", "t.py"), envs[r], 30) for r in (0, 1)]
    forked = [P(410 + i, 401 + r, (PY, "-u", "t.py"), envs[r], 90) for i, r in
              enumerate((0, 0, 1, 1))]
    spawned = [P(420 + r, 401 + r, (PY,) + SPAWN, envs[r], 95) for r in (0, 1)]
    t = table(shell(), agent, *ranks, *forked, *spawned)
    (job,) = D.all_jobs(t)
    assert job.rank_pids == (401, 402) and job.ranks == (0, 1) and job.launcher_pid == 400
    for worker in (410, 412, 420, 421):  # a person typed a worker's pid: its rank's job
        assert D.find_job(worker, t).rank_pids == (401, 402)
    # a worker that writes a heartbeat record says it is a rank
    assert D.is_worker_of(forked[0], ranks[0]) and not D.is_worker_of(forked[0], ranks[0],
                                                                      frozenset({410}))


def test_workers_of_mp_spawn_lightning_and_hand_started_ranks_are_no_ranks():
    # mp.spawn's ranks with spawned DataLoader workers: still two ranks, numbered
    t = spawn_table()
    env = t[202].env
    t.update(table(P(230, 202, (PY,) + SPAWN, env, 90), P(231, 203, (PY,) + SPAWN, env, 91)))
    (job,) = D.all_jobs(t)
    assert job.rank_pids == (202, 203) and job.ranks == (0, 1)
    # Lightning's rank 0 (the launcher) and rank 1, each with forked workers
    t = lightning_table()
    t.update(table(P(310, 301, t[301].cmdline, t[301].env, 90),
                   P(311, 302, t[302].cmdline, t[302].env, 91)))
    (job,) = [j for j in D.all_jobs(t) if 301 in j.rank_pids]
    assert job.rank_pids == (301, 302) and job.ranks == (0, 1)
    # ranks started by hand (MASTER_* and RANK in the environment), forked workers
    envs = [{"RANK": str(r), "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1",
             "MASTER_PORT": "29600"} for r in (0, 1)]
    t = table(shell(), *(P(500 + r, 100, (PY, "t.py"), envs[r], 30) for r in (0, 1)),
              *(P(510 + r, 500 + r, (PY, "t.py"), envs[r], 90) for r in (0, 1)))
    (job,) = D.all_jobs(t)
    assert job.rank_pids == (500, 501) and job.ranks == (0, 1)


def test_a_process_that_set_its_title_is_python_by_its_executable():
    """Ray's workers are titled "ray::RayTrainWorker" (argv no longer says python):
    their executable does; a RANK in their environment makes them ranks as any."""
    assert L.is_python_exe("/root/.pyenv/versions/3.11.7/bin/python3.11")
    assert L.is_python_exe("/opt/venv/bin/python")
    assert not L.is_python_exe("/usr/bin/bash")
    assert not L.is_python_exe("")
    titled = P(50, 1, ("ray::RayTrainWorker",), {"RANK": "0", "WORLD_SIZE": "2"},
                      exe_python=True)
    assert titled.python and not P(51, 1, ("ray::RayTrainWorker",), {}).python
    assert D.looks_like_rank(titled, frozenset())
