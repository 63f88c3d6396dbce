"""A small HTTP/1.0 server that no local user can exhaust (issue 14: 1 030 idle
connections took one thread and one descriptor each, `/metrics` answered nothing
for 30 s and discovery failed with EMFILE).

* One thread accepts and watches connections that have not sent anything yet, in
  a selector; at most `max_pending` are kept, the oldest is closed to make room
  for a new one, and none is kept longer than `idle_timeout_s`. An idle
  connection costs a descriptor for a while, never a thread.
* The accepting thread also reads each request's head (request line and
  headers, at most MAX_HEAD bytes) without blocking, so a client sending a byte
  now and then (slowloris) holds a pending slot, never a worker.
* A connection gets one of `workers` threads only once its whole head is in;
  with every worker busy it is answered 503 at once.
* A worker answers with a per-socket timeout, and an answer still unsent after
  `request_deadline_s` (a client that does not read) is cut.
* Client errors (resets, timeouts, garbage) are quiet: one debug line, never a
  traceback on stderr that would bypass `--log-format json`.
"""
from __future__ import annotations

import io
import logging
import queue
import selectors
import socket
import threading
import time
from collections import OrderedDict

log = logging.getLogger("ddpwatch")

MAX_HEAD = 16384  # a GET's request line and headers; ours need a few hundred bytes
TOO_LARGE = (b"HTTP/1.0 431 Request Header Fields Too Large\r\nContent-Length: 0\r\n"
             b"Connection: close\r\n\r\n")
BUSY = (b"HTTP/1.0 503 Service Unavailable\r\nContent-Type: text/plain\r\n"
        b"Content-Length: 5\r\nRetry-After: 1\r\nConnection: close\r\n\r\nbusy\n")


class BoundedServer:
    def __init__(self, host: str, port: int, handler_class, *, workers: int = 8,
                 max_pending: int = 64, idle_timeout_s: float = 5.0,
                 request_timeout_s: float = 5.0, request_deadline_s: float = 10.0):
        heads = self._heads = {}  # connection -> its request head, read by the acceptor

        class Prebuffered(handler_class):
            def setup(self):
                super().setup()
                self.rfile = io.BytesIO(heads.pop(self.request, b""))

        self.handler_class = Prebuffered if handler_class is not None else None
        self.max_pending = max_pending
        self.idle_timeout_s = idle_timeout_s
        self.request_timeout_s = request_timeout_s
        self.request_deadline_s = request_deadline_s
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM,
                                   flags=socket.AI_PASSIVE)
        # "localhost" may list ::1 first; the daemon always meant 127.0.0.1 by it
        family, _, _, _, address = sorted(infos, key=lambda i: i[0] != socket.AF_INET)[0]
        self.sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            self.sock.bind(address)
            self.sock.listen(128)
            self.sock.setblocking(False)
        except OSError:
            self.sock.close()
            raise
        self.server_address = self.sock.getsockname()
        self._wake_r, self._wake_w = socket.socketpair()
        self._selector = selectors.DefaultSelector()
        self._selector.register(self.sock, selectors.EVENT_READ)
        self._selector.register(self._wake_r, selectors.EVENT_READ)
        self._pending: OrderedDict[socket.socket, tuple[float, object, bytearray]] = \
            OrderedDict()
        self._busy: dict[socket.socket, float] = {}  # in a worker -> since when
        self._lock = threading.Lock()
        self._free = threading.Semaphore(workers)
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._stopping = threading.Event()
        self._threads = [threading.Thread(target=self._work, name=f"ddpwatch-http-{i}",
                                          daemon=True) for i in range(workers)]
        self._threads.append(threading.Thread(target=self._accept_loop, name="ddpwatch-http",
                                              daemon=True))
        self.stats = {"busy_503": 0, "evicted": 0, "expired": 0, "cut": 0, "accept_errors": 0}

    @property
    def port(self) -> int:
        return self.server_address[1]

    def start(self) -> None:
        for t in self._threads:
            t.start()

    def stop(self) -> None:
        self._stopping.set()
        try:
            self._wake_w.send(b"x")
        except OSError:
            pass
        for _ in self._threads[:-1]:
            self._jobs.put(None)
        for t in self._threads:
            if t.is_alive():
                t.join(timeout=5)
        for conn in list(self._pending):
            _close(conn)
        self._pending.clear()
        for s in (self.sock, self._wake_r, self._wake_w):
            _close(s)
        self._selector.close()

    # --- the accepting thread --------------------------------------------------------
    def _accept_loop(self) -> None:
        while not self._stopping.is_set():
            try:
                events = self._selector.select(timeout=1.0)
            except OSError:  # closed under us at stop
                return
            try:
                for key, _ in events:
                    if key.fileobj is self.sock:
                        self._accept()
                    elif key.fileobj is self._wake_r:
                        return
                    elif key.fileobj in self._pending:  # not evicted earlier this round
                        self._dispatch(key.fileobj)
                self._expire()
            except Exception:  # this thread is the server: it must not die
                log.exception("http: accept loop error")

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
        if not self._free.acquire(blocking=False):
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
        self._jobs.put((conn, addr))

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
        with self._lock:
            slow = [c for c, since in self._busy.items() if now - since > self.request_deadline_s]
        for conn in slow:  # wakes the worker blocked in recv with an error
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
            conn, addr = item
            try:
                conn.setblocking(True)
                conn.settimeout(self.request_timeout_s)
                self.handler_class(conn, addr, self)
            except (OSError, ValueError) as err:  # resets, timeouts, a cut request
                log.debug("http: client %s: %s", addr, err)
            except Exception:  # a bug in a handler: logged, the worker lives on
                log.exception("http: handler failed for %s", addr)
            finally:
                with self._lock:
                    self._busy.pop(conn, None)
                self._heads.pop(conn, None)
                _close(conn)
                self._free.release()


def _close(sock: socket.socket) -> None:
    try:
        sock.close()
    except OSError:
        pass
