"""`webhooks:` config items -> sinks. Strict, like the rest of the config: an
unknown type or key, a missing url or a bad value is a ConfigError naming the
source, the item index and the key. Flavours are looked up in the registry, so
this module knows none of them.
"""
from __future__ import annotations

import importlib
import urllib.parse

from ...errors import ConfigError
from .base import MODULES, REGISTRY, Flavour

COMMON = {"type": str, "url": str, "timeout_s": (int, float), "name": str}
DEFAULT_TIMEOUT_S = 5.0
MAX_TIMEOUT_S = 300.0


def flavours() -> dict[str, Flavour]:
    for module in MODULES:
        importlib.import_module(f"{__package__}.{module}")
    return REGISTRY


def build_sinks(config: list[dict], source: str = "<config>") -> list:
    if config is None:
        return []
    if not isinstance(config, list):
        raise ConfigError(f"{source}: webhooks: expected a list of items, got "
                          f"{type(config).__name__}")
    known = flavours()
    sinks, names = [], set()
    for index, item in enumerate(config):
        where = f"{source}: webhooks[{index}]"
        sink = _build_one(item, where, known, index, config)
        if sink.name in names:
            raise ConfigError(f"{where}: name: {sink.name!r} is already used by another "
                              f"webhook (names key the alert metrics)")
        names.add(sink.name)
        sinks.append(sink)
    return sinks


def _build_one(item, where: str, known: dict[str, Flavour], index: int, config: list):
    if not isinstance(item, dict):
        raise ConfigError(f"{where}: expected a mapping with type and url, got "
                          f"{type(item).__name__}")
    kind = item.get("type")
    if not isinstance(kind, str) or kind not in known:
        raise ConfigError(f"{where}: type: {repr(kind)[:40]} is not one of {sorted(known)}")
    flavour = known[kind]
    allowed = {**COMMON, **flavour.options}
    for key, value in item.items():
        if not isinstance(key, str) or key not in allowed:
            raise ConfigError(f"{where}: unknown key {repr(key)[:40]} for type {kind!r} "
                              f"(allowed: {', '.join(sorted(allowed))})")
        # bool is an int in Python; `timeout_s: true` is still a mistake. The value
        # itself is never shown: url and secret carry credentials.
        if isinstance(value, bool) or not isinstance(value, allowed[key]):
            raise ConfigError(f"{where}: {key}: expected {_type_name(allowed[key])}, "
                              f"got a {type(value).__name__}")
    if "url" not in item:
        raise ConfigError(f"{where}: url: missing (the receiver's http(s) URL)")
    url = urllib.parse.urlsplit(item["url"])
    try:
        _ = url.port  # raises ValueError on a non-numeric or out-of-range port
    except ValueError:
        raise ConfigError(f"{where}: url: bad port for host {url.hostname}") from None
    if url.scheme not in ("http", "https") or not url.hostname:
        # Shown without the path: a Slack webhook path is its token.
        raise ConfigError(f"{where}: url: expected http:// or https://host..., got "
                          f"{url.scheme or '(no scheme)'}://{url.hostname or '(no host)'}")
    timeout_s = float(item.get("timeout_s", DEFAULT_TIMEOUT_S))
    if not 0 < timeout_s <= MAX_TIMEOUT_S:  # also refuses nan and inf
        raise ConfigError(f"{where}: timeout_s: must be > 0 and <= {MAX_TIMEOUT_S:g}, "
                          f"got {timeout_s}")
    same_kind = sum(1 for other in config if isinstance(other, dict) and other.get("type") == kind)
    name = item.get("name") or (kind if same_kind == 1 else f"{kind}-{index}")
    options = {k: v for k, v in item.items() if k in flavour.options}
    try:
        return flavour.make(name=name, url=item["url"], timeout_s=timeout_s, **options)
    except ValueError as err:  # a flavour's own check of its options: "key: why"
        raise ConfigError(f"{where}: {err}") from err


def _type_name(types) -> str:
    types = types if isinstance(types, tuple) else (types,)
    return " or ".join("number" if t in (int, float) else t.__name__ for t in types) \
        .replace("number or number", "number")
