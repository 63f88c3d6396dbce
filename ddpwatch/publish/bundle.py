"""The evidence of an incident, written once when it opens, before anything
(Gloo's timeout, torchrun) kills the job and the stacks are gone."""
from __future__ import annotations

import json
import os
import re
import shutil
import stat
import tempfile

from . import report
from ..observe import snapshot
from ..codec import to_json
from ..judge.classify import job_records
from ..heartbeat.layout import RECORD_SIZE
from ..heartbeat.paths import record_path


SAFE_NAME = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9_.-]{0,127}\Z")


def write_bundle(state_dir: str, incident, view, history, heartbeat_dirs: tuple[str, ...]) -> str:
    """state_dir/incidents/<id>/ (rewritten if the incident's judgement changes):
    report.json (verdicts, evidence), snapshots.json
    (everything observed: processes, sockets, stacks, heartbeat rings), records/
    (the ranks' raw heartbeat files, found in `heartbeat_dirs`). Returns the directory."""
    if not SAFE_NAME.match(incident.id):
        # ids are made by incidents.safe_name; anything else is a bug, not a path
        raise ValueError(f"incident id {incident.id!r} is not a safe directory name")
    root = os.path.join(state_dir, "incidents")
    os.makedirs(root, mode=0o700, exist_ok=True)
    if not stat.S_ISDIR(os.lstat(root).st_mode):  # a symlink planted there: not followed
        raise NotADirectoryError(f"{root} is not a directory")
    final = os.path.join(root, incident.id)
    work = tempfile.mkdtemp(prefix=".tmp-", dir=root)
    try:
        with open(os.path.join(work, "report.json"), "w") as f:
            json.dump({"incident": to_json(incident),
                       **report.as_json(view.judgement, view.last)}, f, indent=1)
        snapshot.save(list(history), os.path.join(work, "snapshots.json"))
        os.mkdir(os.path.join(work, "records"))
        for path in _record_files(view.last, heartbeat_dirs):
            _copy_record(path, os.path.join(work, "records"))
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


def _copy_record(path: str, into: str) -> None:
    """One record file, as the reader opens them: not through a symlink, a regular
    file, at most a record's size (a directory a rank names is that user's: what
    is there may have changed since it was read). A name taken already (the same
    file name in two directories) gets a suffix."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return
    with os.fdopen(fd, "rb") as src:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return
        data = src.read(RECORD_SIZE)
    target, n = os.path.join(into, os.path.basename(path)), 1
    while os.path.exists(target):
        n += 1
        target = os.path.join(into, f"{os.path.basename(path)}.{n}")
    with open(target, "xb") as dst:
        dst.write(data)


def _record_files(last, heartbeat_dirs) -> list[str]:
    """The files of the records the job was judged with (a peer's ranks' are on
    its node; an older record under a reused pid is not this job's)."""
    paths = (record_path(d, rec.rank, rec.pid) for rec, _ in job_records(last)
             for d in heartbeat_dirs)
    return [p for p in paths if os.path.exists(p)]
