"""A one-node SLURM cluster on this host for launcher tests: slurmctld
and slurmd of the Debian package slurm-wlm, on ports picked at run time, with
their state in a temporary directory, so `srun -n 2 python script.py` starts
real SLURM tasks (children of slurmstepd, numbered by SLURM_PROCID).

No munge: auth/none and cred/none, which is fine for a cluster that only
listens on 127.0.0.1 for the length of a test module."""
from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time

import psutil

from conftest import free_port, need, wait_until

TOOLS = ("slurmctld", "slurmd", "srun", "sinfo", "scancel")
NODE = "dwnode"


class Slurm:
    def __init__(self, root, extra_config: tuple[str, ...] = ()):
        """`extra_config`: more slurm.conf lines, e.g. a TaskProlog
        (tests/deploy/test_deploy.py)."""
        need(os.geteuid() == 0 and all(shutil.which(t) for t in TOOLS),
             "needs root and SLURM's slurmctld, slurmd and srun (Debian package slurm-wlm)")
        self.root = str(root)
        for sub in ("state", "spool"):
            os.makedirs(os.path.join(self.root, sub), exist_ok=True)
        self.conf = os.path.join(self.root, "slurm.conf")
        with open(self.conf, "w") as f:
            f.write(self._config(socket.gethostname()) + "".join(
                line + "\n" for line in extra_config))
        self.env = dict(os.environ, SLURM_CONF=self.conf)
        self.daemons = []
        try:
            for argv in (["slurmctld", "-D", "-f", self.conf],
                         ["slurmd", "-D", "-N", NODE, "-f", self.conf]):
                log = open(os.path.join(self.root, f"{argv[0]}.out"), "wb")
                self.daemons.append(subprocess.Popen(
                    argv, env=self.env, stdout=log, stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL, start_new_session=True))
            wait_until(self._idle, 60, interval=0.5,
                       what=f"the SLURM node idle (logs in {self.root})")
        except BaseException:
            self.close()
            raise

    def _config(self, hostname: str) -> str:
        r = self.root
        return "\n".join([
            "ClusterName=ddpwatch", f"SlurmctldHost={hostname}(127.0.0.1)",
            f"SlurmctldPort={free_port()}", f"SlurmdPort={free_port()}",
            "AuthType=auth/none", "CredType=cred/none", "SlurmUser=root", "SlurmdUser=root",
            f"StateSaveLocation={r}/state", f"SlurmdSpoolDir={r}/spool",
            f"SlurmctldPidFile={r}/slurmctld.pid", f"SlurmdPidFile={r}/slurmd.pid",
            f"SlurmctldLogFile={r}/slurmctld.log", f"SlurmdLogFile={r}/slurmd.log",
            # tasks in the step's process group; no cgroups of SLURM's own beside ours
            "ProctrackType=proctrack/pgid", "TaskPlugin=task/none",
            "SelectType=select/cons_tres", "SelectTypeParameters=CR_Core",
            "SchedulerType=sched/builtin", "MpiDefault=none", "ReturnToService=2",
            "JobCompType=jobcomp/none", "AccountingStorageType=accounting_storage/none",
            f"NodeName={NODE} NodeHostname={hostname} NodeAddr=127.0.0.1 CPUs=2 State=UNKNOWN",
            f"PartitionName=dw Nodes={NODE} Default=YES MaxTime=INFINITE State=UP "
            "OverSubscribe=FORCE:4", ""])

    def _idle(self) -> bool:
        out = subprocess.run(["sinfo", "-h", "-o", "%t"], env=self.env, capture_output=True,
                             text=True, timeout=30, check=False).stdout.split()
        return out == ["idle"]

    def cancel_all(self) -> None:
        subprocess.run(["scancel", "--full", "--user=root"], env=self.env,
                       capture_output=True, timeout=30, check=False)

    def steps(self) -> list[psutil.Process]:
        """This cluster's slurmstepd processes (each writes to the slurmd log here):
        a step whose slurmd is gone lingers, retrying, so none may outlive close()."""
        mine = []
        for proc in psutil.process_iter(["name"]):
            try:
                if proc.info["name"] == "slurmstepd" and any(
                        f.path.startswith(self.root + os.sep) for f in proc.open_files()):
                    mine.append(proc)
            except psutil.Error:
                continue
        return mine

    def close(self) -> None:
        if self.daemons:
            self.cancel_all()
            deadline = time.monotonic() + 15  # the steps end once their tasks have
            while self.steps() and time.monotonic() < deadline:
                time.sleep(0.5)
            for proc in self.steps():
                try:
                    proc.kill()
                except psutil.Error:
                    pass
        for proc in self.daemons:
            proc.terminate()
        for proc in self.daemons:
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(30)
