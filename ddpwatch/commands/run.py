"""`ddpwatch run`: start the daemon; SIGHUP reloads config and rules, SIGTERM stops."""
from __future__ import annotations

import json
import logging
import math
import os
import signal
import sys
import threading
import time

from .. import config as config_mod, errors, port_guard
from ..daemon import Daemon, collect_less, load_rules
from ..observe.peers import poller_for
from ..publish.alerts import dispatcher_for
from ..publish.endpoints import STALE_AFTER_S, Server
from ..publish.bounded_server import bind, same_address
from ..sdnotify import Watchdog, listen_socket, notify, watchdog_interval_s

log = logging.getLogger("ddpwatch")

# A test hook, not a setting: while the file this names exists, the tick loop
# waits where a tick would run, as a tick stuck in a hung read would; the
# watchdog pings stop with it (tests/deploy/test_watchdog.py). Unset, it costs nothing.
HOLD_TICK_ENV = "DDPWATCH_HOLD_TICK_FILE"


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
    # An exception escaping any thread goes through the same handler, so nothing
    # reaches stderr outside `--log-format json` (client resets did).
    threading.excepthook = lambda a: log.error(
        "thread %s died", a.thread.name if a.thread else "?",
        exc_info=(a.exc_type, a.exc_value, a.exc_traceback))


def load_all(args):
    overrides = {"listen": args.listen, "log_format": args.log_format}
    cfg = config_mod.load(config_mod.find_file(args.config), overrides)
    return cfg, load_rules(cfg)


def main(args) -> int:
    cfg, rules = load_all(args)  # ConfigError -> exit 78 at the CLI boundary
    setup_logging(cfg.log_format)
    # The port first, while this is the only thread: giving up the capability
    # that bound it (guard_port) holds for every thread started after.
    activated = _activated(cfg)
    sock, pinned = activated, None
    if activated is None:
        try:
            sock = bind(*cfg.host_port)
        except OSError as err:
            raise errors.Unavailable(f"cannot listen on {cfg.listen}: {err.strerror}") from err
        pinned = guard_port(cfg.listen, sock.getsockname()[1])
    poller = poller_for(cfg)
    daemon = Daemon(cfg, rules, dispatcher_for(cfg), peers=poller)
    collect_less()
    from ..publish.metrics import make_registry, render
    # `server` is made below and rebound by a reload that moves the listener
    registry = make_registry(lambda: daemon.view, lambda: server.httpd.stats)

    # /healthz fails where systemd would kill (after its watchdog interval), and
    # never before three ticks were due
    stale_s = watchdog_interval_s() or STALE_AFTER_S

    def make_server(c, sock=None):
        host, port = c.host_port
        return Server(host, port, lambda: daemon.view, lambda: render(registry), c.token,
                      request_stacks=daemon.stack_requests.ask,
                      stacks_min_interval_s=c.stacks_min_interval_s, sock=sock,
                      activated=activated is not None and sock is activated,
                      stale_after_s=max(stale_s, 3 * c.tick_s))

    host = cfg.host_port[0]
    server = make_server(cfg, sock)
    server.start()
    if poller is not None:
        poller.start()
        log.info("peer view: asking %s", ", ".join(poller.urls))
    stop = threading.Event()
    reload_requested = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    signal.signal(signal.SIGHUP, lambda *_: reload_requested.set())
    log.info("ddpwatch run: listening on %s:%d%s, config %s, tick %.1fs", host, server.port,
             " (systemd's socket)" if activated is not None else "", cfg.source, cfg.tick_s)
    watchdog = Watchdog(watchdog_interval_s())
    if watchdog.interval_s:
        log.info("systemd watchdog: %.0fs, pinged from the tick loop", watchdog.interval_s)
    hold = os.environ.get(HOLD_TICK_ENV, "")
    next_tick = time.monotonic()
    first = True
    while not stop.is_set():
        if reload_requested.is_set():
            reload_requested.clear()
            server = _reload(args, daemon, server, make_server, pinned)
        if hold:
            _held(hold, stop)
        daemon.tick()
        if first:
            notify("READY=1")
            first = False
        watchdog.ping()  # only a loop that completes ticks says it is alive
        next_tick += daemon.config.tick_s
        now = time.monotonic()
        if next_tick < now:  # a slow tick: start the next one now, don't pile up
            next_tick = now
        while not stop.is_set():  # reads the ranks' states meanwhile
            # a long tick_s is waited in slices short enough for the watchdog
            slice_end = min(next_tick, time.monotonic() + (watchdog.every_s or math.inf))
            daemon.between_ticks(slice_end, stop)
            if slice_end >= next_tick:
                break
            watchdog.ping()
    notify("STOPPING=1")
    if daemon.peers is not None:
        daemon.peers.stop()
    left = daemon.dispatcher.close(timeout_s=5.0) if daemon.dispatcher is not None else 0
    server.stop()
    daemon.close()
    log.info("ddpwatch run: stopped (%d alert(s) left undelivered)", left)
    return errors.OK


def _activated(cfg):
    """systemd's listening socket (systemd/ddpwatch.socket), if it passed one. It
    must listen where the config says, or clients and the config would disagree
    on where the daemon is: exit 78 naming both."""
    try:
        sock = listen_socket()
    except ValueError as err:
        raise errors.ConfigError(f"socket activation: {err}") from err
    if sock is None:
        return None
    host, port = cfg.host_port
    if not same_address(sock, host, port):
        bound = sock.getsockname()
        sock.close()
        raise errors.ConfigError(
            f"{cfg.source}: listen is {cfg.listen}, but systemd passed a socket on "
            f"{bound[0]}:{bound[1]}: make ddpwatch.socket's ListenStream= and listen agree")
    return sock


def guard_port(listen: str, port: int, procfs: str = "/proc") -> str | None:
    """A port the daemon bound itself: say when any local user could take it while
    the daemon is down (port_guard.warning), and give up CAP_NET_BIND_SERVICE
    once a privileged one is held (the containers add it for that bind alone:
    deploy/image/run.sh, deploy/kubernetes/daemonset.yaml). Returns why a reload
    may no longer move `listen` (the capability is gone), or None."""
    start = port_guard.read_unprivileged_start(procfs)
    said = port_guard.warning(listen, port, start)
    if said:
        log.warning("%s", said)
    try:
        dropped = port_guard.drop_bind_service()
    except OSError as err:
        log.warning("could not give up CAP_NET_BIND_SERVICE: %s", err.strerror)
        return None
    if dropped and port_guard.takeable(port, start) is False:
        log.info("listening on privileged port %d; CAP_NET_BIND_SERVICE given up", port)
        return (f"the daemon gave up CAP_NET_BIND_SERVICE once it held privileged port "
                f"{port}: restart it to listen elsewhere")
    return None


def _held(path: str, stop: threading.Event) -> None:
    """The HOLD_TICK_ENV hook: wait while `path` exists (or until stopped)."""
    while os.path.exists(path) and not stop.is_set():
        stop.wait(0.1)


def _reload(args, daemon, server, make_server, pinned=None):
    """Atomic: a bad file, or a listen address that cannot be bound, is logged and
    the running config kept. `pinned` says why listen may not move (guard_port).
    The daemon reloads itself (Daemon.reload); here only what serves HTTP and the
    log. Returns the server now in use."""
    try:
        cfg, rules = load_all(args)
    except errors.DdpwatchError as err:
        log.error("reload refused, keeping the running config: %s", err)
        return server
    except Exception as err:  # a bug; the loop must not die of it (values may be secret)
        log.error("reload refused, keeping the running config: unexpected %s",
                  type(err).__name__)
        return server
    if cfg.listen != daemon.config.listen and server.httpd.activated:
        log.error("reload refused, keeping the running config: listen moved to %s, but the "
                  "socket is systemd's (ddpwatch.socket): change its ListenStream= and "
                  "restart both", cfg.listen)
        return server
    if cfg.listen != daemon.config.listen and pinned:
        log.error("reload refused, keeping the running config: listen moved to %s, but %s",
                  cfg.listen, pinned)
        return server
    if cfg.listen != daemon.config.listen:
        server, why = rebind(server, cfg, daemon.config, make_server)
        if why:
            log.error("reload refused, keeping the running config: %s", why)
            return server
    server.token = cfg.token
    server.stacks_min_interval_s = cfg.stacks_min_interval_s
    setup_logging(cfg.log_format)
    daemon.reload(cfg, rules)
    log.info("reloaded %s (%d rules)", cfg.source, len(rules))
    return server


def rebind(server, cfg, old_cfg, make_server):
    """Serve on cfg.listen from now on. Returns (server in use, None), or (server in
    use, why not) with the old address still served under the old token: never the
    new token on the old address (moving listen to loopback and dropping
    the token left 0.0.0.0 serving /status without one)."""
    try:
        new = make_server(cfg)
    except OSError as first:
        why = f"{cfg.source}: listen: cannot listen on {cfg.listen}: {first.strerror}"
        if cfg.host_port[1] != old_cfg.host_port[1]:
            return server, why
        # same port, another address: the old socket holds the port; let go, then bind
        server.stop()
        try:
            new = make_server(cfg)
        except OSError as err:
            why = f"{cfg.source}: listen: cannot listen on {cfg.listen}: {err.strerror}"
            try:
                server = make_server(old_cfg)
                server.start()
            except OSError as again:
                log.error("reload: cannot listen on %s nor again on %s (%s): no HTTP until "
                          "a reload succeeds", cfg.listen, old_cfg.listen, again.strerror)
            return server, why
        new.start()
        log.info("reload: now listening on %s (was %s)", cfg.listen, old_cfg.listen)
        return new, None
    new.start()
    server.stop()
    log.info("reload: now listening on %s (was %s)", cfg.listen, old_cfg.listen)
    return new, None
