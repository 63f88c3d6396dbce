"""Two torch processes of one user that talk over one plain TCP connection and
are no DDP job: an inference server and its client, say. The daemon must not
group them (tests/daemon/test_daemon_byhand.py).

    python torch_pair.py server PORT    # listens, accepts one client, holds it
    python torch_pair.py client PORT    # connects, holds the connection
"""
import os
import socket
import sys
import time

import torch  # noqa: F401  (mapped: a torch process, like the server it stands for)

role, port = sys.argv[1], int(sys.argv[2])
if role == "server":
    server = socket.create_server(("127.0.0.1", port))
    print(f"torch_pair: listening pid={os.getpid()}", flush=True)
    conn, _ = server.accept()
else:
    deadline = time.monotonic() + 120
    while True:
        try:
            conn = socket.create_connection(("127.0.0.1", port))
            break
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)
print(f"torch_pair: {role} connected pid={os.getpid()}", flush=True)
while True:
    time.sleep(3600)
