"""YAML files read totally: any input gives a document or a ConfigError naming
file:line, never another exception (`[a]: 1`, `!!python/name:`, binary
bytes and a 382-byte alias bomb each killed the daemon or took 15 s and 809 MB).

Aliases are refused outright: nothing in a config or rule file needs them, and
bounding their expansion is harder to get right than not having them. Nesting is
bounded too (the composer recurses per level) and so is the file's size.
"""
from __future__ import annotations

import re

import yaml

from .errors import ConfigError

MAX_BYTES = 1 << 20   # a config or rule file is a few KiB
MAX_DEPTH = 32        # deepest legitimate nesting is about 5


def read_text(path: str, max_bytes: int = MAX_BYTES) -> str:
    """The file's text as strict UTF-8; a bad byte is named by line."""
    try:
        with open(path, "rb") as f:
            data = f.read(max_bytes + 1)
    except OSError as err:
        raise ConfigError(f"{path}: {err.strerror}") from err
    if len(data) > max_bytes:
        raise ConfigError(f"{path}: larger than {max_bytes} bytes: not a config file")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        line = data[:err.start].count(b"\n") + 1
        raise ConfigError(f"{path}:{line}: not UTF-8 text (byte 0x{data[err.start]:02x} "
                          f"at offset {err.start})") from None


class _Loader(yaml.SafeLoader):
    """SafeLoader that refuses aliases and deep nesting while composing."""

    def __init__(self, text: str, path: str):
        super().__init__(text)
        self.path = path
        self.depth = 0

    def compose_node(self, parent, index):
        event = self.peek_event()
        if isinstance(event, yaml.AliasEvent):
            raise ConfigError(f"{self.path}:{event.start_mark.line + 1}: YAML aliases (*name) "
                              f"are not accepted: write the value out")
        self.depth += 1
        if self.depth > MAX_DEPTH:
            raise ConfigError(f"{self.path}:{event.start_mark.line + 1}: nested deeper than "
                              f"{MAX_DEPTH} levels")
        try:
            return super().compose_node(parent, index)
        finally:
            self.depth -= 1


def _line(err, default: str = "") -> str:
    mark = getattr(err, "problem_mark", None) or getattr(err, "context_mark", None)
    return f":{mark.line + 1}" if mark is not None else default


def compose(text: str, path: str):
    """The document's node tree (None for an empty document)."""
    loader = None
    try:
        loader = _Loader(text, path)  # the reader checks every character here
        return loader.get_single_node()
    except ConfigError:
        raise
    except yaml.reader.ReaderError as err:
        line = text[:max(err.position, 0)].count("\n") + 1
        raise ConfigError(f"{path}:{line}: not valid YAML: non-printable character "
                          f"#x{err.character:04x}") from None
    except yaml.YAMLError as err:
        raise ConfigError(f"{path}{_line(err)}: not valid YAML: "
                          f"{getattr(err, 'problem', None) or 'syntax error'}") from None
    except RecursionError:
        raise ConfigError(f"{path}: nested too deeply") from None
    finally:
        if loader is not None:
            loader.dispose()


def construct(node, path: str):
    """Python values of a composed node, with the safe constructors only (plain
    scalars, lists, mappings): a `!!python/...` tag or an unhashable key is an error
    at its line."""
    loader = yaml.SafeLoader("")
    try:
        return loader.construct_document(node)
    except yaml.YAMLError as err:
        where = _line(err, f":{node.start_mark.line + 1}")
        problem = getattr(err, "problem", None) or "cannot be read"
        raise ConfigError(f"{path}{where}: {_short(problem)}") from None
    except (ValueError, TypeError, OverflowError, RecursionError) as err:
        # e.g. a timestamp-looking value that is no date (2001-13-45)
        raise ConfigError(f"{path}:{node.start_mark.line + 1}: cannot read value "
                          f"({type(err).__name__})") from None
    finally:
        loader.dispose()


def scalar_key(key_node, path: str) -> str:
    """A mapping key as a string; a list or mapping as key (`[a]: 1`) is an error."""
    if not isinstance(key_node, yaml.ScalarNode):
        raise ConfigError(f"{path}:{key_node.start_mark.line + 1}: a key must be a plain "
                          f"name, not a {'list' if isinstance(key_node, yaml.SequenceNode) else 'mapping'}")
    return key_node.value


def _short(text: str, limit: int = 120) -> str:
    text = str(text)
    return text if len(text) <= limit else text[:limit] + "..."


_USERINFO = re.compile(r"(//)[^/@\s'\"]*@")


def show(value, limit: int = 60) -> str:
    """repr() of a user's value, bounded, for error messages; credentials in a URL
    (`//user:password@`) are masked."""
    return _short(_USERINFO.sub(r"\1***@", repr(value)), limit)


def show_url(value) -> str:
    """A URL for an error message without what may be secret in it (credentials,
    path, query: a webhook's path is often its token)."""
    if not isinstance(value, str):
        return f"a {type(value).__name__}"
    scheme, sep, rest = value.partition("://")
    if not sep:
        return show(value[:24] + ("..." if len(value) > 24 else ""))
    hostport = rest.split("/", 1)[0].split("?", 1)[0].rpartition("@")[2]
    hidden = "/..." if len(rest) > len(rest.split("/", 1)[0]) else ""
    return show(f"{scheme[:10]}://{hostport[:60]}{hidden}")
