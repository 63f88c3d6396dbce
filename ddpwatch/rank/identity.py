"""Who a rank is, from what its launcher knows and the script may never say.

Automatic heartbeats (ddpwatch exec, DDPWATCH_AUTO=1) open a rank's record when
its script calls init_process_group, before the rendezvous has said anything.
What is known then, best first (docs/design.md "Launch topologies"; the
variables are the table of launchers', ddpwatch/launchers.py, which discovery
reads too: docs/architecture.md "Which processes are ranks"):

* init_process_group's own `rank` / `world_size` arguments: what the group will
  use (the mp.spawn tutorial and Lightning pass them);
* torch's RANK / LOCAL_RANK / WORLD_SIZE (launchers.TORCH): torchrun, accelerate
  (torchrun inside), DeepSpeed, and env:// rendezvous by hand;
* the index torch.multiprocessing.spawn gave this child (`_wrap(fn, i, ...)`): its
  local rank, and its rank where no node-level launcher says the job spans nodes;
* the other launchers' variables, in the table's order: OMPI_COMM_WORLD_*
  (mpirun), PMI_RANK / PMI_SIZE / MPI_LOCALRANKID (MPICH, Intel MPI), then
  SLURM_PROCID / SLURM_LOCALID / SLURM_NTASKS (srun; an mpirun inside a SLURM
  job passes its step's on to every rank);
* Lightning's NODE_RANK / LOCAL_RANK / WORLD_SIZE: its rank 0 is the user's own
  process, which sets them after exec and re-executes the script for the other
  ranks with LOCAL_RANK=i; "the main process has LOCAL_RANK=0" where unset.

Once init_process_group returned, torch.distributed.get_rank() and
get_world_size() replace these guesses (instrumentation._learn_group_identity).
Pure: the caller hands in the environment. Imports no torch.

The environment is the rank's own here, not another user's claim: numbers are
read as torch's env:// reads them (`int()`), where discovery reads another
process's strictly (launchers.number).
"""
from __future__ import annotations

from collections.abc import Mapping

from ..launchers import ENVS, LIGHTNING, TORCH

UNKNOWN = -1
# The launchers' own variables beside torch's, in the table's order: mpirun's, srun's
# (Lightning's are torch's names and a NODE_RANK: no rank of their own)
_OTHERS = tuple(e for e in ENVS if e.rank and e != TORCH)


def _int(value) -> int:
    try:
        number = int(str(value).strip())
    except (TypeError, ValueError):
        return UNKNOWN
    return number if number >= 0 else UNKNOWN


def _first(env: Mapping[str, str], *names: str) -> int:
    for name in names:
        if name in env:
            number = _int(env[name])
            if number != UNKNOWN:
                return number
    return UNKNOWN


def launcher_identity(env: Mapping[str, str], spawn_index: int | None = None,
                      init_rank: int = UNKNOWN, init_world_size: int = UNKNOWN,
                      lightning: bool = False) -> dict[str, int]:
    """{rank, local_rank, world_size}, each -1 where nothing says.

    `lightning`: a Lightning module is loaded in this process (its convention
    that the process without LOCAL_RANK is local rank 0 applies)."""
    spawned = spawn_index is not None and spawn_index >= 0
    scheduler_world = _first(env, *(e.world_size for e in _OTHERS))
    local = _first(env, TORCH.local_rank)
    if local == UNKNOWN and spawned:
        local = spawn_index
    if local == UNKNOWN:
        local = _first(env, *(e.local_rank for e in _OTHERS if e.local_rank))
    if local == UNKNOWN and lightning:
        local = 0  # Lightning: "the main process which launched the others has LOCAL_RANK=0"

    rank = _int(init_rank)
    if rank == UNKNOWN:
        rank = _first(env, TORCH.rank)
    if rank == UNKNOWN and spawned:
        # One task per node spawning its ranks (srun ... python spawn_script.py):
        # the scheduler's task index is the node's, so the global rank is unknown
        # until init_process_group says.
        if scheduler_world in (UNKNOWN, 1):
            rank = spawn_index
    elif rank == UNKNOWN:
        rank = _first(env, *(e.rank for e in _OTHERS))
    if rank == UNKNOWN and lightning and local != UNKNOWN and _first(
            env, LIGHTNING.node_rank) in (UNKNOWN, 0):
        rank = local  # one node: Lightning's global rank is its local rank

    world = _int(init_world_size)
    if world == UNKNOWN:
        world = _first(env, TORCH.world_size)
    if world == UNKNOWN and not spawned:
        world = scheduler_world
    return {"rank": rank, "local_rank": local, "world_size": world}
