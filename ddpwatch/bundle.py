"""The evidence of an incident, written once when it opens, before anything
(Gloo's timeout, torchrun) kills the job and the stacks are gone."""
from __future__ import annotations

import json
import os
import shutil
import tempfile

from . import report, snapshot
from .codec import to_json
from .heartbeat.paths import default_dir, record_path


def write_bundle(state_dir: str, incident, view, history, heartbeat_dir: str | None) -> str:
    """state_dir/incidents/<id>/ (rewritten if the incident's judgement changes):
    report.json (verdicts, evidence), snapshots.json
    (everything observed: processes, sockets, stacks, heartbeat rings), records/
    (the ranks' raw heartbeat files). Returns the directory."""
    root = os.path.join(state_dir, "incidents")
    os.makedirs(root, mode=0o700, exist_ok=True)
    final = os.path.join(root, incident.id)
    work = tempfile.mkdtemp(prefix=".tmp-", dir=root)
    try:
        with open(os.path.join(work, "report.json"), "w") as f:
            json.dump({"incident": to_json(incident),
                       **report.as_json(view.judgement, view.last)}, f, indent=1)
        snapshot.save(list(history), os.path.join(work, "snapshots.json"))
        os.mkdir(os.path.join(work, "records"))
        hb = view.last.heartbeats
        # (a peer's rank's pid is another node's: it names no file here)
        pids = set(view.last.job.rank_pids) | {r.pid for r in view.judgement.ranks
                                               if not r.remote}
        for record_path in _record_files(hb, pids, heartbeat_dir):
            shutil.copy(record_path, os.path.join(work, "records"))
        with open(os.path.join(work, "report.txt"), "w") as f:
            f.write(report.as_text(view.judgement, view.last) + "\n")
        if os.path.isdir(final):  # the judgement changed: the newer evidence replaces it
            old = final + ".old"
            os.rename(final, old)
            os.rename(work, final)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.rename(work, final)  # appears whole or not at all
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    return final


def _record_files(hb, pids, heartbeat_dir) -> list[str]:
    if hb is None:
        return []
    directory = heartbeat_dir or default_dir()
    paths = (record_path(directory, rec.rank, rec.pid) for rec in hb.records if rec.pid in pids)
    return [p for p in paths if os.path.exists(p)]
