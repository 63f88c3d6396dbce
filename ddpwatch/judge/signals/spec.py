"""What a signal is: a name rules can use, the type of its values, its unit and
what it means. Each family module lists its own (`SIGNALS`) next to the code
that measures them; the rules loader rejects names no family declares, values
of the wrong type and, for a string signal that names one of a few things
(`one_of`), any value it does not declare; `ddpwatch rules signals` lists them all.
A string signal without declared values is free text (a site, an address, evidence)."""
from __future__ import annotations

from dataclasses import dataclass

NUMBER = (int, float)

# The units a signal's values come in; a rule compares a value in its unit
# (`stopped_share >= 0.2` is a fifth of the window, not 0.2%).
UNITS = {
    "s": "seconds",
    "cores": "CPU cores (1.0 = one core busy for the whole window)",
    "share": "a fraction of a whole, 0 to 1 (0.25 = a quarter; evidence shows it as 25%)",
    "ratio": "this amount over another (1.0 = as much; 2.5 = two and a half times)",
    "count": "how many",
    "MB/s": "megabytes (10^6 bytes) per second",
}


@dataclass(frozen=True)
class OneOf:
    """The kind of a string signal that names one of a few things (a stack kind, a
    process state): a rule compares it only with these (judge/conditions.py)."""
    values: tuple[str, ...]


def one_of(*values: str) -> OneOf:
    return OneOf(values)


@dataclass(frozen=True)
class Signal:
    name: str
    kind: type | tuple   # bool, int, str, or NUMBER (a measured amount)
    doc: str
    unit: str = ""       # a key of UNITS; "" for flags, names and identifiers
    values: tuple[str, ...] = ()  # a one_of signal's values; () for anything else

    def __post_init__(self):
        if self.unit and self.unit not in UNITS:
            raise ValueError(f"signal {self.name}: unknown unit {self.unit!r} (one of "
                             f"{', '.join(UNITS)})")

    def accepts(self, value) -> bool:
        """Whether a rule may compare this signal with `value` (True == 1 is not
        a comparison anyone means)."""
        if isinstance(value, bool) or self.kind is bool:
            return isinstance(value, bool) and self.kind is bool
        return isinstance(value, self.kind)

    def declares(self, value) -> bool:
        """Whether `value` is one this signal takes: any, unless it is a one_of."""
        return not self.values or value in self.values

    @property
    def meaning(self) -> str:
        """Its doc, with the values of a one_of (for `rules signals` and docs/rules.md)."""
        return f"{self.doc}; one of: {', '.join(self.values)}" if self.values else self.doc

    @property
    def type_name(self) -> str:
        return "number" if self.kind == NUMBER else self.kind.__name__


def declare(*rows: tuple) -> tuple[Signal, ...]:
    """SIGNALS = declare(("name", kind, "what it means"[, "unit"]), ...); a kind
    `one_of("a", "b")` declares a string signal's values."""
    return tuple(Signal(name, str, doc, *rest, values=kind.values) if isinstance(kind, OneOf)
                 else Signal(name, kind, doc, *rest) for name, kind, doc, *rest in rows)
