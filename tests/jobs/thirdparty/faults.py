"""The env-driven fault knob the third-party jobs share (README.md). Kept apart
so the scripts read like their tutorials; imports nothing of ddpwatch or torch."""
import os
import time

STEPS = int(os.environ.get("DDPWATCH_TEST_STEPS", "0"))  # 0: until killed


def _faults(kind):
    for spec in filter(None, os.environ.get("DDPWATCH_TEST_FAULT", "").split(",")):
        parts = spec.split(":")
        if parts[0] == kind:
            yield [int(p) for p in parts[1:]]


def maybe_hang(rank, step):
    """hang:RANK:STEP - sleep for ever outside any collective."""
    for fault_rank, fault_step in _faults("hang"):
        if rank == fault_rank and step == fault_step:
            print(f"thirdparty: rank {rank} hangs at step {step}", flush=True)
            while True:
                time.sleep(3600)


def extra_samples(rank):
    """data:RANK - one sample more for that rank (a node with other data)."""
    return sum(1 for (fault_rank,) in _faults("data") if fault_rank == rank)


def announce(rank, local_rank, world_size):
    print(f"thirdparty: rank={rank} local_rank={local_rank} world={world_size} "
          f"pid={os.getpid()}", flush=True)
