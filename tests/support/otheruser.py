"""A python that another user (uid 65534, the unit's DynamicUser uid) can run,
with ddpwatch and its imports, whatever the checkout's location.

The checkout's own .venv/bin/python is no good for that: a checkout under
/root, or in a 0700 directory as `mktemp -d` makes it, is closed to other users,
and so is an interpreter under /root/.pyenv. So a world-readable directory under
/tmp holds a copy of the package, of the shipped rules (ddpwatch.resources finds
them beside the package) and of the installed distributions it imports (psutil,
PyYAML, prometheus-client, py-spy's binary), and the interpreter is the first of
these that the other user can run: this interpreter's base, the system's
python of the same minor version (the copied C extensions are built for it), or
else a copy of the base interpreter itself. Built once per test session.
"""
from __future__ import annotations

import atexit
import importlib.metadata
import os
import shutil
import subprocess
import sys
import tempfile

from conftest import REPO, need

NOBODY = 65534
# distributions whose files the package imports or runs (setup.cfg's install_requires)
DISTRIBUTIONS = ("psutil", "PyYAML", "prometheus-client", "py-spy")
MINOR = f"python{sys.version_info.major}.{sys.version_info.minor}"
# the system's interpreter of our minor version: one any user can run (jobs as
# uid 65534 that exec it again, as mp.spawn does, tests/diagnose/test_diagnose_node.py)
SYSTEM_PYTHON = f"/usr/bin/{MINOR}"
# parts of a standard library no test runs (a third of its size)
STDLIB_SKIP = ("site-packages", "dist-packages", "test", "idlelib", "tkinter", "turtledemo",
               "ensurepip", "lib2to3", "config-*")


class Runtime:
    """`argv(*args)`: a command line running `python *args` with the copy on its
    path, for any user."""

    def __init__(self, place: str, python: str, env: dict[str, str]):
        self.place, self.python, self.env = place, python, env

    def argv(self, *args: str) -> list[str]:
        # -s: no user site; -P (3.11+): no checkout directory (the cwd) in front
        # of the copy on sys.path
        flags = ["-s", "-P"] if sys.version_info >= (3, 11) else ["-s"]
        return ["env", *(f"{k}={v}" for k, v in self.env.items()), self.python, *flags, *args]


def as_user(uid: int, *argv: str) -> list[str]:
    """argv run as uid/gid `uid` with no supplementary groups (setpriv)."""
    return ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", *argv]


def _readable(path: str) -> None:
    """World-readable (and traversable, and executable where it was)."""
    for root, dirs, files in os.walk(path):
        os.chmod(root, 0o755)
        for name in files:
            full = os.path.join(root, name)
            if not os.path.islink(full):
                os.chmod(full, 0o755 if os.stat(full).st_mode & 0o100 else 0o644)


def _copy_distribution(name: str, place: str) -> None:
    """The files pip installed for distribution `name`: those in site-packages to
    `place`, its programs (../../bin/x in its RECORD) to `place`/bin."""
    dist = importlib.metadata.distribution(name)
    for file in dist.files or ():
        src = str(file.locate())
        if not os.path.isfile(src) or "__pycache__" in file.parts:
            continue
        if file.parts[0] == "..":
            if "bin" not in file.parts:
                continue
            dest = os.path.join(place, "bin", file.name)
        else:
            dest = os.path.join(place, *file.parts)
        os.makedirs(os.path.dirname(dest), exist_ok=True)
        shutil.copy2(src, dest)


def _copy_prefix(place: str) -> tuple[str, dict[str, str]]:
    """A copy of the base interpreter, its standard library and libpython."""
    prefix = os.path.join(place, "prefix")
    os.makedirs(os.path.join(prefix, "bin"))
    python = os.path.join(prefix, "bin", MINOR)
    shutil.copy2(os.path.join(sys.base_prefix, "bin", MINOR), python)
    shutil.copytree(os.path.join(sys.base_prefix, "lib", MINOR),
                    os.path.join(prefix, "lib", MINOR),
                    ignore=shutil.ignore_patterns(*STDLIB_SKIP, "__pycache__"))
    lib = os.path.join(sys.base_prefix, "lib")
    for name in os.listdir(lib):
        if name.startswith("libpython"):
            shutil.copy2(os.path.join(lib, name), os.path.join(prefix, "lib", name))
    return python, {"PYTHONHOME": prefix, "LD_LIBRARY_PATH": os.path.join(prefix, "lib")}


def _works(runtime: Runtime) -> bool:
    """Whether uid 65534 can start it and import what the tests run."""
    probe = "import ddpwatch.cli, ddpwatch.heartbeat.writer, psutil, yaml, prometheus_client"
    try:
        done = subprocess.run(as_user(NOBODY, *runtime.argv("-c", probe)), cwd=runtime.place,
                              capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0


def _candidates():
    yield os.path.join(sys.base_prefix, "bin", MINOR), {}
    for d in ("/usr/bin", "/usr/local/bin", "/bin"):
        yield os.path.join(d, MINOR), {}


_runtime: Runtime | None = None


_views: dict[str, str] = {}


def view_of(path: str) -> str:
    """`path` where another user can reach it, whatever the directories above it
    (a checkout in a 0700 directory, its .venv with torch inside): a read-only
    bind mount under a new world-traversable directory in /tmp, unmounted at exit.
    For what is too big to copy (torch's site-packages)."""
    need(os.geteuid() == 0, "needs root to bind-mount a directory for another user")
    if path in _views:
        return _views[path]
    place = tempfile.mkdtemp(prefix="ddpwatch-view-", dir="/tmp")
    os.chmod(place, 0o755)
    for cmd in (["mount", "--bind", path, place],
                ["mount", "-o", "remount,bind,ro", place]):
        done = subprocess.run(cmd, capture_output=True, text=True, check=False)
        need(done.returncode == 0, f"cannot bind-mount {path}: {done.stderr.strip()}")
    atexit.register(lambda: (subprocess.run(["umount", "-l", place], capture_output=True,
                                            check=False), os.rmdir(place)))
    _views[path] = place
    return place


def copy_readable(*files: str) -> str:
    """A new world-readable directory in /tmp holding copies of `files` (a job's
    scripts, for another user to run), removed at exit."""
    place = tempfile.mkdtemp(prefix="ddpwatch-scripts-", dir="/tmp")
    atexit.register(shutil.rmtree, place, ignore_errors=True)
    for f in files:
        shutil.copy(f, place)
    _readable(place)
    return place


def runtime(copy_interpreter: bool = False) -> Runtime:
    """The session's Runtime (built on first use; skips without root and setpriv).
    `copy_interpreter`: go straight to a copy of the interpreter (its own test)."""
    global _runtime
    need(os.geteuid() == 0 and shutil.which("setpriv") is not None,
         "needs root and setpriv (util-linux) to run a program as another user")
    if _runtime is not None and not copy_interpreter:
        return _runtime
    place = tempfile.mkdtemp(prefix="ddpwatch-otheruser-", dir="/tmp")
    atexit.register(shutil.rmtree, place, ignore_errors=True)
    for part in ("ddpwatch", "rules"):
        shutil.copytree(os.path.join(REPO, part), os.path.join(place, part),
                        ignore=shutil.ignore_patterns("__pycache__"))
    for name in DISTRIBUTIONS:
        _copy_distribution(name, place)
    env = {"PYTHONPATH": place,
           # py-spy: ddpwatch.observe.system.programs looks beside the interpreter, in the
           # system's directories, then on PATH
           "PATH": os.pathsep.join([os.path.join(place, "bin"), os.environ.get("PATH", "")]),
           "PYTHONDONTWRITEBYTECODE": "1"}
    _readable(place)
    tried = []
    if not copy_interpreter:
        for python, extra in _candidates():
            if os.path.isfile(python):
                found = Runtime(place, python, {**env, **extra})
                if _works(found):
                    _runtime = found
                    return found
                tried.append(python)
    python, extra = _copy_prefix(place)
    _readable(os.path.join(place, "prefix"))
    found = Runtime(place, python, {**env, **extra})
    assert _works(found), f"uid {NOBODY} can run none of {tried} nor a copy at {python}"
    if not copy_interpreter:
        _runtime = found
    return found
