"""Paired A/B runs on a noisy machine: ABBA order, so a linear drift cancels, and
the mean of the pairs' ratios with a bootstrap interval, so a reader sees how
far the figure can be trusted."""
from __future__ import annotations

import random
import statistics


def run_pairs(pairs: int, baseline, treatment) -> tuple[list[float], list[float]]:
    """Call baseline() and treatment() `pairs` times each, alternating which goes first."""
    base, treat = [], []
    for i in range(pairs):
        if i % 2 == 0:
            base.append(baseline())
            treat.append(treatment())
        else:
            treat.append(treatment())
            base.append(baseline())
    return base, treat


def ratio_summary(base: list[float], treat: list[float], draws: int = 4000) -> str:
    """'0.995 (90% interval 0.985-1.004, ': the mean of treat/base per pair; the
    caller finishes the parenthesis."""
    ratios = [t / b for b, t in zip(base, treat)]
    rng = random.Random(0)
    means = sorted(statistics.mean(rng.choices(ratios, k=len(ratios))) for _ in range(draws))
    low, high = means[int(0.05 * draws)], means[int(0.95 * draws)]
    return f"{statistics.mean(ratios):.3f} (90% interval {low:.3f}-{high:.3f}, "
