"""Alert webhooks: the daemon hands incident events to a Dispatcher, which
delivers them in the background to each configured sink.

    sinks = build_sinks(config.webhooks, source=config_path)   # ConfigError if bad
    dispatcher = Dispatcher(sinks)
    dispatcher.submit(Alert(status="firing", ...))   # on open; never blocks
    dispatcher.submit(Alert(status="resolved", ...)) # on resolve (same incident_id)
    left = dispatcher.close(timeout_s=5)             # on SIGTERM
    dispatcher.stats()                               # per sink counters for /metrics

Flavours (one module each, registered by type name): generic, slack, alertmanager.
Only the standard library: the daemon stays light and never imports torch.
"""
from __future__ import annotations

from .base import Alert, DeliveryError, Sink
from .config import build_sinks, flavours
from .dispatch import Dispatcher
from .generic import verify_hub, verify_standard



def dispatcher_for(cfg) -> Dispatcher | None:
    """The config's webhooks' Dispatcher (None without webhooks). ConfigError if bad."""
    return Dispatcher(build_sinks(list(cfg.webhooks), cfg.source)) if cfg.webhooks else None


__all__ = [
           "Alert",
           "DeliveryError",
           "Dispatcher",
           "Sink",
           "build_sinks",
           "dispatcher_for",
           "flavours",
           "verify_hub",
           "verify_standard",
]
