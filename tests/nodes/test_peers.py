"""The peer view with real parts: two "nodes" on this host, each a PID, mount,
UTS (and for node B, network) namespace with its own heartbeat directory, one
rank of a 2-rank Gloo job and its own `ddpwatch run`. Neither daemon can see the
other node's rank; each asks the other's /peer."""
from __future__ import annotations

import os
import shlex
import shutil
import signal
import subprocess
import sys
import urllib.request

from conftest import free_port, need, runs_module, wait_until
from twonodes import TOKEN, get_json, token_file

TIMEOUT = 240


def need_namespaces():
    need(os.geteuid() == 0 and shutil.which("unshare") is not None,
         "needs root and unshare for PID and UTS namespaces")


def start_node(start_job, tmp_path, name: str, rank: int, listen: str, peer_url: str,
               master: tuple[str, int], ifname: str, webhook: str, prefix=(), faults=(),
               first=()):
    """A node: a shell (pid 2 of its own PID namespace; pid 1 stays a plain
    shell so no rank looks orphaned) running one rank by hand and a daemon;
    `first`, a command started a second before the rank (a look-alike)."""
    root = tmp_path / name
    (root / "hb").mkdir(parents=True)
    config = root / "config.yaml"
    config.write_text(f"listen: {listen}\ntoken: {TOKEN}\ntick_s: 0.5\n"
                      f"state_dir: {root / 'state'}\nheartbeat_dir: {root / 'hb'}\n"
                      f"peers: [{peer_url}]\n"
                      f"webhooks:\n  - type: generic\n    url: {webhook}\n")
    rank_env = {"MASTER_ADDR": master[0], "MASTER_PORT": str(master[1]), "WORLD_SIZE": "2",
                "RANK": str(rank), "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1",
                "GLOO_SOCKET_IFNAME": ifname}
    # the rank's variables on the rank only: the daemon is a python process too
    trainer = ["env", *(f"{k}={v}" for k, v in rank_env.items()), sys.executable, "-m",
               "trainer", "--steps=0", *(f"--fault={f}" for f in faults)]
    daemon = [sys.executable, "-m", "ddpwatch", "run", "--config", str(config)]
    before = ""
    if first:  # a script of its own: its argv needs no quoting inside the node's `sh -c`
        (root / "first.sh").write_text(f"exec {shlex.join(first)}\n")
        before = f"sh {root / 'first.sh'} > {root / 'first.log'} 2>&1 & sleep 1; "
    script = (f"hostname {name}; sh -c '{before}{' '.join(trainer)} > {root / 'rank.log'} 2>&1 & "
              f"{' '.join(daemon)} > {root / 'daemon.log'} 2>&1 & wait'; true")
    env = {"DDPWATCH_DIR": str(root / "hb")}
    argv = [*prefix, "unshare", "--pid", "--fork", "--mount-proc", "--uts", "sh", "-c", script]
    return start_job(argv, env=env, name=name), root


def test_two_daemons_name_the_culprit_on_the_other_node(start_job, tmp_path, netns, receivers):
    need_namespaces()
    hook = receivers(host=netns["host_addr"])  # both nodes reach it (B over its veth)
    port_a, port_b, master_port = free_port(), free_port(), free_port()
    url_a = f"http://{netns['host_addr']}:{port_a}"
    url_b = f"http://{netns['peer_addr']}:{port_b}"
    master = (netns["host_addr"], master_port)
    node_a, root_a = start_node(start_job, tmp_path, "node-a", 0, f"{netns['host_addr']}:{port_a}",
                                url_b, master, netns["host_if"], hook.url)
    node_b, root_b = start_node(start_job, tmp_path, "node-b", 1, f"{netns['peer_addr']}:{port_b}",
                                url_a, master, netns["peer_if"], hook.url, prefix=netns["exec"],
                                faults=["hang:rank=1:step=150"])

    def ranks_seen(doc):
        job = next((j for j in (doc or {}).get("jobs", []) if j["key"] == f"{master[0]}:{master[1]}"),
                   None)
        return {(r["rank"], r["host"]): (r["verdict"], r["role"]) for r in job["ranks"]} if job else {}

    def logs():
        return "\n".join(f"--- {p}:\n" + (p.read_text()[-3000:] if p.exists() else "(none)")
                         for p in (root_a / "daemon.log", root_b / "daemon.log",
                                   root_a / "rank.log", root_b / "rank.log"))

    # Both ranks train; each daemon judges its own rank with the other node's.
    both = {(0, "node-a"), (1, "node-b")}
    wait_until(lambda: set(ranks_seen(get_json(url_a + "/status"))) == both
               and set(ranks_seen(get_json(url_b + "/status"))) == both, TIMEOUT,
               what=lambda: f"both daemons seeing both ranks\n{logs()}")
    peer_doc = get_json(url_a + "/peer")
    assert peer_doc["node"] == "node-a"
    assert [s["rank"] for job in peer_doc["jobs"].values() for s in job] == [0]  # its own only

    # Rank 1 hangs outside collectives at step 150: both daemons name it.
    culprit = {(0, "node-a"): ("blocked_in_collective", "victim"),
               (1, "node-b"): ("hung_outside_collective", "culprit")}
    for url in (url_a, url_b):
        wait_until(lambda: ranks_seen(get_json(url + "/status")) == culprit, TIMEOUT,
                   what=lambda: f"{url} naming rank 1 on node-b\n{logs()}")
    status_a = get_json(url_a + "/status")
    assert status_a["node"] == "node-a" and status_a["job"]["culprits"] == [1]
    assert "rank 1 (on node-b) is the culprit" in status_a["job"]["summary"]
    assert status_a["peers"][0]["node"] == "node-b" and status_a["peers"][0]["error"] == ""
    table = subprocess.run([sys.executable, "-m", "ddpwatch", "status", "--url", url_a,
                            "--token-file", token_file()], capture_output=True, text=True, timeout=60)
    assert table.returncode == 0, table.stderr
    row = next(line.split() for line in table.stdout.splitlines()
               if line.startswith(f"{master[0]}:{master[1]}") and "hung_outside" in line)
    assert row[1:3] == ["node-b", "1"] and "culprit" in row
    assert f"peer {url_b} (node-b): ok" in table.stdout
    # Node A's incident bundle holds the whole judgement, and only its own record.
    incident = wait_until(lambda: next((i for i in get_json(url_a + "/status")["incidents"]
                                        if i["culprits"] == [1] and i["bundle"]), None),
                          TIMEOUT, what="an incident with a bundle on node A")
    report = open(os.path.join(incident["bundle"], "report.txt")).read()
    assert "rank 1" in report and "on node-b (peer view)" in report
    assert [r.startswith("rank0") for r in os.listdir(os.path.join(incident["bundle"], "records"))] == [True]

    # One problem, one page: both nodes hold the incident; node A (rank 0's) sends
    # the webhooks, culprit on node B included, and node B, having seen A claim the
    # job, sends none.
    def alerts_from(url):
        return [i.get("alerts_from") for i in (get_json(url + "/status") or {}).get("incidents", [])
                if i["state"] != "resolved"]
    for url in (url_a, url_b):
        wait_until(lambda: alerts_from(url) == ["node-a"], TIMEOUT,
                   what=lambda: f"{url}'s incident sent from node-a\n{logs()}")
    firing = wait_until(lambda: [b for b in hook.bodies() if b["status"] == "firing"
                                 and b["culprits"] == [1]], TIMEOUT,
                        what=lambda: f"a firing webhook naming rank 1\n{logs()}")
    assert {b["node"] for b in hook.bodies()} == {"node-a"}, hook.bodies()
    assert "webhooks from node-a" in subprocess.run(
        [sys.executable, "-m", "ddpwatch", "status", "--url", url_b, "--token-file", token_file()],
        capture_output=True, text=True, timeout=60).stdout
    # Node A exports its own rank's series only; rank 1's come from node B.
    request = urllib.request.Request(url_a + "/metrics")
    metrics = urllib.request.urlopen(request, timeout=10).read().decode()
    assert 'ddpwatch_job_culprit{ddp_job="%s:%d",rank="1"} 1.0' % master in metrics
    assert 'rank="1",verdict="hung_outside_collective"' not in metrics
    assert 'rank="0",verdict="blocked_in_collective"} 1.0' in metrics
    assert f'ddpwatch_peer_up{{peer="{url_b}"}} 1.0' in metrics

    # Node B's daemon goes away: node A says so and stops judging rank 1 from old news.
    for proc in node_b.processes():
        if runs_module(proc.cmdline(), "ddpwatch", "run"):
            proc.send_signal(signal.SIGTERM)
    wait_until(lambda: (get_json(url_a + "/status") or {}).get("peers", [{}])[0].get("error"),
               TIMEOUT, what=lambda: f"node A noticing its peer is gone\n{logs()}")
    wait_until(lambda: set(ranks_seen(get_json(url_a + "/status"))) == {(0, "node-a")}, TIMEOUT,
               what="rank 1 dropped once the peer's answer is too old")
    assert get_json(url_a + "/status")["job"]["culprits"] == []
    metrics = urllib.request.urlopen(url_a + "/metrics", timeout=10).read().decode()
    assert f'ddpwatch_peer_up{{peer="{url_b}"}} 0.0' in metrics


def test_a_look_alike_started_first_neither_hides_nor_silences_the_real_job(
        start_job, tmp_path, netns, receivers):
    """Another user (uid 65534) starts a look-alike "rank 1" on node B under the
    run id the real job will have (its master's address and port), a second
    before the real rank 1 starts there. Node B labels the look-alike with the
    bare run id and the real job with its owner added (observe/jobs/discovery.py
    labels). Node A must still join node B's real rank, not the look-alike, and
    name it when it hangs; node B must leave the real job's webhooks to node A,
    whose claim names the real job's owner (publish/peers.py `owned`)."""
    need_namespaces()
    import otheruser
    runtime = otheruser.runtime()
    hook = receivers(host=netns["host_addr"])
    port_a, port_b, master_port = free_port(), free_port(), free_port()
    url_a = f"http://{netns['host_addr']}:{port_a}"
    url_b = f"http://{netns['peer_addr']}:{port_b}"
    master = (netns["host_addr"], master_port)
    label = f"{master[0]}:{master[1]}"
    lookalike = otheruser.as_user(
        otheruser.NOBODY, "env", "RANK=1", "WORLD_SIZE=2", "LOCAL_RANK=0",
        f"MASTER_ADDR={master[0]}", f"MASTER_PORT={master[1]}",
        *runtime.argv("-c", "import time; time.sleep(3600)"))
    start_node(start_job, tmp_path, "node-a", 0, f"{netns['host_addr']}:{port_a}", url_b,
               master, netns["host_if"], hook.url)
    _, root_b = start_node(start_job, tmp_path, "node-b", 1, f"{netns['peer_addr']}:{port_b}",
                           url_a, master, netns["peer_if"], hook.url, prefix=netns["exec"],
                           faults=["hang:rank=1:step=150"], first=lookalike)

    def logs():
        return "\n".join(f"--- {p}:\n" + (p.read_text()[-3000:] if p.exists() else "(none)")
                         for p in (root_b / "daemon.log", root_b / "first.log",
                                   root_b / "rank.log"))

    def jobs(url):
        return {j["key"]: j for j in (get_json(url + "/status") or {}).get("jobs", [])}

    def ranks_of(job):
        return {(r["rank"], r["host"]): (r["verdict"], r["role"]) for r in job["ranks"]}

    # node B holds both: the look-alike under the bare run id, the real job beside it
    real_b = wait_until(lambda: (lambda js: next((k for k in js if k.startswith(label + "@u0.")),
                                                 None) if label in js else None)(jobs(url_b)),
                        TIMEOUT, what=lambda: f"node B's look-alike and real job\n{logs()}")
    both = {(0, "node-a"), (1, "node-b")}
    wait_until(lambda: set(ranks_of(jobs(url_a).get(label, {"ranks": []}))) == both
               and set(ranks_of(jobs(url_b).get(real_b, {"ranks": []}))) == both, TIMEOUT,
               what=lambda: f"both nodes judging the real job's two ranks\n{logs()}")
    look_b = jobs(url_b)[label]
    assert {r["host"] for r in look_b["ranks"]} <= {"node-b"}, look_b  # joined to nothing
    # rank 1 hangs at step 150: node A names the real rank 1, on node B
    culprit = {(0, "node-a"): ("blocked_in_collective", "victim"),
               (1, "node-b"): ("hung_outside_collective", "culprit")}
    wait_until(lambda: ranks_of(jobs(url_a).get(label, {"ranks": []})) == culprit, TIMEOUT,
               what=lambda: f"node A naming rank 1 on node-b\n{logs()}")
    # node B's incident of the real job is left to node A, the owner of its rank 0
    def real_incident_b():
        return next((i for i in (get_json(url_b + "/status") or {}).get("incidents", [])
                     if i["owner"].startswith("u0.") and i["state"] != "resolved"), None)
    wait_until(lambda: (real_incident_b() or {}).get("alerts_from") == "node-a", TIMEOUT,
               what=lambda: f"node B leaving the real job's webhooks to node A\n{logs()}")
    wait_until(lambda: [b for b in hook.bodies() if b["status"] == "firing"
                        and b["node"] == "node-a" and b["job"] == label
                        and b["culprits"] == [1]], TIMEOUT,
               what=lambda: f"node A's firing webhook naming rank 1\n{logs()}")
    assert not [b for b in hook.bodies() if b["node"] == "node-b" and b["job"] == real_b], \
        hook.bodies()
