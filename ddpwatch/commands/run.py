"""`ddpwatch run`: start the daemon; SIGHUP reloads config and rules, SIGTERM stops."""
from __future__ import annotations

import json
import logging
import signal
import sys
import threading
import time

from .. import config as config_mod, errors
from ..daemon import Daemon, load_rules
from ..publish.httpd import Server
from ..sdnotify import notify

log = logging.getLogger("ddpwatch")


class JsonFormatter(logging.Formatter):
    def format(self, record):
        doc = {"ts": round(record.created, 3), "level": record.levelname.lower(),
               "msg": record.getMessage()}
        if record.exc_info:
            doc["error"] = self.formatException(record.exc_info)
        return json.dumps(doc)


def setup_logging(fmt: str) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else
                         logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
    root = logging.getLogger("ddpwatch")
    root.handlers[:] = [handler]
    root.setLevel(logging.INFO)


def build_dispatcher(cfg):
    if not cfg.webhooks:
        return None
    from ..publish.alerts import Dispatcher, build_sinks
    return Dispatcher(build_sinks(list(cfg.webhooks), cfg.source))


def poller_inputs(cfg) -> tuple:
    """Everything the peer poller is built from (a reload rebuilds it if any changed)."""
    return (cfg.peers, cfg.peer_token or cfg.token, cfg.tick_s, cfg.probe_timeout_s,
            cfg.peer_max_age_s)


def build_poller(cfg):
    if not cfg.peers:
        return None
    from ..publish.peers import PeerPoller
    peers, token, tick_s, timeout_s, max_age_s = poller_inputs(cfg)
    return PeerPoller(peers, token, interval_s=tick_s, timeout_s=timeout_s, max_age_s=max_age_s)


def load_all(args):
    overrides = {"listen": args.listen, "log_format": args.log_format}
    cfg = config_mod.load(config_mod.find_file(args.config), overrides)
    return cfg, load_rules(cfg)


def main(args) -> int:
    cfg, rules = load_all(args)  # ConfigError -> exit 78 at the CLI boundary
    setup_logging(cfg.log_format)
    dispatcher = build_dispatcher(cfg)
    poller = build_poller(cfg)
    daemon = Daemon(cfg, rules, dispatcher, peers=poller)
    from ..publish.metrics import make_registry, render
    registry = make_registry(lambda: daemon.view)
    host, port = cfg.host_port
    try:
        server = Server(host, port, lambda: daemon.view, lambda: render(registry), cfg.token,
                        request_stacks=lambda: setattr(daemon, "stacks_requested", True))
    except OSError as err:
        daemon.close()
        raise errors.Unavailable(f"cannot listen on {cfg.listen}: {err.strerror}") from err
    server.start()
    if poller is not None:
        poller.start()
        log.info("peer view: asking %s", ", ".join(poller.urls))
    stop = threading.Event()
    reload_requested = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    signal.signal(signal.SIGHUP, lambda *_: reload_requested.set())
    log.info("ddpwatch run: listening on %s:%d, config %s, tick %.1fs", host, server.port,
             cfg.source, cfg.tick_s)
    next_tick = time.monotonic()
    first = True
    while not stop.is_set():
        if reload_requested.is_set():
            reload_requested.clear()
            dispatcher = _reload(args, daemon, dispatcher, server)
        daemon.tick()
        if first:
            notify("READY=1")
            first = False
        next_tick += daemon.config.tick_s
        now = time.monotonic()
        if next_tick < now:  # a slow tick: start the next one now, don't pile up
            next_tick = now
        stop.wait(next_tick - now)
    notify("STOPPING=1")
    if daemon.peers is not None:
        daemon.peers.stop()
    left = dispatcher.close(timeout_s=5.0) if dispatcher is not None else 0
    server.stop()
    daemon.close()
    log.info("ddpwatch run: stopped (%d alert(s) left undelivered)", left)
    return errors.OK


def _reload(args, daemon, dispatcher, server):
    """Atomic: a bad file is logged and the running config kept."""
    try:
        cfg, rules = load_all(args)
        new_dispatcher = build_dispatcher(cfg) if cfg.webhooks != daemon.config.webhooks \
            else dispatcher
    except errors.DdpwatchError as err:
        log.error("reload refused, keeping the running config: %s", err)
        return dispatcher
    if cfg.listen != daemon.config.listen:
        log.warning("reload: listen changes only on restart (still %s)", daemon.config.listen)
    if poller_inputs(cfg) != poller_inputs(daemon.config):
        if daemon.peers is not None:
            daemon.peers.stop()
        daemon.peers = build_poller(cfg)
        if daemon.peers is not None:
            daemon.peers.start()
    if new_dispatcher is not dispatcher:
        if dispatcher is not None:
            dispatcher.close(timeout_s=2.0)
        daemon.dispatcher = new_dispatcher
    server.token = cfg.token
    setup_logging(cfg.log_format)
    daemon.reconfigure(cfg, rules)
    log.info("reloaded %s (%d rules)", cfg.source, len(rules))
    return new_dispatcher
