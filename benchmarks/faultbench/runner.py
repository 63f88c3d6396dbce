"""One run of one scenario: start the real job, wait until the daemon judges it
training, inject the fault (checked reached), run the diagnoser at the stall,
watch the daemon's /status and pages until the ground truth's deadline, undo,
kill the job. Returns what was seen; score.py judges it."""
from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import time

from . import nodes
from .catalogue import Run
from .inject import Context, Injection, gone, inject, job_env
from .jobs import REPO, Job, expand, missing
from .logserver import LogServer
from .waiting import NotReached, free_port, wait_for
from .watch import BASE_CONFIG

DIAGNOSE = f"{shlex.quote(sys.executable)} -m ddpwatch diagnose --json {{pid}}"
SETTLE_S = 2.0     # after the state is reached, before the diagnoser looks
LINGER_S = 3.0     # after the first page: later pages of the same incident are counted
DURING_WINDOW_S = 4.0  # "during": the diagnoser's window, the fault in it
DURING_LEAD_S = 2.0  # "during", a diagnoser that runs no py-spy: its start to the fault


class Diagnosis:
    """The diagnoser run on a pid of the job: its command (a template with {pid})
    prints JSON with job.verdict and job.culprits (and ranks: rank, verdict, role),
    ddpwatch's shape (README "ddpwatch diagnose <pid>")."""

    def __init__(self, template: str, pid: int, hb_dir: str, extra: str = "",
                 prefix: tuple[str, ...] = ()):
        """`prefix`: a command that runs it elsewhere (nsenter into a namespace
        node, faultbench/nodes.py), `pid` as it is numbered there."""
        cmd = [*prefix, *shlex.split(template.format(pid=pid)), *shlex.split(extra)]
        self.began = time.monotonic()
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     text=True, cwd=REPO, start_new_session=True,
                                     env=dict(os.environ, PYTHONPATH=REPO, DDPWATCH_DIR=hb_dir))

    def sampling(self) -> bool:
        """Whether its window is open: ddpwatch diagnose runs py-spy at the window's
        first end (README "ddpwatch diagnose <pid>"), a child of its process."""
        try:
            with open(f"/proc/{self.proc.pid}/task/{self.proc.pid}/children") as f:
                kids = f.read().split()
        except OSError:
            return False
        for kid in kids:
            try:
                with open(f"/proc/{kid}/cmdline", "rb") as f:
                    if b"py-spy" in f.read():
                        return True
            except OSError:
                continue
        return False

    def result(self) -> dict:
        try:
            stdout, stderr = self.proc.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.communicate()
            return {"exit": None, "error": "timed out after 120 s"}
        out = {"exit": self.proc.returncode, "seconds": round(time.monotonic() - self.began, 2)}
        try:
            doc = json.loads(stdout)
        except ValueError:
            out["error"] = (stderr or stdout)[-300:].strip()
            return out
        job = doc.get("job", {})
        out.update(verdict=job.get("verdict"), culprits=sorted(job.get("culprits") or []),
                   summary=(job.get("summary") or "")[:300],
                   ranks={str(r.get("rank")): [r.get("verdict"), r.get("role"), r.get("rule")]
                          for r in doc.get("ranks", ())},
                   findings=sorted({f.get("id") for r in doc.get("ranks", ())
                                    for f in r.get("findings", ())}))
        return out


def _window_open(looker: Diagnosis) -> None:
    """Until the diagnoser's window is open (its first py-spy), so that the fault
    falls inside it; a diagnoser that runs no py-spy is given DURING_LEAD_S.
    Python's start on a loaded 2-core machine took longer than 0.5 s: a SIGKILL
    given then was over before ddpwatch diagnose first looked, and it named the
    victim that died next."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and looker.proc.poll() is None:
        if looker.sampling():
            return
        time.sleep(0.02)
    time.sleep(max(0.0, looker.began + DURING_LEAD_S - time.monotonic()))


def _trains(watch, job, nranks: int, since: float):
    """The daemon's entry for the job once it judges every rank healthy (in a
    reading since `since`)."""
    ranks = job.ranks()
    if len(ranks) < nranks:
        return None
    found = watch.job_of(ranks.values(), since)
    if not found:
        return None
    _, entry = found
    if entry["job"].get("verdict") == "healthy" and len(entry.get("ranks", ())) >= nranks \
            and all(r.get("verdict") == "healthy" for r in entry["ranks"]):
        return entry
    return None


def run(spec: Run, watch, workdir: str, diagnoser: str = DIAGNOSE,
        diagnose_extra: str = "") -> dict:
    result = {"name": spec.name, "scenario": spec.scenario, "class": spec.klass,
              "framework": spec.framework, "heartbeats": spec.heartbeats,
              "fault": spec.fault, "expected": spec.expect.as_json(), "where": spec.where,
              "known": spec.known}
    if spec.expect_diagnose:
        result["expected_diagnose"] = spec.expect_diagnose.as_json()
    why = missing(spec.needs)
    if why:
        result["skipped"] = why
        return result
    rundir = os.path.join(workdir, spec.name.replace("/", "_").replace("+", "_"))
    os.makedirs(rundir, exist_ok=True)
    pair = None
    if spec.nodes == 2:  # the pair's daemons start with the run's settings
        try:
            pair = nodes.Pair(spec, rundir, BASE_CONFIG)
        except nodes.Unavailable as err:
            result["skipped"] = str(err)
            return result
        except NotReached as err:
            result["error"] = f"{spec.where}: {err}"
            return result
        watch = pair.watch
    else:
        watch.configure(spec.daemon)

    logserver = LogServer() if any("{logport}" in a for a in spec.argv) else None

    def start(name):
        argv, env = expand(spec.argv, spec.env, free_port(), rundir,
                           logserver.port if logserver else 0)
        return Job(argv, {**env, **job_env(spec.fault)}, os.path.join(rundir, f"{name}.log"),
                   spec.announce, spec.heartbeats, watch.hb_dir)

    def looking(pid: int, extra: str = diagnose_extra) -> Diagnosis:
        """The diagnoser on `pid`; on a pair, inside the node of the expected culprit."""
        if pair is None:
            return Diagnosis(diagnoser, pid, watch.hb_dir, extra)
        prefix, ns_pid, hb_dir = pair.looker(job.ranks(), spec.expect.culprits)
        return Diagnosis(diagnoser, ns_pid, hb_dir, extra, prefix)
    job = pair.job if pair else start("job")
    injection = looker = None
    began = time.monotonic()
    try:
        nranks = int(spec.fault.get("ranks", 2))
        if not spec.trains:  # the fault is the job's start: a rank that never comes
            injection = Injection(job.started, (pair and pair.pre_fault)
                                  or "a rank that never came to the rendezvous")
            entry = wait_for(lambda: (watch.job_of(job.pids()) or (0, None))[1], 120,
                             "the daemon to see the job", job.output)
            result.update(key=entry["key"], injected=injection.what)
            time.sleep(max(0.0, injection.at + SETTLE_S - time.monotonic()))
            result["diagnose"] = dict(looking(job.launcher_pid).result(), when="after")
            result["daemon"] = _daemon_view(spec, watch, entry["key"], injection.at)
            result["watched_s"] = round(time.monotonic() - injection.at, 1)
            return result
        context = Context(lambda: start("twin"), rundir, logserver, pair)
        if spec.fault.get("at") == "start":
            # from the first step (a rank starved from its start): given once every
            # rank is up, before any trained; scored from then, the job never healthy
            ranks = wait_for(lambda: (lambda r: r if len(r) >= nranks else None)(job.ranks()),
                             240, "every rank up", job.output)
            injection = inject(spec.fault, job, ranks, context)
            wait_for(lambda: job.trained(nranks), 240, "every rank's first step", job.output)
            entry = wait_for(lambda: (watch.job_of(ranks.values()) or (0, None))[1], 120,
                             "the daemon to see the job", job.output)
            key = entry["key"]
        else:
            # training, by the job's own lines: the daemon said "healthy" of an mp.spawn
            # job still in DDP's constructor, and a fault given then was scored against
            # a job that had not started (diagnose: warming up, in
            # _verify_param_shape_across_processes)
            wait_for(lambda: job.trained(nranks), 240, "every rank's first step", job.output)
            stepped = time.monotonic()
            entry = wait_for(lambda: _trains(watch, job, nranks, stepped), 120,
                             "the job's ranks judged healthy by the daemon", job.output)
            key, ranks = entry["key"], job.ranks()
            result["trained_after_s"] = round(time.monotonic() - began, 1)
            if spec.diagnose == "during":
                # the launcher's pid: a death tears the ranks down in a second
                looker = looking(job.launcher_pid,
                                 diagnose_extra or f"--window {DURING_WINDOW_S:g}")
                _window_open(looker)
            injection = inject(spec.fault, job, ranks, context)
        t0 = injection.at
        result["injected"] = injection.what
        if spec.fault.get("at") == "start":
            # a fault from the start has no stall to settle: the person paged runs
            # diagnose then (a job still starting is judged starting, not slow)
            result["daemon"] = _daemon_view(spec, watch, key, t0)
        if looker is None:
            time.sleep(max(0.0, t0 + SETTLE_S - time.monotonic()))  # the stall settles
            live = [p for _, p in sorted(ranks.items()) if not gone(p)]
            looker = looking(live[0] if live else job.launcher_pid)
        result["diagnose"] = dict(looker.result(), when=spec.diagnose)
        if "daemon" not in result:
            result["daemon"] = _daemon_view(spec, watch, key, t0)
        result["watched_s"] = round(time.monotonic() - t0, 1)
    except NotReached as err:
        result["error"] = f"{spec.where}: {err}"
    finally:
        if looker and looker.proc.poll() is None:  # a fault never reached: not waited for
            looker.proc.kill()
            looker.proc.wait()
        if injection:
            injection.undo()
        job.close()
        if pair:
            pair.close()
        if logserver:
            logserver.close()
    return result


def _daemon_view(spec: Run, watch, key: str, t0: float) -> dict:
    """What the daemon said from the fault on: for a fault, until its first page
    (then LINGER_S more) or the deadline; for a negative, over watch_s."""
    if spec.expect.page:
        want = set(spec.expect.culprits)

        def paged():
            return watch.receiver.firing(key, t0)
        try:
            wait_for(paged, spec.within_s, "a page")
            time.sleep(LINGER_S)  # a second page of the same incident, if any, is counted
        except NotReached:
            pass
    else:
        time.sleep(spec.watch_s)  # a negative: the time watched is the measurement
        want = set()
    firing = watch.receiver.firing(key, t0)
    entries = watch.entries(key, t0)
    view = {"key": key, "pages": len(firing)}
    if firing:
        t, first = firing[0]
        view.update(time_to_page_s=round(t - t0, 2), verdict=first.get("verdict"),
                    culprits=sorted(first.get("culprits") or []),
                    summary=(first.get("summary") or "")[:300],
                    incidents=len({m.get("incident_id") for _, m in firing}),
                    pages_first_incident=sum(m.get("incident_id") == first.get("incident_id")
                                             for _, m in firing))
    named = next((t for t, e in entries if want and set(e["job"].get("culprits") or []) == want),
                 None)
    if named is not None:
        view["time_to_culprit_s"] = round(named - t0, 2)
    if entries:
        last = entries[-1][1]
        view["status_verdict"] = last["job"].get("verdict")
        view["status_culprits"] = sorted(last["job"].get("culprits") or [])
        view["status_roles"] = {str(r.get("rank")): [r.get("verdict"), r.get("role"),
                                                     r.get("rule")]
                                for r in last.get("ranks", ())}
        # every finding /status showed on any rank since the fault
        view["findings"] = sorted({f.get("id") for _, e in entries for r in e.get("ranks", ())
                                   for f in r.get("findings", ()) if isinstance(f, dict)})
    return view
