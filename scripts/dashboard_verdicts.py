"""Regenerate the dashboard's verdict panels from the vocabulary.

The "Job verdict" and "Rank state" panels encode each verdict as its index in
ddpwatch.judge.vocabulary.VERDICTS (a state timeline shows numbers) and map the
numbers back to names and colours. After adding a verdict, run

    python scripts/dashboard_verdicts.py          # rewrites grafana/ddpwatch.json
    python scripts/dashboard_verdicts.py --check   # exit 1 if it would change
"""
from __future__ import annotations

import argparse
import json
import os
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
from ddpwatch.judge.vocabulary import VERDICTS  # noqa: E402

DASHBOARD = os.path.join(REPO, "grafana", "ddpwatch.json")
PANELS = {"Job verdict": ("ddpwatch_job_state", "ddp_job, instance"),
          "Rank state": ("ddpwatch_rank_state", "ddp_job, instance, rank")}


def expr(metric: str, by: str) -> str:
    terms = [f'{metric}{{ddp_job=~"$job", instance=~"$instance", verdict="{v.name}"}} * {i}'
             for i, v in enumerate(VERDICTS)]
    return f"sum by ({by}) (\n  " + "\n  or ".join(terms) + "\n)"


def mappings() -> list:
    return [{"type": "value", "options": {
        str(i): {"text": v.name, "color": v.color, "index": i} for i, v in enumerate(VERDICTS)}}]


def regenerate(dash: dict) -> dict:
    for panel in dash["panels"]:
        if panel.get("title") in PANELS:
            metric, by = PANELS[panel["title"]]
            panel["targets"][0]["expr"] = expr(metric, by)
            panel["fieldConfig"]["defaults"]["mappings"] = mappings()
    return dash


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--check", action="store_true", help="only say whether it is current")
    args = parser.parse_args()
    with open(DASHBOARD) as f:
        before = f.read()
    after = json.dumps(regenerate(json.loads(before)), indent=2) + "\n"
    if args.check:
        if after != before:
            print(f"{DASHBOARD}: verdict panels out of date: run {sys.argv[0]}")
            return 1
        return 0
    with open(DASHBOARD, "w") as f:
        f.write(after)
    return 0


if __name__ == "__main__":
    sys.exit(main())
