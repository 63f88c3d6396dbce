"""Grouping ranks by their connections (observe/jobs/tcp_discovery.py), on built socket tables."""
from __future__ import annotations

from socket_tables import NS, est, listen, pair_job, server_and_client

from ddpwatch.observe.jobs import tcp_discovery
from ddpwatch.observe.probes.sockets import TableEntry


def test_links_pair_the_two_ends_of_a_connection():
    linked = tcp_discovery.links(pair_job())
    assert linked[10] == {11} and linked[11] == {10} and linked[12] == set()


def test_component_and_store_host_and_closed_pair_numbered():
    sockets = pair_job()
    linked = tcp_discovery.links(sockets)
    members = tcp_discovery.component(11, linked)
    assert members == {10, 11}
    assert tcp_discovery.store_host(members, sockets) == 10
    assert tcp_discovery.closed(members, sockets)
    assert tcp_discovery.number(members, 10, True, {}) == ({10: 0, 11: 1}, 2)


def test_an_open_group_leaves_unknown_ranks_unknown():
    """A connection to a process that is no member (another node's rank, a
    server): the world is not the group, so only the store's host is numbered."""
    sockets = pair_job(extra_for_1=(est(20, 52000, 29501, paddr="10.0.0.2"),))
    members = tcp_discovery.component(10, tcp_discovery.links(sockets))
    assert not tcp_discovery.closed(members, sockets)
    assert tcp_discovery.number(members, 10, False, {}) == ({10: 0}, -1)


def test_a_store_every_member_dialled_and_no_one_else_makes_the_world_the_group():
    """Ray Train's workers: both dialled the store rank 0 hosts, and each talks to
    Ray's controller too (pid 30, a torch process, no rank). The group is open,
    yet the store says who the world is: rank 1 is numbered."""
    controller = (NS, (listen(40, 45000), est(41, 45000, 53000), est(42, 45000, 53001)))
    sockets = pair_job(extra_for_1=(est(21, 53001, 45000),))
    sockets[10] = (NS, sockets[10][1] + (est(22, 53000, 45000),))
    sockets[30] = controller
    members = {10, 11}
    assert not tcp_discovery.closed(members, sockets)
    assert tcp_discovery.store_complete(10, members, sockets)
    assert tcp_discovery.number(members, 10, True, {}) == ({10: 0, 11: 1}, 2)
    # the DDP shape leaves the controller out
    assert tcp_discovery.ddp_groups(sockets) == [(10, frozenset({10, 11}))]


def test_a_store_dialled_from_another_node_is_no_complete_world():
    """A rank elsewhere dialled the store too: the local two are not the world."""
    sockets = pair_job()
    sockets[10] = (NS, sockets[10][1] + (est(23, 29500, 50555, paddr="10.0.0.2"),))
    assert not tcp_discovery.store_complete(10, {10, 11}, sockets)
    assert not tcp_discovery.store_complete(-1, {10, 11}, sockets)


def test_no_store_no_rank_numbers():
    """file:// init: Gloo's connections only, nobody hosts a store."""
    sockets = {10: (NS, (listen(5, 40000), est(6, 40000, 50002))),
               11: (NS, (est(8, 50002, 40000),))}
    members = tcp_discovery.component(10, tcp_discovery.links(sockets))
    assert members == {10, 11}
    assert tcp_discovery.store_host(members, sockets) == -1
    assert tcp_discovery.number(members, -1, True, {}) == ({}, 2)


def test_loopback_tuples_of_other_namespaces_do_not_link():
    sockets = {10: (NS, (est(6, 40000, 50002),)),
               11: ("net:[other]", (est(8, 50002, 40000),))}
    assert tcp_discovery.links(sockets) == {10: set(), 11: set()}


def test_component_goes_through_members_only():
    sockets = pair_job()
    members = tcp_discovery.component(11, tcp_discovery.links(sockets),
                                      member=lambda pid: pid != 10)
    assert members == {11}


# ---- the daemon's rule: which lone torch processes have the shape of one DDP job


def test_a_store_host_and_its_clients_are_a_ddp_group():
    assert tcp_discovery.ddp_groups(pair_job()) == [(10, frozenset({10, 11}))]


def test_a_server_and_its_client_are_no_job():
    """Linked, and a pair is trivially a full mesh: yet no store (the server is
    no client of its own port), and a pair alone is what any client and server
    look like."""
    sockets = server_and_client()
    assert tcp_discovery.links(sockets) == {20: {21}, 21: {20}}
    assert tcp_discovery.ddp_groups(sockets) == []


def test_a_torch_client_of_rank_0_is_left_out_of_the_job():
    """Rank 0 also serves something (a metrics endpoint on 8000) that another
    torch process of the user reads: the job is the store's clients only, and
    not closed (rank 0 talks to a non-member), so rank 1 is not guessed."""
    sockets = pair_job()
    sockets[10] = (NS, sockets[10][1] + (listen(40, 8000), est(41, 8000, 53000)))
    sockets[13] = (NS, (est(42, 53000, 8000),))
    ((host, members),) = tcp_discovery.ddp_groups(sockets)
    assert (host, members) == (10, frozenset({10, 11}))
    closed = tcp_discovery.closed(members, sockets)
    assert tcp_discovery.number(set(members), host, closed, {}) == ({10: 0}, -1)


def test_the_store_is_where_the_members_are_connected_not_any_port_number():
    """A client connected to port 29500 of some other process (another node's
    store, say) is no client of this one."""
    sockets = pair_job()
    sockets[13] = (NS, (est(43, 54000, 29500, paddr="10.0.0.2"),))
    assert tcp_discovery.ddp_groups(sockets) == [(10, frozenset({10, 11}))]


def mesh(n, base=100):
    """`n` processes, each pair connected once (the lower pid dials the higher
    one's Gloo port), no store: a file:// init."""
    sockets = {base + i: (NS, (listen(1000 + i, 41000 + i),)) for i in range(n)}
    ino = 2000
    for i in range(n):
        for j in range(i + 1, n):
            a, b = base + i, base + j
            eph = 60000 + 100 * i + j
            sockets[a] = (NS, sockets[a][1] + (est(ino, eph, 41000 + j),))
            sockets[b] = (NS, sockets[b][1] + (est(ino + 1, 41000 + j, eph),))
            ino += 2
    return sockets


def test_a_full_mesh_of_three_is_a_job_without_ranks():
    sockets = mesh(3)
    assert tcp_discovery.ddp_groups(sockets) == [(-1, frozenset({100, 101, 102}))]
    members = {100, 101, 102}
    assert tcp_discovery.number(members, -1, tcp_discovery.closed(members, sockets), {}) == ({}, 3)


def test_a_chain_of_three_is_no_mesh_and_a_mesh_of_two_no_job():
    chain = mesh(3)
    # 100 and 102 not connected: a client that talks to two servers
    chain = {pid: (ns, tuple(e for e in entries if not (
        (pid == 100 and e.peer_port == 41002) or (pid == 102 and e.local_port == 41002
                                                  and e.peer_port == 60002))))
             for pid, (ns, entries) in chain.items()}
    assert tcp_discovery.links(chain)[100] == {101}
    assert tcp_discovery.ddp_groups(chain) == []
    assert tcp_discovery.ddp_groups(mesh(2)) == []


def test_two_jobs_of_one_user_are_two_groups():
    sockets = {**pair_job(), **{pid + 100: (NS, tuple(
        TableEntry(e.inode + 100, e.family, e.state, e.local_addr, e.local_port + 1,
                   e.peer_addr, e.peer_port + 1 if e.peer_port else 0, 0, 0, 0)
        for e in entries)) for pid, (ns, entries) in pair_job().items() if pid != 12}}
    assert tcp_discovery.ddp_groups(sockets) == [(10, frozenset({10, 11})),
                                                 (110, frozenset({110, 111}))]


# ---- what the daemon carries from one pass to the next (tcp_discovery.carry)

A, B, C = (10, 500), (11, 501), (12, 502)


def test_carry_keeps_a_number_later_evidence_lacks():
    before = [(((A, 0), (B, 1)), 2)]
    found = [(((A, 0), (B, -1)), -1)]  # rank 1 opened a connection elsewhere: open group
    assert tcp_discovery.carry(before, found, {A, B}) == [(((A, 0), (B, 1)), 2)]


def test_carry_never_gives_one_number_twice():
    before = [(((A, 0), (B, 1)), 2)]
    found = [(((A, 1), (B, -1)), -1)]  # new evidence says A is 1: B is not 1 too
    assert tcp_discovery.carry(before, found, {A, B}) == [(((A, 1), (B, -1)), 2)]


def test_carry_keeps_the_survivors_of_a_group_no_longer_on_the_wire():
    """Rank 1 died: rank 0 is connected to nobody, and still that job's rank 0."""
    before = [(((A, 0), (B, 1)), 2)]
    assert tcp_discovery.carry(before, [], {A}) == [(((A, 0),), 2)]
    assert tcp_discovery.carry(before, [], set()) == []


def test_carry_drops_an_earlier_group_a_new_one_took_a_member_of():
    before = [(((A, 0), (B, 1)), 2)]
    found = [(((B, 0), (C, 1)), 2)]
    assert tcp_discovery.carry(before, found, {A, B, C}) == found


def test_carry_does_not_take_a_reused_pid_for_the_rank():
    """pid 11 again, another process (another start time): not rank 1."""
    before = [(((A, 0), (B, 1)), 2)]
    other = (11, 999)
    assert tcp_discovery.carry(before, [(((A, 0), (other, -1)), -1)], {A, other}) == \
        [(((A, 0), (other, -1)), 2)]
