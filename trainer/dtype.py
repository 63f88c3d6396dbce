"""Which device to train on and which dtype to compute in - decided from the TRAINING device.

Field report: `COMPUTE_DTYPE: bfloat16 (auto-detected: CUDA SM 89)` on a
`--device-type=cpu` run. The detection asked `torch.cuda.is_available()` (true:
an unused RTX 4070 was installed) instead of looking at the device it trained
on, and bf16 on that CPU was many times slower than fp32. So `choose_dtype` is
pure and is told the device; on CPU it looks only at CPU flags.
"""
from __future__ import annotations

DTYPES = ("float32", "bfloat16")
DEVICE_TYPES = ("cpu", "cuda", "auto")


def choose_dtype(requested: str, device_type: str, *, cpu_flags: frozenset[str],
                 cuda_capability: tuple[int, int] | None) -> tuple[str, str]:
    """(dtype name, human reason) to compute in on `device_type`.

    `cuda_capability` is consulted only when training on cuda: a GPU in the
    machine says nothing about a CPU run.
    """
    if requested in DTYPES:
        return requested, "requested"
    if requested != "auto":
        raise ValueError(f"unknown dtype {requested!r}; choose from auto, {', '.join(DTYPES)}")
    if device_type == "cuda":
        if cuda_capability is None:
            return "float32", "auto on cuda: compute capability unknown"
        sm = f"SM {cuda_capability[0]}{cuda_capability[1]}"
        if tuple(cuda_capability) >= (8, 0):
            return "bfloat16", f"auto on cuda: {sm} has bf16 tensor cores"
        return "float32", f"auto on cuda: {sm} < SM 80 has no fast bf16"
    if device_type == "cpu":
        if "amx_bf16" in cpu_flags:
            return "bfloat16", "auto on cpu: amx_bf16 makes bf16 matmuls faster than fp32"
        if "avx512_bf16" in cpu_flags:
            return "float32", ("auto on cpu: avx512_bf16 but no AMX: bf16 is not faster "
                               "than fp32 here")
        return "float32", ("auto on cpu: no avx512_bf16/amx_bf16: bf16 would be emulated "
                           "and many times slower")
    raise ValueError(f"unknown device type {device_type!r}; choose from cpu, cuda")


def parse_cpu_flags(cpuinfo: str) -> frozenset[str]:
    """The `flags` of /proc/cpuinfo text (the first processor's; they agree)."""
    for line in cpuinfo.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip() == "flags":
            return frozenset(value.split())
    return frozenset()


def cpu_flags(path: str = "/proc/cpuinfo") -> frozenset[str]:
    """This machine's CPU flags; empty where /proc/cpuinfo is absent (then fp32)."""
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return parse_cpu_flags(f.read())
    except OSError:
        return frozenset()


def resolve_device(requested: str) -> str:
    """`--device-type`: auto means cuda if torch can use one, else cpu."""
    import torch
    if requested not in DEVICE_TYPES:
        raise ValueError(f"unknown device type {requested!r}; "
                         f"choose from {', '.join(DEVICE_TYPES)}")
    if requested == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if requested == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device-type cuda, but torch sees no usable CUDA device")
    return requested


def cuda_capability(device_type: str, index: int = 0) -> tuple[int, int] | None:
    """The GPU's compute capability, asked only when training on cuda."""
    if device_type != "cuda":
        return None
    import torch
    return tuple(torch.cuda.get_device_capability(index))
