"""The catalogue (benchmarks/faults.yaml) read strictly and expanded into runs.

A scenario is one fault in one kind of job with its ground truth; a run is a
scenario on one framework, with or without heartbeats. An unknown key, a missing
one or a framework the file does not define is an error naming file:line, as
ddpwatch's own config is (ddpwatch/yamlfile.py)."""
from __future__ import annotations

import os
from dataclasses import dataclass, field

import yaml

from ddpwatch.errors import ConfigError
from ddpwatch.yamlfile import compose, construct, read_text

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_PATH = os.path.join(HERE, "faults.yaml")

FRAMEWORK_KEYS = {"argv", "env", "needs", "announce", "note", "nodes"}
SCENARIO_KEYS = {"name", "class", "frameworks", "heartbeats", "quick", "fault", "expect",
                 "within_s", "watch_s", "daemon", "env", "args", "needs", "known",
                 "note", "diagnose", "trains", "expect_diagnose"}
EXPECT_KEYS = {"verdict", "culprits", "victims"}
FINDING_KEYS = {"page", "finding", "unless_cpu"}
NO_PAGE = "no page"


@dataclass(frozen=True)
class Expect:
    """Ground truth: the job's verdict (any of `verdicts`), its culprit ranks and
    victims; `page` False for a negative (nothing may page). `finding`: a finding
    that must be on some rank (`present`) or on none, in diagnose and /status."""
    page: bool
    verdicts: tuple[str, ...] = ()
    culprits: tuple[int, ...] = ()
    victims: tuple[int, ...] = ()
    finding: str = ""
    present: bool = False

    def as_json(self):
        if self.finding:
            return {"page": False, "finding": self.finding, "present": self.present}
        if not self.page:
            return NO_PAGE
        return {"verdict": list(self.verdicts), "culprits": list(self.culprits),
                "victims": list(self.victims)}


@dataclass(frozen=True)
class Run:
    """One scenario on one framework: what the runner starts and scores."""
    name: str            # scenario/framework[+hb]
    scenario: str
    klass: str
    framework: str
    heartbeats: bool
    fault: dict
    expect: Expect
    argv: tuple[str, ...]
    env: dict
    announce: str
    within_s: float
    watch_s: float
    daemon: dict
    needs: tuple[str, ...]
    known: str
    where: str           # file:line of the scenario
    diagnose: str        # "after" (at the stall) or "during" (a window over the fault)
    expect_diagnose: Expect | None = None  # a one-shot judge's own ground truth
    trains: bool = True  # False: the job never trains (a rank missing at rendezvous):
                         # the fault is its start, and the daemon need only see it
    notes: tuple[str, ...] = field(default=())
    nodes: int = 1       # 2: one rank on each of two namespace nodes (faultbench/nodes.py)


def _node_lines(node) -> dict:
    """key -> line of a mapping node's keys (1-based)."""
    return {k.value: k.start_mark.line + 1 for k, _ in node.value
            if isinstance(k, yaml.ScalarNode)}


def _check_keys(doc: dict, allowed: set, where: str, what: str, lines=None) -> None:
    """An unknown key is an error at its own line (`lines`: key -> line)."""
    unknown = sorted(set(doc) - allowed)
    if unknown:
        if lines and unknown[0] in lines:
            where = f"{where.rpartition(':')[0]}:{lines[unknown[0]]}"
        raise ConfigError(f"{where}: unknown key(s) {', '.join(unknown)} in {what} "
                          f"(known: {', '.join(sorted(allowed))})")


def _expect(value, where: str) -> Expect:
    if value == NO_PAGE:
        return Expect(page=False)
    if not isinstance(value, dict):
        raise ConfigError(f"{where}: expect must be {NO_PAGE!r} or a mapping with "
                          f"verdict and culprits")
    if "finding" in value:
        _check_keys(value, FINDING_KEYS, where, "expect")
        if value.get("page", False):
            raise ConfigError(f"{where}: a finding's scenario expects no page (page: false)")
        has = cpu_flags() & set(value.get("unless_cpu", ()))
        return Expect(page=False, finding=value["finding"], present=not has)
    _check_keys(value, EXPECT_KEYS, where, "expect")
    if "verdict" not in value or "culprits" not in value:
        raise ConfigError(f"{where}: expect needs verdict and culprits")
    verdicts = value["verdict"] if isinstance(value["verdict"], list) else [value["verdict"]]
    return Expect(True, tuple(verdicts), tuple(int(r) for r in value["culprits"]),
                  tuple(int(r) for r in value.get("victims", ())))


def cpu_flags(path: str = "/proc/cpuinfo") -> set[str]:
    """The CPU's flags (the first processor's), for expectations that depend on
    them (bf16 on a CPU without avx512_bf16 or amx_bf16)."""
    try:
        with open(path) as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.partition(":")[2].split())
    except OSError:
        pass
    return set()


def _shown(path: str) -> str:
    """The catalogue's path as errors and results show it: from the repository's
    root when it is in it."""
    rel = os.path.relpath(os.path.abspath(path), os.path.dirname(HERE))
    return path if rel.startswith("..") else rel


def load(path: str = DEFAULT_PATH) -> tuple[dict, list[dict]]:
    """(frameworks, scenarios) with each scenario's `_where` (file:line)."""
    node = compose(read_text(path), path)
    doc = construct(node, path) if node is not None else None
    if not isinstance(doc, dict) or set(doc) - {"frameworks", "scenarios", "defaults"}:
        raise ConfigError(f"{path}: want a mapping of frameworks, scenarios (and defaults)")
    top = _node_lines(node)
    frameworks = doc.get("frameworks") or {}
    fw_node = next(v for k, v in node.value if k.value == "frameworks")
    fw_lines = _node_lines(fw_node)
    for name, fw in frameworks.items():
        where = f"{path}:{fw_lines.get(name, top['frameworks'])}"
        if not isinstance(fw, dict) or "argv" not in fw:
            raise ConfigError(f"{where}: framework {name!r} needs argv")
        _check_keys(fw, FRAMEWORK_KEYS, where, f"framework {name!r}")
        if fw.get("nodes", 1) not in (1, 2):
            raise ConfigError(f"{where}: framework {name!r}: nodes is 1 or 2 "
                              f"(one rank on each of two namespace nodes)")
    sc_node = next(v for k, v in node.value if k.value == "scenarios")
    defaults = doc.get("defaults") or {}
    scenarios = []
    seen = set()
    for item, item_node in zip(doc.get("scenarios") or [], sc_node.value):
        where = f"{_shown(path)}:{item_node.start_mark.line + 1}"
        if not isinstance(item, dict):
            raise ConfigError(f"{where}: a scenario is a mapping")
        _check_keys(item, SCENARIO_KEYS, where, f"scenario {item.get('name', '?')!r}",
                    _node_lines(item_node))
        for key in ("name", "class", "frameworks", "fault", "expect"):
            if key not in item:
                raise ConfigError(f"{where}: scenario {item.get('name', '?')!r} needs {key}")
        if item["name"] in seen:
            raise ConfigError(f"{where}: scenario name {item['name']!r} used twice")
        seen.add(item["name"])
        for fw in list(item["frameworks"]) + ([item["quick"]] if "quick" in item else []):
            if fw not in frameworks:
                raise ConfigError(f"{where}: framework {fw!r} is not defined under "
                                  f"frameworks (defined: {', '.join(frameworks)})")
        item = {**defaults, **item, "_where": where}
        item["_expect"] = _expect(item["expect"], where)
        if "expect_diagnose" in item:
            item["_expect_diagnose"] = _expect(item["expect_diagnose"], where)
        scenarios.append(item)
    return frameworks, scenarios


def expand(frameworks: dict, scenarios: list[dict], quick: bool = False,
           only: str = "") -> list[Run]:
    """Every run of the catalogue, in its order; `quick`: only the scenarios with a
    `quick:` framework, on that framework and the first heartbeats setting;
    `only`: CLASS, FRAMEWORK, CLASS/FRAMEWORK, SCENARIO/FRAMEWORK or a run's name
    (comma-separated)."""
    wanted = [w for w in only.split(",") if w]
    runs = []
    for sc in scenarios:
        fws = list(sc["frameworks"])
        hbs = [bool(h) for h in sc.get("heartbeats", [False])]
        if quick:
            if "quick" not in sc:
                continue
            fws = [sc["quick"]]
            hbs = hbs[:1]
        for fw in fws:
            for hb in hbs:
                run = _run(sc, fw, hb, frameworks[fw])
                if not wanted or any(_matches(w, run) for w in wanted):
                    runs.append(run)
    return runs


def _matches(word: str, run: Run) -> bool:
    klass, _, fw = word.partition("/")
    if fw:
        return klass in (run.klass, run.scenario, "*") and fw == run.framework
    return word in (run.klass, run.framework, run.scenario, run.name)


def _run(sc: dict, fw_name: str, hb: bool, fw: dict) -> Run:
    needs = tuple(fw.get("needs", ())) + tuple(sc.get("needs", ()))
    return Run(
        name=f"{sc['name']}/{fw_name}" + ("+hb" if hb else ""),
        scenario=sc["name"], klass=sc["class"], framework=fw_name, heartbeats=hb,
        fault=dict(sc["fault"]), expect=sc["_expect"],
        argv=tuple(fw["argv"]) + tuple(sc.get("args", {}).get(fw_name, ())),
        env={**fw.get("env", {}), **sc.get("env", {})},
        announce=fw.get("announce", "thirdparty"),
        within_s=float(sc.get("within_s", 60)), watch_s=float(sc.get("watch_s", 20)),
        daemon=dict(sc.get("daemon", {})), needs=needs, known=sc.get("known", ""),
        where=sc["_where"], diagnose=sc.get("diagnose", "after"),
        trains=bool(sc.get("trains", True)),
        expect_diagnose=sc.get("_expect_diagnose"),
        notes=tuple(filter(None, (fw.get("note"), sc.get("note")))),
        nodes=int(fw.get("nodes", 1)))
