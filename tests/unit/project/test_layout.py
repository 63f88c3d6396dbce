"""The package's stages import one way (ddpwatch/*/__init__.py say what goes
where), and nothing the daemon or `diagnose` loads imports torch."""
from __future__ import annotations

import ast
import os
import subprocess
import sys

from conftest import REPO

PACKAGE = os.path.join(REPO, "ddpwatch")
# Lower numbers are lower stages. A module may import its own stage or lower ones;
# `rank` runs inside training processes and nothing in the watcher imports it.
STAGE = {"errors": 0, "codec": 0, "resources": 0, "yamlfile": 0, "": 0,
         "launchers": 0,  # the table of launchers: rank (inside a training process) and observe
         "signed": 0,     # signed requests between daemons and clients: observe, publish, commands
         "heartbeat": 1, "rank": 2,
         "observe": 3, "judge": 4, "publish": 5, "watch": 5,  # watch: a job over time
         "daemon": 6, "config": 6, "cli": 6, "__main__": 6, "sdnotify": 6, "port_guard": 6,
         "commands": 6,
         "preflight": 6}  # preflight: a command of its own, before any job
WATCHER = ("signed", "observe", "judge", "publish", "watch", "daemon", "config", "cli", "commands",
           "heartbeat",
           "preflight")


def modules():
    for dirpath, _, files in os.walk(PACKAGE):
        for name in files:
            if name.endswith(".py"):
                path = os.path.join(dirpath, name)
                rel = os.path.relpath(path, REPO)[:-3].replace(os.sep, ".")
                yield path, rel[:-9] if rel.endswith(".__init__") else rel


def stage_of(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def imports_of(path: str, module: str) -> list[tuple[int, str]]:
    """(line, absolute module) of every ddpwatch import, lazy ones too."""
    with open(path) as f:
        tree = ast.parse(f.read(), path)
    package = module if path.endswith("__init__.py") else module.rsplit(".", 1)[0]
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            names = [f"{target}.{a.name}" for a in node.names]
            found += [(node.lineno, n if _is_module(n) else target) for n in names]
        elif isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names]
    return [(line, m) for line, m in found if m == "ddpwatch" or m.startswith("ddpwatch.")
            or m.split(".")[0] == "torch"]


def _is_module(dotted: str) -> bool:
    path = os.path.join(REPO, *dotted.split("."))
    return os.path.isdir(path) or os.path.exists(path + ".py")


def test_stages_import_one_way():
    wrong = []
    for path, module in modules():
        mine = stage_of(module)
        for line, target in imports_of(path, module):
            where = f"{os.path.relpath(path, REPO)}:{line}"
            if target.split(".")[0] == "torch":
                if mine != "rank":
                    wrong.append(f"{where}: imports torch outside ddpwatch/rank")
                continue
            theirs = stage_of(target)
            if module == "ddpwatch" and theirs == "rank":
                continue  # `ddpwatch.instrument()`: the training script's entry, imported lazily
            if mine == "heartbeat" and theirs == "rank":
                wrong.append(f"{where}: heartbeat imports rank ({target})")
            elif mine in WATCHER and theirs == "rank":
                wrong.append(f"{where}: the watcher imports {target} (training-process code)")
            elif STAGE[theirs] > STAGE[mine]:
                wrong.append(f"{where}: {mine or 'ddpwatch'} imports the higher stage {target}")
    assert not wrong, "\n".join(wrong)


def test_every_module_has_a_stage():
    assert {stage_of(m) for _, m in modules()} <= set(STAGE)


def test_the_daemon_and_diagnose_never_import_torch():
    code = ("import sys, pkgutil, importlib, ddpwatch\n"
            "for m in pkgutil.walk_packages(ddpwatch.__path__, 'ddpwatch.'):\n"
            "    if not m.name.startswith('ddpwatch.rank') and m.name != 'ddpwatch.__main__':\n"
            "        importlib.import_module(m.name)\n"
            "from ddpwatch.cli import main\n"
            "rc = main(['diagnose', '--replay', sys.argv[1]])\n"
            "assert 'torch' not in sys.modules, 'torch was imported'\n"
            "print('judged', rc)\n")
    fixture = os.path.join(REPO, "tests", "fixtures", "snapshots", "trainer_stop.json")
    done = subprocess.run([sys.executable, "-c", code, fixture], capture_output=True, text=True,
                          env=dict(os.environ, PYTHONPATH=REPO), timeout=120)
    assert done.returncode == 0, done.stderr
    assert "judged 1" in done.stdout, done.stdout
