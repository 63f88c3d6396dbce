"""Property-based fuzzing of the config and rules loaders: whatever the
bytes, the result is a valid Config / rule list or a ConfigError that names the
file (and a line where there is one) - never another exception, never a hang.
Bounded (max_examples, deadline) so it runs in seconds in CI."""
from __future__ import annotations

import re

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from ddpwatch import config as config_mod
from ddpwatch.errors import ConfigError
from ddpwatch.judge import rules as rules_mod

BOUNDED = settings(max_examples=300, deadline=2000, derandomize=True, database=None,
                   suppress_health_check=[HealthCheck.function_scoped_fixture,
                                          HealthCheck.too_slow])
LOCATED = re.compile(r"^(?P<file>[^:]+)(:(?P<line>\d+))?")

CONFIG_KEYS = [k for k in config_mod._TYPES if k != "source"] + ["bogus", "[a]", "? [a]"]
RULE_KEYS = sorted(rules_mod.RULE_KEYS) + ["bogus"]
# scalars that broke the loaders before and their relatives
NASTY = ["1", "-1", "0", ".inf", "-.inf", ".nan", "1e999", "true", "null", "~", "2001-13-45",
         "!!python/name:os.system", "!!python/object/apply:os.system [id]", "!!binary AAA",
         "&a [1]", "*a", "[*a, *a]", "{a: 1}", "[a]", "'x'", '"\\x1b[31m"', "'", "[", "{",
         "whsec_c2VjcmV0", "http://u:p@h/x", "127.0.0.1:1", "0.0.0.0:80", "[healthy]",
         "'state == \"T\"'", "['state in [\"T\"]']", "['nope > 1']", "{straggler: .nan}",
         "[{type: generic, url: 'http://h/x', secret: 'whsec_!!'}]", "\t", "- x\n- y"]

scalar = st.one_of(st.sampled_from(NASTY), st.text(max_size=12),
                   st.floats(allow_nan=True, allow_infinity=True).map(repr),
                   st.integers(-2**70, 2**70).map(str))


def yamlish(keys):
    line = st.tuples(st.sampled_from(keys), scalar).map(lambda kv: f"{kv[0]}: {kv[1]}")
    return st.lists(line, max_size=8).map("\n".join)


def located(err: ConfigError, path: str) -> None:
    text = str(err)
    assert text.startswith(path), text
    m = LOCATED.match(text)
    assert m and m.group("file") == path, text


@pytest.fixture
def file(tmp_path):
    path = tmp_path / "f.yaml"
    return path


@BOUNDED
@given(body=st.one_of(yamlish(CONFIG_KEYS), st.binary(max_size=200).map(
    lambda b: b.decode("latin-1")), st.text(max_size=200)))
def test_config_loader_is_total(file, body):
    file.write_bytes(body.encode("utf-8", "surrogatepass"))
    try:
        cfg = config_mod.load(str(file))
    except ConfigError as err:
        located(err, str(file))
        return
    # accepted: every duration is a finite number within its bounds
    for key, (least, most) in config_mod.BOUNDS.items():
        assert least <= getattr(cfg, key) <= most


@BOUNDED
@given(data=st.binary(max_size=300))
def test_config_loader_is_total_on_raw_bytes(file, data):
    file.write_bytes(data)
    try:
        config_mod.load(str(file))
    except ConfigError as err:
        located(err, str(file))


@BOUNDED
@given(rules=st.lists(yamlish(RULE_KEYS), max_size=4), top=st.sampled_from(
    ["rules:\n", "version: 1\nrules:\n", "rulez:\n", "[a]: 1\nrules:\n", "rules: &r\n"]))
def test_rules_loader_is_total(file, rules, top):
    body = top + "".join("  - " + r.replace("\n", "\n    ") + "\n" for r in rules if r)
    file.write_text(body)
    try:
        loaded = rules_mod.load(str(file))
    except ConfigError as err:
        located(err, str(file))
        return
    for rule in loaded:
        assert 0.0 <= rule.confidence <= 1.0 and rule.when


@BOUNDED
@given(data=st.binary(max_size=300))
def test_rules_loader_is_total_on_raw_bytes(file, data):
    file.write_bytes(data)
    try:
        rules_mod.load(str(file))
    except ConfigError as err:
        located(err, str(file))


def test_shipped_rules_still_load():
    assert len(rules_mod.load_default()) > 10


SECRET = "whsec_c2VjcmV0LWZ1enoK"
SECRET_VALUES = [SECRET, f"[{SECRET}]", f"{{a: {SECRET}}}", "http://u:pw-SECRET@h:1/T0SECRET",
                 "[http://u:pw-SECRET@h:1]",
                 f"[{{type: generic, url: 'http://u:pw-SECRET@h/T0SECRET', secret: {SECRET}}}]",
                 f"[{{type: generic, url: 'ftp://u:pw-SECRET@h/T0SECRET', secret: [{SECRET}]}}]",
                 f"[{{type: slack, url: 'https://hooks.example/T0SECRET', secret: {SECRET}}}]",
                 "[{type: generic, url: 'http://u:pw-SECRET@h/T0SECRET', timeout_s: .nan}]"]


@BOUNDED
@given(lines=st.lists(st.one_of(
    st.tuples(st.sampled_from(["token", "peer_token", "webhooks"]), st.sampled_from(SECRET_VALUES)),
    st.tuples(st.just("peers"), st.sampled_from([v for v in SECRET_VALUES if "@" in v]))),
    min_size=1, max_size=3),
       other=yamlish(CONFIG_KEYS))
def test_config_errors_never_show_a_secret(file, lines, other):
    """Secret fields (token, peer_token, webhooks) and credentials in any URL."""
    file.write_text("\n".join(f"{k}: {v}" for k, v in lines) + "\n" + other)
    try:
        config_mod.load(str(file))
    except ConfigError as err:
        located(err, str(file))
        for secret in (SECRET, "pw-SECRET", "T0SECRET", "c2VjcmV0LWZ1enoK"):
            assert secret not in str(err), str(err)
