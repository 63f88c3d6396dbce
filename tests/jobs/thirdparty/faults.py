"""The env-driven fault knob the third-party jobs share (README.md). Kept apart
so the scripts read like their tutorials; imports nothing of ddpwatch or torch."""
import os
import signal
import sys
import threading
import time

STEPS = int(os.environ.get("DDPWATCH_TEST_STEPS", "0"))  # 0: until killed


def _faults(kind):
    for spec in filter(None, os.environ.get("DDPWATCH_TEST_FAULT", "").split(",")):
        parts = spec.split(":")
        if parts[0] == kind:
            yield [int(p) for p in parts[1:]]


def maybe_hang(rank, step):
    """hang:RANK:STEP - sleep for ever outside any collective. Says once that the
    rank trains (its first step done): a harness that injects faults waits for
    it (benchmarks/faultbench/jobs.py TRAINS), as a job still in DDP's set-up
    is starting, not training."""
    if step == 1:
        print(f"thirdparty: rank={rank} step={step} trains", flush=True)
    if _pending:
        _act(_pending.pop())
    for fault_rank, fault_step in _faults("hang"):
        if rank == fault_rank and step == fault_step:
            print(f"thirdparty: rank {rank} hangs at step {step}", flush=True)
            while True:
                time.sleep(3600)


def maybe_desync(rank, step):
    """desync:RANK:STEP - at that step, that rank calls a broadcast its peers never
    call; they go on to the step's backward and wait in DDP's gradient all-reduce.
    Gloo keys each algorithm's messages by its own slot, so neither side receives
    the other's: both wait until Gloo's timeout (30 min), a desync."""
    for fault_rank, fault_step in _faults("desync"):
        if rank == fault_rank and step == fault_step:
            import torch
            import torch.distributed as dist
            print(f"thirdparty: rank {rank} desyncs at step {step}", flush=True)
            dist.broadcast(torch.zeros(1), src=0)


def autocast_forward(model):
    """DDPWATCH_TEST_AUTOCAST=DEVICE - the model's forward under
    torch.autocast(DEVICE, dtype=torch.bfloat16), as a decorator (its frame is on
    the stack during forward). `cuda` on a CPU job is a bf16 flag with no effect:
    autocast for another device leaves the CPU ops in float32."""
    device = os.environ.get("DDPWATCH_TEST_AUTOCAST")
    if device:
        import torch
        forward = model.forward
        work = torch.randn(192, 192)

        def heavier(*args, **kwargs):
            # Most of the step inside the forward (a few ms of float32 matmuls: on
            # the CPU, autocast for another device leaves them as they are), so
            # that a stack sample catches autocast's frame: the toy model's own
            # forward is a sliver of its step, and the test waited up to 150 s
            # for one (tests/thirdparty/test_thirdparty_stacks.py).
            x = work
            for _ in range(8):
                x = torch.tanh(x @ work)
            return forward(*args, **kwargs)
        model.forward = torch.autocast(device, dtype=torch.bfloat16)(heavier)
    return model


def extra_samples(rank):
    """data:RANK - one sample more for that rank (a node with other data)."""
    return sum(1 for (fault_rank,) in _faults("data") if fault_rank == rank)


def uneven_ranks():
    """uneven:RANK - that rank's dataset has half the samples (uneven shards): it
    runs out of batches mid-epoch, leaves the training loop and meets its peers in
    an epoch-end collective while they wait in the next step's."""
    return {fault_rank for (fault_rank,) in _faults("uneven")}


def announce(rank, local_rank, world_size):
    # print() writes the line and its newline apart, so the other rank's line, on
    # the same stdout, can fall between: readers search the output for it
    # (benchmarks/soak.py ANNOUNCE). One write instead held Ray's second worker's
    # line back in Ray's log deduplication until the job ended.
    print(f"thirdparty: rank={rank} local_rank={local_rank} world={world_size} "
          f"pid={os.getpid()}", flush=True)


# DDPWATCH_TEST_ON_SIGUSR2=ACTION: a fault that happens when the rank is sent SIGUSR2,
# so that a harness outside the job picks the moment (benchmarks/faults.py) and the
# script stays as its tutorial wrote it. The action runs at the next step's start
# (maybe_hang, outside any collective); ACTION-now runs it in the handler itself,
# which Python calls in the main thread at its next bytecode: wherever the loop is,
# inside backward() included. The actions follow NVRx's fault injector
# (nvidia-resiliency-ext, fault_injector.py):
#   raise        an exception in the loop (the rank exits with a traceback)
#   async-raise  a thread raises it in the main thread (PyThreadState_SetAsyncExc)
#   gil          a C call that holds the GIL for ever (libc pause() through ctypes.PyDLL)
#   sleep        a sleep for ever outside any collective
#   spin         a busy loop for ever at a place no step went before
ON_SIGNAL = os.environ.get("DDPWATCH_TEST_ON_SIGUSR2", "")
ACTION = ON_SIGNAL[:-len("-now")] if ON_SIGNAL.endswith("-now") else ON_SIGNAL
_pending = []  # an action the signal asked for, done at the next step's start


class InjectedFault(RuntimeError):
    pass


def _say(action):
    print(f"thirdparty: fault {ON_SIGNAL} pid={os.getpid()} at={time.time():.3f}", flush=True)


def _spin_for_ever():
    x = 0
    while True:
        x = (x * 31 + 7) % 1000003


def _on_signal(signum, frame):
    if ACTION == ON_SIGNAL:
        _pending.append(ACTION)
    else:
        _act(ACTION)


def _act(action):
    _say(action)
    if action == "raise":
        raise InjectedFault("injected: an exception in the training loop")
    if action == "async-raise":
        import ctypes
        main = threading.main_thread().ident

        def throw():
            ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(main),
                                                       ctypes.py_object(InjectedFault))
        threading.Thread(target=throw, name="injector").start()
        return
    if action == "gil":
        import ctypes
        ctypes.PyDLL(None).pause()  # PyDLL keeps the GIL across the call
    if action == "sleep":
        while True:
            time.sleep(3600)
    if action == "spin":
        _spin_for_ever()


if ON_SIGNAL and threading.current_thread() is threading.main_thread():
    if ACTION not in ("raise", "async-raise", "gil", "sleep", "spin"):
        sys.exit(f"{__file__}: unknown DDPWATCH_TEST_ON_SIGUSR2={ON_SIGNAL!r}")
    signal.signal(signal.SIGUSR2, _on_signal)
