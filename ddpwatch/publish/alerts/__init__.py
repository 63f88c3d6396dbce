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

__all__ = [
           "Alert",
           "DeliveryError",
           "Dispatcher",
           "Sink",
           "build_sinks",
           "flavours",
           "verify_hub",
           "verify_standard",
]
