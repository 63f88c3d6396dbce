"""A non-editable wheel install works: console script, shipped rules, no torch."""
from __future__ import annotations

import glob
import os
import shutil
import subprocess
import sys
import zipfile

from conftest import REPO, need


# What a source tree needs to build (a copy, so no build/ left by another build is reused).
SOURCES = ("ddpwatch", "trainer", "rules", "systemd", "grafana", "setup.cfg", "setup.py",
           "pyproject.toml", "README.md")


def need_build_tools():
    try:
        import setuptools  # noqa: F401
        import wheel  # noqa: F401
    except ImportError:
        need(False, "setuptools and wheel are needed to build the wheel (pip install -e '.[test]')")


def build_wheel_into_venv(tmp_path, env=None) -> tuple[list[str], str]:
    """Build a wheel from a copy of the sources and install it into a fresh venv
    that sees the installed dependencies (psutil, PyYAML...) but not this checkout.
    Returns the wheel's file names and the venv's python."""
    src = tmp_path / "src"
    ignore = shutil.ignore_patterns("__pycache__", "*.so", "*.egg-info", "build")
    for name in SOURCES:
        if os.path.isdir(os.path.join(REPO, name)):
            shutil.copytree(os.path.join(REPO, name), src / name, ignore=ignore)
        else:
            shutil.copy(os.path.join(REPO, name), src / name)
    # --no-build-isolation: build with what is installed, so the test downloads nothing
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps",
                            "--no-build-isolation", "-w", str(tmp_path / "dist"), str(src)],
                           timeout=300, cwd=str(tmp_path), capture_output=True, text=True,
                           env=dict(os.environ, **(env or {})))
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
    (wheel_path,) = glob.glob(str(tmp_path / "dist" / "ddpwatch-*.whl"))
    venv = tmp_path / "venv"
    # A venv of its own: the base interpreter's site-packages (--system-site-packages)
    # hold no psutil on a fresh machine. Its dependencies come from where
    # pip takes them for this checkout (its configured index and wheel directory,
    # its cache), as dev.sh installed them.
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    py = str(venv / "bin" / "python")
    # Without PYTHONPATH: a source tree on it (its egg-info) makes pip say "already
    # satisfied" and install nothing.
    clean = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    installed = subprocess.run([py, "-m", "pip", "install", "-q", "--only-binary=:all:",
                                wheel_path], timeout=600, env=clean, capture_output=True,
                               text=True)
    assert installed.returncode == 0, installed.stdout[-3000:] + installed.stderr[-3000:]
    return zipfile.ZipFile(wheel_path).namelist(), py


def test_wheel_installs_into_a_fresh_venv_and_runs(tmp_path):
    need_build_tools()
    need(shutil.which("cc") or shutil.which("gcc"), "no C compiler: the wheel would be pure Python")
    names, py = build_wheel_into_venv(tmp_path)
    venv = tmp_path / "venv"
    assert any(n.endswith("data/data/share/ddpwatch/rules/default.yaml") for n in names), names
    assert any(n.startswith("trainer/") for n in names)
    assert any(n.startswith("ddpwatch/heartbeat/_hotpath") and n.endswith(".so") for n in names), names
    # automatic heartbeats: the .pth at the wheel's root, exec's sitecustomize in the package
    assert "ddpwatch-auto.pth" in names and "ddpwatch/rank/boot/sitecustomize.py" in names, names
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "DDPWATCH_PURE_PYTHON")
           and not k.startswith("DDPWATCH_AUTO")}
    auto = subprocess.run([py, "-c", "import sys; m = sys.modules.get('ddpwatch.rank.autoboot'); "
                           "print(m and m.__file__); assert 'torch' not in sys.modules"],
                          capture_output=True, text=True, env=dict(env, DDPWATCH_AUTO="1"),
                          cwd=str(tmp_path))
    assert auto.returncode == 0 and str(venv) in auto.stdout and not auto.stderr, auto
    hot = subprocess.run([py, "-c", "from ddpwatch.heartbeat import _hotpath; "
                          "from ddpwatch.heartbeat.writer import core_class; "
                          "assert core_class() is _hotpath.Core; print(_hotpath.__file__)"],
                         capture_output=True, text=True, env=env, cwd=str(tmp_path))
    assert hot.returncode == 0 and str(venv) in hot.stdout, hot.stderr
    where = subprocess.run([py, "-c", "import ddpwatch, sys; print(ddpwatch.__file__); "
                            "import ddpwatch.cli, ddpwatch.commands.diagnose; "
                            "assert 'torch' not in sys.modules"],
                           capture_output=True, text=True, env=env, cwd=str(tmp_path), check=True)
    assert str(venv) in where.stdout, where.stdout
    check = subprocess.run([str(venv / "bin" / "ddpwatch"), "rules", "check"],
                           capture_output=True, text=True, env=env, cwd=str(tmp_path))
    assert check.returncode == 0, check.stderr
    assert str(venv / "share" / "ddpwatch" / "rules" / "default.yaml") in check.stdout
    ranks = subprocess.run([str(venv / "bin" / "ddpwatch"), "ranks", "--dir", str(tmp_path)],
                           capture_output=True, text=True, env=env, cwd=str(tmp_path))
    assert ranks.returncode == 0 and "no ranks found" in ranks.stdout


def test_without_a_compiler_the_wheel_is_pure_python_and_writes_records(tmp_path):
    """setup.py marks the C hot path optional: a failed compile must not fail the
    install, and the Python core must then write the records."""
    need_build_tools()
    names, py = build_wheel_into_venv(tmp_path, env={"CC": "false"})
    assert not any(n.endswith(".so") for n in names), names
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "DDPWATCH_PURE_PYTHON")}
    script = ("import sys; from ddpwatch.heartbeat import open_writer, read_dir; "
              "from ddpwatch.heartbeat.writer import PyCore; "
              "w = open_writer(sys.argv[1], rank=0); assert type(w.core) is PyCore; "
              "w.exit(w.enter(1, 4)); w.step(8); (r,), _ = read_dir(sys.argv[1]); "
              "assert (r.collectives_completed, r.tokens) == (1, 8), r")
    run = subprocess.run([py, "-c", script, str(tmp_path / "hb")], capture_output=True,
                         text=True, env=env, cwd=str(tmp_path))
    assert run.returncode == 0, run.stderr
