"""Floods: fake ranks that any user can start and end cost the people paged
nothing, and never push a real page out (publish/limits.py, bundle.prune,
alerts/dispatch.py drop_index). Pure parts, then uid 65534 against a real
daemon watching a real job."""
from __future__ import annotations

import os
import re
import signal
import time

from attacker import need_root, no_traceback, keeps_ticking, python_as_nobody
from conftest import JOB_TAG, wait_until
from crafted import alert
from daemons import DaemonRun, get, our_status, rank_pid, trainer_job

from ddpwatch.observe.jobs import discovery
from ddpwatch.observe.jobs.discovery import CLK_TCK
from ddpwatch.publish import bundle, limits
from ddpwatch.publish.alerts.dispatch import drop_index
from ddpwatch.publish.incidents import IncidentBook

# --- pure parts ---------------------------------------------------------------------


def test_owner_key_gives_uid_and_birth():
    key = f"u65534.p4242.s{int(120.5 * CLK_TCK)}"
    assert discovery.owner_uid(key) == 65534 and discovery.born_s(key) == 120.5
    assert limits.life_s(key, 121.5) == 1.0 and limits.life_s(key, None) is None
    for odd in ("pid300", "u-1.p7.s-1", "u1.p2", "x"):
        assert discovery.born_s(odd) is None
    assert discovery.owner_uid("pid300") == -1 and discovery.owner_uid("u-1.p7.s-1") == -1


def test_only_a_young_death_is_held_back():
    assert limits.too_young("dead", 1.0, 10.0)
    assert not limits.too_young("dead", 10.0, 10.0)
    assert not limits.too_young("dead", None, 10.0)  # undated: pages
    assert not limits.too_young("stopped", 1.0, 10.0)  # a stall takes a live process
    assert not limits.too_young("dead", 1.0, 0.0)
    assert not limits.too_young("dead", 1.0, 10.0, worked=True)  # it trained: pages


def test_buckets_per_uid_burst_then_refill():
    b = limits.Buckets(3, 60.0)
    assert [b.take(7, 0.0) for _ in range(4)] == [True, True, True, False]
    assert b.take(8, 0.0)  # another uid has its own
    assert not b.take(7, 59.0)  # 59/60 of a token
    assert b.take(7, 120.0) and b.take(7, 121.0) and not b.take(7, 121.0)  # two by then
    assert [b.take(7, 10_000.0) for _ in range(4)] == [True, True, True, False]  # never above burst


def test_incident_book_gate_holds_back_and_counts_once_per_job():
    why = {"a": "young", "b": "uid_rate", "c": ""}
    book = IncidentBook(5.0, gate=lambda key, verdict: why[key])
    for t in range(6):  # six ticks of the same three problems
        events = book.update({k: ("dead", (1,), "s") for k in why}, 100.0 + t)
    assert [i.owner for i in book.open()] == ["c"]
    assert book.limited_total == {"young": 1, "uid_rate": 1} and not events
    why["b"] = ""  # the uid's bucket refilled: the problem that still stands opens
    events = book.update({k: ("dead", (1,), "s") for k in why}, 107.0)
    assert [e.incident.owner for e in events] == ["b"]
    assert book.limited_total == {"young": 1, "uid_rate": 1}


def bundle_dir(root, name: str, size: int, age_s: float, now: float) -> str:
    path = os.path.join(root, "incidents", name)
    os.makedirs(os.path.join(path, "records"))
    with open(os.path.join(path, "records", "rank0.hb"), "wb") as f:
        f.write(b"r" * size)
    for p in (os.path.join(path, "records", "rank0.hb"), os.path.join(path, "records"), path):
        os.utime(p, (now - age_s, now - age_s))
    return path


def test_prune_by_age_then_size_never_an_open_ones(tmp_path):
    now = time.time()
    root = str(tmp_path)
    old = bundle_dir(root, "old-1", 1000, 8 * 86400, now)
    open_old = bundle_dir(root, "open-1", 1000, 9 * 86400, now)
    a = bundle_dir(root, "a-1", 400_000, 300, now)
    b = bundle_dir(root, "b-1", 400_000, 200, now)
    c = bundle_dir(root, "c-1", 400_000, 100, now)
    leftover = bundle_dir(root, ".tmp-x", 10, 7200, now)
    os.symlink("/etc", os.path.join(root, "incidents", "link"))  # not followed
    removed = bundle.prune(root, 7 * 86400, 1_000_000, frozenset({open_old}), now)
    assert removed == {"age": 2, "size": 1}
    assert [os.path.exists(p) for p in (old, open_old, a, b, c, leftover)] == \
        [False, True, False, True, True, False]
    assert os.path.exists("/etc/hostname") or os.path.isdir("/etc")
    assert bundle.prune(root, 7 * 86400, 1_000_000, frozenset({open_old}), now) == \
        {"age": 0, "size": 0}


def test_a_full_queue_drops_the_least_severe_then_the_oldest():
    straggler = alert(iid="s", verdict="straggler")
    dead_old, dead_new = alert(iid="d0", verdict="dead"), alert(iid="d1", verdict="dead")
    stopped = alert(iid="t", verdict="stopped")
    assert drop_index([dead_old, straggler, stopped], dead_new) == 1  # the straggler
    assert drop_index([dead_old, stopped], dead_new) == 1             # stopped < dead
    assert drop_index([dead_old, dead_new], alert(iid="x", verdict="dead")) == 0  # oldest
    assert drop_index([dead_old, stopped], straggler) == 2  # the new one is the least
    assert drop_index([alert(iid="u", verdict="no-such"), dead_old], stopped) == 0


# --- uid 65534 against a real daemon ------------------------------------------------

# Fake ranks, each its own job: argv0 `python3` and RANK in the environment,
# a shell that sleeps `life` seconds and exits 3 (an abnormal end: held and
# judged dead, observe/jobs/departures.py). Double-forked, so no parent of theirs
# looks like a launcher that would make them one job.
FLOOD = r"""
import os, sys, time
n, life, gap, tag = int(sys.argv[1]), sys.argv[2], float(sys.argv[3]), sys.argv[4]
for i in range(n):
    env = {"PATH": "/usr/bin:/bin", "RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "2",
           "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(20000 + i),
           "TORCHELASTIC_RUN_ID": f"fake-{tag}-{i}", "%s": os.environ["%s"]}
    if os.fork() == 0:
        if os.fork() == 0:
            os.execve("/bin/sh", ["python3", "-c", f"sleep {life}; exit 3"], env)
        os._exit(0)
    os.wait()
    time.sleep(gap)
print("started", n, flush=True)
""" % (JOB_TAG, JOB_TAG)

LIMIT = 3  # the test's uid_incidents


def metric(text: str, name: str, **labels) -> float:
    sel = ",".join(f'{k}="{v}"' for k, v in labels.items())
    m = re.search(rf"^{name}{{{sel}}} (\S+)$" if sel else rf"^{name} (\S+)$", text, re.M)
    return float(m.group(1)) if m else 0.0


def test_fake_rank_floods_page_nothing_however_long_they_live(
        start_job, tmp_path, hb_dir, receivers):
    need_root()
    hook = receivers()
    daemon = DaemonRun(start_job, tmp_path, hb_dir, {
        "tick_s": 0.5, "resolve_after_s": 2, "uid_incidents": LIMIT, "uid_bundles": 2 * LIMIT,
        "uid_refill_s": 3600, "webhooks": [{"type": "generic", "url": hook.url}]})
    trainer = trainer_job(start_job)
    healthy = wait_until(lambda: (lambda s: s if len(s["ranks"]) == 2 and s["job"]["verdict"]
                                  == "healthy" else None)(our_status(daemon, trainer)), 240,
                         what="healthy job")
    # 8 fakes that live 20 s (twice min_life_s: before publish/limits.py
    # shows_a_job they opened `dead` incidents up to the uid's bucket), and
    # meanwhile 12 that live 1 s each. None has a record, a socket or a peer.
    older = start_job(python_as_nobody("-c", FLOOD, "8", "20", "0", "old"), name="flood-old")
    wait_until(lambda: "started" in older.output(), 60, what="the 20-second fakes")
    young = start_job(python_as_nobody("-c", FLOOD, "12", "1", "0.3", "young"),
                      name="flood-young")
    wait_until(lambda: "started" in young.output(), 60, what="the one-second fakes")
    # every watched fake (8 a user: budget.MAX_JOBS_PER_UID) was held back: it only
    # claimed a rank
    wait_until(lambda: metric(daemon.metrics(), "ddpwatch_incidents_limited_total",
                              reason="claims_only") >= 8, 90,
               what=lambda: "the fakes' deaths held back; the daemon's counts:\n" + "\n".join(
                   line for line in daemon.metrics().splitlines() if line.startswith((
                       "ddpwatch_incidents_limited_total", "ddpwatch_left_out"))))
    wait_until(lambda: not [j for j in daemon.status()["jobs"]
                            if j["job"]["run_id"].startswith("fake-")], 60,
               what="the 20-second fakes gone")
    # the real job (root's) is paged all the same
    os.kill(rank_pid(healthy, 1), signal.SIGSTOP)
    key = healthy["key"]
    wait_until(lambda: [b for b in hook.bodies() if b["status"] == "firing" and b["job"] == key],
               60, what="the real job's firing webhook")
    os.kill(rank_pid(healthy, 1), signal.SIGCONT)

    status = daemon.status()
    fake = [i for i in status["incidents"] if i["owner"].startswith("u65534.")]
    assert not fake, [(i["job"], i["verdict"]) for i in fake]
    fired = {b["job"] for b in hook.bodies() if b["status"] == "firing"}
    assert not any(j.startswith(("fake-", "uid65534-")) for j in fired), fired
    bundles = os.listdir(os.path.join(daemon.state_dir, "incidents"))
    assert not [b for b in bundles if b.startswith(("fake-", "uid65534-"))], bundles
    text = daemon.metrics()
    assert metric(text, "ddpwatch_incidents_opened_total", verdict="dead") == 0
    assert metric(text, "ddpwatch_bundles_pruned_total", reason="age") == 0
    assert daemon.job.proc.poll() is None
    keeps_ticking(daemon)
    no_traceback(daemon)
    assert get(daemon.url + "/metrics")[0] == 200
