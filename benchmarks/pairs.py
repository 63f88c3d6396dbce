"""Paired A/B runs on a noisy machine: ABBA order, so a linear drift cancels, and
the ratio of the totals with a bootstrap interval over the pairs, so a reader
sees how far the figure can be trusted. (Totals, not the mean of per-pair
ratios: one pair hit by a hiccup would pull a mean of ratios far off.)"""
from __future__ import annotations

import itertools
import random


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


def run_rounds(rounds: int, arms: dict) -> dict[str, list[float]]:
    """Call every arm once per round. The rounds cycle through every order of the
    arms, so with a multiple of that many rounds each arm runs equally often
    first, second... and after each other arm (a run is slowed or sped up by
    what ran just before it; ABBA does this for two arms)."""
    orders = list(itertools.permutations(arms))
    results: dict[str, list[float]] = {name: [] for name in arms}
    for r in range(rounds):
        for name in orders[r % len(orders)]:
            results[name].append(arms[name]())
    return results


def ratio_summary(base: list[float], treat: list[float], draws: int = 4000) -> str:
    """'0.995 (90% interval 0.985-1.004, ': sum(treat) / sum(base); the caller
    finishes the parenthesis."""
    pairs = list(zip(base, treat))
    rng = random.Random(0)

    def ratio(sample):
        return sum(t for _, t in sample) / sum(b for b, _ in sample)
    ratios = sorted(ratio(rng.choices(pairs, k=len(pairs))) for _ in range(draws))
    low, high = ratios[int(0.05 * draws)], ratios[int(0.95 * draws)]
    return f"{ratio(pairs):.3f} (90% interval {low:.3f}-{high:.3f}, "
