"""Automatic heartbeats, the parts without torch: the launcher identity (pure), the
post-import hook, `ddpwatch exec`'s environment, the start-up paths (.pth of the
editable install, the sitecustomize of exec, chaining, warn once)."""
from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
import textwrap

import pytest
from conftest import REPO

from ddpwatch.commands.exec import boot_dir, exec_env
from ddpwatch.rank import autohook, autowarn
from ddpwatch.rank.identity import launcher_identity


def ident(rank, local, world):
    return {"rank": rank, "local_rank": local, "world_size": world}


@pytest.mark.parametrize("env, kwargs, expected", [
    # torchrun / accelerate / env:// by hand
    ({"RANK": "3", "LOCAL_RANK": "1", "WORLD_SIZE": "4"}, {}, ident(3, 1, 4)),
    # init_process_group's own arguments win over the environment
    ({"RANK": "3", "WORLD_SIZE": "4"}, dict(init_rank=2, init_world_size=8), ident(2, -1, 8)),
    # mp.spawn: the spawn index is the local rank and, on one node, the rank
    ({}, dict(spawn_index=1), ident(1, 1, -1)),
    ({}, dict(spawn_index=1, init_rank=1, init_world_size=2), ident(1, 1, 2)),
    # srun with one task per node spawning its ranks: the task index is the node's
    ({"SLURM_PROCID": "1", "SLURM_NTASKS": "2", "SLURM_LOCALID": "0"}, dict(spawn_index=1),
     ident(-1, 1, -1)),
    # srun, a task per rank
    ({"SLURM_PROCID": "5", "SLURM_LOCALID": "1", "SLURM_NTASKS": "8"}, {}, ident(5, 1, 8)),
    # mpirun (Open MPI), MPICH / Intel MPI
    ({"OMPI_COMM_WORLD_RANK": "2", "OMPI_COMM_WORLD_LOCAL_RANK": "0",
      "OMPI_COMM_WORLD_SIZE": "4"}, {}, ident(2, 0, 4)),
    ({"PMI_RANK": "1", "PMI_SIZE": "2", "MPI_LOCALRANKID": "1"}, {}, ident(1, 1, 2)),
    # ... inside a SLURM job: the step's variables, passed on to every rank, lose
    ({"SLURM_PROCID": "0", "SLURM_LOCALID": "0", "SLURM_NTASKS": "1",
      "OMPI_COMM_WORLD_RANK": "3", "OMPI_COMM_WORLD_LOCAL_RANK": "1",
      "OMPI_COMM_WORLD_SIZE": "4"}, {}, ident(3, 1, 4)),
    # Lightning: the re-executed rank has LOCAL_RANK, NODE_RANK and WORLD_SIZE
    ({"LOCAL_RANK": "1", "NODE_RANK": "0", "WORLD_SIZE": "2"}, dict(lightning=True),
     ident(1, 1, 2)),
    # ... on node 1 its global rank needs the devices per node: left to init_process_group
    ({"LOCAL_RANK": "1", "NODE_RANK": "1", "WORLD_SIZE": "4"}, dict(lightning=True),
     ident(-1, 1, 4)),
    # Lightning's rank 0 before it set anything: "the main process has LOCAL_RANK=0"
    ({}, dict(lightning=True), ident(0, 0, -1)),
    # nothing known; junk is unknown, never a crash
    ({}, {}, ident(-1, -1, -1)),
    ({"RANK": "one", "LOCAL_RANK": "-2", "WORLD_SIZE": ""}, dict(init_rank=None),
     ident(-1, -1, -1)),
])
def test_launcher_identity(env, kwargs, expected):
    assert launcher_identity(env, **kwargs) == expected


def test_exec_env_turns_it_on_and_keeps_the_users_path(tmp_path):
    env = exec_env({"PYTHONPATH": "/a:/b", "HOME": "/root"}, directory="rel/hb")
    assert env["DDPWATCH_AUTO"] == "1" and env["HOME"] == "/root"
    assert env["PYTHONPATH"].split(os.pathsep) == [boot_dir(), "/a", "/b"]
    assert os.listdir(boot_dir()) == ["sitecustomize.py"] or set(os.listdir(boot_dir())) <= {
        "sitecustomize.py", "__pycache__"}  # nothing else becomes importable
    assert env["DDPWATCH_DIR"] == os.path.abspath("rel/hb")
    assert os.path.isfile(os.path.join(env["DDPWATCH_AUTO_HOME"], "ddpwatch", "__init__.py"))
    assert exec_env(env)["PYTHONPATH"] == env["PYTHONPATH"]  # exec under exec: once


def test_exec_errors_are_one_line_with_distinct_codes():
    env = dict(os.environ, PYTHONPATH=REPO)
    for argv, code, text in ((["--", "no-such-command-xyz"], 127, "command not found"),
                             (["--", os.path.join(REPO, "setup.cfg")], 126, "not executable"),
                             ([], 2, "no command to run")):
        out = subprocess.run([sys.executable, "-m", "ddpwatch", "exec", *argv], env=env,
                             capture_output=True, text=True, timeout=60)
        assert out.returncode == code and text in out.stderr, (argv, out)
        assert "Traceback" not in out.stderr


# --- the post-import hook ----------------------------------------------------------
@pytest.fixture
def fake_package(tmp_path, monkeypatch):
    pkg = tmp_path / "ddpw_fakepkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "target.py").write_text("VALUE = 41\n")
    (pkg / "broken.py").write_text("VALUE = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delenv("DDPWATCH_AUTO_WARNED", raising=False)
    monkeypatch.setattr(autowarn, "_warned", False)
    yield "ddpw_fakepkg"
    for name in [m for m in sys.modules if m.startswith("ddpw_fakepkg")]:
        del sys.modules[name]
    autohook._hooks.clear()
    if autohook._FINDER in sys.meta_path:
        sys.meta_path.remove(autohook._FINDER)


def test_after_import_runs_once_after_the_module_and_leaves_no_trace(fake_package):
    seen = []

    def bump(module):
        seen.append(module.__name__)
        module.VALUE += 1
    autohook.after_import(f"{fake_package}.target", bump)
    assert autohook._FINDER in sys.meta_path and not seen  # nothing imported by us
    import ddpw_fakepkg.target as target
    assert seen == [f"{fake_package}.target"] and target.VALUE == 42
    # the module has its real loader; the finder is gone once nothing is watched
    assert type(target.__loader__).__name__ == "SourceFileLoader"
    assert target.__spec__.loader is target.__loader__
    assert autohook._FINDER not in sys.meta_path
    # already imported: the callback runs at once
    autohook.after_import(f"{fake_package}.target", bump)
    assert target.VALUE == 43


def test_a_failing_callback_warns_once_and_never_breaks_the_import(fake_package, capsys):
    def fail(module):
        raise RuntimeError("boom")
    autohook.after_import(f"{fake_package}.broken", fail)
    autohook.after_import(f"{fake_package}.target", fail)
    import ddpw_fakepkg.broken
    import ddpw_fakepkg.target  # noqa: F401
    assert ddpw_fakepkg.broken.VALUE == 1
    err = capsys.readouterr().err
    assert err.count("ddpwatch:") == 1 and "boom" in err, err
    assert os.environ["DDPWATCH_AUTO_WARNED"] == "1"  # the children stay quiet too


# --- start-up paths ----------------------------------------------------------------
def run_python(python, code, env, cwd):
    return subprocess.run([python, "-c", code], env=env, capture_output=True, text=True,
                          timeout=120, cwd=cwd)


LOADED = ("import sys; print(sorted(m for m in sys.modules if m.split('.')[0] in "
          "('torch', 'ddpwatch')))")


def clean_env(**extra):
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("DDPWATCH") and k != "PYTHONPATH"}
    env.update(extra)
    return env


def test_the_editable_install_has_the_pth_and_it_only_acts_on_ddpwatch_auto(tmp_path):
    """The .pth dev.sh's `pip install -e` put in this venv's site-packages: with
    DDPWATCH_AUTO=1 it installs the hook (no torch imported); without, nothing."""
    purelib = sysconfig.get_paths()["purelib"]
    assert os.path.isfile(os.path.join(purelib, "ddpwatch-auto.pth")), os.listdir(purelib)
    on = run_python(sys.executable, LOADED, clean_env(DDPWATCH_AUTO="1"), tmp_path)
    assert on.returncode == 0 and on.stderr == "", on
    assert "'ddpwatch.rank.autoboot'" in on.stdout and "torch" not in on.stdout, on.stdout
    for value in (None, "0", "yes"):
        env = clean_env() if value is None else clean_env(DDPWATCH_AUTO=value)
        off = run_python(sys.executable, LOADED, env, tmp_path)
        assert off.stdout.strip() == "[]", (value, off)


def bare_venv(tmp_path) -> str:
    """A venv that sees neither ddpwatch nor its .pth (no system site-packages)."""
    venv = tmp_path / "bare"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True,
                   timeout=120)
    return str(venv / "bin" / "python")


def test_exec_works_where_ddpwatch_is_not_installed_and_chains_sitecustomize(tmp_path):
    """The bare venv has no ddpwatch: exec's sitecustomize loads the package from
    DDPWATCH_AUTO_HOME, then runs the user's sitecustomize it hides."""
    python = bare_venv(tmp_path)
    site = tmp_path / "site_dir"
    site.mkdir()
    (site / "sitecustomize.py").write_text(
        "import sys; print('their sitecustomize ran in', sys.executable)\n")
    code = (LOADED + "; import sitecustomize, ddpwatch; print(sitecustomize.__file__); "
            "print(ddpwatch.__file__)")
    out = subprocess.run([sys.executable, "-m", "ddpwatch", "exec", "--", python, "-c", code],
                         env=clean_env(PYTHONPATH=str(site)), capture_output=True,
                         text=True, timeout=120, cwd=tmp_path)
    assert out.returncode == 0 and out.stderr == "", out
    lines = out.stdout.splitlines()[-4:]  # (ddpwatch exec's own python ran it too)
    assert lines[0] == f"their sitecustomize ran in {python}"
    assert "'ddpwatch.rank.autoboot'" in lines[1] and "torch" not in lines[1]
    assert lines[2] == str(site / "sitecustomize.py")
    assert lines[3] == os.path.join(REPO, "ddpwatch", "__init__.py")


def test_a_missing_ddpwatch_warns_once_per_process_tree_and_the_script_runs(tmp_path):
    python = bare_venv(tmp_path)
    empty = tmp_path / "empty"
    empty.mkdir()
    child = f"import subprocess; subprocess.run([{python!r}, '-c', 'print(2)'])"
    env = clean_env(DDPWATCH_AUTO="1", DDPWATCH_AUTO_HOME=str(empty), PYTHONPATH=boot_dir())
    out = run_python(python, f"print(1); {child}", env, tmp_path)
    assert out.returncode == 0 and out.stdout.split() == ["1", "2"], out
    assert out.stderr.count("ddpwatch:") == 1 and "Traceback" not in out.stderr, out.stderr
    assert "without them" in out.stderr


def test_the_pth_line_warns_once_where_ddpwatch_cannot_be_imported(tmp_path):
    python = bare_venv(tmp_path)
    purelib = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()"
                              "['purelib'])"], capture_output=True, text=True,
                             check=True).stdout.strip()
    with open(os.path.join(REPO, "ddpwatch", "rank", "ddpwatch-auto.pth")) as f:
        pth = f.read()
    with open(os.path.join(purelib, "ddpwatch-auto.pth"), "w") as f:
        f.write(pth)
    out = run_python(python, "print('trained')", clean_env(DDPWATCH_AUTO="1"), tmp_path)
    assert out.returncode == 0 and out.stdout == "trained\n", out
    assert out.stderr.count("ddpwatch:") == 1 and "Traceback" not in out.stderr, out.stderr
    quiet = run_python(python, "print('trained')", clean_env(), tmp_path)
    assert quiet.stderr == "" and quiet.stdout == "trained\n"


def test_pth_is_one_import_line():
    """site runs a .pth line only if it starts with `import`; any other line is a path."""
    with open(os.path.join(REPO, "ddpwatch", "rank", "ddpwatch-auto.pth")) as f:
        lines = [line for line in f.read().splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("import ")
    assert textwrap.dedent(lines[0]) == lines[0]


def test_a_rank_stopped_inside_a_collective_is_no_desync_peer(tmp_path):
    """Seen under exec with Lightning: SIGSTOP caught rank 1 inside its per-step
    broadcast (#N) while rank 0, past it, waited in the bucket all-reduce (#N+1).
    The saved trainer_stop history, rank 1's record moved into such a broadcast:
    rank 1 stopped culprit, rank 0 blocked (not a desync victim)."""
    import json

    from ddpwatch.judge import classify
    from ddpwatch.judge import rules as rules_mod
    from ddpwatch.observe.snapshot import load
    with open(os.path.join(REPO, "tests", "fixtures", "snapshots", "trainer_stop.json")) as f:
        history = json.load(f)
    for snap in history["history"]:
        records = {r["rank"]: r for r in snap["heartbeats"]["records"]}
        stopped, waiting = records[1], records[0]
        stopped.update(phase="inside", op="broadcast", outstanding=1,
                       collective_seq=waiting["collective_seq"] - 1,
                       entered_at=waiting["entered_at"] - 0.01,
                       updated_at=waiting["entered_at"] - 0.01)
    path = tmp_path / "stopped_in_broadcast.json"
    path.write_text(json.dumps(history))
    judgement = classify.judge(load(str(path)), rules_mod.load_default(None))
    got = {r.rank: (r.verdict, r.role) for r in judgement.ranks}
    assert got == {0: ("blocked_in_collective", "victim"), 1: ("stopped", "culprit")}, got
