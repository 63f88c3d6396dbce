"""A bounded look at record directories other users fill.

The daemon reads, every second and as root, directories whose owners may put
anything in them: 20 000 junk `.hb` files took its tick from 0.04 s to 0.5 s.
So a scan here costs a bounded amount whatever a directory holds:

* a directory's listing is reused while the directory itself is unchanged
  (its mtime moves with every create, remove and rename in it);
* at most MAX_FILES_PER_DIR files of one directory and MAX_READS_PER_TICK
  record reads in all are looked at per scan; files named for a live pid
  (`rank<r>-pid<p>.hb`, p running) come first, so junk cannot push a running
  rank's record out;
* a file already refused for good (garbage, wrong layout, another uid, a
  non-regular file) is not read again while its identity (inode, size, mtime,
  ctime) stays the same. A record being created (size 0, or a header still
  all zeros: the writer truncates, then maps and fills it, which leaves mtime
  alone) is never remembered as refused: it is read again next time.

What was left out is said, as a Skipped per directory, never silently.
"""
from __future__ import annotations

import os
import re
import stat
from dataclasses import dataclass, field
from typing import AbstractSet

from . import layout
from .reader import Skipped, read_file

MAX_FILES_PER_DIR = 512
MAX_READS_PER_TICK = 1024
NAME = re.compile(r"rank(-?\d{1,9})-pid(\d{1,9})" + re.escape(layout.FILE_SUFFIX) + r"\Z")
# Reasons a file stays refused while it is unchanged: the bytes are not, and will
# not become, a record of this reader's (a writer rewrites by creating anew).
_FINAL = ("not a ddpwatch heartbeat record", "layout version", "truncated",
          "record claims uid", "not a regular file", "unreadable record", "field ")


@dataclass
class ScanState:
    """What a caller scanning every tick keeps between scans."""
    listings: dict = field(default_factory=dict)   # dir -> (dir identity, Listing)
    refused: dict = field(default_factory=dict)    # path -> (file identity, Skipped)


def identity(st: os.stat_result) -> tuple:
    return (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


@dataclass(frozen=True)
class Listing:
    """A directory's record file names, sorted, each with the pid its name
    gives (None if it is not named like a record): parsed once per listing."""
    names: tuple[str, ...] = ()
    pids: tuple[int | None, ...] = ()


def _pid(name: str) -> int | None:
    m = NAME.match(name)
    return int(m.group(2)) if m else None


def _names(directory: str, state: ScanState | None) -> Listing:
    try:
        st = os.stat(directory)
    except OSError:
        return Listing()
    if not stat.S_ISDIR(st.st_mode):
        return Listing()
    key = identity(st)
    if state is not None:
        cached = state.listings.get(directory)
        if cached is not None and cached[0] == key:
            return cached[1]
    try:
        names = tuple(sorted(n for n in os.listdir(directory) if n.endswith(layout.FILE_SUFFIX)))
    except OSError:
        return Listing()
    listing = Listing(names, tuple(_pid(n) for n in names))
    if state is not None:
        state.listings[directory] = (key, listing)
    return listing


def choose(listing: Listing, live: AbstractSet[int] | None, limit: int) -> tuple[list[str], int]:
    """The names to look at (at most `limit`: named for a running pid first, then
    named like a record, then the rest, each by name) and how many were left out.
    One pass with set lookups: this runs every tick over every name."""
    names = listing.names
    if len(names) <= limit:
        return list(names), 0
    live = live or frozenset()
    tiers: tuple[list, list, list] = ([], [], [])
    for name, pid in zip(names, listing.pids):
        tiers[2 if pid is None else 0 if pid in live else 1].append(name)
    return (tiers[0] + tiers[1] + tiers[2])[:limit], len(names) - limit


def scan(directories, state: ScanState | None = None, live: AbstractSet[int] | None = None,
         reader=read_file, per_dir: int = MAX_FILES_PER_DIR,
         reads: int = MAX_READS_PER_TICK, identities: dict | None = None):
    """Yield (path, Record | Skipped) for the files worth reading in
    `directories`, within the caps. `reader(path)` reads one file (the caller's
    caches of gone writers' records go in front of it). `identities` (with a
    `state`): gets each file's identity as taken before `reader` is called, so
    the reader need not stat the file again (observe/probes/heartbeats.py)."""
    seen_paths = set()
    budget = reads
    for directory in directories:
        listing = _names(directory, state)
        chosen, left_out = choose(listing, live, per_dir)
        for name in chosen:
            path = os.path.join(directory, name)
            seen_paths.add(path)
            if budget <= 0:
                left_out += 1
                continue
            ident = None
            if state is not None:
                try:
                    ident = identity(os.stat(path, follow_symlinks=False))
                except OSError:
                    continue  # removed since the listing
                cached = state.refused.get(path)
                if cached is not None and cached[0] == ident:
                    yield path, cached[1]
                    continue
                if identities is not None:
                    identities[path] = ident
            budget -= 1
            try:
                result = reader(path)
            except Exception as err:  # one bad file never fails the scan
                result = Skipped(path, f"unreadable: {type(err).__name__}: {err}")
            if state is not None and isinstance(result, Skipped):
                if ident[1] > 0 and result.reason.startswith(_FINAL) and not _zero_header(path):
                    state.refused[path] = (ident, result)
                else:
                    state.refused.pop(path, None)
            yield path, result
        if left_out:
            yield directory, Skipped(directory, f"{left_out} of {len(listing.names)} record files "
                                                f"not examined this tick (at most {per_dir} "
                                                f"per directory, {reads} reads per tick)")
    if state is not None:
        for path in set(state.refused) - seen_paths:
            del state.refused[path]
        for directory in set(state.listings) - set(directories):
            del state.listings[directory]


def _zero_header(path: str) -> bool:
    """A header still all zeros: a writer between truncating and filling it."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return False
    try:
        return not any(os.pread(fd, 16, 0))
    except OSError:
        return False
    finally:
        os.close(fd)
