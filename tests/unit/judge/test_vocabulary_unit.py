"""A verdict is one row (judge/vocabulary.py VERDICTS): its severity is its place in
SEVERITY, by name; its time category (watch/timebook.py) and its colours (the
dashboard's, the incident page's, publish/page_svg.py) are on the row."""
from ddpwatch.judge import vocabulary
from ddpwatch.publish.page_svg import VERDICT_COLOURS
from ddpwatch.watch import timebook


def test_every_verdict_has_a_place_in_the_severity_order_once():
    assert sorted(vocabulary.SEVERITY) == sorted(vocabulary.NAMES)
    assert len(set(vocabulary.SEVERITY)) == len(vocabulary.SEVERITY)
    assert vocabulary.SEVERITY[0] == "dead" and vocabulary.SEVERITY[-1] == "healthy"


def test_where_each_verdicts_time_goes_is_on_its_row():
    for v in vocabulary.VERDICTS:
        assert v.time in timebook.STATES or (v.name == "slowing" and v.time == ""), v
    assert timebook._BY_VERDICT == {v.name: v.time for v in vocabulary.VERDICTS}


def test_the_incident_pages_colours_are_the_rows_and_calm_is_never_red():
    assert VERDICT_COLOURS == {v.name: v.page for v in vocabulary.VERDICTS}
    red = vocabulary.Verdict.page
    assert [v.name for v in vocabulary.VERDICTS if v.calm and v.page == red] == []
    assert VERDICT_COLOURS["slowing"] != red  # drawn as a problem before it had a row
