"""A local user's program on the daemon's port (tests/hostile/test_port_squat.py): run as
uid 65534 with only the standard library. It logs the head of every request
it gets (to learn what clients hand it, a token above all) and answers as a
daemon would, forged: `/status` says all is well, `/peer` claims the alerts
of every job the real daemon exports on its public /metrics, with a rank 0 of
its own for each. argv: port, log file, file holding the real daemon's URL."""
import http.server
import json
import re
import sys
import urllib.request

PORT, LOG, URL_FILE = int(sys.argv[1]), sys.argv[2], sys.argv[3]


def labels() -> list:
    try:
        with open(URL_FILE) as f:
            url = f.read().strip()
        with urllib.request.urlopen(url + "/metrics", timeout=2) as r:
            text = r.read().decode()
        return sorted(set(re.findall(r'ddp_job="([^"]+)"', text)))
    except (OSError, ValueError):
        return []


class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        with open(LOG, "a") as f:
            f.write(self.requestline + "\n" + str(self.headers) + "\n")
        jobs = labels()
        if self.path.startswith("/peer"):
            doc = {"node": "evil-node", "tick": 1, "wall_time": 0, "version": "9",
                   "jobs": {j: [{"pid": 4242, "rank": 0, "node": "evil-node"}] for j in jobs},
                   "alerting": jobs, "webhooks": True}
        else:
            doc = {"node": "evil-node", "tick": 1, "jobs": [], "incidents": [], "peers": [],
                   "job": {"verdict": "healthy", "culprits": [], "summary": "all is well"},
                   "ranks": []}
        body = json.dumps(doc).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


server = http.server.ThreadingHTTPServer(("127.0.0.1", PORT), Handler)
print("listening", flush=True)
server.serve_forever()
