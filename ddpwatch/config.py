"""The daemon's one documented config: defaults -> file -> environment -> flags.

File lookup: `--config FILE` > `$DDPWATCH_CONFIG` > /etc/ddpwatch/config.yaml (if
present). Strict: an unknown key is an error naming file and line (exit 78), so
is a duration out of its bounds (BOUNDS; NaN and infinities too), a YAML alias,
a `!!python/...` tag, a list as a key or a byte that is not UTF-8 (yamlfile.py).
The values of secret fields (token, peer_token, webhooks) are never shown.

    listen: 127.0.0.1:19500      # HTTP for /metrics /status /healthz /readyz
    token: ""                    # bearer token for /status; required off loopback
    tick_s: 1.0                  # one discovery -> probes -> judge -> publish cycle
    window_s: 2.0                # CPU and progress are judged over this much history
    heartbeat_dir: ""            # default $DDPWATCH_DIR or /dev/shm/ddpwatch and its
                                 # per-user directories; the ranks' own DDPWATCH_DIR
                                 # are read too
    state_dir: ""                # incident bundles; default /var/lib/ddpwatch (root)
                                 # or ~/.local/state/ddpwatch
    stacks_min_interval_s: 5.0   # py-spy at most this often per job (only on suspicion)
    reading_s: 0.25              # between ticks, healthy jobs' ranks' main threads are
                                 # read about this often (every thread each 0.1 s under
                                 # suspicion): a rank stopped part of the time; 0: never
    steady_s: 3.0                # a healthy job whose every rank's record moved on since
                                 # the last tick, none seen stopped by the readings, keeps
                                 # its last look this long at most (its ticks read its
                                 # records alone); 0: every tick looks at every job
    probe_timeout_s: 2.0
    resolve_after_s: 30.0        # calm this long before an incident resolves (hysteresis:
                                 # a hang that comes back after a few good steps is
                                 # the same incident)
    group_interval_s: 60.0       # an open incident whose verdict grows more severe is
                                 # told again at most this often (one incident, one page)
    pause_floor_s: 300.0         # a pause (a rank working outside the collectives while
                                 # its peers wait: evaluation, checkpoint...) pages once
                                 # it lasts longer than this AND pause_factor x the
                                 # longest earlier pause of the job at that place
    pause_factor: 3.0
    collective_timeout_s: 0.0    # the jobs' collective timeout; a pause pages before it
                                 # kills the job. 0: by backend (NCCL 600, else Gloo 1800)
    straggler_after_s: 30.0      # a rank slower than its peers is `slowing` (calm) until
                                 # it has been so this long, most of the time; then it
                                 # is a straggler (and paged)
    open_after_s: {}             # a job verdict opens an incident once it lasted this
                                 # long; over the defaults {rendezvous_wait: 60,
                                 # slow_collective: 30}
                                 # (any other problem: at once, on its second tick)
    probes: {stacks: true, sockets: true}   # switch probes off by name (also host,
                                 # traffic: the packet socket that sees connects dropped;
                                 # wire_groups: ranks started by hand, by their connections)
    rules: []                    # extra rule files (add or override by id)
    webhooks: []                 # [{type: generic|slack|alertmanager, url, secret, timeout_s}]
    log_format: text             # text | json
    peers: []                    # other nodes' daemons, e.g. [http://node2:19500]: their
                                 # ranks' signals join this node's judgement (the peer view)
    peer_token: ""               # bearer token for the peers' /peer; default: token
    peer_max_age_s: 5.0          # a peer's answer older than this is not used
    min_life_s: 10.0             # a rank's death pages only for a job that lived this long
                                 # (from its oldest process's start to the last tick it
                                 # was seen alive) or was judged healthy before: a fake
                                 # rank that lives a second, or a job that fails at
                                 # start in front of its user, does not
    uid_incidents: 10            # incidents the jobs of one uid may open at once; then
    uid_bundles: 20              # (and evidence bundles) one more each uid_refill_s; a
    uid_refill_s: 60.0           # problem held back opens when allowed, if it still stands
    bundle_max_age_s: 604800.0   # bundles of incidents no longer open are removed after
    bundle_max_mb: 500           # this long (7 days), oldest first past this many MiB in all
    external_url: ""             # this daemon's base URL as people reach it (e.g.
                                 # https://node1.example:19500, or behind a proxy
                                 # https://ops.example/ddpwatch/node1): webhook messages
                                 # link to <external_url>/incidents/<id>, the incident
                                 # page; default the listen address
"""
from __future__ import annotations

import dataclasses
import os
import re
from dataclasses import dataclass, field

import yaml

from . import yamlfile
from .signed import strength
from .errors import ConfigError
from .observe.probes import load_all as load_probes
from .judge.vocabulary import PROBLEMS  # job verdicts an incident can be opened for

DEFAULT_PORT = 19500  # 10000-32767: clear of torchrun's 29500 and Linux's ephemeral range
SYSTEM_CONFIG = "/etc/ddpwatch/config.yaml"
# a daemon's base URL: http(s)://HOST[:PORT], HOST a name or address ([v6] too)
PEER_URL = re.compile(r"https?://(\[[0-9a-fA-F:.]+\]|[^/\s:\[\]]+)(:\d+)?/?")
# the same, with a path prefix (a reverse proxy's), without query or fragment
EXTERNAL_URL = re.compile(r"https?://(\[[0-9a-fA-F:.]+\]|[^/\s:\[\]?#]+)(:\d{1,5})?"
                          r"(/[^\s?#]*)?")


@dataclass(frozen=True)
class Config:
    listen: str = f"127.0.0.1:{DEFAULT_PORT}"
    token: str = ""
    tick_s: float = 1.0
    window_s: float = 2.0
    heartbeat_dir: str = ""
    state_dir: str = ""
    stacks_min_interval_s: float = 5.0
    reading_s: float = 0.25
    steady_s: float = 3.0
    probe_timeout_s: float = 2.0
    resolve_after_s: float = 30.0
    group_interval_s: float = 60.0
    pause_floor_s: float = 300.0
    pause_factor: float = 3.0
    collective_timeout_s: float = 0.0
    straggler_after_s: float = 30.0
    open_after_s: dict[str, float] = field(default_factory=dict)
    probes: dict[str, bool] = field(default_factory=dict)
    rules: tuple[str, ...] = ()
    webhooks: tuple[dict, ...] = ()
    log_format: str = "text"
    peers: tuple[str, ...] = ()
    peer_token: str = ""
    peer_max_age_s: float = 5.0
    external_url: str = ""
    min_life_s: float = 10.0
    uid_incidents: int = 10
    uid_bundles: int = 20
    uid_refill_s: float = 60.0
    bundle_max_age_s: float = 7 * 86400.0
    bundle_max_mb: int = 500
    source: str = "defaults"

    @property
    def host_port(self) -> tuple[str, int]:
        host, _, port = self.listen.rpartition(":")
        return host.strip("[]") or "127.0.0.1", int(port)

    def probe_on(self, name: str) -> bool:
        spec = load_probes()[name]
        return self.probes.get(name, spec.default_enabled) if spec.switchable else True

    def effective_state_dir(self) -> str:
        if self.state_dir:
            return self.state_dir
        if os.geteuid() == 0:
            return "/var/lib/ddpwatch"
        return os.path.join(os.path.expanduser("~"), ".local", "state", "ddpwatch")


ENV = {  # environment overrides, applied after the file
    "DDPWATCH_LISTEN": "listen", "DDPWATCH_TOKEN": "token", "DDPWATCH_TICK_S": "tick_s",
    "DDPWATCH_DIR": "heartbeat_dir", "DDPWATCH_STATE_DIR": "state_dir",
    "DDPWATCH_LOG_FORMAT": "log_format", "DDPWATCH_PEERS": "peers",
    "DDPWATCH_PEER_TOKEN": "peer_token", "DDPWATCH_EXTERNAL_URL": "external_url",
}
_TYPES = {f.name: f.type for f in dataclasses.fields(Config)}


def find_file(flag: str | None) -> str | None:
    if flag:
        return flag
    if os.environ.get("DDPWATCH_CONFIG"):
        return os.environ["DDPWATCH_CONFIG"]
    return SYSTEM_CONFIG if os.path.exists(SYSTEM_CONFIG) else None


# Durations: (least, most) seconds. A NaN or inf tick was a busy loop or an
# OverflowError; a too-small one burns a core.
BOUNDS = {"tick_s": (0.1, 3600.0), "window_s": (0.1, 86400.0),
          "stacks_min_interval_s": (1.0, 86400.0), "reading_s": (0.0, 60.0),
          "steady_s": (0.0, 60.0), "probe_timeout_s": (0.1, 600.0),
          "resolve_after_s": (0.0, 86400.0), "peer_max_age_s": (0.1, 86400.0),
          "group_interval_s": (0.0, 86400.0), "pause_floor_s": (0.0, 7 * 86400.0),
          "pause_factor": (1.0, 1000.0), "collective_timeout_s": (0.0, 7 * 86400.0),
          "straggler_after_s": (0.0, 86400.0), "min_life_s": (0.0, 3600.0),
          "uid_refill_s": (0.0, 86400.0), "bundle_max_age_s": (60.0, 365 * 86400.0)}
# Counts: (least, most).
INT_BOUNDS = {"uid_incidents": (1, 10000), "uid_bundles": (1, 10000),
              "bundle_max_mb": (1, 10**6)}
# values never shown in an error or a log line
SECRETS = ("token", "peer_token", "webhooks")


def load(path: str | None, overrides: dict | None = None) -> Config:
    values: dict = {}
    lines: dict[str, str] = {}  # key -> "file:line" (or $VAR, --flag) it came from
    source = "defaults"
    if path:
        values, lines = _read(path)
        source = path
    for var, key in ENV.items():
        if os.environ.get(var):
            values[key] = _coerce(key, os.environ[var], f"${var}")
            lines[key] = f"${var}"
    for key, value in (overrides or {}).items():
        if value is not None:
            flag = f"--{key.replace('_', '-')}"
            values[key] = _coerce(key, value, flag)
            lines[key] = flag
    config = Config(**values, source=source)
    _validate(config, lines)
    return config


def _read(path: str) -> tuple[dict, dict]:
    root = yamlfile.compose(yamlfile.read_text(path), path)
    if root is None:
        return {}, {}
    if not isinstance(root, yaml.MappingNode):
        raise ConfigError(f"{path}:{root.start_mark.line + 1}: the config must be a mapping "
                          f"of keys")
    values, lines = {}, {}
    for key_node, value_node in root.value:
        key = yamlfile.scalar_key(key_node, path)
        where = f"{path}:{key_node.start_mark.line + 1}"
        if key not in _TYPES or key == "source":
            raise ConfigError(f"{where}: unknown key {yamlfile.show(key)} (known: "
                              f"{', '.join(k for k in _TYPES if k != 'source')})")
        if key in values:
            raise ConfigError(f"{where}: {key}: given twice (first at {lines[key]})")
        values[key] = _coerce(key, yamlfile.construct(value_node, path), where)
        lines[key] = where
    return values, lines


def _coerce(key: str, value, where: str):
    kind = _TYPES[key]
    try:
        if kind == "float":
            if isinstance(value, bool) or not isinstance(value, (int, float, str)):
                raise TypeError
            number = float(value)
            least, most = BOUNDS[key]
            if not least <= number <= most:  # also false for nan
                raise ConfigError(f"{where}: {key}: {yamlfile.show(value)} is not a number of "
                                  f"seconds within {least:g}..{most:g}")
            return number
        if kind == "int":
            if isinstance(value, bool) or not isinstance(value, (int, str)):
                raise TypeError
            number = int(value)
            least, most = INT_BOUNDS[key]
            if not least <= number <= most:
                raise ConfigError(f"{where}: {key}: {yamlfile.show(value)} is not a whole "
                                  f"number within {least}..{most}")
            return number
        if key == "external_url":
            if not isinstance(value, str) or not (value == "" or EXTERNAL_URL.fullmatch(value)):
                raise ConfigError(f"{where}: external_url: {yamlfile.show(value)} is not a base "
                                  f"URL as people reach this daemon "
                                  f"(http(s)://HOST[:PORT][/PREFIX], no query)")
            return value
        if kind == "str":
            if isinstance(value, bool) or not isinstance(value, (str, int, float)):
                raise TypeError
            return str(value)
        if key == "probes":
            if not isinstance(value, dict) or not all(isinstance(v, bool) for v in value.values()):
                raise TypeError
            switchable = [n for n, spec in load_probes().items() if spec.switchable]
            unknown = set(map(str, value)) - set(switchable)
            if unknown:
                raise ConfigError(f"{where}: probes: unknown probe(s) "
                                  f"{yamlfile.show(sorted(unknown))} "
                                  f"(switchable: {', '.join(switchable)})")
            return dict(value)
        if key == "open_after_s":
            return _open_after(value, where)
        if key == "peers" and isinstance(value, str):  # $DDPWATCH_PEERS: comma-separated
            value = [u.strip() for u in value.split(",") if u.strip()]
        if key in ("rules", "webhooks", "peers"):
            if value is None:
                return ()
            if not isinstance(value, list):
                raise TypeError
            if key == "peers":
                for url in value:
                    if not (isinstance(url, str) and PEER_URL.fullmatch(url)):
                        raise ConfigError(f"{where}: peers: {yamlfile.show_url(url)} is not a "
                                          f"daemon's base URL (http://HOST:PORT)")
            if key == "rules" and not all(isinstance(r, str) and r for r in value):
                raise TypeError
            if key == "webhooks":
                # checked now, so a bad item fails the load (exit 78, or a refused
                # reload) with its line, not later when the dispatcher is built
                from .publish.alerts import build_sinks
                build_sinks(list(value), where)
            return tuple(value)
    except (TypeError, ValueError) as err:
        wanted = ("list" if kind.startswith("tuple") else
                  "mapping" if kind.startswith("dict") else kind)
        shown = (f"a {type(value).__name__}" if key in SECRETS or key == "peers"
                 else yamlfile.show(value))
        raise ConfigError(f"{where}: {key}: {shown} is not a valid {wanted}") from err
    return value


def _open_after(value, where: str) -> dict[str, float]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise TypeError
    delays = {}
    for verdict, seconds in value.items():
        if verdict not in PROBLEMS:
            raise ConfigError(f"{where}: open_after_s: {yamlfile.show(verdict)} is not a verdict that opens "
                              f"an incident ({', '.join(PROBLEMS)})")
        if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) \
                or not 0 <= seconds <= 86400:  # also refuses nan and inf
            raise ConfigError(f"{where}: open_after_s: {verdict}: {yamlfile.show(seconds)} is "
                              f"not a number of seconds within 0..86400")
        delays[verdict] = float(seconds)
    return delays


def _validate(c: Config, lines: dict | None = None) -> None:
    lines = lines or {}

    def at(*keys: str) -> str:  # the file:line of the first key given, else the file
        return next((lines[k] for k in keys if k in lines), c.source)
    try:
        host, port = c.host_port
        if not 0 < port < 65536 or not host:
            raise ValueError
    except ValueError as err:
        raise ConfigError(f"{at('listen')}: listen: {yamlfile.show(c.listen)} is not "
                          f"HOST:PORT") from err
    if c.peers and c.peer_max_age_s <= c.tick_s + c.probe_timeout_s:
        # a peer is polled once per tick, each poll waiting up to probe_timeout_s
        raise ConfigError(f"{at('peer_max_age_s', 'peers')}: peer_max_age_s "
                          f"({c.peer_max_age_s:g}) must exceed tick_s + "
                          f"probe_timeout_s ({c.tick_s + c.probe_timeout_s:g}), or no peer's "
                          f"answer is ever fresh")
    if c.log_format not in ("text", "json"):
        raise ConfigError(f"{at('log_format')}: log_format: {yamlfile.show(c.log_format)} "
                          f"(text or json)")
    if not is_loopback(host) and not c.token:
        raise ConfigError(f"{at('listen', 'token')}: listen: {c.listen} is not loopback: set a "
                          f"token (token: or $DDPWATCH_TOKEN) so /status is not open to the "
                          f"network")
    if not is_loopback(host):
        # off loopback a captured signed request is an offline guessing game
        # (signed/strength.py); the value itself is never shown (SECRETS)
        for key in ("token", "peer_token"):
            why = strength.weakness(getattr(c, key)) if getattr(c, key) else None
            if why:
                raise ConfigError(f"{at(key)}: {key}: {why} (listen: {c.listen} is not "
                                  f"loopback)")


def is_loopback(host: str) -> bool:
    return host in ("localhost", "::1") or host.startswith("127.")
