"""The evidence of an incident, written once when it opens, before anything
(Gloo's timeout, torchrun) kills the job and the stacks are gone."""
from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import re
import shutil
import stat
import tempfile

from . import page, report
from ..observe import snapshot
from ..codec import read_json_file, to_json
from ..errors import DdpwatchError, NO_INPUT
from ..heartbeat.layout import RECORD_SIZE
from ..heartbeat.paths import record_path

log = logging.getLogger("ddpwatch")


SAFE_NAME = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9_.-]{0,127}\Z")


def write_bundle(state_dir: str, incident, view, history, heartbeat_dirs: tuple[str, ...]) -> str:
    """state_dir/incidents/<id>/ (rewritten if the incident's judgement changes):
    report.json (verdicts, evidence), snapshots.json
    (everything observed: processes, sockets, stacks, heartbeat rings), records/
    (the ranks' raw heartbeat files, found in `heartbeat_dirs`), report.html (the
    page, publish/page.py). Returns the directory."""
    if not SAFE_NAME.match(incident.id):
        # ids are made by incidents.safe_name; anything else is a bug, not a path
        raise ValueError(f"incident id {incident.id!r} is not a safe directory name")
    root = os.path.join(state_dir, "incidents")
    os.makedirs(root, mode=0o700, exist_ok=True)
    if not stat.S_ISDIR(os.lstat(root).st_mode):  # a symlink planted there: not followed
        raise NotADirectoryError(f"{root} is not a directory")
    final = os.path.join(root, dir_name(incident.id))
    incident = dataclasses.replace(incident, bundle=final)
    work = tempfile.mkdtemp(prefix=".tmp-", dir=root)
    try:
        doc = {"incident": to_json(incident), **report.as_json(view.judgement, view.last)}
        over = report.over_time_json(getattr(view, "over_time", None), full=True)
        if over:
            doc["over_time"] = over  # the verdicts before the stall, time by state
        with open(os.path.join(work, "report.json"), "w") as f:
            json.dump(doc, f, indent=1)
        # with the signals over time its ranks were judged with (watch/overtime.py):
        # `report --replay` and `diagnose --replay` of it judge what was judged
        snapshot.save(list(history), os.path.join(work, "snapshots.json"),
                      over=getattr(getattr(view, "over_time", None), "signals", None))
        _write_page(os.path.join(work, PAGE), doc, tuple(history))
        os.mkdir(os.path.join(work, "records"))
        for path in _record_files(view.judgement.records, heartbeat_dirs):
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


PAGE = "report.html"


def _write_page(path: str, doc: dict, history: tuple) -> None:
    """The page is drawn from the evidence; a failure to draw it must not cost
    the evidence itself (the rest of the bundle is written all the same)."""
    try:
        html = page.render(doc, history, doc["incident"])
    except Exception:
        log.exception("incident %s: drawing its page failed; the bundle is written without "
                      "it (`ddpwatch report` draws it again)", doc["incident"]["id"])
        return
    with open(path, "w") as f:
        f.write(html)


def dir_name(incident_id: str) -> str:
    """The bundle directory's name: the id holds the job key, which holds the
    ranks' run id (a claim: "../x" must not leave state_dir). Other characters
    than [A-Za-z0-9._:-] become "_", with a digest of the id so two ids that
    differ only there do not share a directory."""
    safe = re.sub(r"[^A-Za-z0-9._:-]", "_", incident_id)[:120].lstrip(".") or "_"
    if safe == incident_id:
        return safe
    return f"{safe}-{hashlib.sha256(incident_id.encode()).hexdigest()[:8]}"


def prune(state_dir: str, max_age_s: float, max_bytes: int, keep: frozenset[str],
          now: float) -> dict[str, int]:
    """Remove bundles under state_dir/incidents/: those older than `max_age_s`
    (by their newest write), then the oldest while all of them hold more than
    `max_bytes`; never one in `keep` (the open incidents' directories).
    Work directories a crashed write left (".tmp-*", ".old") go after an hour.
    Nothing is followed through a link. Returns {"age": n, "size": n} removed."""
    root = os.path.join(state_dir, "incidents")
    removed = {"age": 0, "size": 0}
    try:
        if not stat.S_ISDIR(os.lstat(root).st_mode):
            return removed
        names = os.listdir(root)
    except OSError:  # none yet
        return removed
    kept = {os.path.realpath(k) for k in keep}
    bundles = []  # (newest write, bytes, path)
    for name in names:
        path = os.path.join(root, name)
        try:
            st = os.lstat(path)
        except OSError:
            continue
        if not stat.S_ISDIR(st.st_mode) or os.path.realpath(path) in kept:
            continue
        newest, size = _measure(path, st)
        leftover = name.startswith(".tmp-") or name.endswith(".old")
        if now - newest > (3600.0 if leftover else max_age_s):
            shutil.rmtree(path, ignore_errors=True)
            removed["age"] += 1
        else:
            bundles.append((newest, size, path))
    total = sum(size for _, size, _ in bundles) + sum(
        _measure(k, os.lstat(k))[1] for k in kept if os.path.isdir(k))
    for _, size, path in sorted(bundles):
        if total <= max_bytes:
            break
        shutil.rmtree(path, ignore_errors=True)
        removed["size"] += 1
        total -= size
    return removed


def _measure(path: str, st) -> tuple[float, int]:
    """(newest mtime, bytes) of a bundle directory and the files in it, one level
    down (records/); links are not followed."""
    newest, size = st.st_mtime, 0
    stack = [path]
    for depth in range(3):
        below = []
        for directory in stack:
            try:
                entries = list(os.scandir(directory))
            except OSError:
                continue
            for entry in entries:
                try:
                    est = entry.stat(follow_symlinks=False)
                except OSError:
                    continue
                newest = max(newest, est.st_mtime)
                size += est.st_size
                if entry.is_dir(follow_symlinks=False):
                    below.append(entry.path)
        stack = below
    return newest, size


class BundleError(DdpwatchError):
    """A directory that is not a readable incident bundle."""
    exit_code = NO_INPUT


def read(bundle_dir: str) -> tuple[dict, tuple]:
    """(report.json's document, the snapshot history) of a bundle."""
    if not os.path.isdir(bundle_dir):
        raise BundleError(f"{bundle_dir}: not a directory (an incident bundle is "
                          f"<state_dir>/incidents/<id>/)")
    path = os.path.join(bundle_dir, "report.json")
    doc = read_json_file(path, BundleError, " (not an incident bundle?)")
    if not isinstance(doc, dict) or not isinstance(doc.get("job"), dict) \
            or not isinstance(doc.get("ranks"), list):
        raise BundleError(f"{path}: not a ddpwatch report (no 'job' and 'ranks')")
    try:
        history = snapshot.load(os.path.join(bundle_dir, "snapshots.json"))
    except snapshot.SnapshotFileError as err:
        raise BundleError(str(err)) from err
    return doc, history


def render_page(bundle_dir: str, incident=None, evidence_base: str = "") -> str:
    """The bundle's page drawn again; `incident` (an Incident) replaces the one
    the bundle was written with (its state now: resolved, say)."""
    doc, history = read(bundle_dir)
    if incident is not None:
        doc = {**doc, "incident": to_json(incident)}
    return page.render(doc, history, doc.get("incident"), evidence_base)


def rewrite_page(bundle_dir: str, incident) -> str:
    """The incident changed state (resolved): report.json and report.html say so.
    Each file is replaced whole (rename), so a reader never sees half of one."""
    doc, history = read(bundle_dir)
    doc = {**doc, "incident": to_json(dataclasses.replace(incident, bundle=bundle_dir))}
    _replace(os.path.join(bundle_dir, "report.json"), json.dumps(doc, indent=1))
    path = os.path.join(bundle_dir, PAGE)
    _replace(path, page.render(doc, history, doc["incident"]))
    return path


def _replace(path: str, text: str) -> None:
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=os.path.dirname(path))
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


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


def _record_files(records, heartbeat_dirs) -> list[str]:
    """The files of the records the job was judged with (a peer's ranks' are on
    its node; an older record under a reused pid is not this job's)."""
    paths = (record_path(d, rec.rank, rec.pid) for rec, _ in records
             for d in heartbeat_dirs)
    return [p for p in paths if os.path.exists(p)]
