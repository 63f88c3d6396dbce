"""Judgement over time, without processes: a job's pauses learned per call site
(watch/pauses.py), a pause turned into a hang past its bound and a spell of
slowness held (signals over time, watch/overtime.py, judged by the shipped rules
of stage over-time), where the ranks' time went (watch/timebook.py) and one page
per incident (publish/incidents.py). Judgements are built in code with a fixed
clock."""
from __future__ import annotations

import dataclasses
from types import SimpleNamespace

from ddpwatch.judge import rules as rules_mod
from ddpwatch.judge.classify import Judgement, RankVerdict, again, job_verdict
from ddpwatch.judge.pausekind import pause_of
from ddpwatch.observe.probes.stacks import Frame, PidStacks, ThreadStack
from ddpwatch.publish.incidents import IncidentBook
from ddpwatch.watch import overtime
from ddpwatch.watch.job import WatchedJob
from ddpwatch.watch.pauses import Pause, timeout_for
from ddpwatch.watch.timebook import TimeBook

SITE = "estimate_loss <- train.py:260"
CONFIG = SimpleNamespace(pause_floor_s=20.0, pause_factor=3.0, collective_timeout_s=0.0,
                         straggler_after_s=30.0)
RULES = rules_mod.load_default()


def rank(r, verdict, role="none", **signals) -> RankVerdict:
    return RankVerdict(pid=100 + r, rank=r, local_rank=r, host="", verdict=verdict, role=role,
                       confidence=0.7, rule="", evidence=f"rank {r} evidence", remedy="",
                       findings=(), stack="", signals=signals)


def judgement(*ranks) -> Judgement:
    return Judgement(job_verdict(list(ranks)), tuple(ranks))


# what the rules of a pause read (paused-working, waits-for-paused-peer): the watch
# judges its ranks again with the signals over time added (classify.again)
PEERS = {"alive": True, "peer_dead": False, "peer_stopped": False}


def pausing(kind="evaluation", site=SITE):
    return judgement(rank(0, "paused", pausing=True, pause_kind=kind, pause_site=site,
                          cpu_ratio=0.98, in_collective=False, peers_blocked=1, **PEERS),
                     rank(1, "paused", pausing=False, cpu_ratio=0.01, in_collective=True,
                          peers_paused=1, **PEERS))


HEALTHY = judgement(rank(0, "healthy"), rank(1, "healthy"))


def run(job: WatchedJob, seconds: float, judged, start: float, step: float = 1.0):
    """Feed `judged` every `step` seconds from `start`; the last (judgement, over)."""
    t, out = start, None
    while t < start + seconds:
        out = job.over_time(judged, t, 1_000_000.0 + t, CONFIG, RULES)
        t += step
    return out, t


def test_pauses_are_learned_per_site_and_a_tenfold_one_pages_past_its_bound():
    job = WatchedJob("k", 0.0)
    t = 0.0
    for _ in range(3):  # three evaluations of ~4 s, training between them
        (judged, over), t = run(job, 4.0, pausing(), t)
        assert judged.job.verdict == "paused" and judged.job.culprits == ()
        (judged, over), t = run(job, 10.0, HEALTHY, t)
        assert over.pause is None
    assert [round(e.length_s) for e in job.pauses.ended] == [3, 3, 3]
    # the fourth lasts 10x: calm until its bound (max(20 s floor, 3 x 3 s)), then a hang
    (judged, over), t = run(job, 19.0, pausing(), t)
    assert judged.job.verdict == "paused" and over.pause.earlier == (3.0, 3.0, 3.0)
    assert "every ~14s for ~3.0s" in over.note
    (judged, over), t = run(job, 3.0, pausing(), t)
    assert over.pause.over and judged.job.verdict == "hung_outside_collective"
    assert judged.job.culprits == (0,)
    culprit, victim = judged.ranks
    assert culprit.rule == "pause-past-bound" and victim.rule == "waits-past-pause-bound"
    assert "evaluates at estimate_loss <- train.py:260 for 21s" in culprit.evidence
    assert "its 3 earlier pause(s) there lasted 3.0s" in culprit.evidence


def test_a_pause_at_a_new_place_pages_at_the_floor_and_a_learned_long_one_does_not():
    job = WatchedJob("k", 0.0)
    (judged, over), t = run(job, 21.5, pausing("unknown", "spin <- train.py:99"), 0.0)
    assert over.pause.bound_s == 20.0 and judged.job.verdict == "hung_outside_collective"
    # a job whose checkpoint always takes 60 s is not paged at 25 s of it
    job = WatchedJob("k", 0.0)
    ckpt = pausing("checkpoint", "save <- train.py:300")
    (_, _), t = run(job, 60.0, ckpt, 0.0)
    (_, over), t = run(job, 10.0, HEALTHY, t)
    (judged, over), t = run(job, 25.0, ckpt, t)
    assert judged.job.verdict == "paused" and over.pause.bound_s == 177.0


def test_a_pause_near_the_collective_timeout_pages_with_the_time_left():
    p = Pause(rank=0, pid=100, kind="checkpoint", site="save <- t.py:1", elapsed_s=500.0,
              earlier=(400.0,), floor_s=300.0, factor=3.0, timeout_s=timeout_for("nccl"),
              backend="nccl")
    assert p.bound_s == 480.0 and p.over  # 600 s NCCL timeout less its 120 s margin
    window = pausing("checkpoint")
    judged = again(window, RULES, overtime.signals(window, p, None))
    assert judged.ranks[0].rule == "pause-past-bound"
    assert "the gloo timeout" not in judged.ranks[0].evidence
    assert "the nccl timeout (600s) ends the job in about 100s" in judged.ranks[0].evidence
    assert timeout_for("", 0.0) == 1800.0 and timeout_for("gloo", 900.0) == 900.0


def test_a_pause_missed_for_a_tick_goes_on_and_one_not_seen_for_long_ends():
    job = WatchedJob("k", 0.0)
    job.over_time(pausing(), 0.0, 0.0, CONFIG, RULES)
    straggler = judgement(rank(0, "straggler", "culprit"), rank(1, "waiting_on_peer", "victim"))
    _, over = job.over_time(straggler, 2.0, 2.0, CONFIG, RULES)  # judged from CPU alone
    assert over.pause is not None
    _, over = job.over_time(pausing(), 3.0, 3.0, CONFIG, RULES)
    assert over.pause.elapsed_s == 3.0
    _, over = job.over_time(HEALTHY, 9.0, 9.0, CONFIG, RULES)
    assert over.pause is None and [e.length_s for e in job.pauses.ended] == [3.0]


def test_the_time_book_splits_ranks_time_by_state():
    book = TimeBook()
    book.add(pausing(), 0.0, 600.0, "evaluation")
    book.add(pausing(), 4.0, 604.0, "evaluation")
    trained = judgement(rank(0, "healthy", hb_comm_share=0.25),
                        rank(1, "healthy", hb_comm_share=0.25))
    book.add(trained, 8.0, 608.0)
    assert book.by_rank() == {0: {"paused": 4.0, "computing": 3.0, "collective": 1.0},
                              1: {"waiting": 4.0, "computing": 3.0, "collective": 1.0}}
    assert book.idle_note(608.0) == "rank 1 waited 50% of the last 8s"
    assert [v for _, v, _ in book.timeline] == ["paused", "healthy"]


def test_one_incident_is_one_page_while_its_verdict_flips():
    book = IncidentBook(resolve_after_s=30.0, group_interval_s=60.0)
    hung = ("hung_outside_collective", (0,), "rank 0 hung")
    straggler = ("straggler", (0,), "rank 0 straggles")
    stopped = ("stopped", (0,), "rank 0 stopped")
    book.update({"j": hung}, 0.0)
    (opened,) = book.update({"j": hung}, 1.0)
    told = []
    for t in range(2, 40):  # hung, straggler, hung... each tick
        for e in book.update({"j": straggler if t % 2 else hung}, float(t)):
            assert e.kind == "changed"
            told += [e] if e.notify else []
    assert told == []  # never more severe than what was told at opening
    (rise,) = book.update({"j": stopped}, 40.0)
    assert rise.notify  # more severe: told at once (no change told before)
    book.update({"j": hung}, 41.0)
    (held,) = [e for e in book.update({"j": ("dead", (0,), "gone")}, 42.0)]
    assert not held.notify  # more severe again, inside the group interval: held back
    later = [e for t in range(43, 101) for e in book.update({"j": ("dead", (0,), "gone")},
                                                           float(t))]
    assert [e.notify for e in later] == [True]  # ... and told once the interval ended
    assert later[0].incident.verdict == "dead"
    # healthy for less than resolve_after_s, then hung again: the same incident
    for t in range(101, 120):
        assert book.update({"j": ("healthy", (), "")}, float(t)) == []
    assert [e.kind for e in book.update({"j": hung}, 120.0)] == ["changed"]
    assert len(book.open()) == 1 and book.opened_total == {"hung_outside_collective": 1}


def _dump(*frames):
    return PidStacks(pid=7, status="ok", threads=(ThreadStack(
        thread_id=1, os_thread_id=7, name="MainThread", active=True, owns_gil=True,
        frames=tuple(Frame(n, f, "", f.split("/")[-1], line) for n, f, line in frames)),))


def test_pause_kinds_from_real_frame_shapes():
    evaluation = _dump(("get_batch", "/home/u/nanoGPT/train.py", 125),
                       ("estimate_loss", "/home/u/nanoGPT/train.py", 223),
                       ("<module>", "/home/u/nanoGPT/train.py", 260))
    assert pause_of(evaluation) == ("evaluation", "estimate_loss <- train.py:260")
    saving = _dump(("_save", "/v/lib/python3.11/site-packages/torch/serialization.py", 900),
                   ("save", "/v/lib/python3.11/site-packages/torch/serialization.py", 850),
                   ("estimate_and_save", "/home/u/train.py", 40),
                   ("main", "/home/u/train.py", 80))
    assert pause_of(saving)[0] == "checkpoint"
    data = _dump(("_next_data", "/v/lib/python3.11/site-packages/torch/utils/data/dataloader.py",
                  1300), ("__next__", "/v/lib/python3.11/site-packages/torch/utils/data/"
                          "dataloader.py", 700), ("train", "/home/u/train.py", 50))
    assert pause_of(data) == ("data", "__next__ <- train.py:50")
    spin = _dump(("spin_forever", "/home/u/train.py", 99), ("main", "/home/u/train.py", 140))
    assert pause_of(spin) == ("unknown", "spin_forever <- train.py:140")
    sleeping = _dump(("maybe_hang", "/home/u/faults.py", 22), ("main", "/home/u/train.py", 30))
    assert pause_of(sleeping)[0] == "unknown"


def test_a_pause_site_is_the_same_wherever_the_dump_caught_it():
    """Two dumps of one torch.save and of one decorated evaluation name one site:
    the library chain's outermost frame, and the user's line that called it."""
    lib = "/v/lib/python3.11/site-packages/torch/"
    a = _dump(("_save", lib + "serialization.py", 1003), ("save", lib + "serialization.py", 967),
              ("main", "/home/u/train.py", 150), ("<module>", "/home/u/train.py", 170))
    b = _dump(("__exit__", lib + "serialization.py", 800), ("_save", lib + "serialization.py",
                                                            1002),
              ("save", lib + "serialization.py", 967), ("main", "/home/u/train.py", 150),
              ("<module>", "/home/u/train.py", 170))
    assert pause_of(a) == pause_of(b) == ("checkpoint", "save <- train.py:150")
    decorated = _dump(("get_batch", "/home/u/train.py", 70),
                      ("estimate_loss", "/home/u/train.py", 80),
                      ("decorate_context", lib + "utils/_contextlib.py", 124),
                      ("main", "/home/u/train.py", 140))
    assert pause_of(decorated) == ("evaluation", "estimate_loss <- train.py:140")


def test_the_incident_page_shows_the_job_over_time():
    """report.json's over_time (publish/report.py) drawn by publish/page.py: the
    verdict band with the pauses before the stall, the earlier pauses, the bars."""
    import xml.etree.ElementTree as ET

    from ddpwatch.publish import page
    from ddpwatch.publish.report import over_time_json

    job = WatchedJob("k", 0.0)
    t = 0.0
    for _ in range(2):
        (_, _), t = run(job, 4.0, pausing(), t)
        (_, _), t = run(job, 10.0, HEALTHY, t)
    (judged, over), t = run(job, 22.0, pausing(), t)
    assert judged.job.verdict == "hung_outside_collective"
    doc = {"job": {"verdict": judged.job.verdict, "culprits": [0], "summary": ""},
           "ranks": [], "over_time": over_time_json(over, full=True)}
    html = page.render(doc, ())
    assert 'id="over-time"' in html and 'id="pauses"' in html
    svg = html[html.index('<svg class="verdicts"'):]
    svg = svg[:svg.index("</svg>") + 6]
    drawn = [r.get("data-verdict") for r in ET.fromstring(svg).iter("rect")]
    assert drawn == ["paused", "healthy", "paused", "healthy", "paused",
                     "hung_outside_collective"], drawn
    assert html.count("<td>evaluation</td>") == 2
    assert 'data-state="waiting"' in html and 'data-state="paused"' in html


def test_the_evidence_of_a_hang_is_not_overwritten_by_its_milder_end():
    book = IncidentBook(resolve_after_s=30.0)
    hung = ("hung_outside_collective", (0,), "rank 0 hung")
    book.update({"j": hung}, 0.0)
    book.update({"j": hung}, 1.0)
    (milder,) = book.update({"j": ("straggler", (0,), "rank 0 straggles")}, 2.0)
    assert milder.kind == "changed" and not milder.evidence and not milder.notify
    (worse,) = book.update({"j": ("stopped", (0,), "rank 0 stopped")}, 3.0)
    assert worse.evidence and worse.notify


STRAGGLING = judgement(rank(0, "waiting_on_peer", "victim", cpu_ratio=0.03),
                       rank(1, "straggler", "culprit", cpu_ratio=0.3))


def test_a_rank_slow_for_a_few_seconds_is_slowing_and_a_straggler_once_it_lasts():
    """A straggler is slow over many steps (watch/slow.py, rule slowing-briefly): one
    window of it (a start-up beside other jobs) is `slowing`, calm, what it would
    be kept in signals; slow in most ticks for straggler_after_s, it is named."""
    job = WatchedJob("k", 0.0)
    (judged, over), t = run(job, 3.0, STRAGGLING, 0.0)
    assert judged.job.verdict == "slowing" and judged.job.culprits == ()
    victim, culprit = judged.ranks
    assert (culprit.verdict, culprit.role, culprit.rule) == ("slowing", "none", "slowing-briefly")
    assert culprit.signals["slow_as"] == "straggler" and victim.signals["slow_as"] == \
        "waiting_on_peer"
    assert culprit.signals["slow_rule"] == "" and culprit.signals["slow_s"] == 2.0
    assert "falls behind its peers for 2s so far" in culprit.evidence
    assert "rank 1 evidence" in culprit.evidence and "30s (straggler_after_s)" in culprit.evidence
    assert over.slow.elapsed_s == 2.0 and not over.slow.confirmed
    # its time is what it would be: the slow rank computes, its peer waits
    assert over.time[0].get("waiting") == 2.0 and over.time[1].get("computing") == 2.0
    # a contended rank's windows alternate slow and healthy: one spell
    for _ in range(13):
        (judged, over), t = run(job, 1.0, HEALTHY, t)
        (judged, over), t = run(job, 1.0, STRAGGLING, t)
    assert judged.job.verdict == "slowing" and over.slow.share >= 0.5
    assert over.slow.elapsed_s == 28.0
    (judged, over), t = run(job, 2.0, STRAGGLING, t)
    assert over.slow.confirmed and judged.job.verdict == "straggler"
    assert judged.job.culprits == (1,) and judged.ranks[1].rule == ""  # the window's
    # the spell ends after GAP_S without a slow tick: the next one is held again
    (judged, over), t = run(job, 10.0, HEALTHY, t)
    assert over.slow is None and judged.job.verdict == "healthy"
    (judged, over), t = run(job, 1.0, STRAGGLING, t)
    assert judged.job.verdict == "slowing"


def test_a_rank_slow_in_few_of_its_ticks_is_no_straggler():
    job = WatchedJob("k", 0.0)
    t = 0.0
    for _ in range(20):  # one slow tick in three over a minute
        (judged, over), t = run(job, 1.0, STRAGGLING, t)
        (judged, over), t = run(job, 2.0, HEALTHY, t)
    assert over.slow is not None and over.slow.elapsed_s >= 30 and over.slow.share < 0.5
    (judged, over), t = run(job, 1.0, STRAGGLING, t)
    assert judged.job.verdict == "slowing"


def test_a_confirmed_straggler_judged_healthy_in_one_window_stays_the_straggler():
    """A rank held to a fraction of a core looks like its peers in some windows
    (tests/nodes/test_two_nodes.py: node 0's view of node 1's throttled rank):
    once the spell is confirmed, the page must not flip with them. A rank
    healthy in this window keeps its slow verdict while the spell's gap lasts;
    a worse verdict is shown as it is, and the spell's end ends the hold."""
    job = WatchedJob("k", 0.0)
    (judged, over), t = run(job, 31.0, STRAGGLING, 0.0)
    assert over.slow.confirmed and judged.job.culprits == (1,)
    # the straggler looks healthy while its peer still waits: still the culprit
    half = judgement(rank(0, "waiting_on_peer", "victim"), rank(1, "healthy"))
    (judged, over), t = run(job, 1.0, half, t)
    assert judged.job.verdict == "straggler" and judged.job.culprits == (1,)
    held = judged.ranks[1]
    assert (held.verdict, held.role, held.rule) == ("straggler", "culprit", "straggler-held")
    assert held.evidence == "rank 1 evidence (1s ago; this window alone looked like its " \
                            "peers', as the windows of a slow rank alternate)"
    assert held.signals["slow_as"] == "straggler" and held.signals["slow_seen_s"] == 1.0
    # both look healthy for a few seconds: the spell is open, both held
    (judged, over), t = run(job, 5.0, HEALTHY, t)
    assert [r.verdict for r in judged.ranks] == ["waiting_on_peer", "straggler"]
    assert [r.rule for r in judged.ranks] == ["waiting-on-straggler-held", "straggler-held"]
    assert "6s ago" in judged.ranks[1].evidence
    # a worse verdict is not hidden by the hold
    dead = judgement(rank(0, "waiting_on_peer", "victim"), rank(1, "dead", "culprit"))
    (judged, over), t = run(job, 1.0, dead, t)
    assert judged.ranks[1].verdict == "dead"
    # no slow tick for GAP_S: the spell and its hold are over
    (judged, over), t = run(job, 11.0, HEALTHY, t)
    assert over.slow is None and judged.job.verdict == "healthy"


def test_a_spell_not_yet_confirmed_holds_nothing():
    job = WatchedJob("k", 0.0)
    (judged, over), t = run(job, 3.0, STRAGGLING, 0.0)
    (judged, over), t = run(job, 1.0, HEALTHY, t)
    assert not over.slow.confirmed and judged.job.verdict == "healthy"


def test_straggler_after_zero_names_a_straggler_at_once():
    job = WatchedJob("k", 0.0)
    config = SimpleNamespace(**{**vars(CONFIG), "straggler_after_s": 0.0})
    judged, over = job.over_time(STRAGGLING, 0.0, 1_000_000.0, config, RULES)
    assert judged.job.verdict == "straggler" and over.slow.confirmed


def test_a_recompile_while_a_peer_waits_is_a_pause_of_kind_compile_paged_past_its_bound():
    """torch.compile on one rank while its peer waits (rules compiling-while-peers-wait,
    waits-for-compiling-peer: paused, as diagnose says) is a pause over time: named
    compile, learned, a hang past its bound (rule pause-past-bound)."""
    def compiling():
        waits = dataclasses.replace(rank(0, "paused", in_collective=True, peers_compiling=1,
                                         **PEERS), rule="waits-for-compiling-peer")
        busy = dataclasses.replace(rank(1, "paused", stack="compile", cpu_ratio=0.9,
                                        pause_site="compile_fx <- train.py:80",
                                        warming_up=True, in_collective=False, peers_blocked=1,
                                        **PEERS), rule="compiling-while-peers-wait")
        return judgement(waits, busy)
    job = WatchedJob("k", 0.0)
    (judged, over), t = run(job, 5.0, compiling(), 0.0)
    assert judged.job.verdict == "paused" and judged.job.culprits == ()
    assert [r.rule for r in judged.ranks] == ["waits-for-compiling-peer",
                                              "compiling-while-peers-wait"]
    assert over.pause.kind == "compile" and over.pause.rank == 1
    assert over.pause.site == "compile_fx <- train.py:80"
    assert over.time[1] == {"paused": 4.0} and over.time[0] == {"waiting": 4.0}
    (judged, over), t = run(job, 18.0, compiling(), t)  # past the 20 s floor: a hang
    assert judged.job.verdict == "hung_outside_collective" and judged.job.culprits == (1,)
    assert [r.rule for r in judged.ranks] == ["waits-past-pause-bound", "pause-past-bound"]
    assert judged.ranks[1].evidence.startswith("compiles at compile_fx <- train.py:80 for 22s")
    # both compiling at once: nobody waits, warming up
    both = judgement(rank(0, "warming_up"), rank(1, "warming_up"))
    assert WatchedJob("k", 0.0).over_time(both, 0.0, 1e6, CONFIG, RULES)[0].job.verdict == \
        "warming_up"


def test_a_job_seen_past_its_start_stays_so_for_the_same_ranks():
    """The daemon reads stacks in a few looks only; one that saw a backward pass
    (job_starting false) ends the start for the lean looks after it
    (Snapshot.seen_training, judge/signals/window.link), until the ranks change."""
    from ddpwatch.judge.signals.window import link
    from ddpwatch.observe.snapshot import Job, Snapshot

    def look(pids, t):
        return Snapshot(1, t, t, Job(1, 9, "torchrun", pids, "", (0, 1), 2), None, None, None,
                        None, None, ())
    job = WatchedJob("k", 0.0)
    _, last = job.window(look((100, 101), 0.0), None, 5.0)
    assert last.seen_training is False
    job.over_time(judgement(rank(0, "healthy", job_starting=True),
                            rank(1, "healthy", job_starting=True)), 0.0, 0.0, CONFIG, RULES)
    _, last = job.window(look((100, 101), 1.0), None, 5.0)
    assert last.seen_training is False  # nothing said the start is over yet
    job.over_time(judgement(rank(0, "healthy", job_starting=False),
                            rank(1, "straggler", "culprit", job_starting=False)), 1.0, 1.0,
                  CONFIG, RULES)
    _, last = job.window(look((100, 101), 2.0), None, 5.0)
    assert last.seen_training is True
    # what the signals make of it: a young job without stacks in this look is no start
    young = [{"alive": True, "rank_age_s": 9.0, "seen_training": True},
             {"alive": True, "rank_age_s": 9.0}]
    link(young)
    assert [s["job_starting"] for s in young] == [False, False]
    # torchrun restarted its workers: new ranks start again
    _, last = job.window(look((200, 201), 3.0), None, 5.0)
    assert last.seen_training is False
