"""deploy/: the container image, the Kubernetes manifests, Grafana provisioning
and the SLURM recipe, checked offline: rendered by `kubectl kustomize`, validated
against the Kubernetes schemas (kubernetes-validate ships them), the PrometheusRule
through `promtool check rules`, the generated files against their sources, and the
image run beside a real 2-rank job."""
from __future__ import annotations

import configparser
import errno
import json
import os
import secrets
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid

import pytest
import yaml

from conftest import REPO, free_port, need, trainer, wait_until

DEPLOY = os.path.join(REPO, "deploy")
KUBE = os.path.join(DEPLOY, "kubernetes")
UNIT = os.path.join(REPO, "systemd", "ddpwatch.service")
# appArmorProfile (daemonset.yaml) is a field since Kubernetes 1.30
KUBERNETES_VERSION = "1.30.0"


def kustomize(path: str) -> list[dict]:
    kubectl = shutil.which("kubectl")
    need(kubectl is not None, "kubectl is not installed (it renders kustomizations)")
    done = subprocess.run([kubectl, "kustomize", path], capture_output=True, text=True,
                          timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    return [d for d in yaml.safe_load_all(done.stdout) if d]


def by_kind(docs: list[dict], kind: str) -> dict:
    found = [d for d in docs if d["kind"] == kind]
    assert len(found) == 1, (kind, [d["kind"] for d in docs])
    return found[0]


def unit_setting(name: str) -> list[str]:
    values = []
    with open(UNIT) as f:
        for line in f:
            if line.startswith(name + "="):
                values.append(line.split("=", 1)[1].strip())
    return values


# What tests/deploy/test_deploy.py holds the Prometheus Operator's two kinds to: the
# fields these manifests use, as the operator's API reference documents them
# (monitoring.coreos.com/v1), and nothing else. Its CRDs are not vendored here;
# a typo in a field name fails (additionalProperties: false).
_STR = {"type": "string"}
_OPERATOR_SCHEMAS = {
    "PodMonitor": {
        "type": "object", "required": ["selector", "podMetricsEndpoints"],
        "additionalProperties": False,
        "properties": {
            "jobLabel": _STR,
            "selector": {"type": "object", "properties": {"matchLabels": {
                "type": "object", "additionalProperties": _STR}}},
            "podMetricsEndpoints": {"type": "array", "minItems": 1, "items": {
                "type": "object", "additionalProperties": False,
                "properties": {
                    "port": _STR, "path": _STR,
                    "interval": {"type": "string", "pattern": r"^(\d+(ms|s|m|h))+$"},
                    "relabelings": {"type": "array", "items": {
                        "type": "object", "additionalProperties": False,
                        "properties": {"sourceLabels": {"type": "array", "items": _STR},
                                       "targetLabel": _STR, "action": _STR,
                                       "regex": _STR, "replacement": _STR}}}}}}}},
    "PrometheusRule": {
        "type": "object", "required": ["groups"], "additionalProperties": False,
        "properties": {"groups": {"type": "array", "items": {
            "type": "object", "required": ["name", "rules"], "additionalProperties": False,
            "properties": {"name": _STR, "interval": _STR, "rules": {"type": "array", "items": {
                "type": "object", "required": ["expr"], "additionalProperties": False,
                "properties": {"alert": _STR, "record": _STR, "expr": _STR, "for": _STR,
                               "keep_firing_for": _STR,
                               "labels": {"type": "object", "additionalProperties": _STR},
                               "annotations": {"type": "object",
                                               "additionalProperties": _STR}}}}}}}}},
}


def validate(doc: dict) -> None:
    """A core kind against Kubernetes' own schema (strict: unknown fields fail);
    an operator kind against _OPERATOR_SCHEMAS."""
    try:
        import kubernetes_validate
        import jsonschema
    except ImportError:
        need(False, "kubernetes-validate is not installed (pip install -e '.[test]')")
    if doc["apiVersion"].startswith("monitoring.coreos.com/"):
        assert doc["apiVersion"] == "monitoring.coreos.com/v1"
        assert set(doc) <= {"apiVersion", "kind", "metadata", "spec"}
        jsonschema.validate(doc["spec"], _OPERATOR_SCHEMAS[doc["kind"]])
        return
    try:
        kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)
    except kubernetes_validate.ValidationError as err:
        pytest.fail(f"{doc['kind']}/{doc['metadata'].get('name')}: {err.message} "
                    f"at {'.'.join(map(str, err.path))}")


def test_manifests_render_and_validate_against_the_kubernetes_schemas():
    docs = kustomize(KUBE)
    assert sorted(d["kind"] for d in docs) == sorted(
        ["Namespace", "ServiceAccount", "ConfigMap", "ConfigMap", "Secret", "Service",
         "DaemonSet", "PodMonitor", "PrometheusRule"])
    for doc in docs:
        validate(doc)
        if doc["kind"] != "Namespace":
            assert doc["metadata"]["namespace"] == "ddpwatch", doc["kind"]


def test_daemonset_runs_the_daemon_as_the_unit_does():
    docs = kustomize(KUBE)
    ds = by_kind(docs, "DaemonSet")
    pod = ds["spec"]["template"]["spec"]
    (box,) = pod["containers"]
    assert pod["hostPID"] is True and pod["hostNetwork"] is True
    assert pod["dnsPolicy"] == "ClusterFirstWithHostNet"
    # the same five capabilities as the unit's bounding set, every other dropped but
    # the one that binds a privileged port (the daemon gives it up once bound:
    # test_nobody_takes_the_containers_port_while_it_restarts reads its CapEff)
    (bounding,) = unit_setting("CapabilityBoundingSet")
    want = sorted([c.removeprefix("CAP_") for c in bounding.split()] + ["NET_BIND_SERVICE"])
    sc = box["securityContext"]
    assert sorted(sc["capabilities"]["add"]) == want and sc["capabilities"]["drop"] == ["ALL"]
    assert sc["allowPrivilegeEscalation"] is False and sc["readOnlyRootFilesystem"] is True
    assert not sc.get("privileged")
    # memory: the unit's MemoryMax, as a Kubernetes quantity
    (memory_max,) = unit_setting("MemoryMax")
    assert memory_max == "200M" and box["resources"]["limits"]["memory"] == "200Mi"
    assert "cpu" not in box["resources"]["limits"]
    # probes on the port the config listens on
    config = yaml.safe_load(by_kind([d for d in docs if d["kind"] == "ConfigMap" and
                                     d["metadata"]["name"].startswith("ddpwatch-config")],
                                    "ConfigMap")["data"]["config.yaml"])
    port = int(config["listen"].rsplit(":", 1)[1])
    # one no user of the node may bind while the pod restarts (the kernel's
    # default net.ipv4.ip_unprivileged_port_start)
    assert port < 1024
    (http,) = box["ports"]
    assert http["containerPort"] == port and http["name"] == "http"
    (service_port,) = by_kind(docs, "Service")["spec"]["ports"]
    assert service_port["port"] == port and service_port["targetPort"] == "http"
    env = {e["name"]: e.get("value") for e in box["env"]}
    assert env["DDPWATCH_EXTERNAL_URL"] == f"http://$(NODE_IP):{port}"
    assert box["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert box["readinessProbe"]["httpGet"]["path"] == "/readyz"
    # the node's record directory, read-only, where the daemon's config reads
    mounts = {m["name"]: m for m in box["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["records"]["hostPath"]["path"] == "/dev/shm/ddpwatch"
    assert mounts["records"]["mountPath"] == config["heartbeat_dir"] == "/dev/shm/ddpwatch"
    assert mounts["records"]["readOnly"] is True
    assert mounts["state"]["mountPath"] == config["state_dir"]
    # the generated ConfigMap and Secret names were rewritten into the pod
    assert volumes["config"]["configMap"]["name"].startswith("ddpwatch-config-")
    assert box["envFrom"][0]["secretRef"]["name"].startswith("ddpwatch-secrets-")
    # Prometheus's job label is "ddpwatch", as DDPWatchDaemonDown selects it
    monitor = by_kind(docs, "PodMonitor")
    label = monitor["spec"]["jobLabel"]
    assert ds["spec"]["template"]["metadata"]["labels"][label] == "ddpwatch"
    with open(os.path.join(REPO, "rules", "prometheus", "ddpwatch-alerts.yaml")) as f:
        assert 'up{job="ddpwatch"}' in f.read()


def test_webhooks_component_moves_the_config_into_a_secret(tmp_path):
    overlay = tmp_path / "overlay"
    overlay.mkdir()
    (overlay / "kustomization.yaml").write_text(yaml.safe_dump({
        "apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
        "resources": [os.path.relpath(KUBE, overlay)],
        "components": [os.path.relpath(os.path.join(KUBE, "components", "webhooks"), overlay)]}))
    docs = kustomize(str(overlay))
    for doc in docs:
        validate(doc)
    pod = by_kind(docs, "DaemonSet")["spec"]["template"]["spec"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    name = volumes["config"]["secret"]["secretName"]
    secret = next(d for d in docs if d["kind"] == "Secret" and d["metadata"]["name"] == name)
    assert "config.yaml" in secret["data"] and "configMap" not in volumes["config"]


@pytest.mark.parametrize("path", ["deploy/kubernetes/config.yaml",
                                  "deploy/kubernetes/components/webhooks/config.yaml"])
def test_shipped_configs_load_with_the_daemons_strict_loader(path, monkeypatch):
    from ddpwatch import config
    from ddpwatch.errors import ConfigError
    for var in config.ENV:
        monkeypatch.delenv(var, raising=False)
    # off loopback the token is required; the Secret gives it as $DDPWATCH_TOKEN
    with pytest.raises(ConfigError, match="token"):
        config.load(os.path.join(REPO, path))
    monkeypatch.setenv("DDPWATCH_TOKEN", "t" * 32)  # one letter: too weak off loopback
    with pytest.raises(ConfigError, match="too weak"):
        config.load(os.path.join(REPO, path))
    monkeypatch.setenv("DDPWATCH_TOKEN", secrets.token_hex(32))  # `openssl rand -hex 32`
    loaded = config.load(os.path.join(REPO, path))
    assert loaded.listen == "0.0.0.0:195" and loaded.state_dir == "/var/lib/ddpwatch"


def test_the_images_config_is_the_units_on_a_privileged_port():
    """deploy/image/config.yaml is systemd/config.yaml but for the port: the unit's
    socket is held by systemd across restarts, the container's is one no user may bind."""
    with open(os.path.join(DEPLOY, "image", "config.yaml")) as f:
        image = yaml.safe_load(f)
    with open(os.path.join(REPO, "systemd", "config.yaml")) as f:
        unit = yaml.safe_load(f)
    host, port = image.pop("listen").rsplit(":", 1)
    assert host == "127.0.0.1" and int(port) < 1024
    unit.pop("listen")
    assert image == unit
    with open(os.path.join(DEPLOY, "kubernetes", "config.yaml")) as f:
        assert yaml.safe_load(f)["listen"] == f"0.0.0.0:{port}"
    with open(os.path.join(DEPLOY, "image", "Containerfile")) as f:
        assert f"EXPOSE {port}\n" in f.read()
    with open(os.path.join(DEPLOY, "image", "run.sh")) as f:
        assert "--cap-add=CAP_NET_BIND_SERVICE" in f.read()


def test_secret_ships_no_token():
    with open(os.path.join(KUBE, "secret.env")) as f:
        assert [line.strip() for line in f if line.strip() and not line.startswith("#")] == \
            ["DDPWATCH_TOKEN="]


def test_generated_files_agree_with_their_sources():
    done = subprocess.run([sys.executable, os.path.join(DEPLOY, "generate.py"), "--check"],
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    with open(os.path.join(REPO, "rules", "prometheus", "ddpwatch-alerts.yaml")) as f:
        groups = yaml.safe_load(f)["groups"]
    with open(os.path.join(KUBE, "prometheusrule.yaml")) as f:
        rule = yaml.safe_load(f)
    assert rule["kind"] == "PrometheusRule" and rule["spec"]["groups"] == groups
    with open(os.path.join(REPO, "grafana", "ddpwatch.json")) as f:
        dashboard = json.load(f)
    with open(os.path.join(KUBE, "grafana-dashboard.yaml")) as f:
        cm = yaml.safe_load(f)
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert json.loads(cm["data"]["ddpwatch.json"]) == dashboard


def test_generate_check_names_a_stale_file(tmp_path):
    """--check fails, naming the file, when the source moved on."""
    copy = tmp_path / "repo"
    for part in ("deploy", "rules", "grafana"):
        shutil.copytree(os.path.join(REPO, part), copy / part)
    alerts = copy / "rules" / "prometheus" / "ddpwatch-alerts.yaml"
    alerts.write_text(alerts.read_text().replace("for: 30s", "for: 31s", 1))
    done = subprocess.run([sys.executable, str(copy / "deploy" / "generate.py"), "--check"],
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 1 and "deploy/kubernetes/prometheusrule.yaml" in done.stderr
    assert "Traceback" not in done.stderr


def test_prometheusrule_passes_promtool(tmp_path):
    promtool = shutil.which("promtool")
    need(promtool is not None, "promtool is not installed (Debian: apt install prometheus)")
    rule = by_kind(kustomize(KUBE), "PrometheusRule")
    rules_file = tmp_path / "rules.yaml"
    rules_file.write_text(yaml.safe_dump({"groups": rule["spec"]["groups"]}))
    done = subprocess.run([promtool, "check", "rules", str(rules_file)], capture_output=True,
                          text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    assert re.search(r"SUCCESS: \d+ rules found", done.stdout + done.stderr)


# Grafana's provisioning reference (administration/provisioning): the keys a
# dashboard provider and a data source may have.
PROVIDER_KEYS = {"name", "orgId", "folder", "folderUid", "type", "disableDeletion",
                 "updateIntervalSeconds", "allowUiUpdates", "options"}
PROVIDER_OPTION_KEYS = {"path", "foldersFromFilesStructure"}
DATASOURCE_KEYS = {"name", "type", "access", "orgId", "uid", "url", "user", "database",
                   "basicAuth", "basicAuthUser", "withCredentials", "isDefault", "jsonData",
                   "secureJsonData", "version", "editable"}


def test_grafana_provisioning_files_parse_as_grafana_documents_them():
    base = os.path.join(DEPLOY, "grafana", "provisioning")
    with open(os.path.join(base, "dashboards", "ddpwatch.yaml")) as f:
        dashboards = yaml.safe_load(f)
    assert dashboards["apiVersion"] == 1
    (provider,) = dashboards["providers"]
    assert set(provider) <= PROVIDER_KEYS and set(provider["options"]) <= PROVIDER_OPTION_KEYS
    assert provider["type"] == "file" and isinstance(provider["orgId"], int)
    assert isinstance(provider["updateIntervalSeconds"], int)
    # the path is where setup.cfg's data_files put grafana/*.json for a root pip install
    parser = configparser.ConfigParser()
    parser.read(os.path.join(REPO, "setup.cfg"))
    data_files = parser["options.data_files"]
    assert data_files["share/ddpwatch/grafana"].strip() == "grafana/*.json"
    assert provider["options"]["path"] == "/usr/local/share/ddpwatch/grafana"
    with open(os.path.join(base, "datasources", "prometheus.example.yaml")) as f:
        sources = yaml.safe_load(f)
    assert sources["apiVersion"] == 1
    (source,) = sources["datasources"]
    assert set(source) <= DATASOURCE_KEYS
    assert source["type"] == "prometheus" and source["access"] == "proxy"
    assert re.fullmatch(r"https?://\S+", source["url"])
    # the dashboard chooses its data source by a variable of type datasource,
    # so any Prometheus source (this one, or the sidecar's) fits it
    with open(os.path.join(REPO, "grafana", "ddpwatch.json")) as f:
        variables = json.load(f)["templating"]["list"]
    assert any(v["type"] == "datasource" and v["query"] == "prometheus" for v in variables)


def taskprolog(env: dict) -> str:
    done = subprocess.run(["sh", os.path.join(DEPLOY, "slurm", "taskprolog.sh")],
                          env={"PATH": os.environ["PATH"], **env}, capture_output=True,
                          text=True, timeout=30, check=True)
    return done.stdout


def test_slurm_taskprolog_turns_heartbeats_on_per_user():
    assert taskprolog({}) == f"export DDPWATCH_AUTO=1\nexport DDPWATCH_DIR=/dev/shm/ddpwatch-{os.getuid()}\n"
    assert taskprolog({"DDPWATCH_DIR": "/x"}) == "export DDPWATCH_AUTO=1\n"
    assert taskprolog({"DDPWATCH_AUTO": "0"}) == ""  # a job that said no is left alone


def test_slurm_job_under_the_taskprolog_writes_heartbeats_the_daemon_reads(
        start_job, tmp_path, hb_dir, tmp_path_factory):
    """The recipe on the one-node SLURM cluster (tests/support/slurm.py): slurm.conf's
    TaskProlog is deploy/slurm/taskprolog.sh, the job script has no ddpwatch in it
    (tests/jobs/thirdparty/srun_ddp.py), and the node's daemon reads its ranks'
    heartbeats: DDPWATCH_AUTO=1 came from the prolog alone."""
    from slurm import Slurm
    from daemons import DaemonRun, with_heartbeats
    cluster = Slurm(tmp_path_factory.mktemp("slurm"),
                    (f"TaskProlog={os.path.join(DEPLOY, 'slurm', 'taskprolog.sh')}",))
    try:
        daemon = DaemonRun(start_job, tmp_path, hb_dir, {})
        env = dict(cluster.env, MASTER_PORT=str(free_port()))
        env.pop("DDPWATCH_AUTO", None)
        # the records go to this test's directory (the prolog keeps a DDPWATCH_DIR
        # the job already has), not the node's per-user one
        script = os.path.join(REPO, "tests", "jobs", "thirdparty", "srun_ddp.py")
        job = start_job(["srun", "-n", "2", sys.executable, script], env=env, name="srun")

        def slurm_job_with_heartbeats():
            for found in daemon.status()["jobs"]:
                if found["job"]["launcher_kind"] == "slurm" and with_heartbeats(found):
                    return found
            return None
        found = wait_until(slurm_job_with_heartbeats, 240, what="the srun job's heartbeats")
        assert sorted(r["rank"] for r in found["ranks"]) == [0, 1]
        # the tasks carry the job's tag through srun (--export=ALL): they are its
        assert {r["pid"] for r in found["ranks"]} <= {p.pid for p in job.processes()}
        for rank in found["ranks"]:
            with open(f"/proc/{rank['pid']}/environ", "rb") as f:
                assert b"DDPWATCH_AUTO=1" in f.read().split(b"\0")
        assert sorted(os.listdir(hb_dir)) == sorted(
            f"rank{r['rank']}-pid{r['pid']}.hb" for r in found["ranks"])
    finally:
        cluster.close()


# --- the image ----------------------------------------------------------------------

def build_image() -> str:
    need(os.geteuid() == 0, "building the image needs root (mmdebstrap, podman)")
    need(shutil.which("podman") is not None and shutil.which("mmdebstrap") is not None,
         "podman and mmdebstrap are not installed (Debian: apt install podman mmdebstrap)")
    done = subprocess.run(["bash", os.path.join(DEPLOY, "image", "build.sh")],
                          capture_output=True, text=True, timeout=900, check=False,
                          env=dict(os.environ, PYTHON=sys.executable))
    need(done.returncode == 0, f"the image could not be built: {done.stderr.strip()[-800:]}")
    return done.stdout.strip().splitlines()[-1]


def test_image_holds_the_daemon_without_torch():
    image = build_image()
    cmd = ("import ddpwatch.daemon, sys, shutil; "
           "print('torch' in sys.modules, [shutil.which(t) for t in ('ss','ip','nsenter','py-spy')])")
    done = subprocess.run(["bash", "-c", f'. {DEPLOY}/image/podman-opts.sh && '
                           f'podman_opts {image} "${{DDPWATCH_IMAGE_CACHE:-/var/cache/ddpwatch-image}}" && '
                           f'podman "${{PODMAN_OPTS[@]}}" run --rm --network=none "${{ULIMITS[@]}}" '
                           f'--entrypoint /opt/ddpwatch/bin/python {image} -c "{cmd}"'],
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    torch_loaded, tools = done.stdout.strip().split(" ", 1)
    assert torch_loaded == "False" and "None" not in tools, done.stdout
    listing = subprocess.run(["podman", "image", "inspect", image, "--format",
                              "{{.Config.User}} {{json .Config.Entrypoint}}"],
                             capture_output=True, text=True, timeout=60, check=True).stdout
    assert listing.split(" ", 1) == ["0", '["/opt/ddpwatch/bin/ddpwatch"]\n']


def test_image_names_the_culprit_of_a_stopped_rank(start_job, hb_dir):
    """The image run as the DaemonSet runs it (run.sh: host PID and network, five
    capabilities, read-only root, the record directory mounted read-only) beside a
    real 2-rank job on the host: SIGSTOP rank 1, the container's /status names it."""
    from daemons import get, our_status, rank_pid, with_heartbeats
    image = build_image()
    name = f"ddpwatch-test-{uuid.uuid4().hex[:8]}"
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    os.makedirs(hb_dir, exist_ok=True)
    state = os.path.join(os.path.dirname(hb_dir), "state")
    env = dict(os.environ, DDPWATCH_NAME=name, DDPWATCH_RECORDS=hb_dir, DDPWATCH_STATE=state,
               DDPWATCH_LISTEN=f"127.0.0.1:{port}")
    started = subprocess.run(["bash", os.path.join(DEPLOY, "image", "run.sh"), image],
                             env=env, capture_output=True, text=True, timeout=120, check=False)
    try:
        assert started.returncode == 0, started.stderr
        wait_until(lambda: get(url + "/readyz")[0] == 200, 90, what="the container's /readyz")

        class Daemon:  # what test_daemon's helpers ask of a daemon
            def status(self, token=None):
                code, body = get(url + "/status", token)
                assert code == 200, (code, body)
                return json.loads(body)
        daemon = Daemon()
        job = start_job(trainer(), name="trainer")
        healthy = wait_until(lambda: with_heartbeats(our_status(daemon, job)), 180,
                             what="2 ranks with heartbeats, read by the container")
        wait_until(lambda: our_status(daemon, job)["job"]["verdict"] == "healthy", 120,
                   what="a healthy job")
        # every probe works inside the container: py-spy, sockets, traffic, exits
        view = daemon.status()
        assert view["probe_errors"] == {} and view["stage_failures"] == {}, view["probe_errors"]
        os.kill(rank_pid(healthy, 1), signal.SIGSTOP)
        stalled = wait_until(lambda: (lambda s: s if s["job"]["culprits"] == [1] else None)(
            our_status(daemon, job)), 60, what="rank 1 named the culprit")
        assert stalled["job"]["verdict"] == "stopped"
        assert next(r for r in stalled["ranks"] if r["rank"] == 1)["verdict"] == "stopped"
    finally:
        logs = subprocess.run(["podman", "logs", name], capture_output=True, text=True,
                              timeout=60, check=False)
        subprocess.run(["podman", "rm", "--force", "--time", "2", name], capture_output=True,
                       timeout=60, check=False)
        print(logs.stdout[-4000:], logs.stderr[-4000:])  # shown by pytest on a failure


# uid 65534's side of the restart test below: try to bind the port on loopback and
# on every address, without pause but a breath, until the stop file appears; say
# at once if a bind took, then the errno of every refusal counted, with the
# monotonic clock (system-wide) of the first and last attempt.
SQUAT_LOOP = """\
import json, os, socket, sys, time
port, stop = int(sys.argv[1]), sys.argv[2]
refused, held, first = {}, [], time.monotonic()
print("trying", flush=True)
while not os.path.exists(stop):
    for host in ("127.0.0.1", "0.0.0.0"):
        s = socket.socket()
        # as any server does: the daemon's closed connections (TIME_WAIT) then
        # keep nobody from the port, only a listener or the kernel's rule would
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
            s.listen(8)
            held.append(s)  # kept: the daemon's clients would now reach this program
            print("TOOK", host, flush=True)
        except OSError as e:
            refused[e.errno] = refused.get(e.errno, 0) + 1
            s.close()
    time.sleep(0.002)
print(json.dumps({"refused": refused, "took": len(held), "first": first,
                  "last": time.monotonic()}), flush=True)
"""


def test_nobody_takes_the_containers_port_while_it_restarts(start_job, hb_dir):
    """The image as run.sh runs it, on the port its own config names, restarted twice
    (`podman restart`; the daemon killed, then `podman start`) while uid 65534 tries
    to bind that port without pause: in a container nothing holds the port across a
    restart, so only a port no user may bind closes the window (deploy/image/config.yaml,
    ddpwatch/port_guard.py). The squatter never gets it, the daemon answers after each
    restart, and keeps only the unit's five capabilities once bound."""
    from attacker import as_nobody, need_root
    from daemons import get
    need_root()
    image = build_image()
    name = f"ddpwatch-test-{uuid.uuid4().hex[:8]}"
    os.makedirs(hb_dir, exist_ok=True)
    state = os.path.join(os.path.dirname(hb_dir), "state")
    env = dict(os.environ, DDPWATCH_NAME=name, DDPWATCH_RECORDS=hb_dir, DDPWATCH_STATE=state)
    env.pop("DDPWATCH_LISTEN", None)  # the image's own port
    playground = tempfile.mkdtemp(prefix="ddpw-restart-", dir="/tmp")
    os.chmod(playground, 0o1777)
    stop = os.path.join(playground, "stop")

    def podman(*args, timeout=120):
        return subprocess.run(["podman", *args], capture_output=True, text=True,
                              timeout=timeout, check=False)

    def logs() -> str:
        done = podman("logs", name, timeout=60)
        return done.stdout + done.stderr

    started = subprocess.run(["bash", os.path.join(DEPLOY, "image", "run.sh"), image],
                             env=env, capture_output=True, text=True, timeout=120, check=False)
    try:
        assert started.returncode == 0, started.stderr
        listening = wait_until(lambda: re.search(r"listening on ([\d.]+):(\d+)", logs()), 90,
                               what=lambda: f"the daemon listening: {logs()[-2000:]}")
        url = f"http://{listening.group(1)}:{listening.group(2)}"
        port = int(listening.group(2))
        wait_until(lambda: get(url + "/readyz")[0] == 200, 90, what="the container's /readyz")
        squatter = start_job(as_nobody("/usr/bin/python3", "-I", "-c", SQUAT_LOOP, str(port),
                                       stop), name="squatter")
        wait_until(lambda: "trying" in squatter.output(), 30, what="the squatter trying")

        def back_or_taken():
            return "TOOK" in squatter.output() or get(url + "/readyz")[0] == 200

        before = time.monotonic()
        restarted = podman("restart", "--time", "10", name)  # SIGTERM, then a fresh start
        assert restarted.returncode == 0, restarted.stderr
        wait_until(back_or_taken, 90, what="the restarted container's /readyz")
        assert "TOOK" not in squatter.output(), squatter.output()
        pid = podman("inspect", "--format", "{{.State.Pid}}", name).stdout.strip()
        os.kill(int(pid), signal.SIGKILL)  # the daemon crashes...
        wait_until(lambda: podman("inspect", "--format", "{{.State.Running}}",
                                  name).stdout.strip() == "false", 60, what="the container down")
        assert podman("start", name).returncode == 0  # ...and is started again
        wait_until(back_or_taken, 90, what="the container's /readyz after the crash")
        after = time.monotonic()
        with open(stop, "w"):
            pass
        assert squatter.wait(30) == 0, squatter.output()
        out = squatter.output()
        assert "TOOK" not in out, out
        summary = json.loads(out.strip().splitlines()[-1])
        # it tried all through both restarts, and the kernel refused it for the
        # port's sake (EACCES), not because someone held it (EADDRINUSE)
        assert summary["first"] < before and summary["last"] > after, (summary, before, after)
        assert summary["refused"].get(str(errno.EACCES), 0) >= 200, summary
        assert set(summary["refused"]) == {str(errno.EACCES)}, summary
        assert get(url + "/readyz")[0] == 200  # the daemon, not the squatter, answers
        said = logs()
        assert "CAP_NET_BIND_SERVICE given up" in said, said[-3000:]
        assert "any local user may bind" not in said, said[-3000:]
        # once bound the daemon holds the unit's five capabilities, no sixth
        pid = podman("inspect", "--format", "{{.State.Pid}}", name).stdout.strip()
        with open(f"/proc/{pid}/status") as f:
            caps = dict(line.split(":\t", 1) for line in f.read().splitlines() if ":\t" in line)
        (bounding,) = unit_setting("CapabilityBoundingSet")
        bits = {"CAP_SYS_PTRACE": 19, "CAP_DAC_READ_SEARCH": 2, "CAP_NET_RAW": 13,
                "CAP_SYS_ADMIN": 21, "CAP_NET_ADMIN": 12}
        assert int(caps["CapEff"], 16) == sum(1 << bits[c] for c in bounding.split())
        assert int(caps["CapPrm"], 16) == int(caps["CapEff"], 16)
    finally:
        print(logs()[-4000:])  # shown by pytest on a failure
        podman("rm", "--force", "--time", "2", name, timeout=60)
        shutil.rmtree(playground, ignore_errors=True)
