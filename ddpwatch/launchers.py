"""The launchers ddpwatch knows, as one table: how each one's own process reads in
argv, how its ranks stand to it and are recognised, and the variables it gives them.

Discovery reads it (observe/jobs/launchers.py, observe/jobs/discovery.py), so does the
allow-list of what is read from other users' environments (observe/probes/process.py
`ENV_ALLOW`) and a rank's own guess at who it is (rank/identity.py). A launcher of a
common shape (ranks with their number in the environment, under a launcher process
recognised by argv, like torchrun's, srun's or mpirun's) is one entry here and its
case in tests/unit/observe/test_launchers_unit.py (docs/architecture.md, "Adding things").

`/proc/<pid>/environ` is the environment at exec only, so each launcher leaves
different traces:

* torchrun / elastic, `accelerate launch` (runs the elastic agent in its own
  process), DeepSpeed's `deepspeed.launcher.launch`: the workers are the
  launcher's children with RANK (DeepSpeed also passes `--local_rank=i`);
* `torch.multiprocessing.spawn`: the children run `spawn_main(...)
  --multiprocessing-fork` with no rank at all (the rank is the spawn index, an
  argument of `_wrap` sent over a pipe); the parent is no rank;
* Lightning's subprocess launcher: rank 0 is the user's own process (its
  variables are set after exec), the others re-execute the script with
  LOCAL_RANK=i, NODE_RANK, WORLD_SIZE, MASTER_ADDR/PORT and no RANK;
* SLURM `srun`: SLURM_PROCID / SLURM_LOCALID / SLURM_NTASKS;
* mpirun: OMPI_COMM_WORLD_RANK / _SIZE (Open MPI), PMI_RANK / PMI_SIZE (MPICH,
  Intel MPI).

Order matters. A rank's number comes from the first set of variables in table
order that it carries, and a launcher started inside another passes the outer
one's variables on: a torchrun worker inside an srun step carries RANK and
SLURM_PROCID, and RANK is what torch's env:// rendezvous reads; an MPI rank of
an mpirun inside a SLURM job carries OMPI_COMM_WORLD_RANK (or PMI_RANK) and the
SLURM_PROCID of the step mpirun runs in, the same for all its ranks on a node
(tests/thirdparty/test_thirdparty_jobs.py runs one). Of the ranks no
variable numbers, mp.spawn's are recognised before Lightning's; of the ranks
without a launcher process, srun's step groups before a shared MASTER_ADDR:PORT.

Everything read here may be another user's claim: numbers are parsed strictly
(`number`: digits only, bounded), anything else is "unknown" (-1). Standard
library only: rank/ imports this inside training processes.
"""
from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class Env:
    """One set of variables a launcher puts in each rank's environment at exec;
    "" where it sets none."""
    rank: str
    local_rank: str
    world_size: str
    node_rank: str = ""   # the node's index, where the rank is computed from it

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(n for n in (self.rank, self.local_rank, self.world_size, self.node_rank) if n)


TORCH = Env("RANK", "LOCAL_RANK", "WORLD_SIZE")  # what torch's env:// rendezvous reads
SLURM = Env("SLURM_PROCID", "SLURM_LOCALID", "SLURM_NTASKS")
OPEN_MPI = Env("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_SIZE")
PMI = Env("PMI_RANK", "MPI_LOCALRANKID", "PMI_SIZE")  # MPICH, Intel MPI
# Lightning's re-executed ranks: no RANK; the rank is NODE_RANK x local world + LOCAL_RANK
LIGHTNING = Env("", "LOCAL_RANK", "WORLD_SIZE", node_rank="NODE_RANK")


@dataclass(frozen=True)
class Argv:
    """How a launcher's own process reads in its argv (observe/jobs/launchers.py
    `launcher_kind` asks, most specific first: `test`, then `programs` alone,
    then the leftmost `words`).

    `words`: word sequences that, lying within argv's first four arguments of a
    Python process (or of one whose argv[0] is the `programs` of an entry with
    words: a console script run by name), make it the launcher. A word that names a
    program ("accelerate") matches a path's basename, options and the words after
    it match exactly."""
    programs: tuple[str, ...] = ()          # argv[0]'s basename; alone, without `words`
    words: tuple[tuple[str, ...], ...] = ()
    test: Callable[[tuple[str, ...]], bool] | None = None  # a launcher whose flags must parse


@dataclass(frozen=True)
class Launcher:
    """One launcher's conventions. `shape`: how its ranks stand to its process,
    one of observe/jobs/discovery.py `SHAPES`:

    * "workers": every child of its process is a rank (an agent that starts only
      workers; multiprocessing's helpers aside);
    * "claimants": its children that say they are ranks (mpirun's daemons);
    * "spawned": its children `rank_argv` recognises, numbered in their start
      order, else its children that say they are ranks;
    * "reexecuted": its own process is rank 0, the others its children
      `rank_env` recognises;
    * "peers": no launcher process: ranks join by the variables `peers` (an srun
      step's tasks are children of slurmstepd, which says nothing in argv)."""
    kind: str                                # Job.launcher_kind (observe/snapshot.py)
    shape: str
    argv: Argv | None = None                 # None: no launcher process argv tells
    env: tuple[Env, ...] = ()                # the variables its ranks carry, best first
    launcher_rank: str = "never"             # its own process is a rank: never, always,
                                             # claimed (when it says so)
    rank_argv: Callable[[tuple[str, ...]], bool] | None = None  # a rank, by its own argv
    rank_env: Callable[[Mapping[str, str]], bool] | None = None  # by its environment
    adopts: bool = False    # any Python parent of ranks no entry recognises is one of these
    peers: tuple[str, ...] = ()   # "peers": the values one job's ranks share (absent: ""),
    needs: tuple[str, ...] = ()   # for a process that carries all of these (default: peers)
    rank_flags: tuple[str, ...] = ()  # a worker's `--local_rank=i`, where no variable says
    node_flag: str = ""               # the launcher's flag for its node: on node 0, i is the rank
    reads: tuple[str, ...] = ()       # other variables its conventions read (ENV_ALLOW)
    # every rank of its world is a process on this node, found there: one parent
    # starts them all (judge/signals/launch.py `all_ranks_local`). Not for torchrun-
    # like launchers: network namespaces share the process table, and other nodes'
    # ranks would all look local.
    world_local: bool = False


# ------------------------------------------------------------ bespoke shapes
# The code entries refer to, where a pattern is not enough.

MAX_RANK = 1 << 20  # a claimed rank above this is junk, not a rank
SPAWN_MAIN = "from multiprocessing.spawn import spawn_main"


def number(value: str | None) -> int:
    """A non-negative decimal below MAX_RANK, else -1 (absent, junk, '+1', '1e3')."""
    if value is None or not value.isascii() or not value.isdigit() or len(value) > 7:
        return -1
    n = int(value)
    return n if n < MAX_RANK else -1


def is_python(cmdline: tuple[str, ...]) -> bool:
    """What argv says: a command line that runs python (a process that set its
    title says nothing here: discovery.ProcInfo.python asks its executable too)."""
    return bool(cmdline) and "python" in os.path.basename(cmdline[0])


def is_spawn_child(cmdline: tuple[str, ...]) -> bool:
    """A child started by multiprocessing's "spawn" method (torch.multiprocessing.spawn)."""
    return (is_python(cmdline) and "--multiprocessing-fork" in cmdline
            and any(a.startswith(SPAWN_MAIN) for a in cmdline))


def is_lightning_child(env: Mapping[str, str]) -> bool:
    """Started by Lightning's _SubprocessScriptLauncher: LOCAL_RANK >= 1 and the
    variables it sets beside it, without RANK (torchrun sets RANK and GROUP_RANK,
    never NODE_RANK)."""
    return ("RANK" not in env and number(env.get("LOCAL_RANK")) >= 1
            and number(env.get("NODE_RANK")) >= 0 and "MASTER_PORT" in env
            and number(env.get("WORLD_SIZE")) >= 1)


def is_torchrun(cmdline: tuple[str, ...]) -> bool:
    """torchrun / `python -m torch.distributed.run|launch` itself, with flags or a
    script to run (not `timeout 30 torchrun ...` or a shell around it)."""
    return bool(torchrun_args(cmdline)) and (
        is_python(cmdline) or os.path.basename(cmdline[0]) == "torchrun")


# torchrun's own flags (torch.distributed.run.get_args_parser, torch 2.13; use_env from
# the older torch.distributed.launch). All take a value except _TORCHRUN_BOOL; knowing
# which lets us stop at the training script.
_TORCHRUN_BOOL = ("standalone", "module", "no_python", "run_path", "virtual_local_rank",
                  "use_env")
_TORCHRUN_FLAGS = _TORCHRUN_BOOL + tuple("""nnodes nproc_per_node rdzv_backend rdzv_endpoint
    rdzv_id rdzv_conf max_restarts monitor_interval start_method event_log_handler role
    log_dir redirects tee local_ranks_filter duplicate_stdout_filters
    duplicate_stderr_filters node_rank master_addr master_port local_addr logs_specs
    numa_binding signals_to_handle shutdown_timeout""".split())
_SHORT = {"-m": "module", "-r": "redirects", "-t": "tee"}


def _torchrun_start(argv: tuple[str, ...]) -> int:
    """Index of the first launcher flag, or -1 if argv is not torchrun/launch."""
    for i, arg in enumerate(argv[:3]):
        if os.path.basename(arg) == "torchrun":
            return i + 1
        if arg == "-m" and i + 1 < len(argv) and argv[i + 1] in (
                "torch.distributed.run", "torch.distributed.launch"):
            return i + 2
    return -1


def torchrun_args(cmdline: tuple[str, ...]) -> dict[str, str]:
    """Launcher flags of a torchrun / `python -m torch.distributed.run` cmdline,
    normalised to argparse dests (`--nproc-per-node 2` -> nproc_per_node='2'), plus
    'script'. Argparse accepts unique prefixes (`--nproc 2`), so do we. {} if not
    a launcher."""
    argv = cmdline
    if len(argv) == 1 and " " in argv[0]:  # setproctitle-style rewritten cmdline
        argv = tuple(argv[0].split())
    i = _torchrun_start(argv)
    if i < 0:
        return {}
    out: dict[str, str] = {}
    while i < len(argv):
        arg = argv[i]
        if not arg.startswith("-"):
            out["script"] = arg
            break
        name, eq, value = arg.partition("=")
        if name in _SHORT:
            dest = _SHORT[name]
        else:
            dest = name.lstrip("-").replace("-", "_")
            matches = [f for f in _TORCHRUN_FLAGS if f.startswith(dest)]
            dest = dest if dest in _TORCHRUN_FLAGS or len(matches) != 1 else matches[0]
        if dest in _TORCHRUN_BOOL:
            out[dest] = "1"
        elif eq:
            out[dest] = value
        elif i + 1 < len(argv):
            out[dest] = argv[i + 1]
            i += 1
        i += 1
    return out


# ------------------------------------------------------------------ the table

TABLE: tuple[Launcher, ...] = (
    Launcher("torchrun", "workers", Argv(test=is_torchrun), env=(TORCH,),
             reads=("LOCAL_WORLD_SIZE", "GROUP_RANK", "ROLE_RANK", "TORCHELASTIC_RUN_ID",
                    "TORCHELASTIC_RESTART_COUNT")),
    # `accelerate launch` runs torchrun's agent in a process of its own
    Launcher("accelerate", "workers", Argv(
        programs=("accelerate", "accelerate-launch"),
        words=(("accelerate", "launch"), ("accelerate-launch",),
               ("-m", "accelerate.commands.launch"), ("-m", "accelerate.commands.accelerate_cli"))),
        env=(TORCH,)),
    # its workers also get `--local_rank=i`; the ranks per node of a node > 0 are in
    # its base64 --world_info (left unknown)
    Launcher("deepspeed", "workers", Argv(programs=("deepspeed",),
                                          words=(("-m", "deepspeed.launcher.launch"),)),
             env=(TORCH,), rank_flags=("--local_rank", "--local-rank"), node_flag="--node_rank"),
    # mpirun and the daemons that start an MPI job's ranks on each node
    Launcher("mpirun", "claimants", Argv(programs=(
        "mpirun", "mpiexec", "orterun", "prterun", "orted", "prted", "hydra_pmi_proxy",
        "mpiexec.hydra")), env=(OPEN_MPI, PMI)),
    # after mpirun: an mpirun inside a batch script or an srun step passes the
    # step's SLURM_PROCID (0, or the node's index) on to every rank it starts
    Launcher("slurm", "peers", env=(SLURM,), peers=("SLURM_JOB_ID", "SLURM_STEP_ID"),
             needs=("SLURM_JOB_ID", "SLURM_PROCID")),
    # a user's script that starts its ranks itself is often rank 0: `claimed`
    Launcher("spawn", "spawned", launcher_rank="claimed", rank_argv=is_spawn_child,
             adopts=True, world_local=True),
    # its world is its children's WORLD_SIZE
    Launcher("lightning", "reexecuted", env=(LIGHTNING,), launcher_rank="always",
             rank_env=is_lightning_child, reads=("RANK", "MASTER_PORT"), world_local=True),
    # started by hand (or any env:// launcher): one job by its master and world
    Launcher("env", "peers", env=(TORCH,), peers=("MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE")),
)

# The kinds of jobs no entry's process launched (observe/jobs/discovery.py KINDS),
# never looked for in argv or environments (no shape): ranks grouped by their
# connections (observe/probes/wire_groups.py, observe/jobs/tcp_discovery.py; such a
# group has a world size only when it is closed, all here), or a process alone.
UNLAUNCHED: tuple[Launcher, ...] = (Launcher("wire", "", world_local=True),
                                    Launcher("none", ""))

# The sets of variables that number ranks, each once, in order of precedence.
ENVS: tuple[Env, ...] = tuple(dict.fromkeys(e for entry in TABLE for e in entry.env))
# Every variable the table's conventions read: observe/probes/process.py ENV_ALLOW
# lets them through.
ENV_VARS: frozenset[str] = frozenset(
    name for entry in TABLE
    for name in (*(n for e in entry.env for n in e.names), *entry.peers, *entry.needs,
                 *entry.reads))


def entry(kind: str) -> Launcher:
    return next(e for e in TABLE if e.kind == kind)


def world_local(kind: str) -> bool:
    """Whether every rank of a job of this launcher kind is on this node
    (`Launcher.world_local`)."""
    return any(e.world_local for e in TABLE + UNLAUNCHED if e.kind == kind)
