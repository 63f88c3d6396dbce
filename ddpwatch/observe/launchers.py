"""Who launched a process, and what rank that makes it: the conventions of the
launchers people use. Pure over command lines and allow-listed
environments (probes/process.py ENV_ALLOW); discovery.py puts them together.

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

Everything here is a claim of another user's process: numbers are parsed
strictly (digits only, bounded), anything else is "unknown" (-1).
"""
from __future__ import annotations

import os

from .probes.process import torchrun_args

MAX_RANK = 1 << 20  # a claimed rank above this is junk, not a rank

SPAWN_MAIN = "from multiprocessing.spawn import spawn_main"
# multiprocessing's own helpers: children of a spawning parent that are no rank
MP_HELPERS = ("multiprocessing.resource_tracker", "multiprocessing.semaphore_tracker",
              "multiprocessing.forkserver")
MPI_LAUNCHERS = frozenset(("mpirun", "mpiexec", "orterun", "prterun", "orted", "prted",
                           "hydra_pmi_proxy", "mpiexec.hydra"))


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


def is_python_exe(exe: str) -> bool:
    """The executable (/proc/PID/exe's target) is a Python interpreter: python,
    python3, python3.11, python3.13t, a venv's copy of one."""
    return os.path.basename(exe).startswith(("python", "pypy"))


def launcher_kind(cmdline: tuple[str, ...]) -> str:
    """"torchrun", "accelerate", "deepspeed" or "mpirun" for the launcher process
    itself (not `timeout 30 torchrun ...` or a shell around it), else ""."""
    if not cmdline:
        return ""
    head = cmdline[:4]
    base0 = os.path.basename(cmdline[0])
    if torchrun_args(cmdline) and (is_python(cmdline) or base0 == "torchrun"):
        return "torchrun"
    if base0 in MPI_LAUNCHERS:
        return "mpirun"
    if not (is_python(cmdline) or base0 in ("accelerate", "accelerate-launch", "deepspeed")):
        return ""
    for i, arg in enumerate(head):
        name = os.path.basename(arg)
        nxt = head[i + 1] if i + 1 < len(head) else ""
        if name == "accelerate" and nxt == "launch" or name == "accelerate-launch":
            return "accelerate"
        if arg == "-m" and nxt in ("accelerate.commands.launch", "accelerate.commands.accelerate_cli"):
            return "accelerate"
        if arg == "-m" and nxt == "deepspeed.launcher.launch":
            return "deepspeed"
    return ""


def is_spawn_child(cmdline: tuple[str, ...]) -> bool:
    """A child started by multiprocessing's "spawn" method (torch.multiprocessing.spawn)."""
    return (is_python(cmdline) and "--multiprocessing-fork" in cmdline
            and any(a.startswith(SPAWN_MAIN) for a in cmdline))


def is_mp_helper(cmdline: tuple[str, ...]) -> bool:
    return is_python(cmdline) and any(h in a for a in cmdline[1:4] for h in MP_HELPERS)


def is_lightning_child(env: dict[str, str]) -> bool:
    """Started by Lightning's _SubprocessScriptLauncher: LOCAL_RANK >= 1 and the
    variables it sets beside it, without RANK (torchrun sets RANK and GROUP_RANK,
    never NODE_RANK)."""
    return ("RANK" not in env and number(env.get("LOCAL_RANK")) >= 1
            and number(env.get("NODE_RANK")) >= 0 and "MASTER_PORT" in env
            and number(env.get("WORLD_SIZE")) >= 1)


def env_rank(env: dict[str, str]) -> tuple[int, int, str]:
    """(rank, world size, source) from a launcher's variables in the exec-time
    environment, (-1, -1, "") if none says it."""
    for rank_var, world_var, source in (
            ("RANK", "WORLD_SIZE", "RANK"),
            ("SLURM_PROCID", "SLURM_NTASKS", "SLURM_PROCID"),
            ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_RANK"),
            ("PMI_RANK", "PMI_SIZE", "PMI_RANK")):
        rank = number(env.get(rank_var))
        if rank >= 0:
            world = number(env.get(world_var))
            if world < 0 and rank_var != "RANK":
                world = number(env.get("WORLD_SIZE"))
            return rank, world, source
    return -1, -1, ""


def says_rank(env: dict[str, str]) -> bool:
    """The environment names a rank by any launcher's convention."""
    return env_rank(env)[0] >= 0 or is_lightning_child(env)


def local_rank_arg(cmdline: tuple[str, ...]) -> int:
    """`--local_rank=i` / `--local-rank i` (DeepSpeed's launcher, torch.distributed.launch)."""
    for i, arg in enumerate(cmdline[1:], 1):
        name, eq, value = arg.partition("=")
        if name in ("--local_rank", "--local-rank"):
            return number(value if eq else (cmdline[i + 1] if i + 1 < len(cmdline) else None))
    return -1


def group_key(env: dict[str, str]) -> tuple | None:
    """What the ranks of one job started by hand or by a scheduler share in their
    environment: the SLURM step, or the master's address and the world size."""
    if "SLURM_JOB_ID" in env and "SLURM_PROCID" in env:
        return ("slurm", env["SLURM_JOB_ID"], env.get("SLURM_STEP_ID", ""))
    key = (env.get("MASTER_ADDR"), env.get("MASTER_PORT"), env.get("WORLD_SIZE"))
    return None if None in key else ("env",) + key
