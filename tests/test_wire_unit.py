"""Grouping ranks by their connections (observe/wire.py), on built socket tables."""
from __future__ import annotations

from ddpwatch.observe import wire
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


def test_links_pair_the_two_ends_of_a_connection():
    linked = wire.links(pair_job())
    assert linked[10] == {11} and linked[11] == {10} and linked[12] == set()


def test_component_and_store_host_and_closed_pair_numbered():
    sockets = pair_job()
    linked = wire.links(sockets)
    members = wire.component(11, linked)
    assert members == {10, 11}
    assert wire.store_host(members, sockets) == 10
    assert wire.closed(members, sockets)
    assert wire.number(members, 10, True, {}) == ({10: 0, 11: 1}, 2)


def test_an_open_group_leaves_unknown_ranks_unknown():
    """A connection to a process that is no member (another node's rank, a
    server): the world is not the group, so only the store's host is numbered."""
    sockets = pair_job(extra_for_1=(est(20, 52000, 29501, paddr="10.0.0.2"),))
    members = wire.component(10, wire.links(sockets))
    assert not wire.closed(members, sockets)
    assert wire.number(members, 10, False, {}) == ({10: 0}, -1)


def test_no_store_no_rank_numbers():
    """file:// init: Gloo's connections only, nobody hosts a store."""
    sockets = {10: (NS, (listen(5, 40000), est(6, 40000, 50002))),
               11: (NS, (est(8, 50002, 40000),))}
    members = wire.component(10, wire.links(sockets))
    assert members == {10, 11}
    assert wire.store_host(members, sockets) == -1
    assert wire.number(members, -1, True, {}) == ({}, 2)


def test_loopback_tuples_of_other_namespaces_do_not_link():
    sockets = {10: (NS, (est(6, 40000, 50002),)),
               11: ("net:[other]", (est(8, 50002, 40000),))}
    assert wire.links(sockets) == {10: set(), 11: set()}


def test_component_goes_through_members_only():
    sockets = pair_job()
    members = wire.component(11, wire.links(sockets), member=lambda pid: pid != 10)
    assert members == {11}
