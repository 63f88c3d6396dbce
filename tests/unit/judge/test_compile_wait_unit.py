"""torch.compile on each rank alone: the faster rank waits in the first
collective, past its stall bound, for a peer that still compiles. Both are
paused (a pause of kind compile, paged only past its bound: stage over-time);
a peer stopped or dead, or hung without compile frames, is still a hang
(judge/signals/peers.py `peers_compiling`)."""
from ddpwatch.judge import rules as rules_mod, stages
from ddpwatch.judge.signals.peers import link

RULES = stages.order(rules_mod.load_default())  # the verdict rules, as classify tries them


def judged(ranks):
    link(ranks)
    return [next((r.id for r in RULES if r.matches(s)), "") for s in ranks]


def waiting(pid=1):
    """Blocked in its first all-reduce (heartbeat inside, past the 2 s bound)."""
    return {"pid": pid, "alive": True, "hb": True, "hb_step": 0, "hb_phase": "inside",
            "in_collective": True, "blocked": True, "warming_up": False, "cpu_ratio": 0.01,
            "waiting_in": "all_reduce", "stack": "collective", "state": "S"}


def compiling(pid=2, **more):
    return {"pid": pid, "alive": True, "hb": True, "hb_step": 0, "hb_phase": "outside",
            "in_collective": False, "blocked": False, "warming_up": True, "cpu_ratio": 0.4,
            "stack": "compile", "state": "R", **more}


def test_a_rank_waiting_for_a_compiling_peer_and_the_peer_are_a_pause():
    assert judged([waiting(), compiling()]) == ["waits-for-compiling-peer",
                                                "compiling-while-peers-wait"]


def test_a_stopped_compiling_peer_is_the_culprit_of_a_blocked_rank():
    w, c = waiting(), compiling(state="T")
    got = judged([w, c])
    assert w["peers_compiling"] == 0 and got[0] == "blocked"
    assert got[1] != "compiling-while-peers-wait"


def test_a_peer_hung_outside_compile_frames_is_still_the_culprit():
    hung = compiling(stack="idle_user", warming_up=True, cpu_ratio=0.01)
    assert judged([waiting(), hung]) == ["blocked", "hung-outside-idle"]


def test_a_dead_peer_is_no_warm_up():
    gone = compiling(alive=False)
    w = waiting()
    got = judged([w, gone])
    assert w["peers_compiling"] == 0 and got[0] != "waits-for-compiling-peer"


def advancing(pid, comm_share):
    """Training, its heartbeats advancing, `comm_share` of each step in collectives."""
    return {"pid": pid, "alive": True, "hb": True, "hb_step": 12, "hb_phase": "outside",
            "hb_advanced": True, "in_collective": False, "blocked": False,
            "warming_up": False, "cpu_ratio": 0.9, "stack": "", "state": "R",
            "hb_comm_share": comm_share, "hb_step_s": 0.2, "peers_starved": False}


def test_two_shares_near_nothing_make_no_rank_wait_on_a_peer():
    """Just after the first compiled step both ranks spend ~0% of a step in
    collectives: 0.4% over 0.1% is a ratio of 4, and no rank waits for anyone
    (rules/default.yaml waiting-on-peer asks a fifth of the step at least)."""
    first, second = judged([advancing(1, 0.004), advancing(2, 0.001)])
    assert first != "waiting-on-peer" and second != "waiting-on-peer"
    # a rank that does wait a real share, twice its peer's, still does
    assert judged([advancing(1, 0.4), advancing(2, 0.1)])[0] == "waiting-on-peer"
