"""Pure and file-level parts of the second hostile review's defences: what the
daemon reads and keeps of a process's argv and environment (any size a user
likes), files seen through another process's root, peers' claims, and the
record directory's making."""
from __future__ import annotations

import os
import stat
import time

import pytest

from conftest import need
from ddpwatch.heartbeat import paths
from ddpwatch.observe.jobs import discovery
from ddpwatch.observe.jobs import proctable
from ddpwatch.observe.system import rootfile
from ddpwatch.observe.probes import process as P


def test_read_head_reads_at_most_the_limit_and_never_half_an_item(tmp_path):
    path = tmp_path / "environ"
    path.write_bytes(b"RANK=1\0MASTER_PORT=29500\0" + b"X=" + b"A" * 100_000 + b"\0")
    assert P.read_head(str(path), 25) == b"RANK=1\0MASTER_PORT=29500\0"
    # cut inside MASTER_PORT's value: the half-read variable is dropped, not "295"
    assert P.read_head(str(path), 22) == b"RANK=1\0"
    assert P.parse_environ(P.read_head(str(path), 22)) == {"RANK": "1"}
    assert len(P.read_head(str(path), 4096)) <= 4096
    # a file that fits is read whole, however the chunks fall
    path.write_bytes(b"a\0b\0")
    assert P.read_head(str(path), 4) == b"a\0b\0"
    assert P.read_head(str(path), 100) == b"a\0b\0"


def test_parse_cmdline_and_environ_keep_bounded_parts():
    argv = P.parse_cmdline(b"\0".join([b"python3"] + [b"x"] * 10_000) + b"\0")
    assert len(argv) == P.MAX_ARGS and argv[0] == "python3"
    env = P.parse_environ(b"MASTER_ADDR=" + b"h" * 10_000 + b"\0RANK=0\0")
    assert env == {"MASTER_ADDR": "h" * P.MAX_VALUE, "RANK": "0"}


def fake_proc(tmp_path, pid: int, argv: bytes, environ: bytes = b"") -> str:
    procfs = tmp_path / "proc"
    d = procfs / str(pid)
    d.mkdir(parents=True)
    fields = ["S", "1", str(pid), str(pid), "0", "-1", "0"] + ["0"] * 12 + ["100"] + ["0"] * 20
    (d / "stat").write_text(f"{pid} (x) " + " ".join(fields[:-1]) + "\n")
    (d / "cmdline").write_bytes(argv)
    (d / "environ").write_bytes(environ)
    (procfs / "uptime").write_text("100000.0 1.0\n")
    return str(procfs)


def test_a_megabyte_argv_costs_the_table_and_cache_only_its_head(tmp_path):
    big = b"A" * (6 * 2**20)
    procfs = fake_proc(tmp_path, 10, b"sh\0-c\0sleep 600\0x\0" + big + b"\0" + big + b"\0")
    fake_proc(tmp_path, 11, b"/usr/bin/python3\0train.py\0" + b"\0".join([b"B" * 1000] * 6000),
              b"RANK=0\0WORLD_SIZE=2\0" + b"PAD=" + big + b"\0LOCAL_RANK=0\0")
    cache = {}
    table = discovery.read_table(procfs, cache)
    assert table[10].cmdline == ("sh", "-c", "sleep 600", "x")  # not Python: argv[:4]
    assert table[11].cmdline[:2] == ("/usr/bin/python3", "train.py")
    assert sum(len(a) for a in table[11].cmdline) <= P.CMDLINE_LIMIT
    # the variables past the limit are not read (a pad of MiB): only those before
    assert table[11].env == {"RANK": "0", "WORLD_SIZE": "2"}
    assert len(cache) == 2
    assert sum(discovery._cost(v) for v in cache.values()) < 20_000


def test_the_exec_cache_stops_growing_at_its_budget(tmp_path, monkeypatch):
    monkeypatch.setattr(proctable, "CACHE_BYTES", 3000)  # where read_table reads it
    for pid in range(100, 140):
        procfs = fake_proc(tmp_path, pid, b"/usr/bin/python3\0" + b"y" * 1000 + b"\0")
    cache = {}
    table = discovery.read_table(procfs, cache)
    assert len(table) == 40  # every process is in the table, read anew
    assert 0 < len(cache) < 40 and sum(discovery._cost(v) for v in cache.values()) <= 3000
    # the next read still sees all, from the cache where it has them
    assert set(discovery.read_table(procfs, cache)) == set(table)


# --- files seen through another process's root (observe/system/rootfile.py) -----------------

NOBODY = (65534, frozenset({65534}))


@pytest.fixture(params=["openat2", "nofollow-walk"])
def rank_root(tmp_path, request, monkeypatch):
    """A rank's root with its /etc, read with openat2 and as on a kernel without it."""
    monkeypatch.setattr(rootfile, "_openat2_missing", request.param == "nofollow-walk")
    etc = tmp_path / "root" / "etc"
    etc.mkdir(parents=True)
    return tmp_path / "root"


def test_a_fifo_is_refused_at_once_and_never_waited_on(rank_root):
    os.mkfifo(rank_root / "etc" / "hosts")
    started = time.monotonic()
    with pytest.raises(rootfile.FileRefused, match="not a regular file"):
        rootfile.read_in_root(str(rank_root), "/etc/hosts", NOBODY)
    assert time.monotonic() - started < 1.0


def test_a_device_is_never_opened(rank_root):
    need(os.geteuid() == 0, "mknod needs root")
    os.mknod(rank_root / "etc" / "hosts", stat.S_IFCHR | 0o666, os.makedev(1, 3))  # /dev/null
    with pytest.raises(rootfile.FileRefused, match="not a regular file"):
        rootfile.read_in_root(str(rank_root), "/etc/hosts", NOBODY)


def test_a_file_the_ranks_user_cannot_read_is_refused_even_to_root(rank_root):
    hosts = rank_root / "etc" / "hosts"
    hosts.write_text("root:SECRET-MARKER:19000:0:99999:7:::\n")
    os.chmod(hosts, 0o600)  # root's (or this test user's) own, not the rank's
    if os.geteuid() != 65534:
        with pytest.raises(rootfile.FileRefused, match="not readable by the process's own user"):
            rootfile.read_in_root(str(rank_root), "/etc/hosts", NOBODY)
    me = (os.geteuid(), frozenset({os.getegid()}))
    assert "SECRET-MARKER" in rootfile.read_in_root(str(rank_root), "/etc/hosts", me)
    os.chmod(hosts, 0o644)
    assert "SECRET-MARKER" in rootfile.read_in_root(str(rank_root), "/etc/hosts", NOBODY)


def test_readable_by_follows_the_first_matching_class():
    def st(uid, gid, mode):
        return os.stat_result((stat.S_IFREG | mode, 0, 0, 1, uid, gid, 0, 0, 0, 0))
    alice = (1000, frozenset({1000, 27}))
    assert rootfile.readable_by(st(1000, 1000, 0o400), alice)
    assert not rootfile.readable_by(st(1000, 1000, 0o044), alice)  # owner class decides
    assert rootfile.readable_by(st(0, 27, 0o640), alice)
    assert not rootfile.readable_by(st(0, 27, 0o604), alice)       # group class decides
    assert rootfile.readable_by(st(0, 0, 0o604), alice)
    assert not rootfile.readable_by(st(0, 42, 0o600), alice)
    assert rootfile.readable_by(st(0, 0, 0o000), (0, frozenset({0})))  # root reads itself


def test_the_last_symlink_is_refused_where_openat2_is_missing(tmp_path, monkeypatch):
    monkeypatch.setattr(rootfile, "_openat2_missing", True)
    etc = tmp_path / "root" / "etc"
    etc.mkdir(parents=True)
    (etc / "real").write_text("127.0.0.1 x\n")
    os.symlink("real", etc / "hosts")
    # O_PATH|O_NOFOLLOW opens the link itself, which is no regular file
    with pytest.raises(rootfile.FileRefused, match="not a regular file"):
        rootfile.read_in_root(str(tmp_path / "root"), "/etc/hosts", NOBODY)


def test_reader_of_is_the_filesystem_uid_and_every_gid(tmp_path):
    d = tmp_path / "7"
    d.mkdir()
    (d / "status").write_text("Name:\tx\nUid:\t1000\t1000\t1000\t1001\nGid:\t100\t100\t100\t"
                              "101\nGroups:\t27 44 \n")
    assert rootfile.reader_of(str(tmp_path), 7) == (1001, frozenset({101, 27, 44}))


# --- the record directory (heartbeat/paths.py) ---------------------------------------

@pytest.fixture
def shm(tmp_path, monkeypatch):
    """A /dev/shm of the test's own (root's, sticky, world-writable) and the
    shared parent's name in it."""
    need(os.geteuid() == 0, "planting another uid's directory needs root")
    base = tmp_path / "shm"
    base.mkdir()
    os.chmod(base, 0o1777)
    parent = str(base / "ddpwatch")
    monkeypatch.setattr(paths, "shared_parent", lambda: parent)
    monkeypatch.delenv(paths.ENV_DIR, raising=False)
    victim = tmp_path / "victim"  # what a planted link points at: root's own place
    victim.mkdir(mode=0o755)
    return base, parent, victim


def untouched(victim) -> bool:
    return stat.S_IMODE(os.stat(victim).st_mode) == 0o755 and os.listdir(victim) == []


def test_a_planted_symlink_parent_is_neither_followed_nor_chmodded(shm):
    base, parent, victim = shm
    os.symlink(victim, parent)
    got = paths.prepare_dir(None)
    assert got == f"{parent}-0" and untouched(victim)
    assert stat.S_IMODE(os.lstat(got).st_mode) == 0o700 and os.lstat(got).st_uid == 0
    assert got in paths.user_dirs(parent)


def test_a_parent_planted_by_another_user_is_passed_over(shm):
    base, parent, _ = shm
    os.mkdir(parent)
    os.chmod(parent, 0o777)
    os.chown(parent, 65534, 65534)
    got = paths.prepare_dir(None)
    assert got == f"{parent}-0"
    assert os.listdir(parent) == [] and stat.S_IMODE(os.stat(parent).st_mode) == 0o777


def test_each_user_gets_a_directory_of_their_own_under_a_sticky_parent(shm):
    base, parent, victim = shm
    got = paths.prepare_dir(None)
    assert got == os.path.join(parent, "0")
    st = os.stat(parent)
    assert st.st_uid == 0 and stat.S_IMODE(st.st_mode) == 0o1777
    assert stat.S_IMODE(os.stat(got).st_mode) == 0o700
    assert paths.prepare_dir(None) == got  # the same one again


@pytest.mark.parametrize("plant", ["symlink", "their-dir"])
def test_a_users_name_taken_first_gets_an_unguessable_stand_in(shm, plant):
    base, parent, victim = shm
    os.mkdir(parent, 0o700)
    os.chmod(parent, 0o1777)
    taken = os.path.join(parent, "0")
    if plant == "symlink":
        os.symlink(victim, taken)
    else:
        os.mkdir(taken, 0o700)
        os.chown(taken, 65534, 65534)
    got = paths.prepare_dir(None)
    assert got.startswith(taken + ".") and os.lstat(got).st_uid == 0
    assert stat.S_IMODE(os.lstat(got).st_mode) == 0o700 and untouched(victim)
    assert paths.prepare_dir(None) == got  # reused, not one per rank
    listed = paths.user_dirs(parent)
    assert got in listed and taken not in listed  # the squatter's is not read as root's


def test_a_writer_under_a_squatted_name_writes_beside_it_not_through_it(shm):
    from ddpwatch.heartbeat import writer
    base, parent, victim = shm
    os.symlink(victim, parent)
    w = writer.open_writer(rank=0)
    try:
        assert w.path and os.path.dirname(w.path) == f"{parent}-0" and untouched(victim)
    finally:
        w.close()


def test_an_explicit_directory_that_is_a_link_is_refused(shm, tmp_path):
    _, _, victim = shm
    link = tmp_path / "hb"
    os.symlink(victim, link)
    with pytest.raises(paths.SquattedError, match="not a directory of ours"):
        paths.prepare_dir(str(link))
    assert untouched(victim)


def test_readers_list_the_parent_and_each_directory_owned_by_the_uid_it_names(shm):
    base, parent, victim = shm
    mine = paths.prepare_dir(None)
    theirs = os.path.join(parent, "65534")
    os.mkdir(theirs, 0o700)
    os.chown(theirs, 65534, 65534)
    posing = os.path.join(parent, "1000")  # 65534's directory under uid 1000's name
    os.mkdir(posing, 0o700)
    os.chown(posing, 65534, 65534)
    os.symlink(victim, os.path.join(parent, "1001"))
    assert paths.record_dirs(None) == (parent, mine, theirs)
    assert paths.record_dirs("/elsewhere") == ("/elsewhere",)
