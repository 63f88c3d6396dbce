"""The incident page (publish/page.py) drawn from replay fixtures, without
processes: valid HTML, nothing external, every rank's row, the culprit, the last
collectives and the gap; a job without heartbeats; hostile strings escaped;
the bundle, the HTTP routes and `ddpwatch report` around it; the webhook link."""
from __future__ import annotations

import copy
import dataclasses
import json
import os
import re
import urllib.error
import urllib.request

import pytest

from conftest import REPO
from pages import NS, external_refs, parse
from ddpwatch import cli, errors
from ddpwatch.config import load as load_config
from ddpwatch.errors import ConfigError
from ddpwatch.judge import classify, rules as rules_mod
from ddpwatch.observe import snapshot
from ddpwatch.publish.incidents import safe_name
from ddpwatch.publish import bundle, page, report
from ddpwatch.publish.alerts import Alert, alertmanager, generic, slack
from ddpwatch.publish.endpoints import Server
from ddpwatch.publish.incidents import IncidentBook
from ddpwatch.publish.page_list import incident_path
from ddpwatch.publish.view import DaemonView, Incident, JobView

FIXTURES = os.path.join(REPO, "tests", "fixtures", "snapshots")


def judged(name: str):
    history = snapshot.load(os.path.join(FIXTURES, f"{name}.json"))
    judgement = classify.judge(history, rules_mod.load_default(()))
    return judgement, history


def doc_of(name: str) -> tuple[dict, tuple]:
    judgement, history = judged(name)
    return report.as_json(judgement, history[-1]), history


def texts(tree, xpath: str) -> list[str]:
    return ["".join(e.itertext()) for e in tree.findall(xpath, NS)]


def incident(state="open", **kw) -> dict:
    fields = dict(id="127.0.0.1:1-1795365014-1", job="127.0.0.1:1", state=state,
                  verdict="stopped", culprits=[1], summary="s", opened_at=1795365010.0,
                  updated_at=1795365014.0, resolved_at=0.0, bundle="", alerts_from="",
                  resolution="")
    fields.update(kw)
    return fields


def test_stopped_rank_page_draws_every_rank_the_culprit_and_the_last_collectives():
    doc, history = doc_of("trainer_stop")
    html = page.render(doc, history, incident())
    tree = parse(html)
    assert external_refs(html) == []
    banner = tree.find(".//h:header[@id='verdict']", NS)
    assert banner.get("data-culprits") == "1" and banner.get("data-verdict") == "stopped"
    assert texts(tree, ".//h:div[@id='culprit']") == ["culprit: rank 1 (pid 29554 on vm, stopped)"]
    # one timeline row and one table row per rank, the culprit's marked
    rows = tree.findall(".//s:g[@class]", NS)
    timeline_rows = {g.get("data-rank"): g.get("class") for g in rows
                     if "rank-row" in g.get("class")}
    assert timeline_rows == {"0": "rank-row", "1": "rank-row culprit"}
    table = {tr.get("data-rank"): tr.get("class") for tr in
             tree.findall(".//h:table[@class='ranks']/h:tbody/h:tr", NS)}
    assert table == {"0": None, "1": "culprit"}
    # the last 8 collectives both completed (#22..#29), for both ranks, from the rings
    drawn = {(g.get("data-rank"), int(g.get("data-seq"))) for g in rows
             if g.get("class") == "collective"}
    assert drawn == {(r, s) for r in ("0", "1") for s in range(22, 30)}
    lateness = [tr.get("data-seq") for tr in
                tree.findall(".//h:table[@class='lateness']/h:tbody/h:tr", NS)]
    assert lateness == [str(s) for s in range(22, 30)]
    # where each was at the stall: rank 0 waits in #31, rank 1 left the gap #30-#31
    svg_text = " ".join(texts(tree, ".//s:text"))
    assert "waits in #31 ddp_bucket_all_reduce" in svg_text
    assert "never entered #30–#31" in svg_text and "stopped · CPU 0%" in svg_text
    assert "Resume it: `kill -CONT 29554`" in " ".join(texts(tree, ".//h:div[@id='remedy']"))
    # rank 0's stack folded (innermost last); rank 1 was stopped, not dumped
    stacks = texts(tree, ".//h:details")
    assert "_engine_run_backward (torch/autograd/graph.py:979)" in stacks[0]
    assert "stopped: not dumped" in stacks[1]


def test_job_without_heartbeats_shows_states_and_stacks_and_says_what_heartbeats_add():
    doc, history = doc_of("plain_hang")
    html = page.render(doc, history, None, evidence_base=None)
    tree = parse(html)
    assert external_refs(html) == []
    assert tree.find(".//s:svg[@class='timeline']", NS) is None
    notice = texts(tree, ".//h:div[@id='no-heartbeats']")[0]
    assert "Heartbeats would add the timeline" in notice and "ddpwatch.instrument()" in notice
    states = texts(tree, ".//s:svg[@class='states']/s:g")
    assert len(states) == 2 and "sleeping 100%" in states[0]
    assert "running 12%" in states[1] and "sleeping 88%" in states[1]
    assert {tr.get("data-rank") for tr in
            tree.findall(".//h:table[@class='ranks']/h:tbody/h:tr", NS)} == {"0", "1"}
    assert "<module> (plain_ddp.py:44)" in texts(tree, ".//h:details")[1]
    assert tree.find(".//h:header", NS).get("data-culprits") == "1"


def test_hostile_strings_from_ranks_are_text_not_markup():
    doc, history = doc_of("trainer_stop")
    evil = '"><script>alert(1)</script><img src=http://evil.example/x>'
    doc = copy.deepcopy(doc)
    doc["job"]["run_id"] = evil
    doc["ranks"][1]["host"] = evil
    doc["ranks"][1]["evidence"] = evil
    doc["ranks"][0]["signals"]["hb_op"] = evil
    doc["ranks"][0]["findings"] = [{"id": evil, "severity": "warning", "evidence": evil,
                                    "remedy": evil}]
    frame = dataclasses.replace(history[-1].stacks.pids[0].threads[0].frames[0], name=evil)
    thread = dataclasses.replace(history[-1].stacks.pids[0].threads[0], frames=(frame,), name=evil)
    pid0 = dataclasses.replace(history[-1].stacks.pids[0], threads=(thread,))
    stacks = dataclasses.replace(history[-1].stacks, pids=(pid0,) + history[-1].stacks.pids[1:])
    history = history[:-1] + (dataclasses.replace(history[-1], stacks=stacks),)
    html = page.render(doc, history, incident(id=evil, job=evil, bundle=evil))
    tree = parse(html)
    assert tree.findall(".//h:script", NS) == [] and tree.findall(".//h:img", NS) == []
    assert "<script>" not in html and external_refs(html) == []
    assert external_refs('<!DOCTYPE html><html lang="en"><head><title>t</title></head><body>'
                         '<img alt="" src="http://a.example/x"></body></html>') != []  # can fail
    assert evil in " ".join(texts(tree, ".//h:body"))  # shown, as text


def test_resolved_incident_says_when_and_how():
    doc, history = doc_of("trainer_stop")
    resolved = incident("resolved", resolved_at=1795365074.0,
                        resolution="the job was judged healthy for 5 s")
    tree = parse(page.render(doc, history, resolved))
    assert tree.find(".//h:header", NS).get("data-state") == "resolved"
    (text,) = texts(tree, ".//h:div[@id='resolution']")
    assert text == ("Resolved 2026-11-22 16:31:14 UTC after 64 s: the job was judged healthy "
                    "for 5 s.")


def test_incident_book_says_how_an_incident_resolved():
    hung = ("stopped", (1,), "rank 1 stopped")
    book = IncidentBook(resolve_after_s=5.0)
    book.update({"a": hung, "b": hung}, now=0.0)
    book.update({"a": hung, "b": hung}, now=1.0)
    book.update({"a": ("healthy", (), "")}, now=2.0)
    events = book.update({"a": ("healthy", (), "")}, now=8.0)
    assert {e.incident.job: e.incident.resolution for e in events} == {
        "a": "the job was judged healthy for 6 s",
        "b": "the job's processes were gone for 6 s (it exited, was killed, or torchrun "
             "restarted it)"}


def test_ranks_of_other_nodes_get_a_row_from_their_signals():
    """The peer view: a remote rank's clock-free signals (no ring crosses nodes)."""
    doc, history = doc_of("trainer_stop")
    doc = copy.deepcopy(doc)
    remote = copy.deepcopy(doc["ranks"][0])
    remote.update(rank=2, pid=4242, host="node2")
    remote["signals"].update(remote=True, node="node2", rank=2, hb_inside_s=3.5, hb_seq=31)
    doc["ranks"].append(remote)
    tree = parse(page.render(doc, history, incident()))
    row = next(g for g in tree.findall(".//s:g", NS) if g.get("data-rank") == "2")
    text = " ".join(texts(row, ".//s:text"))
    assert "ring on node node2 (peer view" in text and "waits in #31" in text
    assert "node2 (peer view)" in " ".join(texts(tree, ".//h:table[@class='ranks']//h:td"))


def make_bundle(tmp_path, name="trainer_stop", run_id=None):
    judgement, history = judged(name)
    job_key = run_id or "127.0.0.1:1"
    # ids are made as the IncidentBook makes them: the run id is a label, never a path
    inc = Incident(f"{safe_name(job_key)}-1795365014-1", job_key, "open", judgement.job.verdict,
                   judgement.job.culprits, judgement.job.summary, 1795365010.0, 1795365014.0,
                   0.0, "")
    view = JobView(job_key, judgement, history[-1])
    path = bundle.write_bundle(str(tmp_path), inc, view, history, ())
    return dataclasses.replace(inc, bundle=path), view, path


def test_bundle_holds_the_page_and_a_run_id_cannot_move_it(tmp_path):
    inc, _, path = make_bundle(tmp_path, run_id="../../escape/x")
    assert os.path.dirname(path) == str(tmp_path / "incidents")
    assert not os.path.exists(tmp_path / "escape")
    html = open(os.path.join(path, "report.html")).read()
    tree = parse(html)
    links = [a.get("href") for a in tree.findall(".//h:a", NS)]
    assert links == ["report.txt", "report.json", "snapshots.json"]
    assert all(os.path.exists(os.path.join(path, h)) for h in links)
    resolved = dataclasses.replace(inc, state="resolved", resolved_at=1795365030.0,
                                   resolution="the job was judged healthy for 2 s")
    bundle.rewrite_page(path, resolved)
    assert "the job was judged healthy for 2 s" in open(os.path.join(path, "report.html")).read()
    assert json.load(open(os.path.join(path, "report.json")))["incident"]["state"] == "resolved"


def test_a_page_that_cannot_be_drawn_costs_no_evidence(tmp_path, monkeypatch):
    def broken(*args, **kw):
        raise ValueError("a renderer bug")
    monkeypatch.setattr(page, "render", broken)
    _, _, path = make_bundle(tmp_path)
    assert sorted(os.listdir(path)) == ["records", "report.json", "report.txt", "snapshots.json"]


def get(url, token=None):
    req = urllib.request.Request(url)
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, r.headers.get("Content-Type"), r.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.headers.get("Content-Type"), err.read().decode()


def test_http_serves_list_and_page_under_the_token_rule(tmp_path):
    inc, job, path = make_bundle(tmp_path)
    view = DaemonView(node="vm", tick=1, wall_time=0.0, tick_duration_s=0.0, jobs=(job,),
                      incidents=(inc,), probes=(), incidents_opened_total={}, ready=True)
    server = Server("127.0.0.1", 0, lambda: view, lambda: b"", token="t0ken")
    server.start()
    try:
        base = f"http://127.0.0.1:{server.port}"
        assert get(base + "/incidents/")[0] == 401
        assert get(base + incident_path(inc.id))[0] == 401
        code, ctype, listing = get(base + "/incidents/", "t0ken")
        assert code == 200 and ctype.startswith("text/html")
        link = parse(listing).find(".//h:a", NS).get("href")
        assert link == incident_path(inc.id) == f"/incidents/{inc.id}"  # ids are safe names
        code, _, html = get(base + link, "t0ken")
        assert code == 200 and 'data-culprits="1"' in html
        evidence = [a.get("href") for a in parse(html).findall(".//h:a", NS)]
        assert evidence[0] == link + "/report.txt"
        code, _, text = get(base + evidence[0], "t0ken")
        assert code == 200 and text.startswith("JOB: STOPPED")
        for bad in ("/incidents/nope", link + "/records", link + "/..%2Freport.json",
                    "/incidents/..%2F..%2Fetc%2Fpasswd", link + "/../../x"):
            assert get(base + bad, "t0ken")[0] == 404, bad
    finally:
        server.stop()


def test_report_command_renders_again_and_names_bad_inputs(tmp_path, capsys):
    _, _, path = make_bundle(tmp_path)
    os.remove(os.path.join(path, "report.html"))
    assert cli.main(["report", path]) == 0
    assert capsys.readouterr().out.strip() == os.path.join(path, "report.html")
    parse(open(os.path.join(path, "report.html")).read())
    assert cli.main(["report", "--replay", os.path.join(FIXTURES, "plain_hang.json")]) == 0
    assert "Heartbeats would add the timeline" in capsys.readouterr().out
    assert cli.main(["report", str(tmp_path / "missing")]) == errors.NO_INPUT
    assert "missing: not a directory" in capsys.readouterr().err
    assert cli.main(["report", str(tmp_path)]) == errors.NO_INPUT
    assert "report.json: No such file" in capsys.readouterr().err
    (tmp_path / "bad.json").write_text("{\n oops")
    assert cli.main(["report", "--replay", str(tmp_path / "bad.json")]) == errors.USAGE
    assert "bad.json:2: not JSON" in capsys.readouterr().err
    assert cli.main(["report"]) == errors.USAGE


def test_external_url_is_validated_with_file_and_line(tmp_path):
    good = tmp_path / "good.yaml"
    good.write_text("external_url: https://ops.example/ddpwatch/node1\n")
    assert load_config(str(good)).external_url == "https://ops.example/ddpwatch/node1"
    for bad in ("ftp://x", "node1:19500", "https://x/?token=1", "[1]", "''x"):
        path = tmp_path / "bad.yaml"
        path.write_text(f"tick_s: 1\nexternal_url: {json.dumps(bad)}\n")
        with pytest.raises(ConfigError, match=rf"^{re.escape(str(path))}:2: external_url: "):
            load_config(str(path))


def test_webhook_messages_link_to_the_page():
    url = "https://ops.example/ddpwatch/node1" + incident_path("run:42/x-1-1")
    assert url.endswith("/incidents/run%3A42%2Fx-1-1")
    alert = Alert(status="firing", incident_id="run:42/x-1-1", node="n", job="run:42/x",
                  verdict="stopped", culprits=(1,), summary="s", started_at=1.0, ended_at=0.0,
                  status_url="https://ops.example/ddpwatch/node1/status", incident_url=url)
    assert generic.payload(alert)["incident_url"] == url
    assert f"<{url}|incident page>" in json.dumps(slack.payload(alert))
    (am,) = alertmanager.payload(alert, now=2.0, resend_s=60)
    assert am["annotations"]["incident_url"] == url and am["generatorURL"] == url


def test_a_rank_whose_number_is_unknown_reads_rank_unknown_never_rank_minus_one():
    """The time book and a job's culprits keep -1 for a process no evidence gave a
    rank (a SIGTERMed rank gone before it was read): people read "rank unknown"."""
    assert page._rank_label(-1) == "rank unknown" and page._rank_label(3) == "rank 3"
    over = {"timeline": [{"at": 1795365010.0, "verdict": "dead"}],
            "time_last_hour_s": {"-1": {"computing": 5.0}, "0": {"waiting": 5.0}}}
    html = page._over_time(over, incident())
    assert "rank -1" not in html and "rank unknown" in html
