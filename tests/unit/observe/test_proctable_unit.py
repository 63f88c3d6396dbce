"""observe/jobs/proctable.py TableReader: what the daemon reads of the process
table each tick, over a fake /proc (docs/architecture.md "What a tick reads")."""
from __future__ import annotations

import os
import shutil

from ddpwatch.observe.jobs import discovery, proctable
from ddpwatch.observe.probes.process import CLK_TCK

UPTIME = 100_000.0


class FakeProc:
    def __init__(self, root):
        self.root = root
        os.makedirs(root, exist_ok=True)
        self.last_pid = 0
        self.set_uptime(UPTIME)

    def set_uptime(self, seconds: float) -> None:
        self.uptime = seconds
        with open(os.path.join(self.root, "uptime"), "w") as f:
            f.write(f"{seconds} 1.0\n")

    def add(self, pid: int, ppid: int, argv: list[str], exe: str, env: dict | None = None,
            age_s: float = 60.0) -> None:
        d = os.path.join(self.root, str(pid))
        os.makedirs(d, exist_ok=True)
        start = round((self.uptime - age_s) * CLK_TCK)
        fields = ["S", str(ppid), str(pid), str(pid), "0", "-1", "0"] + ["0"] * 12 + \
            [str(start)] + ["0"] * 20
        with open(os.path.join(d, "stat"), "w") as f:
            f.write(f"{pid} (x) " + " ".join(fields[:-1]) + "\n")
        self.exec(pid, argv, exe, env)
        self.last_pid = pid  # the last one given out, as the kernel says
        self._loadavg()

    def exec(self, pid: int, argv: list[str], exe: str, env: dict | None = None) -> None:
        d = os.path.join(self.root, str(pid))
        with open(os.path.join(d, "cmdline"), "wb") as f:
            f.write(b"\0".join(a.encode() for a in argv) + b"\0")
        with open(os.path.join(d, "environ"), "wb") as f:
            f.write(b"".join(f"{k}={v}\0".encode() for k, v in (env or {}).items()))
        if os.path.lexists(os.path.join(d, "exe")):
            os.remove(os.path.join(d, "exe"))
        os.symlink(exe, os.path.join(d, "exe"))

    def remove(self, pid: int) -> None:
        shutil.rmtree(os.path.join(self.root, str(pid)))

    def _loadavg(self) -> None:
        with open(os.path.join(self.root, "loadavg"), "w") as f:
            f.write(f"0.00 0.00 0.00 1/10 {self.last_pid}\n")


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


RANK_ENV = {"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}


def node(tmp_path):
    proc = FakeProc(str(tmp_path / "proc"))
    proc.add(1, 0, ["/sbin/init"], "/sbin/init")
    proc.add(50, 1, ["sh", "-c", "sleeps"], "/usr/bin/dash")
    for pid in range(100, 110):
        proc.add(pid, 50, ["sleep", "3600"], "/usr/bin/sleep")
    proc.add(200, 1, ["/usr/bin/python3", "train.py"], "/usr/bin/python3.11", RANK_ENV)
    return proc


def test_quiet_processes_are_read_once_and_the_table_stays_whole(tmp_path):
    proc, clock = node(tmp_path), Clock()
    reader = proctable.TableReader(proc.root, clock)
    first = reader.read()
    assert set(first) == {1, 50, 200, *range(100, 110)} and reader.listed
    clock.now += 1
    second = reader.read()
    # nothing was created: no listing; read again: the shell and the Python process
    assert set(second) == set(first) and not reader.listed and reader.reads == 2
    assert second[105].cmdline == ("sleep", "3600")
    assert sorted(p.pid for p in second.children_of(50)) == list(range(100, 110))
    assert second.candidates() == {200}


def test_a_new_process_is_read_and_its_parent_again(tmp_path):
    """A quiet process that exec'd a launcher shows it by the rank it starts."""
    proc, clock = node(tmp_path), Clock()
    proc.add(60, 1, ["/usr/bin/env", "true"], "/usr/bin/env")
    reader = proctable.TableReader(proc.root, clock)
    reader.read()
    proc.exec(60, ["/usr/bin/python3", "/usr/bin/torchrun", "--nproc_per_node=2", "t.py"],
              "/usr/bin/python3.11")
    clock.now += 1
    assert reader.read()[60].cmdline[0] == "/usr/bin/env"  # not asked again yet
    proc.add(61, 60, ["/usr/bin/python3", "t.py"], "/usr/bin/python3.11",
             dict(RANK_ENV, TORCHELASTIC_RUN_ID="r1"), age_s=0.5)
    clock.now += 1
    table = reader.read()
    assert table[60].launcher is not None and [p.pid for p in table.children_of(60)] == [61]
    (job,) = [j for j in discovery.all_jobs(table) if j.launcher_pid == 60]
    assert job.rank_pids == (61,) and job.launcher_kind == "torchrun"


def test_a_shell_that_execs_is_seen_at_the_next_read(tmp_path):
    proc, clock = node(tmp_path), Clock()
    reader = proctable.TableReader(proc.root, clock)
    reader.read()
    proc.exec(50, ["/usr/bin/python3", "train.py"], "/usr/bin/python3.11", RANK_ENV)
    clock.now += 1
    table = reader.read()
    assert table[50].python and 50 in table.candidates()


def test_gone_processes_leave_the_table(tmp_path):
    proc, clock = node(tmp_path), Clock()
    reader = proctable.TableReader(proc.root, clock)
    reader.read()
    proc.remove(200)  # read every time: gone at once
    clock.now += 1
    assert 200 not in reader.read()
    proc.remove(105)  # a quiet one: gone at the next listing (a new pid makes one)
    proc.add(300, 1, ["sleep", "1"], "/usr/bin/sleep")
    clock.now += 1
    table = reader.read()
    assert 105 not in table and 300 in table
    assert 105 not in [p.pid for p in table.children_of(50)]


def test_quiet_processes_are_read_again_after_a_while_a_few_at_a_time(tmp_path, monkeypatch):
    monkeypatch.setattr(proctable, "MAX_REVISITS", 4)
    proc, clock = node(tmp_path), Clock()
    reader = proctable.TableReader(proc.root, clock)
    reader.read()
    proc.exec(103, ["/usr/bin/python3", "x.py"], "/usr/bin/python3.11")  # a set-uid's
    clock.now += proctable.REVISIT_S
    seen = []
    for _ in range(4):
        table = reader.read()
        seen.append(table[103].python)
        assert reader.reads <= 2 + 4 + (len(table) if reader.listed else 0)
        clock.now += 1
    assert seen[-1], "read again within REVISIT_S and a few reads"


def test_a_pid_given_out_again_is_read_anew_at_once(tmp_path):
    """A quiet process ended and its pid went to a rank between two reads: the
    pid was given out since the last listing (loadavg's last pid moved past
    it), so it is read again, not left to the revisits."""
    proc, clock = node(tmp_path), Clock()
    proc.add(300, 50, ["sleep", "3600"], "/usr/bin/sleep")  # from the cycle before
    proc.last_pid = 250
    proc._loadavg()
    reader = proctable.TableReader(proc.root, clock)
    reader.read()
    proc.remove(300)
    proc.add(300, 1, ["/usr/bin/python3", "train.py"], "/usr/bin/python3.11", RANK_ENV, age_s=5)
    clock.now += 1
    table = reader.read()
    assert table[300].python and 300 in table.candidates()
    assert reader.reads == 3  # the shell, the rank at 200 and the reused pid: no other
    # the pids given out between two listings, around the wrap too
    assert proctable._given_out("100", "105") == (range(101, 106),)
    assert proctable._given_out("105", "105") == ()
    assert proctable._given_out("4000", "20") == (range(4001, proctable.PID_LIMIT + 1),
                                                 range(1, 21))
    assert proctable._given_out(None, "20") == ()


def test_revisits_a_read_stay_few_however_many_quiet_processes(tmp_path):
    proc, clock = node(tmp_path), Clock()
    for pid in range(1000, 1400):
        proc.add(pid, 50, ["sleep", "3600"], "/usr/bin/sleep")
    reader = proctable.TableReader(proc.root, clock)
    reader.read()
    clock.now += proctable.REVISIT_S
    counts = []
    for _ in range(5):
        reader.read()
        counts.append(reader.reads)
        clock.now += 1
    # the shell and the rank every read, at most MAX_REVISITS others
    assert max(counts) <= 2 + proctable.MAX_REVISITS, counts


def test_young_processes_are_read_until_they_are_old_enough_to_have_exec_d(tmp_path):
    """A fork not yet exec'd shows its parent's command line for a moment."""
    proc, clock = node(tmp_path), Clock()
    proc.add(70, 1, ["sleep", "1"], "/usr/bin/sleep", age_s=0.1)
    reader = proctable.TableReader(proc.root, clock)
    reader.read()
    proc.exec(70, ["/usr/bin/python3", "t.py"], "/usr/bin/python3.11", RANK_ENV)
    clock.now += 1
    assert reader.read()[70].python


def test_without_loadavg_every_read_lists(tmp_path):
    proc, clock = node(tmp_path), Clock()
    os.remove(os.path.join(proc.root, "loadavg"))
    reader = proctable.TableReader(proc.root, clock)
    reader.read()
    proc.add(300, 1, ["sleep", "1"], "/usr/bin/sleep")
    os.remove(os.path.join(proc.root, "loadavg"))
    clock.now += 1
    assert 300 in reader.read() and reader.listed


def test_a_table_built_by_hand_finds_children_and_candidates_itself():
    P = discovery.ProcInfo
    table = proctable.ProcTable({1: P(1, 0, ("init",), {}), 2: P(2, 1, ("python3", "x"), {}),
                                 3: P(3, 1, ("sleep", "9"), {})})
    assert sorted(p.pid for p in table.children_of(1)) == [2, 3]
    assert table.candidates() == {2}
    table[4] = P(4, 2, ("python3", "y"), {})
    assert [p.pid for p in table.children_of(2)] == [4] and table.candidates() == {2, 4}


def test_a_process_read_again_unchanged_keeps_its_object_and_what_was_worked_out(tmp_path):
    """A hot process read again as it was is the same ProcInfo, so `launcher` and
    `python` are not worked out again every tick (proctable._unchanged); any
    change makes a new one, its parent's children updated."""
    proc, clock = node(tmp_path), Clock()
    proc.add(60, 1, ["/usr/bin/python3", "/usr/bin/torchrun", "--nproc_per_node=2", "t.py"],
             "/usr/bin/python3.11", {"MASTER_PORT": "29500"})
    reader = proctable.TableReader(proc.root, clock)
    before = reader.read()[60]
    assert before.launcher is not None and "launcher" in before.__dict__
    clock.now += 1
    again = reader.read()
    assert again[60] is before and again[200] is reader.read()[200]
    # re-parented (its parent died): a new object, and the children index follows
    stat = os.path.join(proc.root, "60", "stat")
    with open(stat) as f:
        text = f.read()
    with open(stat, "w") as f:
        f.write(text.replace(") S 1 ", ") S 50 ", 1))
    clock.now += 1
    moved = reader.read()
    assert moved[60] is not before and moved[60].ppid == 50
    assert 60 in [p.pid for p in moved.children_of(50)]
    assert 60 not in [p.pid for p in moved.children_of(1)]


def test_every_field_of_a_process_counts_as_a_change():
    """A field added to ProcInfo must not be left out of proctable._unchanged:
    a process whose owner or executable changed would keep its old reading."""
    import dataclasses
    base = proctable.ProcInfo(7, 1, ("python3", "t.py"), {"RANK": "0"}, start=5, uid=1000,
                              foreground=False, exe_python=True, exe="/usr/bin/python3")
    other = {int: 99, tuple: ("python3", "u.py"), dict: {"RANK": "1"}, bool: None, str: "/x"}
    for f in dataclasses.fields(proctable.ProcInfo):
        if f.name == "pid":
            continue  # the table's key: never compared
        value = getattr(base, f.name)
        changed = (not value) if isinstance(value, bool) else other[type(value)]
        assert not proctable._unchanged(base, dataclasses.replace(base, **{f.name: changed})), \
            f.name
    assert proctable._unchanged(base, dataclasses.replace(base, cmdline=("python3", "t.py"),
                                                          env={"RANK": "0"}))
    # _read_one gives the reading before back when the fields it compares one
    # by one are as they were: a field added must be added there too
    assert {f.name for f in dataclasses.fields(proctable.ProcInfo)} == {
        "pid", "ppid", "cmdline", "env", "start", "uid", "foreground", "exe_python", "exe"}


def test_a_process_read_again_is_given_back_only_when_every_field_is_as_it_was(tmp_path):
    """_read_one's shortcut (no new ProcInfo when nothing changed) compares each
    field it reads: a reading before that differs in any one of them (a set-uid
    exec keeps the command line, only the owner tells) gives a new ProcInfo,
    equal to a fresh read."""
    import dataclasses
    proc = node(tmp_path)
    cache, budget = {}, [0]
    info, _ = proctable._read_one(proc.root, 200, UPTIME, cache, budget)
    again, _ = proctable._read_one(proc.root, 200, UPTIME, cache, budget, info)
    assert again is info  # the exec cache's command line and environment, all else equal
    other = {"ppid": 77, "start": info.start + 1, "uid": info.uid + 1,
             "foreground": not info.foreground, "exe": "/usr/bin/other",
             "exe_python": not info.exe_python, "pid": 201}
    assert set(other) | {"cmdline", "env"} == {f.name for f in dataclasses.fields(info)}
    for name, value in other.items():
        before = dataclasses.replace(info, **{name: value})  # the same cmdline and env objects
        read, _ = proctable._read_one(proc.root, 200, UPTIME, cache, budget, before)
        assert read is not before and read == info, name


def test_a_read_that_changed_nothing_gives_the_table_given_before(tmp_path):
    """Beside a steady job most reads change nothing: the table given before is
    given again, not a copy of every process's entry (TableReader._table); any
    change, a process gone or new or read differently, gives a new one and
    leaves the old as it was."""
    proc, clock = node(tmp_path), Clock()
    reader = proctable.TableReader(proc.root, clock)
    first = reader.read()
    clock.now += 1
    assert reader.read() is first and reader.reads == 2  # read, nothing changed
    proc.exec(50, ["/usr/bin/python3", "train.py"], "/usr/bin/python3.11", RANK_ENV)
    clock.now += 1
    execd = reader.read()
    assert execd is not first and execd[50].python and not first[50].python
    proc.remove(200)
    clock.now += 1
    gone = reader.read()
    assert gone is not execd and 200 not in gone and 200 in execd
    clock.now += 1
    assert reader.read() is gone


def own(proc: FakeProc, pid: int, uid: int) -> None:
    """The pid's /proc entry owned by `uid`, as the kernel shows a user's process."""
    os.chown(os.path.join(proc.root, str(pid), "stat"), uid, uid)


def test_a_users_python_processes_past_the_bound_are_set_aside(tmp_path, monkeypatch):
    if os.geteuid() != 0:  # chown to another uid
        import pytest
        pytest.skip("needs root to own fake /proc entries as uid 65534")
    monkeypatch.setattr(proctable, "MAX_PYTHON_PER_UID", 5)
    proc, clock = node(tmp_path), Clock()  # its processes are root's: never bounded
    junk = ["python3"] + ["\udcff" * 10] * 4
    for pid in range(1000, 1020):   # a flood of uid 65534: argv0 python3, run by a shell
        proc.add(pid, 1, [], "/usr/bin/dash")
        with open(os.path.join(proc.root, str(pid), "cmdline"), "wb") as f:
            f.write(b"python3\0" + b"\xff" * 4000 + b"\0")
        own(proc, pid, 65534)
    for pid in range(2000, 2010):   # root's own: all kept
        proc.add(pid, 1, ["python3", "w.py"], "/usr/bin/python3.11")
    reader = proctable.TableReader(proc.root, clock)
    table = reader.read()
    flood = set(range(1000, 1020))
    kept = table.candidates() & flood
    assert len(kept) == 5 and set(range(2000, 2010)) | {200} <= table.candidates()
    assert reader.set_aside_total == 15
    assert all(table[p].cmdline == () and not table[p].env for p in flood - kept)
    clock.now += 1
    reader.read()
    # read again: the kept five, root's eleven and the init shell; not the fifteen
    assert reader.reads == 5 + 11 + 1 and reader.set_aside_total == 15
    # one of the kept ends: a set-aside one is taken in when it is read again
    gone = min(kept)
    proc.remove(gone)
    proc.add(3000, 1, ["sleep", "1"], "/usr/bin/sleep")  # a listing comes with a new pid
    clock.now += proctable.REVISIT_S + 1
    for _ in range(4):
        table = reader.read()
        clock.now += 1
    assert len(table.candidates() & flood) == 5 and gone not in table
    assert reader.set_aside_total == 15  # each counted once, however often read
    del junk
