"""What a rank's main thread is doing, from a py-spy dump. Pure.

Signatures come from real dumps saved in tests/fixtures/pyspy (see its README):
a rank blocked in a collective idles in torch/distributed/distributed_c10d.py;
a DDP rank whose peers never arrive idles in autograd's _engine_run_backward
(the reducer waits for the bucket all-reduce inside the engine); rendezvous
idles in rendezvous.py / TCPStore; time.sleep and input idle in user frames.
"""
from __future__ import annotations

import re

from ..heartbeat.layout import TORCH_COLLECTIVES
from .memo import per_dump

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


# Threads torch starts beside the training loop: their torch frames are no training.
HELPER_FILES = ("torch/utils/data/_utils/pin_memory.py", "torch/utils/data/_utils/worker.py",
                "torch/_inductor/compile_worker/", "torch/utils/_thread")


def _trains(thread) -> bool:
    """A thread in torch's Python frames or a native collective (not one of torch's
    helper threads), or in the user's own code."""
    files = [_file(f) for f in thread.frames if f.line]
    if any(h in f for f in files for h in HELPER_FILES):
        return False
    return (any("/torch/" in f or not is_library_file(f) for f in files)
            or any(any(sig in f.name for sig in NATIVE_COLLECTIVE) for f in thread.frames))


@per_dump
def training_thread(dump):
    """The thread that trains, whose stack is the rank's evidence. Usually the main
    thread. Ray Train runs the training function in a thread of its own
    ("TrainingThread") while the main thread idles in Ray's event loop, and other
    worker pools do the same: a main thread wholly in library code (no frame of
    torch's, none of the user's) is no evidence of anything while another thread
    is in torch or the user's code; that thread is taken (the first in a
    collective, else the first). tests/unit/judge/test_stackmatch_unit.py"""
    main = main_thread(dump)
    if main is None or _trains(main):
        return main
    others = [t for t in dump.threads if t is not main and t.frames and _trains(t)]
    if not others:
        return main
    return next((t for t in others if any(
        "torch/distributed/" in _file(f) for f in t.frames if f.line)), others[0])


def _file(frame) -> str:
    return frame.filename.replace("\\", "/")


@per_dump
def classify_stack(dump) -> str:
    """collective | ddp_backward | rendezvous | compile | agent | idle_user | active | unknown"""
    thread = training_thread(dump)
    if thread is None or not thread.frames:
        return "unknown"
    frames = thread.frames
    files = [_file(f) for f in frames]
    names = [f.name for f in frames]
    # compiling: a compiler frame at work, not a compiler module being imported
    # (DDP's constructor and the first optimizer step import torch._dynamo)
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
    thread = training_thread(dump)
    if thread is None:
        return ""
    parts = []
    python = [f for f in thread.frames if f.line]  # native libc frames say little
    for f in (python or list(thread.frames))[:depth]:
        where = f"{f.short_filename.split('/')[-1]}:{f.line}" if f.line else (f.module or "native")
        parts.append(f"{f.name} ({where})")
    return " <- ".join(parts)


# --- where a rank waits, for a person: the collective and the user's line ------------
# Library code: the interpreter's own modules and everything installed beside them
# (site-packages, Debian's dist-packages), and code without a file (<string>).
_LIBRARY = re.compile(r"/lib/python[\d.]*/|/(site|dist)-packages/")
DDP_GRADIENT_SYNC = "DDP's gradient all-reduce"


def is_library(frame) -> bool:
    return is_library_file(_file(frame))


def is_library_file(name: str) -> bool:
    return name.startswith("<") or bool(_LIBRARY.search(name))


def _where(frame) -> str:
    return f"{frame.short_filename or frame.filename}:{frame.line} ({frame.name})"


@per_dump
def call_site(dump) -> str | None:
    """What a rank waiting in a collective waits in, and where its own code called it:
    "broadcast at faults.py:35 (maybe_desync) <- spawn_ddp.py:63 (demo_basic)", or for
    DDP's bucket all-reduce, reached from backward(), "DDP's gradient all-reduce in
    backward at spawn_ddp.py:66 (demo_basic)". A library that called torch on the
    user's behalf (Lightning's loop) is named too: its line is where the path went.
    None when the rank does not wait in a collective."""
    kind = classify_stack(dump)
    if kind not in ("collective", "ddp_backward"):
        return None
    frames = [f for f in training_thread(dump).frames if f.line]
    if kind == "ddp_backward":
        what = f"{DDP_GRADIENT_SYNC} in backward"
    else:
        top = next((f for f in frames if "torch/distributed/" in _file(f)
                    and f.name.split(".")[-1] in COLLECTIVE_FUNCS), None)
        what = top.name.split(".")[-1] if top else "a collective"
    user = [f for f in frames if not is_library(f)][:2]
    caller = next((f for f in frames if "/torch/" not in _file(f)), None)
    site = what
    if caller is not None and (not user or caller is not user[0]):
        site += f" via {_where(caller)}"
    if user:
        site += " at " + " <- ".join(_where(f) for f in user)
    return site


# --- bf16 compute seen in the stack ---------------------------------------------------
# Python frames of mixed-precision code that, on a CPU, computes in bfloat16 under
# torch.autocast and nothing else (the library refuses or replaces float16 there):
# * Lightning's MixedPrecision plugin: its optimizer_step runs the whole step (the
#   closure: forward and backward) and Lightning turns "16-mixed" into "bf16-mixed"
#   on a CPU accelerator; "32-true" uses the base Precision plugin (precision.py).
# * accelerate's mixed_precision="bf16": prepare() wraps the model's forward in
#   convert_outputs_to_fp32(torch.autocast(...)) only when it computes in bf16
#   (fp16 on a CPU raises), so both frames are on the stack during forward.
# A bare torch.autocast decorator (torch/amp/autocast_mode.py decorate_autocast) is
# no evidence: its device may not be the CPU (autocast("cuda") on a CPU job is a
# bf16 flag with no effect), its dtype float16, or it may be disabled; nor is a
# `with torch.autocast(...)` block, which leaves no frame at all. Those are seen
# only in native frames (a dump with --native): bf16 kernels of libtorch_cpu.
AMP_BF16_FILES = {
    "lightning/pytorch/plugins/precision/amp.py": "Lightning's mixed-precision plugin",
    "pytorch_lightning/plugins/precision/amp.py": "Lightning's mixed-precision plugin",
    "lightning/fabric/plugins/precision/amp.py": "Lightning Fabric's mixed-precision plugin",
}
ACCELERATE_WRAPPER = "accelerate/utils/operations.py"
AUTOCAST_FILE = "torch/amp/autocast_mode.py"


@per_dump
def bf16_evidence(dump) -> tuple[str, bool] | None:
    """(what in this dump says the rank computes in bf16, whether that says the CPU
    does it) or None. Python frames say a library's bf16 autocast is on, not which
    device it is for; a native bf16 kernel of libtorch_cpu says both."""
    thread = training_thread(dump)
    if thread is None:
        return None
    for f in thread.frames:
        if not f.line and "BFloat16" in f.name and "libtorch_cpu" in (f.module or f.filename):
            return f"a bf16 CPU kernel in its native stack ({f.name[:100]})", True
    files = [_file(f) for f in thread.frames]
    for f, name in zip(thread.frames, files):
        for suffix, what in AMP_BF16_FILES.items():
            if name.endswith(suffix):
                return f"{what} ({f.name} at {f.short_filename}:{f.line})", False
    if any(n.endswith(ACCELERATE_WRAPPER) for n in files) and any(
            n.endswith(AUTOCAST_FILE) for n in files):
        return "accelerate's bf16 autocast around the model's forward", False
    return None


# --- where in the training loop, for a person: mid-epoch or out of the loop ----------
# Lightning runs each epoch's batches in its epoch loop, called from the fit loop;
# its epoch-end hooks (ModelCheckpoint.on_train_epoch_end) run from the fit loop
# outside it. A rank that ran out of batches first (uneven data) waits there, in a
# collective of the epoch's end, while its peers wait in the next step's, mid-epoch
# (tests/fixtures/snapshots/thirdparty_lightning_uneven: rank 1 in
# ModelCheckpoint's reduce_boolean_decision, rank 0 in the step's SIGTERM broadcast).
EPOCH_LOOP_FILES = ("lightning/pytorch/loops/training_epoch_loop.py",
                    "pytorch_lightning/loops/training_epoch_loop.py")
FIT_LOOP_FILES = ("lightning/pytorch/loops/fit_loop.py", "pytorch_lightning/loops/fit_loop.py")


def _named(frame) -> str:
    return f"{frame.name} ({frame.short_filename.split('/')[-1]}:{frame.line})"


@per_dump
def loop_position(dump) -> tuple[str, str] | None:
    """("in_epoch", where) for a main thread inside a known epoch loop (the frame its
    run() called); ("left_epoch", where) for one in the fit loop outside any epoch
    (its outermost hook there and the fit loop's line); None when no known loop is
    on the stack (a plain script's loop is the user's own)."""
    thread = training_thread(dump)
    if thread is None:
        return None
    frames = [f for f in thread.frames if f.line]
    epoch = [f for f in frames if _file(f).endswith(EPOCH_LOOP_FILES)]
    if epoch:  # the step's place: the frame the loop's run() called (its advance)
        return "in_epoch", _named(epoch[-2] if len(epoch) >= 2 else epoch[0])
    fit = next((i for i, f in enumerate(frames) if _file(f).endswith(FIT_LOOP_FILES)), None)
    if fit is None:
        return None
    hooks = [f for f in frames[:fit] if f.name.split(".")[-1].startswith("on_")]
    where = " <- ".join(_named(f) for f in hooks[-1:] + [frames[fit]])
    return "left_epoch", where
