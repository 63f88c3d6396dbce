"""What a rank busy outside the collectives is doing, read from its main thread's
stack: the kind of a pause (docs/judgement-over-time.md "The pause's kind and
site") and where the training loop called it. Pure.

Most training loops pause one rank now and then while the others wait in the
next collective: rank 0 evaluates (nanoGPT's `estimate_loss` under
`torch.no_grad`, Lightning's validation loop), saves a checkpoint (`torch.save`,
safetensors, torch.distributed.checkpoint, Lightning's and HF's save paths),
waits for a DataLoader's workers at an epoch's start, recompiles, or logs and
samples. The kinds are tried in this order, over every frame: a checkpoint
written from inside an evaluation is a checkpoint; a DataLoader read from inside
an evaluation is the evaluation. Signatures were taken from real dumps of the
suite's jobs (tests/jobs/thirdparty/nanogpt_ddp.py, lightning_ddp.py).
"""
from __future__ import annotations

import re

from .memo import per_dump
from .stackmatch import COMPILE_FILES, is_library, training_thread

KINDS = ("checkpoint", "evaluation", "compile", "data", "logging", "unknown")

# (kind, file suffixes, function-name pattern): a frame matches by either
_CHECKPOINT_FILES = ("torch/serialization.py", "safetensors/torch.py",
                     "torch/distributed/checkpoint/state_dict_saver.py",
                     "lightning/pytorch/trainer/connectors/checkpoint_connector.py",
                     "lightning/fabric/plugins/io/torch_io.py",
                     "pytorch_lightning/trainer/connectors/checkpoint_connector.py",
                     "lightning/pytorch/callbacks/model_checkpoint.py")
_CHECKPOINT_NAMES = re.compile(r"(^|_)(save|checkpoint|ckpt)", re.I)
_EVAL_FILES = ("lightning/pytorch/loops/evaluation_loop.py",
               "pytorch_lightning/loops/evaluation_loop.py")
_EVAL_NAMES = re.compile(r"(eval|valid|estimate_loss|test_step|inference)", re.I)
_DATA_FILES = ("torch/utils/data/dataloader.py", "torch/utils/data/_utils/fetch.py")
_LOGGING_NAMES = re.compile(r"(^|_)(log|logging|sample|generate|print)", re.I)
_LOGGING_FILES = ("wandb/", "torch/utils/tensorboard/", "mlflow/")


def _file(frame) -> str:
    return frame.filename.replace("\\", "/")


def _kind_of(frame) -> str | None:
    """The pause kind one frame says, if any (checkpoint first: see the module doc)."""
    name, file = frame.name.split(".")[-1], _file(frame)
    user = not is_library(frame)
    if file.endswith(_CHECKPOINT_FILES) or (user and _CHECKPOINT_NAMES.search(name)):
        return "checkpoint"
    if file.endswith(_EVAL_FILES) or (user and _EVAL_NAMES.search(name)):
        return "evaluation"
    if file.endswith(COMPILE_FILES) and name != "<module>":
        return "compile"
    if file.endswith(_DATA_FILES):
        return "data"
    if any(part in file for part in _LOGGING_FILES) or (user and _LOGGING_NAMES.search(name)):
        return "logging"
    return None


_ORDER = {k: i for i, k in enumerate(KINDS)}


@per_dump
def pause_of(dump) -> tuple[str, str]:
    """(kind, site) of a main thread outside the collectives. `site` names the
    frame that gave the kind and the line of the caller that called it
    ("estimate_loss <- train.py:260"): the same at every pause of one place
    of the loop, whichever line inside it the dump caught, so a job's pauses can
    be learned per site. A stack no signature matches is kind "unknown", its site
    the innermost frame of the user's code that called it."""
    thread = training_thread(dump)
    if thread is None or not thread.frames:
        return "unknown", ""
    frames = thread.frames  # innermost first
    best, at = None, -1
    for i, frame in enumerate(frames):
        kind = _kind_of(frame)
        if kind is not None and (best is None or _ORDER[kind] < _ORDER[best]):
            best, at = kind, i
    # torch.no_grad is no evidence: py-spy shows a decorated function inside
    # torch/utils/_contextlib.py, and Lightning's training closure runs under
    # enable_grad the same way (tests/fixtures/snapshots/thirdparty_lightning_hung)
    if best is None:
        users = [i for i, f in enumerate(frames) if f.line and not is_library(f)]
        if not users:
            return "unknown", ""
        at = users[0]
    at = max(at, 0)
    if best is not None and is_library(frames[at]):
        # inside a library's chain (torch.save -> _save -> the zip writer): the
        # chain's outermost frame of the kind names it the same in every dump
        while (at + 1 < len(frames) and is_library(frames[at + 1])
               and _kind_of(frames[at + 1]) == best):
            at += 1
    # the user's line that led there (a decorator's frame, torch.no_grad's, between)
    caller = next((f for f in frames[at + 1:] if f.line and not is_library(f)),
                  next((f for f in frames[at + 1:] if f.line), None))
    name = frames[at].name
    if caller is None:
        return best or "unknown", name
    where = f"{(caller.short_filename or caller.filename).split('/')[-1]}:{caller.line}"
    return best or "unknown", f"{name} <- {where}"


def describe(kind: str) -> str:
    """What a rank of that kind of pause does, for a sentence."""
    return {"checkpoint": "saves a checkpoint", "evaluation": "evaluates",
            "compile": "compiles", "data": "waits for its DataLoader",
            "logging": "logs or samples", "unknown": "works outside the collectives"}.get(
        kind, "works outside the collectives")
