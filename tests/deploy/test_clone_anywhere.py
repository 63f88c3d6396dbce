"""The suite passes wherever the repository is cloned: in a directory named after
the project (`git clone .../ddpwatch` makes one, so every path of the checkout
holds the word "ddpwatch") whose parent is closed to other users (mode 0700, as
`mktemp -d` makes it and as /root is).

Seen on a fresh clone: the two-node tests never found their ranks (the daemon was
told from a rank by the word "ddpwatch" in its command line, and the ranks ran
.../ddpwatch/.venv/bin/python), and test_hostile_surface's fake rank, run as uid
65534 from the checkout's own interpreter, could not start. Both are run here,
for real, from such a clone of this checkout's HEAD (uncommitted changes are not
in it: what CI's clean clone holds).
"""
from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import sysconfig
import tempfile

from conftest import REPO, is_torchrun_agent, need, python_module, runs_module

# one real job of each kind: the bundled trainer on two namespace nodes (its ranks
# found by Node.rank_pids), and a fake rank of uid 65534's beside a daemon
INNER = ("tests/nodes/test_two_nodes.py::"
         "test_lone_views_of_node0_blame_a_rank_on_node1",
         "tests/hostile/test_hostile_surface.py::"
         "test_nan_in_a_users_record_never_reaches_status_json")
INNER_TIMEOUT_S = 170


def test_processes_are_told_by_the_module_they_run_never_a_word_of_their_path():
    venv = "/tmp/x/ddpwatch/.venv/bin/python"
    assert runs_module([venv, "-m", "trainer", "--steps=0"], "trainer")
    assert not runs_module([venv, "-m", "trainer"], "ddpwatch")
    assert runs_module([venv, "-u", "-X", "dev", "-m", "ddpwatch", "run", "--config", "c"],
                       "ddpwatch", "run")
    assert not runs_module([venv, "-m", "ddpwatch", "status"], "ddpwatch", "run")
    assert not runs_module([venv, "/src/ddpwatch/x.py", "-m", "ddpwatch"], "ddpwatch")
    assert not runs_module([venv, "-c", "pass", "-m", "ddpwatch"], "ddpwatch")
    assert python_module([venv, "-mddpwatch", "run"]) == ("ddpwatch", ["run"])
    assert is_torchrun_agent([venv, "-m", "torch.distributed.run", "--nnodes=2", "t.py"])
    assert is_torchrun_agent(["/v/bin/torchrun", "--nnodes=2", "t.py"])
    assert is_torchrun_agent([venv, "/v/bin/torchrun", "t.py"])
    assert not is_torchrun_agent(["/torchrun/.venv/bin/python", "-m", "trainer"])


def _git(*args: str, cwd: str = REPO) -> str:
    done = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, (args, done.stderr)
    return done.stdout.strip()


def _venv(clone: str) -> str:
    """The clone's .venv, made without downloading anything: this interpreter's
    packages (torch, psutil...) reached through a .pth file, the clone's root in
    front of them as `pip install -e .` would put it, its C hot path built in
    place, and the files `pip install` would add (ddpwatch-auto.pth, py-spy)."""
    venv = os.path.join(clone, ".venv")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", venv], check=True,
                   timeout=120)
    python = os.path.join(venv, "bin", "python")
    site = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                          capture_output=True, text=True, check=True).stdout.strip()
    ours = sysconfig.get_path("purelib")
    # site runs .pth files in name order: the clone before this venv's packages
    with open(os.path.join(site, "00-ddpwatch-clone.pth"), "w") as f:
        f.write(clone + "\n")
    with open(os.path.join(site, "10-outer-site-packages.pth"), "w") as f:
        f.write(ours + "\n")
    shutil.copy(os.path.join(clone, "ddpwatch", "rank", "ddpwatch-auto.pth"), site)
    py_spy = os.path.join(os.path.dirname(sys.executable), "py-spy")
    if os.path.exists(py_spy):
        os.symlink(os.path.realpath(py_spy), os.path.join(venv, "bin", "py-spy"))
    built = subprocess.run([python, "setup.py", "-q", "build_ext", "--inplace"], cwd=clone,
                           capture_output=True, text=True, timeout=300)
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
    return python


def test_real_jobs_pass_in_a_closed_clone_named_ddpwatch():
    need(os.geteuid() == 0, "needs root: namespace nodes, and a rank of uid 65534's")
    need(shutil.which("git") is not None, "git missing")
    need(subprocess.run(["git", "rev-parse", "--git-dir"], cwd=REPO,
                        capture_output=True).returncode == 0,
         "the checkout is not a git repository (an unpacked archive)")
    closed = tempfile.mkdtemp(prefix="clone-anywhere-")
    try:
        os.chmod(closed, 0o700)  # as mkdtemp made it, and as /root is
        clone = os.path.join(closed, "ddpwatch")
        _git("clone", "-q", "--no-hardlinks", "--no-checkout", REPO, clone)
        _git("checkout", "-q", "--detach", _git("rev-parse", "HEAD"), cwd=clone)
        python = _venv(clone)
        env = {k: v for k, v in os.environ.items()
               if k not in ("PYTHONPATH", "DDPWATCH_DIR", "DDPWATCH_AUTO", "VIRTUAL_ENV",
                            "PYTEST_ADDOPTS", "PYTEST_CURRENT_TEST")}
        # DDPWATCH_REQUIRE_ALL passes through: under .ci/run a skip in there fails
        log_path = os.path.join(closed, "pytest.log")
        with open(log_path, "wb") as log:
            inner = subprocess.Popen(
                [python, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider",
                 f"--basetemp={os.path.join(closed, 'pytest')}", *INNER],
                cwd=clone, env=env, stdout=log, stderr=subprocess.STDOUT)
            try:
                code = inner.wait(timeout=INNER_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                # Ctrl-C: its fixtures still kill their jobs and remove the nodes
                inner.send_signal(signal.SIGINT)
                try:
                    inner.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    inner.kill()
                    inner.wait()
                code = None
        with open(log_path, errors="replace") as f:
            out = f.read()
        assert code is not None, f"the clone's tests ran past {INNER_TIMEOUT_S} s:\n{out[-8000:]}"
        summary = out.strip().splitlines()[-1] if out.strip() else ""
        skipped = re.findall(r"^SKIPPED \[\d+\] (.*)$", out, re.M)
        if code == 0 and skipped:
            need(False, f"in the clone: {'; '.join(skipped)}")
        assert code == 0 and f"{len(INNER)} passed" in summary, out[-8000:]
    finally:
        shutil.rmtree(closed, ignore_errors=True)
