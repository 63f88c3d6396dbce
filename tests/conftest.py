"""Shared test machinery for real jobs: isolated heartbeat dirs, process groups
that die with the test, and waiting on conditions instead of sleeping."""
from __future__ import annotations

import collections
import json
import os
import signal
import socket
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import psutil
import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TESTS = os.path.join(REPO, "tests")  # jobs/, fixtures/, support/: found from any folder
REQUIRE_ALL = os.environ.get("DDPWATCH_REQUIRE_ALL") == "1"
JOB_TAG = "DDPWATCH_TEST_JOB"


def need(condition: bool, reason: str) -> None:
    """Skip with `reason` on a laptop; fail under .ci/run (DDPWATCH_REQUIRE_ALL=1)."""
    if condition:
        return
    if REQUIRE_ALL:
        pytest.fail(f"required by DDPWATCH_REQUIRE_ALL=1 but unavailable: {reason}")
    pytest.skip(reason)


def wait_until(predicate, timeout: float = 120.0, interval: float = 0.2, what="condition"):
    """Poll `predicate` until it returns a truthy value; fail with `what` on timeout.
    `what` may be a callable, called at the failure: logs read then, not before the
    wait (an f-string argument is read when the wait starts)."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = predicate()
        if last:
            return last
        time.sleep(interval)
    said = what() if callable(what) else what
    pytest.fail(f"timed out after {timeout:.0f}s waiting for {said} (last: {last!r})")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# python's options that take the next argument as theirs (python --help)
_PY_OPTS_WITH_ARG = ("-X", "-W", "--check-hash-based-pycs")


def python_module(cmdline) -> tuple[str, list[str]] | None:
    """(module, its arguments) when argv `cmdline` is a python running `-m module`,
    else None. A process is told by the argv items it was started with, never by a
    word found anywhere in its command line: a checkout may sit in a directory
    named ddpwatch, so its interpreter's path holds that word too."""
    args = list(cmdline)
    i = 1
    while i < len(args):
        arg = args[i]
        if arg == "-m":
            return (args[i + 1], args[i + 2:]) if i + 1 < len(args) else None
        if arg.startswith("-m") and not arg.startswith("--"):
            return arg[2:], args[i + 1:]
        if not arg.startswith("-") or arg in ("-", "-c"):
            return None  # a script, stdin or -c: no module
        i += 2 if arg in _PY_OPTS_WITH_ARG else 1
    return None


def runs_module(cmdline, module: str, *first_args: str) -> bool:
    """Whether `cmdline` runs `python -m module` with `first_args` next, e.g.
    runs_module(cmd, "ddpwatch", "run") for a daemon."""
    found = python_module(cmdline)
    return found is not None and found[0] == module and \
        found[1][:len(first_args)] == list(first_args)


def is_torchrun_agent(cmdline) -> bool:
    """torchrun's launcher: `python -m torch.distributed.run` or the `torchrun`
    console script (run directly or by its interpreter)."""
    args = list(cmdline)
    return runs_module(args, "torch.distributed.run") or any(
        os.path.basename(a) == "torchrun" for a in args[:2])


def tagged_processes(tag: str) -> list[psutil.Process]:
    """Processes whose environment carries this job's tag. torchrun starts each
    worker in a session of its own, so a process group does not hold them all,
    and a worker whose launcher died is re-parented: the tag still finds it."""
    found = []
    for proc in psutil.process_iter():
        try:
            if proc.environ().get(JOB_TAG) == tag:
                found.append(proc)
        except (psutil.Error, OSError):
            continue
    return found


class Job:
    """Processes started for a test; `kill()` ends every process it started."""

    def __init__(self, argv, env, log_path, pass_fds=()):
        self.tag = uuid.uuid4().hex
        env = dict(env, **{JOB_TAG: self.tag})
        self.log_path = log_path
        self.log = open(log_path, "wb")
        self.proc = subprocess.Popen(argv, env=env, stdout=self.log, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, start_new_session=True, cwd=REPO,
                                     pass_fds=pass_fds)
        self.pgid = self.proc.pid

    def output(self) -> str:
        self.log.flush()
        with open(self.log_path, "rb") as f:
            return f.read().decode("utf-8", "replace")

    def wait(self, timeout: float = 300.0) -> int:
        return self.proc.wait(timeout=timeout)

    def processes(self) -> list[psutil.Process]:
        return tagged_processes(self.tag)

    def kill(self) -> None:
        for sig in (signal.SIGCONT, signal.SIGKILL):  # a stopped process must not linger
            try:
                os.killpg(self.pgid, sig)
            except ProcessLookupError:
                pass
            for proc in self.processes():
                try:
                    proc.send_signal(sig)
                except psutil.Error:
                    pass
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            pass
        self.log.close()


@pytest.fixture
def hb_dir(tmp_path):
    d = tmp_path / "hb"
    return str(d)


def _job_starter(log_dir, hb_dir: str):
    """start(argv, env=None, name) -> Job, and the jobs it started (to kill)."""
    jobs = []

    def start(argv, env=None, name="job", pass_fds=()):
        full_env = dict(os.environ)
        full_env.update({"DDPWATCH_DIR": hb_dir, "OMP_NUM_THREADS": "1",
                         "PYTHONUNBUFFERED": "1", "PYTHONPATH": REPO})
        full_env.update(env or {})
        job = Job(argv, full_env, str(log_dir / f"{name}-{len(jobs)}.log"), pass_fds)
        jobs.append(job)
        return job
    return start, jobs


@pytest.fixture
def start_job(tmp_path, hb_dir):
    """start_job(argv, env=None) -> Job in its own process group, killed at teardown."""
    start, jobs = _job_starter(tmp_path, hb_dir)
    yield start
    for job in jobs:
        job.kill()


@pytest.fixture(scope="module")
def start_module_job(tmp_path_factory):
    """start_job for a job several tests of a module share (each test leaves it as
    it found it): starting jobs is most of the suite's time on 2 cores. Its
    records go to its own directory (`.hb_dir` of the starter)."""
    log_dir = tmp_path_factory.mktemp("module-job")
    start, jobs = _job_starter(log_dir, str(log_dir / "hb"))
    start.hb_dir = str(log_dir / "hb")
    yield start
    for job in jobs:
        job.kill()


def torchrun(nproc: int, *args: str) -> list[str]:
    """A torchrun command on a port chosen now (never the shared 29500)."""
    return [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={nproc}",
            "--master_addr=127.0.0.1", f"--master_port={free_port()}", *args]


def trainer(*args: str) -> list[str]:
    """The bundled trainer on 2 CPU ranks under torchrun (a port chosen now),
    training until killed unless `args` give --steps."""
    steps = () if any(a.startswith("--steps") for a in args) else ("--steps=0",)
    return torchrun(2, "-m", "trainer", "--device-type=cpu", *steps, *args)


def need_c_core():
    try:
        from ddpwatch.heartbeat import _hotpath  # noqa: F401
    except ImportError as err:
        need(False, f"the C hot path is not built ({err}): pip install -e . "
                    "or python setup.py build_ext --inplace")


@pytest.fixture
def need_py_spy():
    from ddpwatch.observe.probes.stacks import find_py_spy
    need(find_py_spy() is not None, "py-spy is not installed")
    try:
        with open("/proc/sys/kernel/yama/ptrace_scope") as f:
            scope = f.read().strip()
    except OSError:
        scope = "0"  # no Yama: plain ptrace rules apply to our own children
    need(os.geteuid() == 0 or scope == "0",
         "py-spy needs ptrace: run as root or set kernel.yama.ptrace_scope=0")


@pytest.fixture
def netns(request):
    """A network namespace joined by a veth pair: a second node on this host. Its
    addresses are in 10.231/16, or in the /16 an indirect parameter names (Gloo's
    pairs connect from the higher address to the lower: 198.18/16, above 127/8,
    makes the home LAN's 192.168 order; RFC 2544 keeps it off real networks)."""
    need(os.geteuid() == 0 and shutil.which("ip") and shutil.which("iptables"),
         "needs root, ip and iptables for a network namespace")
    tag = uuid.uuid4().hex[:6]
    ns = {"name": f"ddpw{tag}", "host_if": f"dwa{tag}", "peer_if": f"dwb{tag}"}
    net = 1 + int(tag, 16) % 250
    prefix = getattr(request, "param", "10.231")
    ns.update(host_addr=f"{prefix}.{net}.1", peer_addr=f"{prefix}.{net}.2",
              exec=["ip", "netns", "exec", ns["name"]])
    try:
        for cmd in (["ip", "netns", "add", ns["name"]],
                    ["ip", "link", "add", ns["host_if"], "type", "veth", "peer", "name",
                     ns["peer_if"]],
                    ["ip", "link", "set", ns["peer_if"], "netns", ns["name"]],
                    ["ip", "addr", "add", f"{ns['host_addr']}/24", "dev", ns["host_if"]],
                    ["ip", "link", "set", ns["host_if"], "up"],
                    [*ns["exec"], "ip", "addr", "add", f"{ns['peer_addr']}/24", "dev",
                     ns["peer_if"]],
                    [*ns["exec"], "ip", "link", "set", ns["peer_if"], "up"],
                    [*ns["exec"], "ip", "link", "set", "lo", "up"]):
            done = subprocess.run(cmd, capture_output=True, text=True, check=False)
            need(done.returncode == 0, f"cannot set up a network namespace: {done.stderr}")
        yield ns
    finally:
        subprocess.run(["ip", "netns", "del", ns["name"]], capture_output=True, check=False)
        subprocess.run(["ip", "link", "del", ns["host_if"]], capture_output=True, check=False)


class Receiver:
    """A webhook receiver on `host` (127.0.0.1) and an OS-chosen (or given) port.
    Answers POSTs from a script of (status, headers[, delay_s]) replies, then
    200; records every request (path, lower-cased headers, body, arrival, status)."""

    Request = collections.namedtuple("Request", "path headers body at status")

    def __init__(self, responses=(), host: str = "127.0.0.1", port: int = 0):
        self.requests: list = []
        self.script: collections.deque = collections.deque()
        self.cond = threading.Condition()
        self.respond(*responses)
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                arrived = time.monotonic()
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                with receiver.cond:
                    status, headers, delay = (receiver.script.popleft() if receiver.script
                                              else (200, {}, 0.0))
                    receiver.requests.append(Receiver.Request(
                        self.path, {k.lower(): v for k, v in self.headers.items()}, body,
                        arrived, status))
                    receiver.cond.notify_all()
                time.sleep(delay)
                try:
                    self.send_response(status)
                    for k, v in headers.items():
                        self.send_header(k, v)
                    self.send_header("Content-Length", "2")
                    self.end_headers()
                    self.wfile.write(b"ok")
                except OSError:
                    pass  # the client timed out and left: that is the point of a delay

            def log_message(self, *args):
                pass

        class Server(ThreadingHTTPServer):
            daemon_threads = True
            block_on_close = False  # server_close must not join handlers still sleeping

        self.server = Server((host, port), Handler)
        self.port = self.server.server_address[1]
        self.url = f"http://{host}:{self.port}/hook"
        self.thread = threading.Thread(target=self.server.serve_forever,
                                       kwargs={"poll_interval": 0.05}, daemon=True)
        self.thread.start()

    def respond(self, *replies):
        """More scripted replies: (status, headers) or (status, headers, delay_s)."""
        with self.cond:
            self.script.extend((r[0], r[1], r[2] if len(r) > 2 else 0.0) for r in replies)

    def bodies(self) -> list[dict]:
        return [json.loads(r.body) for r in list(self.requests)]

    def wait_for(self, n: int, timeout: float = 10.0) -> list:
        with self.cond:
            if not self.cond.wait_for(lambda: len(self.requests) >= n, timeout):
                pytest.fail(f"receiver got {len(self.requests)} request(s), wanted {n}")
            return list(self.requests)

    def stop(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receivers():
    """receivers(responses=(), host=..., port=0) -> a running Receiver, stopped at teardown."""
    made = []

    def start(responses=(), host: str = "127.0.0.1", port: int = 0) -> Receiver:
        made.append(Receiver(responses, host, port))
        return made[-1]
    yield start
    for r in made:
        r.stop()


@pytest.fixture
def shared_dir():
    """A directory uid 65534 can use (pytest's tmp_path is root-only)."""
    path = tempfile.mkdtemp(prefix="ddpwatch-hostile-", dir="/tmp")
    os.chmod(path, 0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)
