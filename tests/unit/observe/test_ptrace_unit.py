"""observe/system/ptrace.py: whether a dump of a rank would be refused, and the
remedy said, over saved Yama values and /proc/<pid>/status texts."""
from __future__ import annotations

import pytest

from ddpwatch.observe.probes.stacks import PidStacks, Stacks, refused
from ddpwatch.observe.system import ptrace
from ddpwatch.observe.system.ptrace import CAP_ADD, SUDO, SYSCTL, Caller, Target, refusal

ALL = (1 << 41) - 1
NO_PTRACE = ALL & ~(1 << ptrace.CAP_SYS_PTRACE)
USER = Caller(1000, 0, ALL)
ROOT = Caller(0, ALL, ALL)
ROOT_IN_CONTAINER = Caller(0, NO_PTRACE, NO_PTRACE)  # docker run without --cap-add
MINE = Target(4242, 1000, True)


@pytest.mark.parametrize("scope", [None, 0])
def test_own_process_without_yama_restrictions_is_allowed(scope):
    assert refusal(scope, USER, MINE) is None


def test_yama_1_refuses_a_user_and_names_sudo_and_the_sysctl():
    r = refusal(1, USER, MINE)
    assert "kernel.yama.ptrace_scope=1" in r.missing
    assert r.remedy == f"{SUDO}, or {SYSCTL}"
    assert r.line().startswith("judged without stacks: ")


def test_yama_2_refuses_all_but_cap_sys_ptrace():
    assert "ptrace_scope=2" in refusal(2, USER, MINE).missing
    assert refusal(2, ROOT, MINE) is None


def test_yama_3_refuses_even_root_and_says_a_reboot_is_needed():
    r = refusal(3, ROOT, MINE)
    assert "ptrace_scope=3" in r.missing and "reboot" in r.remedy


def test_another_users_process_needs_sudo():
    r = refusal(None, USER, Target(7, 1001, True))
    assert "belongs to uid 1001" in r.missing and r.remedy == SUDO
    assert refusal(None, ROOT, Target(7, 1001, True)) is None


def test_root_in_a_container_without_sys_ptrace_is_told_to_add_it():
    r = refusal(None, ROOT_IN_CONTAINER, Target(7, 1001, True))
    assert r.remedy == CAP_ADD and "--cap-add=SYS_PTRACE" in r.remedy
    # its own root ranks that keep the capability: commoncap's subset rule
    r = refusal(None, ROOT_IN_CONTAINER, Target(8, 0, True, ALL))
    assert "holds capabilities" in r.missing and r.remedy == CAP_ADD
    assert refusal(None, ROOT_IN_CONTAINER, Target(8, 0, True, NO_PTRACE)) is None


def test_an_undumpable_process_needs_cap_sys_ptrace_even_for_its_user():
    r = refusal(None, USER, Target(9, 1000, False))
    assert "PR_SET_DUMPABLE 0" in r.missing and r.remedy == SUDO
    assert refusal(None, ROOT, Target(9, 1000, False)) is None


def test_scope_and_status_are_parsed_from_saved_files():
    assert ptrace.parse_scope("1\n") == 1 and ptrace.parse_scope("") is None
    status = ("Name:\tpython\nUid:\t1000\t1000\t1000\t1000\nCapPrm:\t0000000000000000\n"
              "CapEff:\t0000000000000000\nCapBnd:\t000001ffffffffff\n")
    assert ptrace.parse_status(status) == (1000, 0, ALL, 0)


def test_read_scope_of_a_saved_procfs(tmp_path):
    (tmp_path / "sys/kernel/yama").mkdir(parents=True)
    (tmp_path / "sys/kernel/yama/ptrace_scope").write_text("1\n")
    assert ptrace.read_scope(str(tmp_path)) == 1
    assert ptrace.read_scope(str(tmp_path / "none")) is None  # no Yama


def test_a_refused_dump_is_told_from_a_failed_one():
    # py-spy 0.4.3's words, measured: uid 65534 on its own undumpable process,
    # and root without CAP_SYS_PTRACE on a root rank (tests/diagnose/test_diagnose_node.py)
    assert refused("Permission Denied: Try running again with elevated permissions")
    assert refused("py-spy exit 1: Error: Failed to get process executable name. Check that "
                   "the process is running. Caused by: 0: Permission denied (os error 13)")
    assert not refused("py-spy exit 1: Error: Failed to find python version")


def test_stackless_marks_each_rank_and_says_it_once():
    from ddpwatch.publish import stackless
    stacks = Stacks(0.0, "py-spy", (PidStacks(5, "error", "S", error="Permission denied"),))

    class Last:
        pass
    last = Last()
    last.stacks = stacks
    r = stackless.refused_dump(last)
    assert r is not None and "pid 5" in r.missing and r.remedy == SUDO
    last.stacks = Stacks(0.0, "py-spy", (PidStacks(5, "ok", "S"),))
    assert stackless.refused_dump(last) is None
    assert stackless.as_json(None) == {"read": True}
    assert stackless.as_json(r)["read"] is False
