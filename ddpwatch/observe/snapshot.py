"""One frozen value per tick: everything the probes saw, with monotonic times.

Snapshots are saved as JSON (`diagnose --save-snapshot`) and replayed
(`diagnose --replay`), so the classifier is testable without processes.
"""
from __future__ import annotations

import json
from dataclasses import dataclass

from .. import codec
from ..errors import DdpwatchError
from .jobs.job import Job
from .window.duty import Duty
from .probes import ProbeResult
from .probes.competitors import Competitors
from .probes.exits import Exits
from .probes.heartbeats import HeartbeatObs
from .probes.host import Host
from .probes.nshost import NsViews
from .probes.process import Processes
from .probes.sockets import Sockets
from .probes.stacks import Stacks
from .probes.traffic import Traffic

SNAPSHOT_VERSION = 1


@dataclass(frozen=True)
class ProbeStatus:
    name: str
    ok: bool
    duration_s: float
    error: str = ""


@dataclass(frozen=True)
class Snapshot:
    version: int
    taken_at: float                # monotonic seconds
    wall_time: float               # unix time, for people only
    job: Job
    processes: Processes | None
    sockets: Sockets | None
    stacks: Stacks | None
    host: Host | None
    heartbeats: HeartbeatObs | None
    probes: tuple[ProbeStatus, ...]
    traffic: Traffic | None = None  # connection attempts on the wire (root only)
    duty: Duty | None = None  # the ranks' states read many times over the window (duty.py)
    exits: Exits | None = None  # how the job's ranks and launcher ended (probes/exits.py)
    competitors: Competitors | None = None  # others running on the ranks' CPUs (DETAIL)
    # stack dumps taken inside the window this snapshot ends, before its own
    # `stacks` (diagnose: observe/window/window_stacks.py); () in older snapshots
    window_stacks: tuple[Stacks, ...] = ()
    # the ranks' own hostname, hosts file and interfaces where their namespaces are
    # not the watcher's (probes/nshost.py); None: not looked (older snapshots)
    ns_hosts: NsViews | None = None
    # an earlier look of the watcher saw these very ranks past their start (a
    # backward pass with every rank connected, heartbeats past the first steps,
    # or older than judge/signals/window.STARTING_S): watch/job.py remembers it
    # for the looks that read no stacks
    seen_training: bool = False


def status_of(result: ProbeResult) -> ProbeStatus:
    return ProbeStatus(result.name, result.ok, round(result.duration_s, 4), result.error)


class SnapshotFileError(DdpwatchError):
    exit_code = 2


def save(history: list[Snapshot] | tuple[Snapshot, ...], path: str,
         remote: tuple[dict, ...] = (), over: dict | None = None) -> None:
    """`remote`: the signals of the job's ranks on other nodes that the judgement
    used (diagnose --peer); `over`: the signals over time the daemon's watch gave
    its ranks (RankVerdict.key -> signals: watch/overtime.py). Kept so that a
    replay judges what was judged."""
    doc = {"ddpwatch_snapshots": SNAPSHOT_VERSION, "history": [codec.to_json(s) for s in history]}
    if remote:
        doc["remote"] = [dict(r) for r in remote]
    if over:
        doc["over_time"] = [{"remote": remote_, "host": host, "pid": pid, "signals": dict(sig)}
                            for (remote_, host, pid), sig in over.items()]
    with open(path, "w") as f:
        json.dump(doc, f, indent=1)


def _scalars(d) -> bool:
    return isinstance(d, dict) and all(v is None or isinstance(v, (int, float, str, bool))
                                       for v in d.values())


def load_remote(path: str) -> tuple[dict, ...]:
    """The peers' rank signals saved beside a history (save's `remote`), () if none."""
    data = codec.read_json_file(path, SnapshotFileError)
    remote = data.get("remote", []) if isinstance(data, dict) else []
    if not isinstance(remote, list) or not all(_scalars(r) for r in remote):
        raise SnapshotFileError(f"{path}: 'remote' is not a list of rank signals")
    return tuple(remote)


def load_over_time(path: str) -> dict[tuple, dict]:
    """The signals over time saved beside a history (save's `over`), by rank key
    (remote, host, pid); {} if none."""
    data = codec.read_json_file(path, SnapshotFileError)
    rows = data.get("over_time", []) if isinstance(data, dict) else []
    if not isinstance(rows, list) or not all(
            isinstance(r, dict) and isinstance(r.get("pid"), int)
            and isinstance(r.get("host", ""), str) and isinstance(r.get("remote", False), bool)
            and _scalars(r.get("signals")) for r in rows):
        raise SnapshotFileError(f"{path}: 'over_time' is not a list of {{pid, host, remote, "
                                f"signals}} of ranks")
    return {(r.get("remote", False), r.get("host", ""), r["pid"]): dict(r["signals"])
            for r in rows}


def load(path: str) -> tuple[Snapshot, ...]:
    """Read a saved history; errors name the file and the JSON path."""
    data = codec.read_json_file(path, SnapshotFileError)
    if not isinstance(data, dict) or data.get("ddpwatch_snapshots") != SNAPSHOT_VERSION:
        raise SnapshotFileError(f"{path}: not a ddpwatch snapshot file of version "
                                f"{SNAPSHOT_VERSION}")
    try:
        return tuple(codec.from_json(Snapshot, s, f"history[{i}]")
                     for i, s in enumerate(data["history"]))
    except codec.DecodeError as err:
        raise SnapshotFileError(f"{path}: {err}") from err
