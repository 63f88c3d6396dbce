"""The live view in a real terminal (tmux): `ddpwatch diagnose <pid> --watch` on an
mp.spawn job shows a rank stopped with SIGSTOP within 2 s of the stop, its line
highlighted (reverse video and a `*`); its screen is read with `tmux capture-pane`."""
from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
import uuid

import pytest

import thirdparty_jobs
from conftest import REPO, need, wait_until

pytestmark = pytest.mark.usefixtures("need_py_spy")
SGR = re.compile(r"\x1b\[([0-9;]*)m")


def reversed_at(escaped: str, needle: str) -> bool:
    """Whether reverse video is on where `needle` starts in a `capture-pane -e`
    screen: tmux writes only the attributes that change, so they are followed
    from the top (SGR 7 on, 27 or 0 off)."""
    on = False
    end = escaped.index(needle)
    for m in SGR.finditer(escaped, 0, end):
        for param in (m.group(1) or "0").split(";"):
            if param in ("0", ""):
                on = False
            elif param == "7":
                on = True
            elif param == "27":
                on = False
    return on


def screen(session: str, escapes: bool = False) -> str:
    return subprocess.run(["tmux", "capture-pane", "-p", *(["-e"] if escapes else []),
                           "-t", session], capture_output=True, text=True, timeout=10).stdout


def rank_line(text: str, pid: int) -> str:
    return next((line for line in text.splitlines() if f"pid {pid} " in line), "")


def test_live_view_shows_a_stopped_rank_within_2s_and_highlights_it(tmp_path):
    need(shutil.which("tmux") is not None, "tmux is not installed (dev.sh DEBIAN_PACKAGES)")
    job = thirdparty_jobs.start("spawn", str(tmp_path))
    session = f"ddpw{uuid.uuid4().hex[:8]}"
    try:
        command = (f"env PYTHONPATH={REPO} TERM=xterm-256color {sys.executable} -m ddpwatch "
                   f"diagnose {job.pids[0]} --watch --window 0.5")
        subprocess.run(["tmux", "new-session", "-d", "-s", session, "-x", "220", "-y", "40",
                        command], check=True, timeout=10)
        # a detached session may keep tmux's default 80 columns
        subprocess.run(["tmux", "resize-window", "-t", session, "-x", "220", "-y", "40"],
                       capture_output=True, timeout=10)
        wait_until(lambda: "HEALTHY" in rank_line(screen(session), job.pids[1]), 120,
                   interval=0.2, what=lambda: f"rank 1 healthy on screen:\n{screen(session)}")
        os.kill(job.pids[1], signal.SIGSTOP)
        stopped_at = time.monotonic()
        wait_until(lambda: "STOPPED" in rank_line(screen(session), job.pids[1]), 2.0,
                   interval=0.05, what=lambda: f"STOPPED on screen:\n{screen(session)}")
        seen_after = time.monotonic() - stopped_at
        assert seen_after <= 2.0
        line = rank_line(screen(session), job.pids[1])
        assert line.lstrip().startswith("*"), line  # the change is marked...
        escaped = screen(session, escapes=True)
        assert reversed_at(escaped, f"pid {job.pids[1]} "), escaped  # ...and drawn reversed
        assert "HEALTHY (" in line.split("history:")[1], line  # what it was before
    finally:
        subprocess.run(["tmux", "kill-session", "-t", session], capture_output=True, timeout=10)
        job.job.kill()
