"""Whether the kernel lets us attach to a rank (py-spy reads its memory with
process_vm_readv, a PTRACE_MODE_ATTACH check even with --nonblocking), and if
not, what evidence is missing and the exact step that brings it back.

PARSE/DECIDE: `refusal` is pure over what was read (Yama's scope, our uid and
capabilities, the target's uid and dumpability); tests feed saved values
(tests/unit/observe/test_ptrace_unit.py). READ: `read_scope`, `read_caller`,
`read_target`. The rules are the kernel's `ptrace_may_access` and Yama's
(Documentation/admin-guide/LSM/Yama.rst):
* another user's process, or one that called prctl(PR_SET_DUMPABLE, 0), needs
  CAP_SYS_PTRACE;
* Yama 1 lets a process attach to its own descendants only (a terminal's
  `ddpwatch diagnose` is no ancestor of the ranks), 2 only with CAP_SYS_PTRACE,
  3 never (and cannot be lowered until a reboot);
* a process whose permitted capabilities are not all the caller's needs
  CAP_SYS_PTRACE too (security/commoncap.c cap_ptrace_access_check): root
  without it may not attach to root's ranks that keep it;
* root without CAP_SYS_PTRACE is a container started without it.
"""
from __future__ import annotations

from dataclasses import dataclass

CAP_SYS_PTRACE = 19  # bit in /proc/<pid>/status CapEff / CapBnd
YAMA = "sys/kernel/yama/ptrace_scope"

SUDO = "run it as root: sudo ddpwatch diagnose"
SYSCTL = "sudo sysctl kernel.yama.ptrace_scope=0"
CAP_ADD = ("start the container with --cap-add=SYS_PTRACE (docker/podman run; Kubernetes: "
           "securityContext.capabilities.add: [SYS_PTRACE])")


@dataclass(frozen=True)
class Caller:
    uid: int        # effective uid
    cap_eff: int    # CapEff bits
    cap_bnd: int    # CapBnd bits: without CAP_SYS_PTRACE, not even root gets it

    @property
    def can_ptrace_any(self) -> bool:
        return bool(self.cap_eff & (1 << CAP_SYS_PTRACE))


@dataclass(frozen=True)
class Target:
    pid: int
    uid: int        # effective uid (/proc/<pid>/status)
    dumpable: bool  # False: prctl(PR_SET_DUMPABLE, 0) (its /proc entries turn root's)
    cap_prm: int = 0  # CapPrm bits


@dataclass(frozen=True)
class Refusal:
    """Why stacks cannot be read, and what brings them back (said once)."""
    missing: str
    remedy: str

    def line(self) -> str:
        return f"judged without stacks: {self.missing}; to read them, {self.remedy}"


def privilege(caller: Caller) -> str:
    """The step that gives CAP_SYS_PTRACE: sudo, or for root in a container
    without it, the container's flag."""
    if caller.uid == 0 or not caller.cap_bnd & (1 << CAP_SYS_PTRACE):
        return CAP_ADD
    return SUDO


def refusal(scope: int | None, caller: Caller, target: Target) -> Refusal | None:
    """None when `caller` may attach to `target` under Yama `scope` (None: no
    Yama), else what is missing and its remedy."""
    if scope == 3:
        return Refusal("the kernel forbids attaching to any process "
                       "(kernel.yama.ptrace_scope=3)",
                       "set kernel.yama.ptrace_scope to 0 in /etc/sysctl.d and reboot "
                       "(3 cannot be lowered while the system runs)")
    if caller.can_ptrace_any:
        return None
    if target.uid != caller.uid:
        return Refusal(f"pid {target.pid} belongs to uid {target.uid}, and reading another "
                       f"user's stacks needs CAP_SYS_PTRACE", privilege(caller))
    if not target.dumpable:
        return Refusal(f"pid {target.pid} forbids being traced (prctl PR_SET_DUMPABLE 0), "
                       f"which only CAP_SYS_PTRACE overrides", privilege(caller))
    if target.cap_prm & ~caller.cap_eff:
        return Refusal(f"pid {target.pid} holds capabilities this process lacks, and reading "
                       f"its stacks then needs CAP_SYS_PTRACE", privilege(caller))
    if scope == 2:
        return Refusal("the kernel lets only CAP_SYS_PTRACE attach to a process "
                       "(kernel.yama.ptrace_scope=2)",
                       f"{privilege(caller)}, or {SYSCTL}")
    if scope == 1:
        return Refusal("the kernel lets a process attach only to its own children "
                       "(kernel.yama.ptrace_scope=1, Ubuntu's default)",
                       f"{privilege(caller)}, or {SYSCTL}")
    return None


def parse_scope(text: str) -> int | None:
    try:
        return int(text.strip())
    except ValueError:
        return None


def read_scope(procfs: str = "/proc") -> int | None:
    """Yama's ptrace_scope; None without Yama (plain ptrace rules apply)."""
    try:
        with open(f"{procfs}/{YAMA}") as f:
            return parse_scope(f.read())
    except OSError:
        return None


def parse_status(text: str) -> tuple[int, int, int, int]:
    """(effective uid, CapEff, CapBnd, CapPrm) from /proc/<pid>/status."""
    uid, caps = -1, {"CapEff:": 0, "CapBnd:": 0, "CapPrm:": 0}
    for line in text.splitlines():
        if line.startswith("Uid:"):
            uid = int(line.split()[2])
        elif line[:7] in caps:
            caps[line[:7]] = int(line.split()[1], 16)
    return uid, caps["CapEff:"], caps["CapBnd:"], caps["CapPrm:"]


def _status(procfs: str, pid) -> tuple[int, int, int, int]:
    with open(f"{procfs}/{pid}/status") as f:
        return parse_status(f.read())


def read_caller(procfs: str = "/proc") -> Caller:
    uid, eff, bnd, _ = _status(procfs, "self")
    return Caller(uid, eff, bnd)


def read_target(procfs: str, pid: int) -> Target | None:
    """None when gone. Dumpability is read as its effect: /proc/<pid>/environ
    (a PTRACE_MODE_READ check, which Yama leaves alone) refuses even its own
    user once the process is not dumpable (tests/diagnose/test_diagnose_node.py).
    The owner of its /proc entries turns root too (proc(5)), but the directory
    itself was seen keeping its user's."""
    try:
        uid, _, _, prm = _status(procfs, pid)
    except (OSError, ValueError, IndexError):
        return None
    try:
        with open(f"{procfs}/{pid}/environ", "rb") as f:
            f.read(1)
        dumpable = True
    except PermissionError:
        dumpable = False  # for another user's process, the uid says it first
    except OSError:
        return None
    return Target(pid, uid, dumpable, prm)


def job_refusal(procfs: str, pids) -> Refusal | None:
    """What forbids attaching to `pids` (one job's ranks), read now: each reason
    once (the remedy of the first; they share the step that grants
    CAP_SYS_PTRACE, `privilege`), None if nothing does."""
    try:
        caller = read_caller(procfs)
    except (OSError, ValueError, IndexError):
        return None  # unreadable: the dump itself will say what it could not
    scope = read_scope(procfs)
    found: list[Refusal] = []
    for pid in pids:
        target = read_target(procfs, pid)
        refused = refusal(scope, caller, target) if target is not None else None
        if refused is not None and refused.missing not in [f.missing for f in found]:
            found.append(refused)
    if not found:
        return None
    return Refusal("; ".join(f.missing for f in found), found[0].remedy)
