"""DDP's constructor meets every rank before the first step: a rank idle there
while its peer is still busy is starting, not a victim, and the busy peer no
straggler (judge/signals/stack.py `ddp_starting`, rule starting-ddp-setup)."""
from ddpwatch.judge import rules as rules_mod, stages
from ddpwatch.judge.signals.stack import link_start as link


def judged(ranks):
    link(ranks)
    verdict_rules = stages.order(rules_mod.load_default())  # as classify tries them
    return [next((r.id for r in verdict_rules if r.matches(s)), "") for s in ranks]


def rank(pid, cpu, peer_cpu, setup, in_collective=False, **more):
    return {"pid": pid, "alive": True, "hb": False, "cpu_ratio": cpu, "cpu_wanted": cpu,
            "peer_cpu_ratio": peer_cpu,
            "ddp_setup": setup, "in_collective": in_collective, "gloo_unconnected": 0,
            "peers_blocked": 0, **more}


def test_idle_in_ddp_setup_beside_a_busy_peer_is_starting_both_ways():
    # the spawn start-up once judged straggler-cpu / waiting-on-peer-cpu
    waiting = rank(1, 0.02, 0.9, True, in_collective=True, stack="collective")
    building = rank(2, 0.9, 0.02, False, stack="active")
    assert judged([waiting, building]) == ["starting-ddp-setup", "starting-ddp-setup"]


def test_a_peer_idle_outside_the_setup_is_no_start():
    # rank 2 hangs (sleeps) before DDP: its peer's wait in the constructor is a
    # real wait, left to the hang rules
    waiting = rank(1, 0.02, 0.01, True, in_collective=True, blocked=True, stack="collective")
    hung = rank(2, 0.01, 0.02, False, stack="idle_user", peers_blocked=1)
    got = judged([waiting, hung])
    assert got == ["blocked", "hung-outside-idle"]
    assert not waiting["ddp_starting"] and not hung["ddp_starting"]


def test_no_stacks_no_setup():
    a, b = rank(1, 0.02, 0.9, None), rank(2, 0.9, 0.02, None)
    link([a, b])
    assert not a["ddp_starting"] and not b["ddp_starting"] and not a["peer_ddp_setup"]


def test_a_rank_at_rendezvous_beside_a_starting_peer_is_starting():
    # Lightning: rank 0 waits in the store while the rank it re-executed imports
    waiting = rank(1, 0.01, 0.3, False, stack="rendezvous")
    importing = rank(2, 0.3, 0.01, False, stack="active", gloo_unconnected=None)
    assert judged([waiting, importing]) == ["starting-ddp-setup", "starting-ddp-setup"]
    # its peer gone quiet instead: a rendezvous wait
    quiet = rank(2, 0.01, 0.01, False, stack="idle_user", gloo_unconnected=None)
    assert judged([rank(1, 0.01, 0.01, False, stack="rendezvous"), quiet])[0] == "rendezvous"


def test_a_rank_still_importing_inside_ddp_setup_beside_a_waiting_peer_is_starting():
    # DDP's constructor imports torch._dynamo and inductor's config lazily: seconds
    # of CPU. The rank that finished first waits in the constructor's collective;
    # the other, busy in that same constructor, once read as hung-outside-busy
    waiting = rank(1, 0.02, 0.9, True, in_collective=True, blocked=True, stack="collective")
    importing = rank(2, 0.9, 0.02, True, stack="active", peers_blocked=1)
    assert judged([waiting, importing]) == ["starting-ddp-setup", "starting-ddp-setup"]
