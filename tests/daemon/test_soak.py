"""Quiet on a healthy run, loud on a real hang: the short version of
benchmarks/soak.py in the suite (docs/judgement-over-time.md).

Two real torchrun jobs of a nanoGPT-shaped loop (tests/jobs/thirdparty/nanogpt_ddp.py)
whose rank 0 alone evaluates every few seconds (one job) or evaluates and saves a
300 MB checkpoint (the other), watched by a real `ddpwatch run` with a webhook
receiver. For a minute: no firing message at all, and the pauses named in
/status with their kind. Then, mid-run, faults on the same jobs: a stopped rank
and a rank waiting on a lock page within seconds; an evaluation 10x as long as
the job's earlier ones pages once past its learned bound; a rank busy-looping
where no pause ran before pages at the pause floor. Each incident pages once.
The page of the long evaluation's incident, opened in headless Chromium, shows
the job's verdicts over time with the evaluations before it. Before them, a
torch.compile job with a recompile mid-run pages nobody and its pauses are named
compile.
"""
from __future__ import annotations

import os
import sys

import html5lib
import pytest
from conftest import REPO, need
from pages import CHROMIUM, NS, RecordingProxy, artifacts_dir, chromium, png_size

from ddpwatch.publish.bundle import dir_name

sys.path.insert(0, os.path.join(REPO, "benchmarks"))
import soak  # noqa: E402

HEALTHY_S = 60.0  # a minute here; benchmarks/soak.py watches for as long as asked
# the compile job: half a minute, and until rank 1's recompile (at step 200 here,
# 400 in benchmarks/soak.py) is done; the long watch is the benchmark's. The
# DataLoader job of benchmarks/soak.py MORE_JOBS (workers forked at each epoch) is
# tests/daemon/test_pause_hangs.py's negative here (test_the_same_pauses_working...)
MORE_S = 30.0
MORE_JOBS = {"compile": {**soak.MORE_JOBS["compile"], "DDPWATCH_TEST_RECOMPILE_AT": "200"}}
FLOOR_S = 20.0  # pause_floor_s: the busy loop pages at it


def test_a_recompile_is_a_pause_that_pages_nobody(tmp_path):
    """The torch.compile job (cold cache; rank 1 alone recompiles at step 200 for
    tens of seconds while rank 0 waits), under the daemon's defaults, for half a
    minute and until the recompile is done. First in this file: it runs before the
    module's three jobs start (2 cores)."""
    run = soak.Soak(str(tmp_path), MORE_JOBS, config={"resolve_after_s": 10})
    try:
        began = run.wait_started()
        compiled = soak.wait_for(
            lambda: "recompiled in" in run.jobs["compile"].output() and soak.time.monotonic(),
            600, "rank 1's recompile")
        soak.wait_for(lambda: soak.time.monotonic() >= max(began + MORE_S, compiled + 5),
                      MORE_S + 10, "half a minute of training")
        ours = {run.label_of(name) for name in run.jobs}
        firing = [(t, m) for t, m in run.receiver.firing() if m.get("job") in ours]
        assert None not in ours and firing == [], "false pages:\n" + run.describe(firing, began)
        pauses, verdicts = run.pauses_seen(), run.verdicts_seen()
        assert pauses["compile"]["compile"] >= 3, (pauses, verdicts, run.jobs["compile"]
                                                   .output()[-2000:])
    finally:
        run.close()


@pytest.fixture(scope="module")
def watched(tmp_path_factory):
    run = soak.Soak(str(tmp_path_factory.mktemp("soak")), soak.JOBS,
                    config={"pause_floor_s": FLOOR_S, "resolve_after_s": 10})
    try:
        run.wait_started()
        yield run
    finally:
        run.close()


def test_a_minute_of_healthy_training_with_pauses_pages_nobody(watched):
    began = soak.time.monotonic()
    soak.wait_for(lambda: soak.time.monotonic() - began >= HEALTHY_S, HEALTHY_S + 10,
                  "a minute of training")
    # the daemon watches every job on the node: ours are judged here
    ours = {watched.label_of(name) for name in watched.jobs}
    firing = [(t, m) for t, m in watched.receiver.firing() if m.get("job") in ours]
    assert None not in ours and firing == [], ("false pages on healthy training:\n"
                                               + watched.describe(firing, began))
    pauses = watched.pauses_seen()
    assert pauses["eval"]["evaluation"] >= 1, (pauses, watched.verdicts_seen())
    # The checkpoint job writes heartbeats: its waiting rank is blocked (and its
    # rank 0 pausing) only once it waits past its collective's learned bound
    # (max(2 s, 10x its recent durations)), which a fast machine's save may not
    # reach. Whatever /status named there is a pause of the right kind, or of no
    # kind yet (its first ticks, before a stack dump says what it does).
    assert set(pauses["checkpoint"]) - {"unknown"} <= {"evaluation", "checkpoint"}, pauses


FAULTS: dict = {}  # what test_faults_mid_run... measured, for the page test after it


def test_faults_mid_run_page_once_each_in_time(watched):
    got = soak.faults(watched, floor_s=FLOOR_S)
    FAULTS.update(got)
    for fault in ("stopped", "lock", "long-eval", "spin"):
        assert got[fault]["pages"] == 1, (fault, got)
    assert got["stopped"]["to_page_s"] <= 20, got      # seconds, on a loaded 2-core box
    assert got["lock"]["to_page_s"] <= 20, got
    assert "stopped" in got["stopped"]["summary"].lower(), got
    # the 10x evaluation: paged past max(floor, 3x its earlier ones), before it ended
    assert got["long-eval"]["to_page_s"] >= FLOOR_S - 2, got
    assert "earlier pause" in got["long-eval"]["summary"], got
    # the busy loop at a new place: at the floor (plus a tick or two of judging)
    # (the fault's own page first in the message: -q cuts a long one short)
    spin = got["spin"]
    said = (spin["to_page_s"], spin["verdicts"], spin["summary"], spin["other"])
    assert FLOOR_S - 2 <= spin["to_page_s"] <= FLOOR_S + 30, said
    assert "no earlier pause" in spin["summary"], said


def test_the_page_of_a_real_stall_shows_the_pauses_before_it(watched, start_job, tmp_path):
    need(CHROMIUM is not None, "Debian package chromium (dev.sh DEBIAN_PACKAGES)")
    if "long-eval" not in FAULTS:
        pytest.fail("the faults test did not run or did not page the long evaluation")
    bundle = os.path.join(watched.workdir, "state", "incidents",
                          dir_name(FAULTS["long-eval"]["incident"]))
    page = os.path.join(bundle, "report.html")
    assert os.path.isfile(page), os.listdir(os.path.dirname(bundle))
    proxy = RecordingProxy()
    try:
        shot = os.path.join(artifacts_dir(), "incident-page-long-evaluation.png")
        made = chromium(start_job, tmp_path, proxy, "file://" + page, "--window-size=1280,2400",
                        f"--screenshot={shot}")
        print(f"\nscreenshot of the incident page: {shot}")
        assert png_size(shot) == (1280, 2400)
        dom_path = str(tmp_path / "dom.html")
        made += chromium(start_job, tmp_path, proxy, "file://" + page, "--dump-dom",
                         out=dom_path)
        assert made == [], f"the page made external requests: {made}"
    finally:
        proxy.close()
    dom = html5lib.HTMLParser(namespaceHTMLElements=True).parse(open(dom_path).read())
    band = next(svg for svg in dom.iter(f"{{{NS['s']}}}svg")
                if "verdicts" in (svg.get("class") or ""))
    drawn = [r.get("data-verdict") for r in band.iter(f"{{{NS['s']}}}rect")]
    # earlier evaluations (paused) before the stall the long one became
    assert "hung_outside_collective" in drawn, drawn
    assert drawn[:drawn.index("hung_outside_collective")].count("paused") >= 2, drawn
    kinds = ["".join(td.itertext()) for td in
             dom.findall(".//h:table[@id='pauses']/h:tbody/h:tr/h:td[3]", NS)]
    assert kinds.count("evaluation") >= 2, kinds
