"""The kernel's process-events connector (netlink NETLINK_CONNECTOR, group
CN_IDX_PROC), as the exits probe uses it: a socket that hears exits only, and
the parsing of what it hears.

`open_socket` joins the group, waits for the kernel's acknowledgement (none
comes in a container: say so rather than listen to nothing), and attaches a
classic BPF filter so the kernel drops every event but a thread group leader's
exit before it is queued. `parse_datagram` and `parse_ack` are pure.
"""
from __future__ import annotations

import ctypes
import errno
import os
import socket
import struct
import time

NETLINK_CONNECTOR = 11
CN_IDX_PROC = CN_VAL_PROC = 1
PROC_CN_MCAST_LISTEN, PROC_CN_MCAST_IGNORE = 1, 2
PROC_EVENT_EXIT = 0x80000000
NLMSG_DONE = 3
SO_ATTACH_FILTER = 26
NLMSG = struct.Struct("=IHHII")          # struct nlmsghdr
CN_MSG = struct.Struct("=IIIIHH")        # struct cn_msg (data follows)
EVENT = struct.Struct("=IIQ")            # struct proc_event: what, cpu, timestamp_ns
EXIT = struct.Struct("=iiII")            # exit: pid, tgid, exit_code (wait status), exit_signal
EXIT_PARENT = struct.Struct("=ii")       # exit: parent_pid, parent_tgid (Linux >= 4.19)
EVENT_AT = NLMSG.size + CN_MSG.size      # 36: where struct proc_event starts
EXIT_AT = EVENT_AT + EVENT.size          # 52: where its exit data starts

# Classic BPF over each datagram (offsets from the nlmsghdr; loads are big-endian,
# the fields host order): pass exits of thread group leaders (pid == tgid), drop
# the rest (forks, execs, threads' exits). Loads past the end drop the datagram.
_EXIT_BE = struct.unpack("!I", struct.pack("=I", PROC_EVENT_EXIT))[0]
_BPF = (
    (0x20, 0, 0, EVENT_AT),      # 0 ld  [36]     what
    (0x15, 0, 5, _EXIT_BE),      # 1 jeq #EXIT ? 2 : 7
    (0x20, 0, 0, EXIT_AT + 4),   # 2 ld  [56]     tgid
    (0x07, 0, 0, 0),             # 3 tax
    (0x20, 0, 0, EXIT_AT),       # 4 ld  [52]     pid
    (0x1D, 0, 1, 0),             # 5 jeq x ? 6 : 7
    (0x06, 0, 0, 0xFFFF),        # 6 ret #65535
    (0x06, 0, 0, 0),             # 7 ret #0
)


def open_socket() -> socket.socket:
    """A non-blocking connector socket listening to exits; OSError if it cannot
    (PermissionError without CAP_NET_ADMIN, ENOTSUP unacknowledged)."""
    sock = socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, NETLINK_CONNECTOR)
    try:
        sock.bind((0, CN_IDX_PROC))  # port chosen by the kernel; the proc group
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 20)
        sock.send(control(PROC_CN_MCAST_LISTEN))
        _await_ack(sock)
        _attach(sock, _BPF)  # after the ack, which the filter would drop
        sock.setblocking(False)
        return sock
    except BaseException:
        sock.close()
        raise


def close_socket(sock: socket.socket) -> None:
    try:
        sock.send(control(PROC_CN_MCAST_IGNORE))
    except OSError:
        pass
    sock.close()


def parse_datagram(data: bytes) -> list[tuple[int, int, int, int, int]]:
    """(pid, tgid, wait status, ppid or -1, timestamp ns) of every process exit in
    one netlink datagram from the connector; anything else, or malformed, is
    skipped (never raises)."""
    out, offset = [], 0
    while offset + NLMSG.size <= len(data):
        length, _type, _flags, _seq, _port = NLMSG.unpack_from(data, offset)
        if length < NLMSG.size or offset + length > len(data):
            break
        body = data[offset + NLMSG.size: offset + length]
        offset += (length + 3) & ~3  # NLMSG_ALIGN
        if len(body) < CN_MSG.size:
            continue
        idx, val, _seq, _ack, size, _flags = CN_MSG.unpack_from(body)
        payload = body[CN_MSG.size: CN_MSG.size + size]
        if (idx, val) != (CN_IDX_PROC, CN_VAL_PROC) or len(payload) < size or \
                size < EVENT.size + EXIT.size:
            continue
        what, _cpu, stamp = EVENT.unpack_from(payload)
        if what != PROC_EVENT_EXIT:
            continue
        pid, tgid, status, _exit_signal = EXIT.unpack_from(payload, EVENT.size)
        ppid = -1
        if size >= EVENT.size + EXIT.size + EXIT_PARENT.size:
            ppid = EXIT_PARENT.unpack_from(payload, EVENT.size + EXIT.size)[1]
        out.append((pid, tgid, status, ppid, stamp))
    return out


def parse_ack(data: bytes) -> int | None:
    """The error number of the connector's answer to LISTEN (0: listening), or
    None when `data` is something else."""
    if len(data) < EXIT_AT + 4:
        return None
    idx, val = CN_MSG.unpack_from(data, NLMSG.size)[:2]
    what = EVENT.unpack_from(data, EVENT_AT)[0]
    if (idx, val) != (CN_IDX_PROC, CN_VAL_PROC) or what != 0:  # PROC_EVENT_NONE
        return None
    return struct.unpack_from("=I", data, EXIT_AT)[0]


def _await_ack(sock: socket.socket, timeout_s: float = 0.5) -> None:
    """The kernel answers LISTEN with an ack, except where it ignores it without a
    word: from a PID or user namespace other than the initial ones (a container).
    No ack, no events: say so rather than watch nothing. Where it answers it
    does at once (under 1 ms here); the wait is paid in containers only."""
    sock.settimeout(timeout_s)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            data, (port, _groups) = sock.recvfrom(4096)
        except socket.timeout:
            break
        err = parse_ack(data) if port == 0 else None
        if err == 0:
            return
        if err is not None:
            raise OSError(err, os.strerror(err))
    raise OSError(errno.ENOTSUP, "the kernel did not acknowledge (not in the initial PID "
                                 "and user namespaces?)")


def control(op: int) -> bytes:
    payload = struct.pack("=I", op)
    cn = CN_MSG.pack(CN_IDX_PROC, CN_VAL_PROC, 0, 0, len(payload), 0) + payload
    return NLMSG.pack(NLMSG.size + len(cn), NLMSG_DONE, 0, 0, 0) + cn


def _attach(sock: socket.socket, program) -> None:
    code = b"".join(struct.pack("HBBI", *insn) for insn in program)  # struct sock_filter
    insns = ctypes.create_string_buffer(code)
    fprog = struct.pack("HP", len(program), ctypes.addressof(insns))  # struct sock_fprog
    sock.setsockopt(socket.SOL_SOCKET, SO_ATTACH_FILTER, fprog)
