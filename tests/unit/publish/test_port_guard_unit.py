"""port_guard: whether another user could bind the daemon's port while it is down,
decided from net.ipv4.ip_unprivileged_port_start (read from a procfs root)."""
from __future__ import annotations

from ddpwatch import port_guard
from ddpwatch.commands.run import guard_port


def procfs(tmp_path, value: str | None):
    if value is not None:
        sysctl = tmp_path / port_guard.UNPRIVILEGED_START
        sysctl.parent.mkdir(parents=True)
        sysctl.write_text(value)
    return str(tmp_path)


def test_the_sysctl_is_read_from_the_procfs_given(tmp_path):
    assert port_guard.read_unprivileged_start(procfs(tmp_path, "1024\n")) == 1024


def test_a_kernel_without_the_sysctl_reserves_ports_below_1024(tmp_path):
    assert port_guard.read_unprivileged_start(procfs(tmp_path, None)) == 1024


def test_an_unreadable_sysctl_is_unknown(tmp_path):
    assert port_guard.read_unprivileged_start(procfs(tmp_path, "lots")) is None


def test_a_privileged_port_is_nobody_elses():
    assert port_guard.takeable(195, 1024) is False
    assert port_guard.warning("0.0.0.0:195", 195, 1024) is None


def test_an_ordinary_port_is_anybodys_and_said_so():
    assert port_guard.takeable(19500, 1024) is True
    said = port_guard.warning("0.0.0.0:19500", 19500, 1024)
    assert "port 19500 is at or above net.ipv4.ip_unprivileged_port_start (1024)" in said
    assert "any local user may bind" in said and "ddpwatch.socket" in said
    assert "below 1024" in said


def test_a_lowered_sysctl_makes_a_low_port_anybodys():
    # rootless container hosts often lower it (sysctl net.ipv4.ip_unprivileged_port_start=0)
    assert port_guard.takeable(195, 0) is True
    said = port_guard.warning("0.0.0.0:195", 195, 0)
    assert "port 195 is at or above net.ipv4.ip_unprivileged_port_start (0)" in said


def test_an_unknown_sysctl_is_warned_about_not_trusted():
    assert port_guard.takeable(195, None) is None
    said = port_guard.warning("0.0.0.0:195", 195, None)
    assert "could not be read" in said and "below 1024" in said


def test_guard_port_pins_listen_only_for_a_privileged_port_whose_capability_went(
        tmp_path, monkeypatch, caplog):
    root = procfs(tmp_path, "1024")
    monkeypatch.setattr(port_guard, "drop_bind_service", lambda: True)
    assert "restart it to listen elsewhere" in guard_port("0.0.0.0:195", 195, root)
    caplog.clear()
    assert guard_port("127.0.0.1:19500", 19500, root) is None  # rebinding needs nothing
    assert "any local user may bind" in caplog.text
    monkeypatch.setattr(port_guard, "drop_bind_service", lambda: False)
    assert guard_port("0.0.0.0:195", 195, root) is None  # never had it: nothing to keep
