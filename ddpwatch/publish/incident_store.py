"""Incidents kept in the state directory, so a daemon killed with SIGKILL and
started again resolves the incidents it had opened, under the same ids, and
pages no second time (incidents lived in memory only).

One JSON file, `<state_dir>/incidents.json`, replaced whole (written beside it
with O_EXCL|O_NOFOLLOW, fsynced, renamed over), so a kill mid-write leaves the
old one. Loading is total: a missing, corrupt, foreign (not ours, not a regular
file) or other-version file is reported and ignored, never a failed start.
"""
from __future__ import annotations

import json
import logging
import os
import stat

from ..codec import DecodeError, from_json, to_json
from .view import Incident

log = logging.getLogger("ddpwatch")

FILE = "incidents.json"
VERSION = 1
MAX_BYTES = 8 << 20  # a state file bigger than this is not one we wrote


def path_in(state_dir: str) -> str:
    return os.path.join(state_dir, FILE)


def save(state_dir: str, book_state: dict, sending: dict[str, str]) -> None:
    """Write the IncidentBook's state and what this node alerts for. Raises
    OSError (the caller's guard counts it and tries again next tick)."""
    os.makedirs(state_dir, mode=0o700, exist_ok=True)
    doc = {"ddpwatch_incidents": VERSION, "counter": book_state["counter"],
           "open": {k: to_json(i) for k, i in book_state["open"].items()},
           "resolved": [to_json(i) for i in book_state["resolved"]],
           "sending": dict(sending)}
    data = json.dumps(doc, indent=1).encode()
    final = path_in(state_dir)
    tmp = f"{final}.tmp-{os.getpid()}"
    try:
        os.unlink(tmp)  # a leftover of a killed write
    except FileNotFoundError:
        pass
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.rename(tmp, final)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def load(state_dir: str) -> tuple[int, dict[str, Incident], list[Incident], dict[str, str]]:
    """(counter, open incidents by job key, resolved ones, sending); empty when
    there is nothing usable, with a warning saying why."""
    empty = (0, {}, [], {})
    path = path_in(state_dir)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except FileNotFoundError:
        return empty
    except OSError as err:
        log.warning("%s: cannot open (%s); starting with no incidents", path, err.strerror)
        return empty
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid():
            log.warning("%s: not a regular file of ours (uid %d); ignored", path, st.st_uid)
            return empty
        with os.fdopen(os.dup(fd), "rb") as f:
            raw = f.read(MAX_BYTES + 1)
    except OSError as err:
        log.warning("%s: cannot read (%s); starting with no incidents", path, err.strerror)
        return empty
    finally:
        os.close(fd)
    try:
        return parse(raw, path)
    except ValueError as err:
        log.warning("%s; starting with no incidents", err)
        return empty


def parse(raw: bytes, path: str = FILE):
    """Pure: the file's bytes -> load()'s tuple; ValueError naming what is wrong."""
    if len(raw) > MAX_BYTES:
        raise ValueError(f"{path}: larger than {MAX_BYTES} bytes")
    try:
        doc = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ValueError(f"{path}: not JSON ({err})") from err
    if not isinstance(doc, dict) or doc.get("ddpwatch_incidents") != VERSION:
        raise ValueError(f"{path}: not a ddpwatch incidents file of version {VERSION}")
    try:
        counter = doc.get("counter", 0)
        if not isinstance(counter, int) or isinstance(counter, bool):
            raise DecodeError(f"$.counter: expected an integer, got {counter!r}")
        open_ = from_json(dict[str, Incident], doc.get("open", {}), "$.open")
        resolved = list(from_json(tuple[Incident, ...], doc.get("resolved", []), "$.resolved"))
        sending = from_json(dict[str, str], doc.get("sending", {}), "$.sending")
    except (DecodeError, TypeError) as err:
        raise ValueError(f"{path}: {err}") from err
    return counter, open_, resolved, sending


class Keeper:
    """Keeps a daemon's incidents (publish/incidents.py IncidentBook) and what its
    node alerts for (publish/alerts/route.py AlertRoute) in `state_dir`: takes
    them up at start (`resume`), saves them when they changed (`save`, each tick)."""

    def __init__(self, incidents, alert_route, failures: dict):
        self.incidents, self.alert_route, self.failures = incidents, alert_route, failures
        self._saved = None  # what was last saved (a mark of it)
        self._error = ""

    def resume(self, state_dir: str) -> None:
        """Take up the incidents a previous daemon left in `state_dir`."""
        counter, open_, resolved, sending = load(state_dir)
        open_ = {k: i for k, i in open_.items() if i.owner == k}  # ours, or not used
        self.incidents.restore(counter, open_, resolved)
        self.alert_route.resume({i: j for i, j in sending.items()
                                 if any(inc.id == i for inc in open_.values())})
        self._saved = self._mark()[2]  # nothing new to write yet
        if open_:
            log.warning("resumed %d open incident(s) from %s: %s", len(open_),
                        path_in(state_dir), ", ".join(sorted(i.id for i in open_.values())))

    def save(self, state_dir: str) -> None:
        """Save the incidents when they changed; a failure (a full disk, say) is
        counted in `failures["persist"]`, said once, and tried again next tick."""
        state, sending, mark = self._mark()
        if mark == self._saved:
            return
        try:
            save(state_dir, state, sending)
        except OSError as err:
            self.failures["persist"] += 1
            if str(err) != self._error:
                log.warning("incidents not saved to %s (%s); retried each tick", state_dir, err)
            self._error = str(err)
            return
        self._saved, self._error = mark, ""

    def _mark(self):
        state = self.incidents.state()
        sending = self.alert_route.sent_from_here()
        return state, sending, (state["counter"], tuple(sorted(state["open"].items())),
                                tuple(i.id for i in state["resolved"]),
                                tuple(sorted(sending.items())))
