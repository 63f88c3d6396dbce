"""What every alert flavour shares: the Alert value, the one-method Sink protocol,
the error a failed delivery raises, and the registry flavours add themselves to.

Like the probes registry: a flavour module calls `register("slack", ...)` at
import, so config names it by that type and nothing else knows the flavours.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

STATUSES = ("firing", "resolved")


@dataclass(frozen=True)
class Alert:
    """One incident event as the daemon reports it; sinks only read it."""
    status: str                 # "firing" | "resolved"
    incident_id: str            # stable per incident: receivers deduplicate on it
    node: str                   # hostname of the daemon
    job: str                    # job key (run id or launcher pid)
    verdict: str                # e.g. "hung_outside_collective"
    culprits: tuple[int, ...]   # culprit ranks
    summary: str                # one paragraph, human text
    started_at: float           # unix time the incident opened
    ended_at: float             # unix time resolved, 0.0 while firing
    status_url: str = ""        # link to the daemon's /status
    incident_url: str = ""      # link to the incident's page (config external_url)
    severity: str = "critical"

    def __post_init__(self):
        if self.status not in STATUSES:
            raise ValueError(f"Alert.status must be one of {STATUSES}, not {self.status!r}")
        # The daemon may hand a list; a frozen value must hold a tuple of ints.
        object.__setattr__(self, "culprits", tuple(int(r) for r in self.culprits))

    @property
    def firing(self) -> bool:
        return self.status == "firing"


class Sink(Protocol):
    """One webhook flavour. `send` makes ONE HTTP attempt; retrying, queueing and
    threads belong to the Dispatcher. A sink may also declare `resend_s` (> 0):
    the Dispatcher then re-sends still-firing alerts that often (Alertmanager
    forgets alerts that are not re-sent, see alertmanager.py)."""
    name: str

    def send(self, alert: Alert) -> None: ...


class DeliveryError(Exception):
    """One delivery attempt failed. `retryable` False means trying again cannot help
    (a 4xx other than 408/429); `retry_after` is the receiver's own wish, in seconds.
    Messages never hold the URL path or a secret: a Slack URL path IS the token."""

    def __init__(self, message: str, *, retry_after: float | None = None,
                 retryable: bool = True):
        super().__init__(message)
        self.retry_after = retry_after
        self.retryable = retryable


@dataclass(frozen=True)
class Flavour:
    kind: str
    make: Callable[..., Any]          # make(name=, url=, timeout_s=, **options) -> Sink
    options: dict[str, type | tuple]  # extra config keys this flavour accepts -> types
    help: str


REGISTRY: dict[str, Flavour] = {}
MODULES = ("generic", "slack", "alertmanager")


def register(kind: str, *, options: dict | None = None, help: str = ""):
    def decorate(cls):
        REGISTRY[kind] = Flavour(kind, cls, dict(options or {}), help)
        return cls
    return decorate
