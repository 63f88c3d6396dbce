"""Socket tables built in code for grouping ranks by their connections
(observe/jobs/tcp_discovery.py): {pid: (network namespace, TableEntry...)} as the
sockets probe reads them. Used by tests/unit/observe (test_tcp_discovery_unit,
test_wire_groups_unit)."""
from __future__ import annotations

from ddpwatch.observe.probes.sockets import TableEntry

NS = "net:[4026531840]"
LO = "127.0.0.1"


def est(ino, lport, pport, laddr=LO, paddr=LO):
    return TableEntry(ino, "tcp", "ESTABLISHED", laddr, lport, paddr, pport, 0, 0, 0)


def listen(ino, port):
    return TableEntry(ino, "tcp", "LISTEN", "0.0.0.0", port, "0.0.0.0", 0, 0, 0, 0)


def pair_job(extra_for_1=()):
    """Rank 0 (pid 10) hosts the store on 29500; both are its clients; one Gloo
    connection between them (rank 1 dials rank 0's port 40000)."""
    return {
        10: (NS, (listen(1, 29500), est(2, 50000, 29500), est(3, 29500, 50000),
                  est(4, 29500, 50001), listen(5, 40000), est(6, 40000, 50002))),
        11: (NS, (est(7, 50001, 29500), est(8, 50002, 40000)) + tuple(extra_for_1)),
        12: (NS, (est(9, 51000, 80, paddr="10.0.0.9"),)),  # someone else's HTTP client
    }


def server_and_client():
    """An inference server (pid 20, port 8000) and its client (21), both torch
    processes of one user: one connection, nobody dials their own port."""
    return {20: (NS, (listen(30, 8000), est(31, 8000, 52000))),
            21: (NS, (est(32, 52000, 8000),))}
