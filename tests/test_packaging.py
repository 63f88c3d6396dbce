"""A non-editable wheel install works: console script, shipped rules, no torch."""
from __future__ import annotations

import glob
import os
import subprocess
import sys
import zipfile

from conftest import REPO, need


def test_wheel_installs_into_a_fresh_venv_and_runs(tmp_path):
    try:
        import setuptools  # noqa: F401
        import wheel  # noqa: F401
    except ImportError:
        need(False, "setuptools and wheel are needed to build the wheel (pip install -e '.[test]')")
    # --no-build-isolation: build with what is installed, so the test downloads nothing
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                    "-q", "-w", str(tmp_path / "dist"), REPO], check=True, timeout=300,
                   cwd=str(tmp_path))
    (wheel_path,) = glob.glob(str(tmp_path / "dist" / "ddpwatch-*.whl"))
    names = zipfile.ZipFile(wheel_path).namelist()
    assert any(n.endswith("data/data/share/ddpwatch/rules/default.yaml") for n in names), names
    assert any(n.startswith("trainer/") for n in names)
    # A fresh venv that sees the already-installed dependencies (psutil, PyYAML...)
    # but not this checkout: the wheel must bring everything of its own.
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)],
                   check=True, timeout=300)
    py = str(venv / "bin" / "python")
    subprocess.run([py, "-m", "pip", "install", "-q", "--no-deps", "--no-index", wheel_path],
                   check=True, timeout=300)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH",)}
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
