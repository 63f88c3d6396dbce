"""The live view's terminal: `status --watch` (the daemon's /status) and
`diagnose --watch` (judged here, no daemon). A thread fetches the jobs as fast
as its source answers; the screen is drawn again every REFRESH_S from the
latest (publish/live.py Board), full-screen with curses on a terminal, plain
blocks on a pipe. q or Ctrl-C ends it."""
from __future__ import annotations

import curses
import os
import sys
import threading
import time

from .. import errors
from ..publish.live import Board, Line, plain

REFRESH_S = 1.0  # drawn again at least this often (how long verdicts held)
POLL_S = 0.1     # ... and as soon as a new look arrives: keys and the feed read this often


class Feed:
    """The latest answer of `fetch` (a list of job reports), fetched again and
    again on a thread; a failure is kept as a note, the last jobs stand."""

    def __init__(self, fetch, pause_s: float = 0.0):
        self.fetch, self.pause_s = fetch, pause_s
        self.jobs: list[dict] | None = None
        self.note = ""
        self.version = 0  # counts answers: a new one is drawn at once
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._loop, name="ddpwatch-live", daemon=True)
        self.thread.start()

    def _loop(self) -> None:
        while not self.stop.is_set():
            try:
                self.jobs, self.note = self.fetch(), ""
            except errors.DdpwatchError as err:
                self.note = f"  ({err})"
            except Exception as err:  # the view outlives one failed look
                self.note = f"  (look failed: {type(err).__name__}: {err})"
            self.version += 1
            self.stop.wait(self.pause_s)


def run(fetch, pause_s: float = 0.0, out=None) -> int:
    out = out or sys.stdout
    feed = Feed(fetch, pause_s)
    board = Board()
    try:
        if out.isatty():
            # the terminal's own size, not $COLUMNS/$LINES that a parent left behind
            # (pytest's 80 columns cut the view's lines in tmux)
            curses.use_env(False)
            curses.wrapper(_screen, feed, board)
        else:
            _plain(feed, board, out)
    except KeyboardInterrupt:
        pass
    finally:
        feed.stop.set()
    return errors.OK


def _lines(feed: Feed, board: Board) -> list[Line]:
    if feed.jobs is None:
        return [Line("ddpwatch live view: looking at the node..." + feed.note, header=True)]
    return board.update(feed.jobs, time.monotonic(), feed.note)


def _plain(feed: Feed, board: Board, out) -> None:
    while True:
        print(plain(_lines(feed, board), time.strftime("%H:%M:%S")), file=out, flush=True)
        time.sleep(REFRESH_S)


def _screen(screen, feed: Feed, board: Board) -> None:
    curses.curs_set(0)
    bad = curses.A_BOLD
    if curses.has_colors():
        curses.use_default_colors()
        curses.init_pair(1, curses.COLOR_RED, -1)
        bad = curses.color_pair(1) | curses.A_BOLD
    screen.timeout(int(POLL_S * 1000))
    drawn, drawn_at = -1, 0.0
    while True:
        key = screen.getch()
        if key in (ord("q"), ord("Q")):
            return
        if feed.version == drawn and time.monotonic() - drawn_at < REFRESH_S \
                and key != curses.KEY_RESIZE:
            continue
        drawn, drawn_at = feed.version, time.monotonic()
        _follow_size(screen)
        screen.erase()
        height, width = screen.getmaxyx()
        lines = _lines(feed, board)
        for y, line in enumerate(lines[:height - 1]):
            attr = curses.A_BOLD if line.header else bad if line.bad else curses.A_NORMAL
            if line.changed:
                attr |= curses.A_REVERSE  # what changed in the last seconds
            text = ("* " if line.changed else "  ") + line.text
            screen.addnstr(y, 0, text, width - 1, attr)
        screen.addnstr(height - 1, 0, f"{time.strftime('%H:%M:%S')}  q quits; changed "
                       f"lines are reversed and marked *", width - 1, curses.A_DIM)
        screen.refresh()


def _follow_size(screen) -> None:
    """The terminal's size now: one resized before curses began to listen for
    SIGWINCH (tmux sizes a new pane after starting its program) sends none."""
    try:
        size = os.get_terminal_size(sys.__stdout__.fileno())
    except OSError:
        return
    if (size.lines, size.columns) != screen.getmaxyx():
        curses.resize_term(size.lines, size.columns)


def status_watch(args, fetch_status) -> int:
    return run(lambda: fetch_status()["jobs"])


def diagnose_watch(collect_jobs) -> int:
    return run(collect_jobs)
