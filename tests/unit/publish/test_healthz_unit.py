"""/healthz is liveness: 503 once no tick has completed for `stale_after_s`
(publish/endpoints.py Server._since_tick). Pure: a request object that keeps
what was sent, a clock in hand; tests/deploy/test_watchdog.py holds a real
daemon's tick loop."""
from __future__ import annotations

from fake_request import Request

from ddpwatch.publish.endpoints import Server




def healthz(server) -> tuple[int, bytes]:
    req = Request("/healthz")
    server.handle(req)
    return req.code, req.body


def test_healthz_fails_when_the_view_stops_changing(tmp_path):
    now, view = [100.0], [None]
    server = Server("127.0.0.1", 0, lambda: view[0], lambda: b"", clock=lambda: now[0],
                    stale_after_s=30.0)
    try:
        assert healthz(server)[0] == 200        # starting
        now[0] = 131.0
        assert healthz(server) == (503, b"no first tick for 31 s\n")
        view[0] = object()                      # a tick completed
        assert healthz(server)[0] == 200
        for t in (140.0, 150.0, 160.0):         # ticks go on: each view seen new
            now[0], view[0] = t, object()
            assert healthz(server)[0] == 200
        now[0] = 190.0                          # the same view, 30 s after it was first seen
        assert healthz(server)[0] == 200
        now[0] = 190.5
        assert healthz(server) == (503, b"no tick completed for 30 s\n")
        view[0] = object()
        assert healthz(server)[0] == 200
    finally:
        server.stop()  # never started: closes its sockets
