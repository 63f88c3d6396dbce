"""A small HTTP/1.0 server that no local user can exhaust (1 030 idle
connections took one thread and one descriptor each, `/metrics` answered nothing
for 30 s and discovery failed with EMFILE). It accepts, reads, dispatches and
sends; what each path answers is endpoints.py's.

* One thread accepts and watches connections that have not sent anything yet, in
  a selector; at most `max_pending` are kept, the oldest is closed to make room
  for a new one, and none is kept longer than `idle_timeout_s`. An idle
  connection costs a descriptor for a while, never a thread.
* The accepting thread also reads each request's head (request line and
  headers, at most MAX_HEAD bytes) without blocking, so a client sending a byte
  now and then (slowloris) holds a pending slot, never a worker.
* A connection gets a worker only once its whole head is in, and only to
  compute its answer: the worker writes the answer into memory and hands it
  back to the accepting thread, which sends it without blocking as the client
  reads. A client that does not read (a tiny receive window) holds no worker,
  only its answer's bytes, and only for a while: an answer is cut once it has
  taken `response_deadline_s`, or once, after GRACE_S, the client has read
  (acknowledged: `unsent`) fewer than `min_bytes_per_s` bytes a second; a cut
  is a reset, so the kernel does not send the rest. At most `max_writers` answers
  per class are being sent; a new one beyond that cuts the oldest of its class.
* Two classes of requests, counted apart (`light_workers` of the `workers` are
  kept for the light one): light are /metrics, /healthz and /readyz (what
  Prometheus and probes ask), heavy everything else (/status, /peer,
  /incidents). Heavy requests may keep every heavy worker busy, or fill the
  heavy writers: /metrics is still answered (tests/hostile/test_http_slow_readers.py).
  With every worker of its class busy a connection is answered 503 at once.
* Client errors (resets, timeouts, garbage) are quiet: one debug line, never a
  traceback on stderr that would bypass `--log-format json`.
"""
from __future__ import annotations

import fcntl
import io
import logging
import queue
import selectors
import socket
import struct
import termios
import threading
import time
from collections import OrderedDict

log = logging.getLogger("ddpwatch")

MAX_HEAD = 16384  # a GET's request line and headers; ours need a few hundred bytes
TOO_LARGE = (b"HTTP/1.0 431 Request Header Fields Too Large\r\nContent-Length: 0\r\n"
             b"Connection: close\r\n\r\n")
LIGHT_PATHS = frozenset({"/metrics", "/healthz", "/readyz"})
GRACE_S = 2.0  # an answer's first seconds are not held to min_bytes_per_s (slow start)
CHUNK = 65536  # bytes handed to send() at once
BUSY = (b"HTTP/1.0 503 Service Unavailable\r\nContent-Type: text/plain\r\n"
        b"Content-Length: 5\r\nRetry-After: 1\r\nConnection: close\r\n\r\nbusy\n")


def request_class(head: bytes) -> str:
    """"light" for what monitoring asks (LIGHT_PATHS), else "heavy": from the
    request line's path, its query left out."""
    line = bytes(head).split(b"\n", 1)[0].split()
    path = line[1].split(b"?", 1)[0] if len(line) >= 2 else b""
    return "light" if path.decode("latin-1") in LIGHT_PATHS else "heavy"


def too_slow(sent: int, elapsed_s: float, deadline_s: float, min_bytes_per_s: float) -> bool:
    """Whether an answer still being sent is cut: past its deadline, or (after
    GRACE_S) behind `min_bytes_per_s` since it started."""
    return elapsed_s > deadline_s or (
        elapsed_s > GRACE_S and sent < min_bytes_per_s * (elapsed_s - GRACE_S))


class _Answer:
    __slots__ = ("data", "sent", "since", "kind", "done")

    def __init__(self, data: bytes, kind: str):
        self.data, self.sent, self.since, self.kind = memoryview(data), 0, time.monotonic(), kind
        self.done = False  # all of it handed to the kernel; waiting for the client to read it


def unsent(conn: socket.socket) -> int:
    """Bytes of the answer the kernel holds that the client has not acknowledged
    (SIOCOUTQ, tcp(7)): a loopback socket takes a megabyte at once, so what was
    handed to send() says nothing of what the client read."""
    try:
        return struct.unpack("i", fcntl.ioctl(conn.fileno(), termios.TIOCOUTQ,
                                              b"\0\0\0\0"))[0]
    except OSError:
        return 0


def bind(host: str, port: int) -> socket.socket:
    """A non-blocking socket listening on host:port."""
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    # "localhost" may list ::1 first; the daemon always meant 127.0.0.1 by it
    family, _, _, _, address = sorted(infos, key=lambda i: i[0] != socket.AF_INET)[0]
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(128)
        sock.setblocking(False)
    except OSError:
        sock.close()
        raise
    return sock


def same_address(sock: socket.socket, host: str, port: int) -> bool:
    """Whether `sock` listens where host:port would bind."""
    bound = sock.getsockname()
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except OSError:
        return False
    return any(i[4][0] == bound[0] and i[4][1] == bound[1] for i in infos)


class BoundedServer:
    def __init__(self, host: str, port: int, handler_class, *, workers: int = 8,
                 light_workers: int = 2, max_pending: int = 64, idle_timeout_s: float = 5.0,
                 request_timeout_s: float = 5.0, request_deadline_s: float = 10.0,
                 response_deadline_s: float = 20.0, min_bytes_per_s: float = 32768.0,
                 max_writers: int = 16, sock: socket.socket | None = None,
                 activated: bool | None = None):
        if not 0 < light_workers < workers:
            raise ValueError("light_workers must be within 1..workers-1")
        heads = self._heads = {}  # connection -> its request head, read by the acceptor
        answers = self._answers = {}  # connection -> the answer a handler wrote

        class Buffered(handler_class):
            def setup(self):
                super().setup()
                self.rfile = io.BytesIO(heads.pop(self.request, b""))
                self.wfile = io.BytesIO()  # sent by the accepting thread, as the client reads

            def finish(self):
                answers[self.request] = self.wfile.getvalue()
                super().finish()

        self.handler_class = Buffered if handler_class is not None else None
        self.max_pending = max_pending
        self.idle_timeout_s = idle_timeout_s
        self.request_timeout_s = request_timeout_s
        self.request_deadline_s = request_deadline_s
        self.response_deadline_s = response_deadline_s
        self.min_bytes_per_s = min_bytes_per_s
        self.max_writers = max_writers
        # `sock`: already bound and listening. `activated`: it is systemd's
        # (sdnotify.listen_socket), which a reload may not move (commands/run.py);
        # by default any `sock` is
        self.activated = sock is not None if activated is None else activated
        if sock is not None:
            self.sock = sock
            self.sock.setblocking(False)
        else:
            self.sock = bind(host, port)
        self.server_address = self.sock.getsockname()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._selector = selectors.DefaultSelector()
        self._selector.register(self.sock, selectors.EVENT_READ)
        self._selector.register(self._wake_r, selectors.EVENT_READ)
        self._pending: OrderedDict[socket.socket, tuple[float, object, bytearray]] = \
            OrderedDict()
        # answers being sent, oldest first (the accepting thread's alone)
        self._writing: OrderedDict[socket.socket, _Answer] = OrderedDict()
        self._handed: queue.SimpleQueue = queue.SimpleQueue()  # (conn, answer) from workers
        self._busy: dict[socket.socket, float] = {}  # in a worker -> since when
        self._lock = threading.Lock()
        self._free = {"light": threading.Semaphore(light_workers),
                      "heavy": threading.Semaphore(workers - light_workers)}
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._stopping = threading.Event()
        self._threads = [threading.Thread(target=self._work, name=f"ddpwatch-http-{i}",
                                          daemon=True) for i in range(workers)]
        self._threads.append(threading.Thread(target=self._accept_loop, name="ddpwatch-http",
                                              daemon=True))
        self.stats = {"busy_503": 0, "evicted": 0, "expired": 0, "cut": 0, "accept_errors": 0,
                      "slow_reader": 0, "writers_full": 0}

    @property
    def port(self) -> int:
        return self.server_address[1]

    def start(self) -> None:
        for t in self._threads:
            t.start()

    def stop(self) -> None:
        self._stopping.set()
        self._wake()
        for _ in self._threads[:-1]:
            self._jobs.put(None)
        for t in self._threads:
            if t.is_alive():
                t.join(timeout=5)
        for conn in list(self._pending) + list(self._writing):
            _close(conn)
        self._pending.clear()
        self._writing.clear()
        for s in (self.sock, self._wake_r, self._wake_w):
            _close(s)
        self._selector.close()

    def _wake(self) -> None:
        try:
            self._wake_w.send(b"x")
        except OSError:  # full (the acceptor is behind: it will look anyway) or closed
            pass

    # --- the accepting thread --------------------------------------------------------
    def _accept_loop(self) -> None:
        while not self._stopping.is_set():
            try:
                events = self._selector.select(timeout=0.5)
            except OSError:  # closed under us at stop
                return
            try:
                for key, mask in events:
                    if key.fileobj is self.sock:
                        self._accept()
                    elif key.fileobj is self._wake_r:
                        self._drain_wake()
                        if self._stopping.is_set():
                            return
                    elif key.fileobj in self._writing:
                        self._write(key.fileobj)
                    elif key.fileobj in self._pending:  # not evicted earlier this round
                        self._dispatch(key.fileobj)
                self._take_answers()
                self._expire()
            except Exception:  # this thread is the server: it must not die
                log.exception("http: accept loop error")

    def _drain_wake(self) -> None:
        try:
            while self._wake_r.recv(4096):
                pass
        except OSError:
            pass

    def _accept(self) -> None:
        for _ in range(256):  # bounded per round: expiry must still run
            try:
                conn, addr = self.sock.accept()
            except BlockingIOError:
                return
            except OSError as err:  # EMFILE/ENFILE: keep the backlog, retry next round
                self.stats["accept_errors"] += 1
                log.debug("http: accept failed: %s", err)
                time.sleep(0.05)
                return
            if len(self._pending) >= self.max_pending:
                oldest, _ = self._pending.popitem(last=False)
                self._forget(oldest)
                self.stats["evicted"] += 1
            conn.setblocking(False)
            self._pending[conn] = (time.monotonic(), addr, bytearray())
            self._selector.register(conn, selectors.EVENT_READ)

    def _dispatch(self, conn: socket.socket) -> None:
        _, addr, head = self._pending[conn]
        try:
            data = conn.recv(MAX_HEAD + 1 - len(head))
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:  # closed or reset before a whole request
            del self._pending[conn]
            self._forget(conn)
            return
        head += data
        if b"\r\n\r\n" not in head and b"\n\n" not in head:
            if len(head) <= MAX_HEAD:
                return  # more to come; the idle timeout bounds the wait
            del self._pending[conn]
            try:
                conn.send(TOO_LARGE)
            except OSError:
                pass
            self._forget(conn)
            return
        del self._pending[conn]
        self._selector.unregister(conn)
        kind = request_class(head)
        if not self._free[kind].acquire(blocking=False):
            self.stats["busy_503"] += 1
            try:
                conn.send(BUSY)  # ~100 bytes: fits any send buffer, never blocks
            except OSError:
                pass
            _close(conn)
            return
        with self._lock:
            self._busy[conn] = time.monotonic()
        self._heads[conn] = bytes(head)
        self._jobs.put((conn, addr, kind))

    def _take_answers(self) -> None:
        """Answers the workers wrote: sent from here on, as the clients read."""
        while True:
            try:
                conn, answer = self._handed.get_nowait()
            except queue.Empty:
                return
            if self._stopping.is_set():
                _close(conn)
                continue
            same = [c for c, a in self._writing.items() if a.kind == answer.kind]
            if len(same) >= self.max_writers:  # the oldest of its class makes room
                self._stop_writing(same[0], abort=True)
                self.stats["writers_full"] += 1
            conn.setblocking(False)
            self._writing[conn] = answer
            self._selector.register(conn, selectors.EVENT_WRITE)
            self._write(conn)

    def _write(self, conn: socket.socket) -> None:
        answer = self._writing[conn]
        try:
            answer.sent += conn.send(answer.data[answer.sent:answer.sent + CHUNK])
        except BlockingIOError:
            return
        except OSError as err:  # reset by the client
            log.debug("http: answer not sent: %s", err)
            self._stop_writing(conn)
            return
        if answer.sent >= len(answer.data):
            # the FIN follows the data (a client reading to EOF gets it at once);
            # the connection is watched until the client has read it (_expire)
            answer.done = True
            self._selector.unregister(conn)
            try:
                conn.shutdown(socket.SHUT_WR)
            except OSError:
                self._stop_writing(conn)

    def _stop_writing(self, conn: socket.socket, abort: bool = False) -> None:
        """Done with an answer; `abort` (a cut one): reset the connection, so the
        kernel does not go on sending what is left of it to a client that does
        not read (a plain close would, in the background) and it frees at once."""
        self._writing.pop(conn, None)
        if abort:
            try:
                conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            except OSError:
                pass
        self._forget(conn)

    def _forget(self, conn: socket.socket) -> None:
        try:
            self._selector.unregister(conn)
        except (KeyError, ValueError):
            pass
        _close(conn)

    def _expire(self) -> None:
        now = time.monotonic()
        while self._pending:
            conn, (since, _, _) = next(iter(self._pending.items()))
            if now - since < self.idle_timeout_s:
                break
            del self._pending[conn]
            self._forget(conn)
            self.stats["expired"] += 1
        read, slow_readers = [], []
        for conn, answer in self._writing.items():
            left = unsent(conn)
            if answer.done and left == 0:
                read.append(conn)
            elif too_slow(answer.sent - left, now - answer.since, self.response_deadline_s,
                          self.min_bytes_per_s):
                slow_readers.append(conn)
        for conn in read:
            self._stop_writing(conn)
        for conn in slow_readers:
            self._stop_writing(conn, abort=True)
            self.stats["slow_reader"] += 1
        with self._lock:
            slow = [c for c, since in self._busy.items() if now - since > self.request_deadline_s]
        for conn in slow:  # a handler that overran: its socket is shut, its answer dropped
            self.stats["cut"] += 1
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    # --- workers ---------------------------------------------------------------------
    def _work(self) -> None:
        while True:
            item = self._jobs.get()
            if item is None:
                return
            conn, addr, kind = item
            answer = b""
            try:
                self.handler_class(conn, addr, self)
                answer = self._answers.pop(conn, b"")
            except (OSError, ValueError) as err:  # resets, timeouts, a cut request
                log.debug("http: client %s: %s", addr, err)
            except Exception:  # a bug in a handler: logged, the worker lives on
                log.exception("http: handler failed for %s", addr)
            finally:
                with self._lock:
                    self._busy.pop(conn, None)
                self._heads.pop(conn, None)
                self._answers.pop(conn, None)
                self._free[kind].release()
            if answer:
                self._handed.put((conn, _Answer(answer, kind)))
                self._wake()
            else:
                _close(conn)


def _close(sock: socket.socket) -> None:
    try:
        sock.close()
    except OSError:
        pass
