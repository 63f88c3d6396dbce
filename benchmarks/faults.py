"""The open fault benchmark: real jobs put into known states from outside, watched
by one `ddpwatch run` (webhook, /status) and judged by `ddpwatch diagnose` at the
stall, scored against each scenario's ground truth (benchmarks/faults.yaml).

    python benchmarks/faults.py --quick              # one framework per scenario
    python benchmarks/faults.py --only stopped/spawn --repeat 3
    python benchmarks/faults.py --diagnoser 'mytool --json {pid}'   # another tool

Writes faults-<UTC timestamp>.json, .md and .html under --out (default
benchmarks/results/) and prints the summary. Exit status: 0 when every scored run
is right (or a known finding of the catalogue), 1 when one is wrong, 2 when a
run broke (its injection never reached its state: the catalogue or harness is
wrong). benchmarks/README.md "The fault benchmark" says how to add a scenario.
"""
from __future__ import annotations

import argparse
import contextlib
import datetime
import fcntl
import json
import os
import platform
import shlex
import signal
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from faultbench import catalogue, report, runner, score  # noqa: E402
from faultbench.watch import Watch  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))


def parse(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--catalogue", default=catalogue.DEFAULT_PATH, help="the scenarios (YAML)")
    p.add_argument("--quick", action="store_true",
                   help="one framework and one heartbeats setting per scenario")
    p.add_argument("--only", default="", help="CLASS, FRAMEWORK, CLASS/FRAMEWORK or a "
                   "scenario's name; comma-separated")
    p.add_argument("--repeat", type=int, default=1, help="run each selected run N times")
    p.add_argument("--out", default=os.path.join(HERE, "results"), help="where the JSON and "
                   "the report go")
    p.add_argument("--diagnoser", default=runner.DIAGNOSE,
                   help="command template run at each stall, {pid} a pid of the job; it "
                        "prints JSON with job.verdict and job.culprits (default: ddpwatch "
                        "diagnose --json)")
    p.add_argument("--list", action="store_true", help="print the selected runs and exit")
    p.add_argument("--lock", default="", metavar="FILE",
                   help="hold an exclusive flock(2) on FILE during each run, not between: "
                        "on a shared machine, other CPU-heavy work that takes the same lock "
                        "runs between the benchmark's runs, never during one")
    return p.parse_args(argv)


@contextlib.contextmanager
def _held(path: str):
    if not path:
        yield
        return
    with open(path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def main(argv=None) -> int:
    args = parse(argv)
    frameworks, scenarios = catalogue.load(args.catalogue)
    runs = catalogue.expand(frameworks, scenarios, quick=args.quick, only=args.only)
    if args.list:
        for r in runs:
            print(f"{r.name:40} {r.klass:22} {r.where}")
        return 0
    if not runs:
        print(f"no run matches --only {args.only!r}", file=sys.stderr)
        return 2
    # a timeout's SIGTERM ends the run through `finally`: no job left behind
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    started = datetime.datetime.now(datetime.timezone.utc)
    began = time.monotonic()
    results = []
    with tempfile.TemporaryDirectory(prefix="faultbench-") as workdir:
        watch = Watch(workdir)
        try:
            for i in range(args.repeat):
                for spec in runs:
                    with _held(args.lock):
                        got = score.score_run(runner.run(spec, watch, workdir, args.diagnoser))
                    got["repeat"] = i
                    results.append(got)
                    row = report.rows([got])[0]
                    print(f"{row[5]:5} {spec.name:32} daemon: {row[3]}; diagnose: {row[4]}",
                          flush=True)
        finally:
            watch.close()
    doc = {"started": started.strftime("%Y-%m-%dT%H:%M:%SZ"),
           "command": " ".join(shlex.quote(a) for a in ["python", "benchmarks/faults.py",
                                                        *(argv if argv is not None
                                                          else sys.argv[1:])]),
           "host": f"{platform.node()}, {os.cpu_count()} CPUs, {platform.platform()}",
           "wall_s": round(time.monotonic() - began, 1), "diagnoser": args.diagnoser,
           "scenarios": results, "summary": score.summarize(results)}
    os.makedirs(args.out, exist_ok=True)
    stem = os.path.join(args.out, "faults-" + started.strftime("%Y%m%dT%H%M%SZ"))
    with open(stem + ".json", "w") as f:
        json.dump(doc, f, indent=1)
    with open(stem + ".md", "w") as f:
        f.write(report.markdown(doc))
    with open(stem + ".html", "w") as f:
        f.write(report.html_page(doc))
    print("\n".join(report.summary_lines(doc)))
    print(f"wrote {stem}.json, .md, .html")
    s = doc["summary"]
    if s["broken"]:
        return 2
    # a wrong culprit or a negative that paged is a run not ok; a known finding of
    # the catalogue still shows as FAIL but does not fail the benchmark
    wrong = [r["name"] for r in results if r.get("ok") is False and not r.get("known")]
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
