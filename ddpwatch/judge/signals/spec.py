"""What a signal is: a name rules can use, the type of its values, and what it
means. Each family module lists its own (`SIGNALS`) next to the code that
measures them; the rules loader rejects names no family declares and values of
the wrong type."""
from __future__ import annotations

from dataclasses import dataclass

NUMBER = (int, float)


@dataclass(frozen=True)
class Signal:
    name: str
    kind: type | tuple   # bool, int, str, or NUMBER (a measured amount)
    doc: str

    def accepts(self, value) -> bool:
        """Whether a rule may compare this signal with `value` (True == 1 is not
        a comparison anyone means)."""
        if isinstance(value, bool) or self.kind is bool:
            return isinstance(value, bool) and self.kind is bool
        return isinstance(value, self.kind)


def declare(*rows: tuple) -> tuple[Signal, ...]:
    """SIGNALS = declare(("name", kind, "what it means"), ...)"""
    return tuple(Signal(*row) for row in rows)
