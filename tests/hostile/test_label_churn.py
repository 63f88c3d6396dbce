"""Label churn: uid 65534 starts fake ranks under fresh run ids, one every
0.6 s, each living 3 s, against a real daemon. The ddp_job values its jobs
give /metrics stay within its label budget (ddpwatch/publish/label_budget.py):
before it every job was a new value (~100 a minute), each a new set of series
in Prometheus."""
from __future__ import annotations

import json
import re
import time

from attacker import keeps_ticking, need_root, no_traceback, python_as_nobody
from conftest import JOB_TAG, wait_until
from daemons import DaemonRun, get

from ddpwatch.observe.budget import LABEL_REFILL_S, MAX_LABELS_PER_UID
from ddpwatch.publish.label_budget import overflow_label

# Each fake: argv0 `python3`, RANK and a run id of its own in the environment, a
# shell that sleeps and exits; double-forked, so no launcher makes them one job.
CHURN = r"""
import os, sys, time
n, life, gap, tag = int(sys.argv[1]), sys.argv[2], float(sys.argv[3]), sys.argv[4]
for i in range(n):
    env = {"PATH": "/usr/bin:/bin", "RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "2",
           "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(21000 + i),
           "TORCHELASTIC_RUN_ID": f"churn-{tag}-{i}", "%s": os.environ["%s"]}
    if os.fork() == 0:
        if os.fork() == 0:
            os.execve("/bin/sh", ["python3", "-c", f"sleep {life}; exit 0"], env)
        os._exit(0)
    os.wait()
    time.sleep(gap)
print("started", n, flush=True)
""" % (JOB_TAG, JOB_TAG)

JOBS = 36


def test_fresh_run_ids_make_a_bounded_number_of_label_values(start_job, tmp_path, hb_dir):
    need_root()
    daemon = DaemonRun(start_job, tmp_path, hb_dir, {"tick_s": 0.5})
    tag = f"{time.monotonic_ns() % 10**8}"
    churn = start_job(python_as_nobody("-c", CHURN, str(JOBS), "3", "0.6", tag), name="churn")
    ours = re.compile(rf'ddp_job="(churn-{tag}-\d+|{overflow_label(65534)})"')
    labels, jobs = set(), set()

    def scrape():
        labels.update(ours.findall(daemon.metrics()))
        code, body = get(daemon.url + "/status")
        if code == 200:
            jobs.update(j["job"]["run_id"] for j in json.loads(body)["jobs"]
                        if j["job"]["run_id"].startswith(f"churn-{tag}-"))
        return "started" in churn.output()
    wait_until(scrape, 90, interval=0.25, what="the churn of fake ranks")
    wait_until(lambda: scrape() and not jobs_alive(daemon, tag), 30, interval=0.25,
               what="the last fake ranks gone")
    # the daemon saw most of the fakes as jobs, yet gave them few label values:
    # its bucket (MAX_LABELS_PER_UID), at most one refill in the run, the overflow
    assert len(jobs) >= 2 * MAX_LABELS_PER_UID, sorted(jobs)
    bound = MAX_LABELS_PER_UID + 1 + 1
    assert LABEL_REFILL_S >= 60 and len(labels) <= bound, sorted(labels)
    assert overflow_label(65534) in labels
    left = re.search(r'^ddpwatch_left_out_total\{what="job_labels"\} (\S+)$', daemon.metrics(),
                     re.M)
    assert left and float(left.group(1)) >= len(jobs) - bound, daemon.metrics()[-2000:]
    keeps_ticking(daemon)
    no_traceback(daemon)


def jobs_alive(daemon, tag: str) -> bool:
    code, body = get(daemon.url + "/status")
    return code != 200 or any(j["job"]["run_id"].startswith(f"churn-{tag}-")
                              for j in json.loads(body)["jobs"])
