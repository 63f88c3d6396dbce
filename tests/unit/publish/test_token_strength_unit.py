"""Where a token may come from and how strong it must be: never the command line
(ddpwatch/commands/token.py), and off loopback no weaker than
ddpwatch/signed/strength.py MIN_BITS, refused with the config's file:line."""
from __future__ import annotations

import os
import secrets
import subprocess
import sys

import pytest

from ddpwatch import config, errors
from ddpwatch.errors import ConfigError
from ddpwatch.publish.endpoints import Server
from ddpwatch.publish.view import DaemonView
from ddpwatch.signed import strength

STRONG = secrets.token_hex(32)


@pytest.mark.parametrize("weak", [
    "a-shared-secret",                        # the README's example before
    "tok-Zq8v1-secret-token", "correct-horse-battery-staple-lamp",
    "0123456789abcdef" * 4,                   # long, but a pattern repeated
    "a" * 200, secrets.token_hex(12),         # 96 random bits
])
def test_weak_tokens_are_estimated_below_the_bar(weak):
    assert strength.bits(weak) < strength.MIN_BITS and strength.weakness(weak)


def test_generated_tokens_pass_every_time():
    # the commands the README gives, 2 000 draws each: the estimate's loss to
    # the empirical entropy never takes one below the bar
    for _ in range(2000):
        assert strength.weakness(secrets.token_hex(32)) is None
        assert strength.weakness(secrets.token_urlsafe(32)) is None


@pytest.mark.parametrize("key", ["token", "peer_token"])
def test_a_weak_token_off_loopback_is_refused_with_its_line_never_its_value(tmp_path, key):
    path = tmp_path / "config.yaml"
    extra = "" if key == "token" else f"token: {STRONG}\n"
    path.write_text(f"listen: 0.0.0.0:19500\n{extra}tick_s: 1\n{key}: a-shared-secret\n")
    line = 3 if key == "token" else 4
    with pytest.raises(ConfigError) as err:
        config.load(str(path))
    assert str(err.value).startswith(f"{path}:{line}: {key}: too weak")
    assert "openssl rand -hex 32" in str(err.value) and "a-shared-secret" not in str(err.value)


def test_a_strong_token_off_loopback_and_any_token_on_loopback_load(tmp_path, monkeypatch):
    path = tmp_path / "config.yaml"
    path.write_text(f"listen: 0.0.0.0:19500\ntoken: {STRONG}\n")
    assert config.load(str(path)).token == STRONG
    path.write_text("listen: 127.0.0.1:19500\ntoken: a-shared-secret\n")
    assert config.load(str(path)).token == "a-shared-secret"
    monkeypatch.setenv("DDPWATCH_TOKEN", "weak")
    path.write_text("listen: 0.0.0.0:19500\n")
    with pytest.raises(ConfigError, match=r"^\$DDPWATCH_TOKEN: token: too weak"):
        config.load(str(path))


def ddpwatch(*argv, env=None):
    return subprocess.run([sys.executable, "-m", "ddpwatch", *argv], capture_output=True,
                          text=True, timeout=60, env={**os.environ, **(env or {})})


@pytest.fixture
def daemon_port():
    view = DaemonView(node="n1", tick=1, wall_time=0.0, tick_duration_s=0.0, jobs=(),
                      incidents=(), probes=(), incidents_opened_total={}, ready=True)
    server = Server("127.0.0.1", 0, lambda: view, lambda: b"", token=STRONG)
    server.start()
    yield server.port
    server.stop()


@pytest.mark.parametrize("argv", [["status", "--token", STRONG],
                                  [f"--token={STRONG}", "status"],
                                  ["diagnose", "--token", STRONG, "--replay", "x.json"]])
def test_a_token_on_the_command_line_is_refused_saying_where_to_put_it(argv, daemon_port):
    if argv[0].startswith("--token"):
        argv = ["status", argv[0], "--url", f"http://127.0.0.1:{daemon_port}"]
    done = ddpwatch(*argv)
    assert done.returncode == errors.USAGE, done.stderr
    assert "--token-file FILE, or set $DDPWATCH_TOKEN" in done.stderr and not done.stdout
    assert "Traceback" not in done.stderr


def test_status_reads_the_token_from_a_file_or_the_environment(tmp_path, daemon_port):
    url = f"http://127.0.0.1:{daemon_port}"
    assert ddpwatch("status", "--url", url).returncode == errors.NO_PERMISSION
    secret = tmp_path / "token"
    secret.write_text(STRONG + "\n")
    for argv, env in ((["--token-file", str(secret)], None), ([], {"DDPWATCH_TOKEN": STRONG})):
        done = ddpwatch("status", "--url", url, "--json", *argv, env=env)
        assert done.returncode == 0 and '"node": "n1"' in done.stdout, done.stderr
    done = ddpwatch("status", "--url", url, "--token-file", str(tmp_path / "none"))
    assert done.returncode == errors.NO_INPUT and f"{tmp_path}/none" in done.stderr
