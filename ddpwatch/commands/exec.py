"""`ddpwatch exec -- COMMAND...`: run a launch command with automatic heartbeats.

Replaces itself with COMMAND (exec: signals, exit status and the process tree
are the command's own), in an environment that turns automatic heartbeats on
for every Python process started under it, whatever launches the ranks
(torchrun, Lightning, mp.spawn, accelerate launch, srun, mpirun):
* DDPWATCH_AUTO=1, which the ddpwatch-auto.pth installed with the package acts on;
* ddpwatch/rank/boot first on PYTHONPATH: its sitecustomize.py does the same where
  the .pth is absent (the training runs in an environment without ddpwatch) and
  then runs the sitecustomize it hides;
* DDPWATCH_AUTO_HOME: where this ddpwatch package is, for that case.
ddpwatch/rank/autoboot.py says what happens in the processes. Imports no torch.
"""
from __future__ import annotations

import os

from .. import errors
from ..heartbeat.paths import ENV_DIR


class CommandNotFound(errors.DdpwatchError):
    exit_code = 127  # as env(1), nohup(1) and shells say it


class CommandNotExecutable(errors.DdpwatchError):
    exit_code = 126


_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def boot_dir() -> str:
    """ddpwatch/rank/boot, found by path: the command imports nothing of the rank side."""
    return os.path.join(_PACKAGE, "rank", "boot")


def package_home() -> str:
    return os.path.dirname(_PACKAGE)


def exec_env(environ: dict, directory: str | None = None) -> dict:
    """`environ` with automatic heartbeats turned on (pure, for tests)."""
    env = dict(environ)
    env["DDPWATCH_AUTO"] = "1"
    env["DDPWATCH_AUTO_HOME"] = package_home()
    boot = boot_dir()
    rest = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and p != boot]
    env["PYTHONPATH"] = os.pathsep.join([boot, *rest])
    if directory:
        env[ENV_DIR] = os.path.abspath(directory)
    return env


def main(args) -> int:
    command = list(args.launch)
    if command[:1] == ["--"]:
        command = command[1:]
    if not command:
        raise errors.UsageError("no command to run: ddpwatch exec -- torchrun "
                                "--nproc_per_node=2 train.py")
    env = exec_env(os.environ, args.dir)
    try:
        os.execvpe(command[0], command, env)
    except FileNotFoundError as err:
        raise CommandNotFound(f"{command[0]}: command not found") from err
    except PermissionError as err:
        raise CommandNotExecutable(f"{command[0]}: not executable ({err.strerror})") from err
    except OSError as err:
        raise CommandNotExecutable(f"{command[0]}: cannot run it ({err.strerror})") from err
    return errors.OK  # not reached: exec replaced this process
