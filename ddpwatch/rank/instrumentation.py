"""`ddpwatch.instrument()`: heartbeats from inside a training process (imports torch).

What it patches, and why each:
* every public torch.distributed collective and point-to-point op, in both
  `torch.distributed` and `torch.distributed.distributed_c10d` (scripts call the
  former, torch's own helpers such as `all_gather_object` call the latter);
* `init_process_group`, so the record says RENDEZVOUS while peers are awaited and
  learns rank, world size and backend afterwards;
* DistributedDataParallel: DDP's gradient all-reduces run in C++ and never pass
  through the Python functions, so at a model's first forward (unless the user
  registered a hook of their own, whose inner collectives we then see anyway) we
  register a comm hook that does what DDP's default does — divide by the world
  size and all-reduce the bucket — and writes a heartbeat with the bucket's bytes;
* the optimizer step post-hook, so scripts that never call `ddpwatch.step()`
  still report steps.

Async work: completion time comes from the Work's future, or where a backend's
Work has none, from the caller's wait (asyncwork.py). The future's callbacks
run on the backend's thread, which takes care at exit (callbacks.py).

The wrappers and the record writer have a C implementation (ddpwatch/heartbeat/_hotpath.c,
about 0.1 us per call instead of 1.8 us) used when it was built; the Python
code here and in heartbeat/writer.py is the reference it mirrors and the
fallback (DDPWATCH_PURE_PYTHON=1 forces it).

Nothing here may raise into training: set-up problems degrade to no heartbeats.
"""
from __future__ import annotations

import atexit
import functools
import operator
import struct
import threading
import warnings

import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d
from torch.optim.optimizer import register_optimizer_step_post_hook

from . import asyncwork, callbacks
from .asyncwork import call_quietly as _call_quietly, when_done
from ..heartbeat import OP_CODE, Phase, open_writer
from ..heartbeat.layout import TORCH_COLLECTIVES
try:
    from ..heartbeat import _hotpath
except ImportError:  # not built (no compiler at install): the Python wrappers
    _hotpath = None
from ..heartbeat.writer import NullWriter, default_identity

IDENTITY_FIELDS = tuple(default_identity())

_COLLECTIVES = TORCH_COLLECTIVES  # the functions wrapped (heartbeat/layout.py)

_state = threading.local()
_writer = NullWriter()
_installed = False
_explicit_steps = False
_explicit_dtype = False
_first_optimizer = None
_install_lock = threading.Lock()


def writer():
    return _writer


def installed() -> bool:
    """instrument() ran in this process (by the script or automatically, auto.py)."""
    return _installed


def instrument(model=None, directory: str | None = None, auto_steps: bool = True, **identity):
    """Install the patches once (later calls only update identity / hook `model`).

    auto_steps: count optimizer steps as training steps; scripts that call
    ddpwatch.step() themselves pass False (else their first step counts twice).
    """
    global _writer, _installed, _explicit_dtype, _explicit_steps
    _explicit_steps = _explicit_steps or not auto_steps
    unknown = set(identity) - set(IDENTITY_FIELDS)
    if unknown:  # never raise into training: say so and go on without them
        warnings.warn(f"ddpwatch: ignoring unknown identity field(s) {sorted(unknown)}",
                      RuntimeWarning, stacklevel=3)
        identity = {k: v for k, v in identity.items() if k not in unknown}
    with _install_lock:
        if not _installed:
            identity.setdefault("torch_version", torch.__version__.split("+")[0])
            if identity.get("compute_dtype"):
                identity["compute_dtype"] = _dtype_name(identity["compute_dtype"])
            _writer = open_writer(directory, **identity)
            try:
                _patch_distributed()
                _patch_ddp()
                register_optimizer_step_post_hook(_on_optimizer_step)
            except Exception as err:  # a torch without what we patch: train unwatched
                warnings.warn(f"ddpwatch: instrumentation incomplete: {err!r}",
                              RuntimeWarning, stacklevel=2)
            atexit.register(_writer.close)
            atexit.register(callbacks.wait_for_release)  # runs first: last in
            _installed = True
            if dist.is_available() and dist.is_initialized():
                _call_quietly(_learn_group_identity)
        elif identity:
            set_identity(**identity)
        _explicit_dtype = _explicit_dtype or bool(identity.get("compute_dtype"))
    if model is not None:
        _hook_ddp(model)
    return _writer


def step(tokens: int = 0) -> None:
    global _explicit_steps
    _explicit_steps = True
    try:
        tokens = operator.index(tokens)
    except TypeError:  # ddpwatch.step(tokens=1.5): never raise into training
        warnings.warn(f"ddpwatch.step: tokens must be an int, not {type(tokens).__name__}; "
                      f"counted as 0", RuntimeWarning, stacklevel=3)
        tokens = 0
    _writer.step(tokens)
    asyncwork.prune()


def set_identity(**fields) -> None:
    global _explicit_dtype
    if fields.get("compute_dtype"):
        _explicit_dtype = True
    try:
        _writer.set_identity(**{k: (_dtype_name(v) if k == "compute_dtype" else v)
                                for k, v in fields.items()})
    except (TypeError, ValueError, struct.error) as err:  # never raise into training
        warnings.warn(f"ddpwatch: identity not updated: {err}", RuntimeWarning, stacklevel=3)


# --- collectives ---------------------------------------------------------------
_Tensor = torch.Tensor


def _payload_bytes(args, kwargs) -> int:
    """Bytes of the first tensor argument (or list of tensors)."""
    if args and isinstance(args[0], _Tensor):  # all_reduce(t), broadcast(t, src)...
        return args[0].nbytes
    for value in (*args[:2], *kwargs.values()):
        if isinstance(value, _Tensor):
            return value.nbytes
        if isinstance(value, (list, tuple)) and value and isinstance(value[0], _Tensor):
            return sum(t.nbytes for t in value)
    return 0


def _wrap(name: str, original):
    """`original` with entry and exit heartbeats: the C Wrapper when the writer
    has the C core (about a tenth of the CPU per call), else the Python one
    below, which is the reference the C code mirrors."""
    op_code = OP_CODE[name]
    core = getattr(_writer, "core", None)
    if _hotpath is not None and type(core) is _hotpath.Core:
        wrapper = _hotpath.Wrapper(original, core, op_code, _Tensor, _payload_bytes,
                                   _on_completion)
        return functools.update_wrapper(wrapper, original)
    state = _state

    @functools.wraps(original)
    def wrapper(*args, **kwargs):
        if state.__dict__.get("depth"):  # a collective calling another: count the outer
            return original(*args, **kwargs)
        writer = _writer
        try:
            nbytes = _payload_bytes(args, kwargs)
        except Exception:  # the byte count is only evidence: never raise for it
            nbytes = 0
        token = writer.enter(op_code, nbytes)
        state.depth = True
        try:
            result = original(*args, **kwargs)
        except BaseException:
            writer.exit(token)
            raise
        finally:
            state.depth = False
        if result is None or token is None:
            writer.exit(token)
            return result
        try:
            return _on_completion(result, token)
        except Exception:  # it raises only before attaching anything: exit once, here
            writer.exit(token)
            return result

    wrapper.__ddpwatch_original__ = original
    return wrapper


def _on_completion(result, token):
    """Record completion of async work (a Work, or a list of them) without waiting."""
    return when_done(result, lambda: _writer.exit(token))


def _patch_distributed():
    for name in _COLLECTIVES:
        original = getattr(c10d, name, None)
        if original is None or hasattr(original, "__ddpwatch_original__"):
            continue
        wrapped = _wrap(name, original)
        setattr(c10d, name, wrapped)
        if getattr(dist, name, None) is original:
            setattr(dist, name, wrapped)
    original_init = c10d.init_process_group
    if not hasattr(original_init, "__ddpwatch_original__"):
        @functools.wraps(original_init)
        def init_process_group(*args, **kwargs):
            _writer.set_phase(Phase.RENDEZVOUS)
            try:
                return original_init(*args, **kwargs)
            finally:
                _writer.set_phase(Phase.OUTSIDE)
                _call_quietly(_learn_group_identity)
        init_process_group.__ddpwatch_original__ = original_init
        c10d.init_process_group = init_process_group
        dist.init_process_group = init_process_group


def _learn_group_identity():
    if not dist.is_initialized():
        return
    backend = str(dist.get_backend())
    fields = dict(rank=dist.get_rank(), world_size=dist.get_world_size(), backend=backend)
    if not _writer.identity().get("device_type"):
        fields["device_type"] = "cuda" if "nccl" in backend else "cpu"
    _writer.set_identity(**fields)


# --- DDP -----------------------------------------------------------------------
def _patch_ddp():
    from torch.nn.parallel import DistributedDataParallel as DDP
    if hasattr(DDP.forward, "__ddpwatch_original__"):
        return
    original_forward = DDP.forward
    original_register = DDP.register_comm_hook
    original_builtin = DDP._register_builtin_comm_hook

    @functools.wraps(original_forward)
    def forward(self, *args, **kwargs):
        if not self.__dict__.get("_ddpwatch_seen"):
            _call_quietly(lambda: _first_forward(self))
        elif not _explicit_dtype:
            _track_dtype(self)
        return original_forward(self, *args, **kwargs)

    @functools.wraps(original_register)
    def register_comm_hook(self, state, hook):
        # The user's hook replaces ours; its inner collectives are seen anyway.
        self.__dict__["_ddpwatch_hooked"] = True
        return original_register(self, state, hook)

    @functools.wraps(original_builtin)
    def register_builtin(self, comm_hook_type):
        self.__dict__["_ddpwatch_hooked"] = True
        return original_builtin(self, comm_hook_type)

    forward.__ddpwatch_original__ = original_forward
    DDP.forward = forward
    _patch_ddp_setup_collectives(DDP)
    DDP.register_comm_hook = register_comm_hook
    DDP._register_builtin_comm_hook = register_builtin


_REBUILD_OP = OP_CODE["ddp_rebuild_buckets"]
_SYNC_BUFFERS_OP = OP_CODE["ddp_sync_buffers"]


def _patch_ddp_setup_collectives(DDP):
    """DDP's own collectives outside the gradients' all-reduce, made by its C++
    reducer and not through torch.distributed's Python functions: the broadcast
    of the rebuilt bucket order in the second iteration's forward (once a run),
    and the buffers' broadcast before each forward of a model with buffers. A
    rank whose peer stopped right after step 0's all-reduce waits in the first
    for ever; unrecorded, its record said "outside, step 1" and it read as
    warming up, not the stopped peer's victim (tests/instrumented/test_autoinstrument.py
    test_under_exec_records_and_a_stopped_rank). Each is recorded as one
    collective of the record while it runs."""
    original_pre, original_sync = DDP._pre_forward, getattr(DDP, "_sync_buffers", None)

    def _pre_forward(self, *args, **kwargs):
        # the bucket order is rebuilt once, in the first forward with gradients
        # after a backward: never in the first forward, in each later one until
        # done, and never with find_unused_parameters unless the graph is static
        # (the reducer's should_rebuild_buckets)
        d = self.__dict__
        first, d["_ddpwatch_pre_seen"] = not d.get("_ddpwatch_pre_seen"), True
        if (first or d.get("_has_rebuilt_buckets", True) or not torch.is_grad_enabled()
                or (d.get("find_unused_parameters") and not d.get("static_graph"))):
            return original_pre(self, *args, **kwargs)
        return _as_collective(_REBUILD_OP, original_pre, self, args, kwargs)

    def _sync_buffers(self, *args, **kwargs):
        return _as_collective(_SYNC_BUFFERS_OP, original_sync, self, args, kwargs)

    for name, original, wrapper in (("_pre_forward", original_pre, _pre_forward),
                                    ("_sync_buffers", original_sync, _sync_buffers)):
        if original is not None:
            wrapper = functools.update_wrapper(wrapper, original)
            wrapper.__ddpwatch_original__ = original
            setattr(DDP, name, wrapper)


def _as_collective(op_code: int, call, ddp, args, kwargs):
    """`call(ddp, ...)` recorded as one collective (enter before, exit after)."""
    token = _writer.enter(op_code, 0)
    try:
        return call(ddp, *args, **kwargs)
    finally:
        _writer.exit(token)


def _first_forward(ddp):
    ddp.__dict__["_ddpwatch_seen"] = True
    _hook_ddp(ddp)
    if not _explicit_dtype:
        param = next(ddp.module.parameters(), None)
        ddp.__dict__["_ddpwatch_device"] = param.device.type if param is not None else "cpu"
        ddp.__dict__["_ddpwatch_param_dtype"] = _dtype_name(param.dtype) if param is not None else ""
        ddp.__dict__["_ddpwatch_dtype"] = _observed_dtype(ddp.module)
        _writer.set_identity(compute_dtype=ddp.__dict__["_ddpwatch_dtype"])


_is_autocast_enabled = torch.is_autocast_enabled


def _track_dtype(ddp):
    """At each later forward: autocast switched on or off since (Lightning's
    bf16-mixed, accelerate's mixed_precision enter it around the forward), a
    dtype seen from outside the script. One call and a comparison per forward;
    the header is rewritten only when the dtype changed."""
    try:
        d = ddp.__dict__
        device = d["_ddpwatch_device"]
        if _is_autocast_enabled(device):
            name = _dtype_name(torch.get_autocast_dtype(device))
        else:
            name = d["_ddpwatch_param_dtype"]
        if name != d["_ddpwatch_dtype"]:
            d["_ddpwatch_dtype"] = name
            _writer.set_identity(compute_dtype=name)
    except Exception:  # evidence only: never into the training step
        pass


def _hook_ddp(ddp):
    if ddp.__dict__.get("_ddpwatch_hooked") or not hasattr(ddp, "reducer"):
        return
    group = ddp.process_group
    ddp.register_comm_hook(group, _bucket_hook)


_BUCKET_OP = OP_CODE["ddp_bucket_all_reduce"]


def _bucket_hook(group, bucket):
    """DDP's default all-reduce (average), plus a heartbeat with the bucket's bytes."""
    tensor = bucket.buffer()
    writer = _writer
    token = writer.enter(_BUCKET_OP, tensor.nbytes)
    tensor.div_(group.size())
    # What DDP's built-in path calls (ProcessGroup.allreduce on the bucket), not
    # the Python c10d.all_reduce with its argument checks: this runs per bucket.
    work = group.allreduce([tensor])
    asyncwork.hold(work)  # why: asyncwork.py, at `_held`
    future = work.get_future()

    def finished(fut):
        writer.exit(token)
        return fut.value()[0]
    return future.then(callbacks.completion_callback(finished))


def _observed_dtype(module) -> str:
    """The dtype the module computes in: autocast's if active, else its parameters'."""
    param = next(module.parameters(), None)
    device_type = param.device.type if param is not None else "cpu"
    if torch.is_autocast_enabled(device_type):
        return _dtype_name(torch.get_autocast_dtype(device_type))
    return _dtype_name(param.dtype) if param is not None else ""


def _dtype_name(dtype) -> str:
    return str(dtype).replace("torch.", "")


def _on_optimizer_step(optimizer, args, kwargs):
    # Several optimizers may step per training step (AdamW + Muon): count one.
    global _first_optimizer
    if _explicit_steps:  # step() counts, and prunes
        return
    if _first_optimizer is None:
        _first_optimizer = id(optimizer)
    if id(optimizer) == _first_optimizer:
        _writer.step(0)
        asyncwork.prune()


__all__ = ["instrument", "step", "set_identity", "writer"]
