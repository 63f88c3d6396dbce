"""Evidence and remedy templates (judge/rules.py render): the parsed-once path
gives what string.Formatter gives (render_parsing), for every shipped rule's
templates over every replay fixture's ranks, and for the odd templates a
user's rule may hold."""
from __future__ import annotations

import glob
import os

import pytest
from conftest import REPO

from ddpwatch.judge import rules as rules_mod
from ddpwatch.judge import signals
from ddpwatch.judge.rules import _compiled, render, render_parsing
from ddpwatch.observe.snapshot import load, load_remote

SNAPSHOTS = sorted(glob.glob(os.path.join(REPO, "tests", "fixtures", "snapshots", "*.json")))


@pytest.fixture(scope="module")
def templates():
    shipped = rules_mod.load_default()
    return sorted({t for r in shipped for t in (r.evidence, r.remedy)})


def test_every_shipped_template_is_parsed_once(templates):
    assert templates and all(_compiled(t) is not None for t in templates)


@pytest.mark.parametrize("path", SNAPSHOTS, ids=lambda p: os.path.basename(p)[:-5])
def test_shipped_templates_render_as_formatter_does(path, templates):
    for s in signals.measure(load(path), load_remote(path)):
        for t in templates:
            assert render(t, s) == render_parsing(t, s), t


@pytest.mark.parametrize("template", [
    "plain text", "{a}", "{a:.0%} and {b:>5}", "[only {a}] always", "[{missing} gone] {a}",
    "{{literal}} {a}", "{a!r}", "{a[0]}", "{0}", "{}", "{a:{b}}", "[x {a] y}", "[{a:.1f}]",
    "{missing:.0%}", "{s:.0%}", "{a", "a}", "[[{a}]]",
])
def test_odd_templates_render_as_formatter_does(template):
    s = {"a": 0.25, "b": "xy", "s": "text", "missing": None}
    try:
        expected = render_parsing(template, s)
    except (ValueError, IndexError, KeyError) as err:
        with pytest.raises(type(err)):
            render(template, s)
        return
    assert render(template, s) == expected
