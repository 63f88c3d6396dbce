"""The cluster view at scale: rules/prometheus/ddpwatch-alerts.yaml over a
simulated cluster (benchmarks/cluster_sim.py), one culprit hidden per scenario
(stopped, lagging, straggler across nodes, hang with the culprit's node down).

`promtool test rules` asserts, at three times per scenario, every alert of the
rule file with exactly the label sets expected: the culprit's rank (or, node
down, its node) and nothing else. The full 256 x 8 run and a real Prometheus
scraping simulated daemons are `python benchmarks/cluster_scale.py`.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest
from conftest import REPO, need

sys.path.insert(0, os.path.join(REPO, "benchmarks"))
import cluster_scale  # noqa: E402
import cluster_sim as sim  # noqa: E402
from prometheus_client import generate_latest  # noqa: E402

from ddpwatch.publish.metrics import SPECS, to_families  # noqa: E402

RANKS = 8
# 256 x 8 (benchmarks/cluster_scale.py --only promtool) takes minutes on a 2-core
# machine (benchmarks/README.md); the suite runs 32 x 8, 256 ranks.
NODES = int(os.environ.get("DDPWATCH_SCALE_NODES", "32"))


def _promtool() -> str:
    promtool = shutil.which("promtool")
    need(promtool is not None, "promtool is not installed (Debian: apt install prometheus)")
    return promtool


def test_a_node_exports_the_daemons_families_and_labels():
    """Rows the daemon's SPECS do not know would be dropped by to_families
    silently: every row is a SPECS family with its label names' count."""
    cluster = sim.Cluster("straggler", 256, RANKS, "run-x", 30.0)
    for t in (0.0, 90.0):
        rows = cluster.rows(cluster.culprit.node, t)
        assert {name for name, _, _ in rows} <= set(SPECS)
        assert all(len(values) == len(SPECS[name][1]) for name, values, _ in rows)
        assert sum(1 for r in rows if r[0] == "ddpwatch_rank_alive") == RANKS


def test_promtool_checks_a_simulated_nodes_metrics(tmp_path):
    promtool = _promtool()
    cluster = sim.Cluster("stopped", 256, RANKS, "run-x", 30.0)

    class Families:
        def collect(self):
            return to_families(cluster.rows(cluster.culprit.node, 60.0))
    done = subprocess.run([promtool, "check", "metrics"], input=generate_latest(Families()),
                          capture_output=True, timeout=60, check=False)
    assert done.returncode == 0, (done.stdout + done.stderr).decode()


def test_each_scenario_names_its_culprit_and_only_it(tmp_path):
    promtool = _promtool()
    paths = cluster_scale.promtool_files(str(tmp_path), NODES, RANKS)
    assert len(paths) == len(sim.SCENARIOS)
    failed = [(os.path.basename(p), out[-3000:]) for p, rc, out, _ in
              cluster_scale.run_promtool(paths, promtool) if rc != 0]
    assert not failed, failed


@pytest.mark.parametrize("scenario", ["stopped", "straggler"])
def test_naming_the_culprits_neighbour_fails(tmp_path, scenario):
    """The check can fail: expecting the rank next to the culprit, promtool
    reports the alert it got, naming the culprit."""
    promtool = _promtool()
    cluster = sim.Cluster(scenario, 4, RANKS, f"run-{scenario}", 180.0)
    real, culprit = cluster.expected, cluster.culprit.rank

    def neighbour(t, instance):
        return {name: [dict(labels, rank=str(culprit + 1)) if "rank" in labels else labels
                       for labels in sets] for name, sets in real(t, instance).items()}
    cluster.expected = neighbour
    (path,) = cluster_scale.promtool_files(str(tmp_path), 4, RANKS, clusters=[cluster])
    ((_, rc, out, _),) = cluster_scale.run_promtool([path], promtool)
    assert rc != 0
    assert f'rank="{culprit + 1}"' in out and f'rank="{culprit}"' in out


def test_expectations_point_at_one_place_in_the_cluster():
    """Every expected alert names the culprit's rank or node, or only the job."""
    for scenario in sim.SCENARIOS:
        cluster = sim.Cluster(scenario, 256, RANKS, "run-x", 180.0)
        c = cluster.culprit
        assert 0 < c.node < 255 and c.rank == c.node * RANKS + c.local
        for t in cluster.checks():
            for labels in (ls for sets in cluster.expected(t, sim.promtool_instance).values()
                           for ls in sets):
                assert labels.get("rank", str(c.rank)) == str(c.rank)
                assert labels.get("instance", sim.promtool_instance(c.node)) == \
                    sim.promtool_instance(c.node)
        assert cluster.expected(cluster.checks()[0], sim.promtool_instance) == {}


def test_the_exporters_text_is_the_daemons_byte_for_byte():
    """cluster_scale.Renderer fills values into a cached text: it must equal a
    full render by the daemon's code as the series and values change."""
    for scenario in sim.SCENARIOS:
        cluster = sim.Cluster(scenario, 16, RANKS, "run-x", 30.0)
        renderer = cluster_scale.Renderer()
        for t in (5.0, 20.0, 31.5, 70.25, 200.0):
            rows = cluster.rows(cluster.culprit.node, t)
            if rows is not None:
                full = generate_latest(cluster_scale._Families(to_families(rows)))
                assert renderer.text(rows) == full, (scenario, t)
