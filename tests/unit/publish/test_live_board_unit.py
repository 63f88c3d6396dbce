"""publish/live.py: the live view's board over job reports fed with a clock."""
from __future__ import annotations

from ddpwatch.publish.live import AGO_S, CHANGED_S, Board, held, plain


def job(verdict: str, r1: str, key="127.0.0.1:29500", culprits=()) -> dict:
    return {"key": key, "job": {"verdict": verdict, "culprits": list(culprits)},
            "ranks": [{"rank": 0, "pid": 10, "verdict": "healthy" if r1 == "healthy" else
                       "blocked_in_collective", "role": "none", "signals": {"cpu_ratio": 0.9,
                                                                            "hb_step": 7}},
                      {"rank": 1, "pid": 11, "verdict": r1, "role": "none",
                       "signals": {"cpu_ratio": 0.0}}]}


def test_a_change_is_highlighted_then_held_and_remembered():
    board = Board()
    board.update([job("healthy", "healthy")], 0.0)
    lines = board.update([job("healthy", "healthy")], 5.0)
    assert not any(line.changed for line in lines)
    assert "HEALTHY for 5s" in lines[1].text and "step 7" in lines[2].text
    lines = board.update([job("stopped", "stopped", culprits=[1])], 6.0)
    rank1 = next(line for line in lines if "pid 11 " in line.text)
    assert rank1.changed and rank1.bad and "history: HEALTHY (6s ago) > STOPPED (0s ago)" \
        in rank1.text
    assert lines[1].changed and "culprit: rank 1" in lines[1].text
    later = board.update([job("stopped", "stopped", culprits=[1])], 6.0 + CHANGED_S + 1)
    assert not any(line.changed for line in later)
    minute = board.update([job("stopped", "stopped", culprits=[1])], 5.0 + AGO_S)
    assert "1 min ago: HEALTHY" in next(line.text for line in minute if "pid 11 " in line.text)


def test_problem_jobs_come_first_and_plain_marks_changes():
    board = Board()
    lines = board.update([job("healthy", "healthy", key="a"), job("stopped", "stopped", key="b")],
                         0.0)
    assert lines[1].text.startswith("JOB b")
    text = plain(lines, "12:00:00")
    assert text.startswith("--- 12:00:00") and "JOB a" in text


def test_held_reads_as_a_person_says_it():
    assert (held(59), held(600), held(7300)) == ("59s", "10m", "2h")
