"""What a rank's main thread is doing, from a py-spy dump. Pure.

Signatures come from real dumps saved in tests/fixtures/pyspy (see its README):
a rank blocked in a collective idles in torch/distributed/distributed_c10d.py;
a DDP rank whose peers never arrive idles in autograd's _engine_run_backward
(the reducer waits for the bucket all-reduce inside the engine); rendezvous
idles in rendezvous.py / TCPStore; time.sleep and input idle in user frames.
"""
from __future__ import annotations

from ..heartbeat.layout import TORCH_COLLECTIVES

# Functions a rank waits in: the collectives the record knows (isend/irecv return
# at once: a rank is not waiting in them), and those that wait without a record op.
COLLECTIVE_FUNCS = frozenset(TORCH_COLLECTIVES) - {"isend", "irecv"} | frozenset((
    "all_gather_object", "broadcast_object_list", "gather_object", "scatter_object_list",
    "wait", "all_gather_single", "reduce_scatter_single",
    # DDP's constructor synchronises with its peers (shapes, then parameters)
    "_verify_param_shape_across_processes", "_sync_module_states", "_sync_params_and_buffers"))
# Files whose frames appear only while torch.compile compiles; a compiled model's
# every step runs under torch/_dynamo/eval_frame.py and inductor's output code,
# so "any _dynamo/_inductor frame" would call a steady compiled job warming up.
COMPILE_FILES = ("torch/_dynamo/convert_frame.py", "torch/_dynamo/symbolic_convert.py",
                 "torch/_inductor/compile_fx.py", "torch/_inductor/codecache.py",
                 "torch/_inductor/async_compile.py", "torch/_inductor/graph.py",
                 "torch/_inductor/scheduler.py", "torch/_inductor/lowering.py",
                 "torch/_functorch/aot_autograd.py", "torch/_dynamo/output_graph.py")
RENDEZVOUS_FILES = ("rendezvous.py", "dynamic_rendezvous.py", "c10d_rendezvous_backend.py")
RENDEZVOUS_FUNCS = ("init_process_group", "_create_c10d_store", "_store_based_barrier",
                    "TCPStore", "_rendezvous", "next_rendezvous")
NATIVE_COLLECTIVE = ("c10d::Work::wait", "ProcessGroupGloo", "gloo::", "Reducer::finalize_backward",
                     "c10d::", "ncclKernel")


def main_thread(dump):
    """The main thread: its Linux tid is the pid (py-spy does not always know the
    thread's Python name), else the one named MainThread, else the first."""
    threads = dump.threads
    return next((t for t in threads if t.os_thread_id == dump.pid),
                next((t for t in threads if t.name == "MainThread"),
                     threads[0] if threads else None))


def _file(frame) -> str:
    return frame.filename.replace("\\", "/")


def classify_stack(dump) -> str:
    """collective | ddp_backward | rendezvous | compile | agent | idle_user | active | unknown"""
    thread = main_thread(dump)
    if thread is None or not thread.frames:
        return "unknown"
    frames = thread.frames
    files = [_file(f) for f in frames]
    names = [f.name for f in frames]
    # compiling: a compiler frame at work, not a compiler module being imported
    # (DDP's constructor and the first optimizer step import torch._dynamo: issue 13)
    if any(f.endswith(COMPILE_FILES) and n != "<module>" for f, n in zip(files, names)):
        return "compile"
    if any(f.endswith(RENDEZVOUS_FILES) for f in files) or any(
            n.split(".")[-1] in RENDEZVOUS_FUNCS for n in names):
        return "rendezvous"
    if any(n.endswith("_invoke_run") and "elastic/agent" in f for n, f in zip(names, files)):
        return "agent"  # a torchrun agent monitoring its workers
    python_frames = [(n, f) for n, f in zip(names, files) if f.endswith(".py")]
    if python_frames:
        name, file = python_frames[0]
        if "torch/distributed/" in file and name.split(".")[-1] in COLLECTIVE_FUNCS:
            return "collective"
        # our collective wrappers (the older path: snapshots saved by earlier versions)
        if file.endswith(("ddpwatch/rank/instrumentation.py", "ddpwatch/instrumentation.py")):
            return "collective"
    if any(any(sig in n for sig in NATIVE_COLLECTIVE) for n in names):
        return "collective"
    if not thread.active and "_engine_run_backward" in names[:2]:
        return "ddp_backward"
    return "active" if thread.active else "idle_user"


def describe_top(dump, depth: int = 3) -> str:
    thread = main_thread(dump)
    if thread is None:
        return ""
    parts = []
    python = [f for f in thread.frames if f.line]  # native libc frames say little
    for f in (python or list(thread.frames))[:depth]:
        where = f"{f.short_filename.split('/')[-1]}:{f.line}" if f.line else (f.module or "native")
        parts.append(f"{f.name} ({where})")
    return " <- ".join(parts)
