"""A flood of processes that look like Python to anyone reading argv: N shells
each started as `python3 -c 'read x' <4 KB of invalid UTF-8>`, all waiting on
one pipe this process holds; they end when it does. Run as root, it first
becomes uid/gid 65534 with no groups (a local user), so the flood is that
user's. Prints "started N" once all are up, then waits to be killed.

    python tests/jobs/python_flood.py N
Used by tests/hostile/test_process_flood.py and benchmarks/hostile_scan.py --procs.
"""
import os
import signal
import sys

if os.geteuid() == 0:
    os.setgroups([])
    os.setgid(65534)
    os.setuid(65534)
n = int(sys.argv[1])
junk = b"\xff\xfe" * 2048  # 4 KB, not UTF-8
read_end, write_end = os.pipe()
env = {k: v for k, v in os.environ.items() if k == "DDPWATCH_TEST_JOB"}  # conftest's tag
env["PATH"] = "/usr/bin:/bin"
for _ in range(n):
    if os.fork() == 0:
        os.dup2(read_end, 0)
        os.close(write_end)
        os.execve("/bin/sh", [b"python3", b"-c", b"read x", junk], env)
os.close(read_end)
print("started", n, flush=True)
signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # reap the shells as they end
while True:
    signal.pause()
