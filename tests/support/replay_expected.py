"""The judgement each replay fixture (tests/fixtures/snapshots/*.json) must get:
EXPECTED, checked by tests/unit/judge/test_replay.py; docs/rules.md lists from it
the fixtures each rule decides or finds in (tests/unit/judge/test_rules_doc_unit.py)."""
from __future__ import annotations

import os

from conftest import REPO

SNAPSHOTS = os.path.join(REPO, "tests", "fixtures", "snapshots")

H, N = "healthy", "none"
OK = (H, N, "healthy-heartbeat")
BLOCKED = ("blocked_in_collective", "victim", "blocked")
DESYNC_PAIR = {0: ("desync", "victim", "desync"), 1: ("desync", "culprit", "desync-deviant")}
LOOPBACK_PAIR = ({0: ("dead", "victim", "exited-at-start-loopback-peer"),
                  1: ("unreachable_peer", "culprit", "unreachable-loopback-address")}, [1],
                 {1: {"wrong_interface"}})

# fixture -> ({rank: (verdict, role, deciding rule)}, job culprits, {rank: finding ids})
EXPECTED = {
    "trainer_healthy": ({0: OK, 1: OK}, [], {}),
    "trainer_hang": ({0: BLOCKED, 1: ("hung_outside_collective", "culprit", "hung-outside-idle")},
                     [1], {}),
    "trainer_stop": ({0: BLOCKED, 1: ("stopped", "culprit", "stopped")}, [1], {}),
    # rank 0 still advanced in the window in which rank 1 was stopped: no straggler
    "daemon_stop_first_window": ({0: OK, 1: ("stopped", "culprit", "stopped")}, [1], {}),
    # the daemon's first two ticks of a job that had just started: busy, no Gloo
    # connections yet, no records yet: starting, not healthy
    "daemon_starting": ({0: ("warming_up", N, "starting"), 1: ("warming_up", N, "starting")},
                        [], {}),
    # exit: rank 1 left the loop and waits in barrier(), rank 0 in the bucket all-reduce
    "trainer_exit": (DESYNC_PAIR, [1], {}),
    "trainer_desync": (DESYNC_PAIR, [1], {}),
    "trainer_slow": ({0: ("waiting_on_peer", "victim", "waiting-on-peer"),
                      1: ("straggler", "culprit", "straggler")}, [1], {}),
    # busy outside the collectives while the peer waits: at first sight a pause
    # (of no known kind); the daemon pages it once it outlasts the pause floor
    # (pause_past_bound below, tests/unit/watch/test_overtime_unit.py)
    # both ranks wait for their DataLoader's new workers at an epoch's start
    "thirdparty_loader_epoch_start": ({0: ("paused", N, "paused-for-data"),
                                       1: ("paused", N, "paused-for-data")}, [], {}),
    # nobody works at a pause site (tests/jobs/pausesites.py, a FIFO where a file was):
    # a hang, whatever the stack's place (docs/judgement-over-time.md "Is anybody working?")
    "pause_data_hung": ({0: BLOCKED, 1: ("hung_outside_collective", "culprit",
                                         "hung-waiting-for-data")}, [1], {}),
    "pause_eval_hung": ({0: ("hung_outside_collective", "culprit", "hung-in-pause"),
                         1: BLOCKED}, [0], {}),
    "pause_ckpt_hung": ({0: ("hung_outside_collective", "culprit", "hung-in-pause"),
                         1: BLOCKED}, [0], {}),
    "pause_log_hung": ({0: ("hung_outside_collective", "culprit", "hung-in-pause"),
                        1: BLOCKED}, [0], {}),
    # the same checkpoint drained slowly: 1% CPU, its bytes moving, a pause
    "pause_ckpt_slow": ({0: ("paused", N, "paused-working"),
                         1: ("paused", N, "waits-for-paused-peer")}, [], {}),
    "trainer_busy_hang": ({0: ("paused", N, "waits-for-paused-peer"),
                           1: ("paused", N, "paused-working")}, [], {}),
    "trainer_bf16": ({0: OK, 1: OK}, [], {}),  # this CPU has avx512_bf16
    "trainer_bf16_no_cpu_bf16": ({0: OK, 1: OK}, [], {0: {"bf16_on_cpu"}, 1: {"bf16_on_cpu"}}),
    "trainer_data_mismatch": (DESYNC_PAIR, [1], {0: {"data_parity"}, 1: {"data_parity"}}),
    "trainer_compiling": ({0: ("warming_up", N, "warming-up"), 1: ("warming_up", N, "warming-up")},
                          [], {}),
    "trainer_compiled": ({0: OK, 1: OK}, [], {}),
    # a cache per rank: rank 0 waits in the first collective past its bound while
    # rank 1 compiles (once judged blocked, and rank 1 hung-outside-idle): a pause of
    # kind compile, as the daemon's watch follows it
    "trainer_compile_apart": ({0: ("paused", N, "waits-for-compiling-peer"),
                               1: ("paused", N, "compiling-while-peers-wait")}, [], {}),
    "trainer_oversubscribed": ({0: OK, 1: OK}, [], {0: {"oversubscribed"}, 1: {"oversubscribed"}}),
    # healthy ranks whose launcher died are no leftovers: no orphan finding
    "trainer_orphan": ({0: OK, 1: OK}, [], {}),
    "leftover_rendezvous": ({0: ("rendezvous_wait", "none", "rendezvous"),
                             1: ("rendezvous_wait", "none", "missing-not-joined")}, [],
                            {0: {"orphan"}}),
    # rank 0 waits on the straggler (its starvation is measured, not the 2x contrast
    # of step-time shares: the starved rank's Gloo threads wait for a CPU too)
    "trainer_starved": ({0: ("waiting_on_peer", "victim", "waiting-on-straggler"),
                         1: ("straggler", "culprit", "straggler-starved")}, [1], {}),
    "dead_rank_loud": ({0: ("blocked_in_collective", "victim", "exiting-after-peer-death"),
                        1: ("dead", "culprit", "dead")}, [1], {}),
    "dead_rank_silent": ({0: ("blocked_in_collective", "victim", "blocked-on-dead-peer"),
                          1: ("dead", "culprit", "dead")}, [1], {}),
    # every packet between the nodes dropped, both ranks alive: the link, no culprit
    "link_silent": ({0: ("unreachable_peer", "victim", "link-silent"),
                     1: ("unreachable_peer", "victim", "link-silent")}, [], {}),
    "exited_early_silent": ({0: BLOCKED, 1: ("dead", "culprit", "exited-early")}, [1], {}),
    "unreachable_peer": ({1: ("unreachable_peer", "culprit", "unreachable-peer")}, [1], {}),
    # the master's node lets the second in on MASTER_PORT only: judged on the second
    # node, its rank's data connect sits in SYN-SENT ...
    "unreachable_data": ({0: ("rendezvous_wait", N, "rendezvous"),
                          1: ("unreachable_peer", "victim", "unreachable-peer-data")}, [], {}),
    # ... judged on the master's node, whose wire shows rank 1's SYNs arrive, unanswered
    "dropped_inbound": ({0: ("unreachable_peer", "culprit", "dropped-inbound"),
                         1: ("unreachable_peer", "victim", "unreachable-peer-dropped-there")},
                        [0], {}),
    # rank 1's Gloo on loopback (its hostname's address; GLOO_SOCKET_IFNAME=lo): rank 0,
    # sent to its own loopback, gave up in init_process_group
    "hostname_loopback": LOOPBACK_PAIR,
    "ifname_loopback": LOOPBACK_PAIR,
    # rank 1 failed in init_process_group (GLOO_SOCKET_IFNAME names no interface)
    "exited_at_start": ({0: ("rendezvous_wait", N, "rendezvous"),
                         1: ("dead", "culprit", "exited-at-start")}, [1], {}),
    # rank 1's Gloo on the second node's docker bridge: rank 0's connect there unanswered
    "bridge_interface": ({0: ("unreachable_peer", "victim", "unreachable-peer-off-route"),
                          1: ("unreachable_peer", "culprit", "unreachable-gloo-address")}, [1],
                         {1: {"wrong_interface"}}),
    # rank 1 of the all-local job has no process: not started yet, while rank 0 joins
    "rendezvous_alone": ({0: ("rendezvous_wait", N, "rendezvous"),
                          1: ("rendezvous_wait", N, "missing-not-joined")}, [], {}),
    "rendezvous_alone_no_stacks": ({0: ("rendezvous_wait", N, "rendezvous-heartbeat"),
                                    1: ("rendezvous_wait", N, "missing-not-joined")}, [], {}),
    "rendezvous_launcher": ({-1: ("rendezvous_wait", N, "rendezvous-launcher")}, [], {}),
    "agent_exit_barrier": ({-1: (H, N, "agent")}, [], {}),
    "plain_healthy": ({0: (H, N, "healthy-cpu"), 1: (H, N, "healthy-cpu")}, [], {}),
    # no heartbeats: rank 1's death leaves nothing but its absence from an all-local job
    "plain_dead_same_host": ({0: ("blocked_in_collective", "victim", "survivor-of-dead-peer"),
                              1: ("dead", "culprit", "missing-rank")}, [1], {}),
    # ... read as rank 0 tears down after Gloo's "Connection reset": its last
    # reading's environ is empty (its memory released), its first one's stands
    # (judge/signals/process.py measure)
    "plain_dead_same_host_teardown": (
        {0: ("blocked_in_collective", "victim", "survivor-of-dead-peer"),
         1: ("dead", "culprit", "missing-rank")}, [1], {}),
    "plain_hang": ({0: BLOCKED, 1: ("hung_outside_collective", "culprit", "hung-outside-idle")},
                   [1], {}),
    "plain_slow": ({0: ("waiting_on_peer", "victim", "waiting-on-peer-cpu"),
                    1: ("straggler", "culprit", "straggler-cpu")}, [1], {}),
    # both ranks starved of CPU inside DDP's all-reduce, its bytes moving: slow,
    # not stuck (judged blocked, no culprit, before signal rank_links_idle_s)
    "plain_starved_moving": ({0: ("healthy", "none", "collective-moving"),
                              1: ("healthy", "none", "collective-moving")}, [], {}),
    # two namespace nodes, one rank each, node 1's under a 0.15-core CPU quota
    # (tests/nodes/test_two_nodes.py): judged in node 0 with the peer view (rank
    # 1's signals saved beside the history), in node 1 with it, and in node 0 alone
    "two_nodes_throttled_node0": ({0: ("waiting_on_peer", "victim", "waiting-on-straggler"),
                                   1: ("straggler", "culprit", "straggler-across-nodes")},
                                  [1], {}),
    "two_nodes_throttled_node1": ({0: ("waiting_on_peer", "victim", "waiting-on-straggler"),
                                   1: ("straggler", "culprit", "straggler-throttled")}, [1], {}),
    # the same with a plain torchrun script (no heartbeats), node 0 with the peer view
    "two_nodes_thirdparty_node0": ({0: ("waiting_on_peer", "victim", "waiting-on-straggler"),
                                    1: ("straggler", "culprit",
                                        "straggler-starved-across-nodes")}, [1], {}),
    # both directions of node 1's link shaped to 8 Mbit/s (tests/nodes/test_two_nodes_link.py)
    "two_nodes_slow_link_node0": ({0: ("slow_collective", "none", "slow-link"),
                                   1: ("slow_collective", "none", "slow-link")}, [], {}),
    "two_nodes_lone_node0": ({0: ("waiting_on_peer", "victim", "waiting-on-unseen-node")}, [], {}),
    # node 0 alone with the plain torchrun script (no heartbeats): healthy, then, with
    # node 1's rank under the quota, a victim of a rank on node 1's address
    "two_nodes_thirdparty_lone_healthy_node0": ({0: (H, N, "healthy-cpu")}, [], {}),
    "two_nodes_thirdparty_lone_node0": ({0: ("waiting_on_peer", "victim",
                                             "waiting-on-unseen-node-window")}, [], {}),
    # node 1 resolves its hostname to 127.0.1.1 (its /etc/hosts); diagnosed from the
    # host namespace: node 1's own view (probes/nshost.py, tests/nodes/test_two_nodes_nsview.py)
    "two_nodes_nsview_outside": ({1: ("unreachable_peer", "culprit",
                                      "unreachable-loopback-address")}, [1],
                                 {1: ("wrong_interface",)}),
    # node 1 drops node 0's new connections; node 0 alone: its rank a victim of node 1
    "two_nodes_firewall_lone_node0": ({0: ("unreachable_peer", "victim",
                                           "unreachable-peer-data")}, [], {}),
}
# The same histories with the signals over time a daemon's watch gives their ranks
# (tests/support/overtime_fixtures.py; rules of stage over-time)
SLOWING = ("slowing", N, "slowing-briefly")
EXPECTED.update({
    "pause_past_bound": ({0: ("blocked_in_collective", "victim", "waits-past-pause-bound"),
                          1: ("hung_outside_collective", "culprit", "pause-past-bound")},
                         [1], {}),
    "slowing_briefly": ({0: SLOWING, 1: SLOWING}, [], {}),
    "straggler_held": ({0: ("waiting_on_peer", "victim", "waiting-on-straggler-held"),
                        1: ("straggler", "culprit", "straggler-held")}, [1], {}),
})
# Third-party trainers without heartbeats (tests/thirdparty/test_thirdparty_jobs.py)
THIRDPARTY = {
    "healthy": ({0: (H, N, "healthy-cpu"), 1: (H, N, "healthy-cpu")}, [], {}),
    "stopped": ({0: BLOCKED, 1: ("stopped", "culprit", "stopped")}, [1], {}),
    "part_stopped": ({0: ("waiting_on_peer", "victim", "waiting-on-straggler"),
                      1: ("straggler", "culprit", "straggler-part-stopped")}, [1], {}),
    "throttled": ({0: ("waiting_on_peer", "victim", "waiting-on-straggler"),
                   1: ("straggler", "culprit", "straggler-throttled")}, [1], {}),
    "hung": ({0: BLOCKED, 1: ("hung_outside_collective", "culprit", "hung-outside-idle")},
             [1], {}),
    # rank 1 beside busy processes on its CPU (tests/thirdparty/test_thirdparty_contention.py)
    "contended": ({0: ("waiting_on_peer", "victim", "waiting-on-straggler"),
                   1: ("straggler", "culprit", "straggler-starved")}, [1], {}),
    # both ranks beside as many busy processes: slowed alike, no alarm
    "shared": ({0: (H, N, "healthy-cpu"), 1: (H, N, "healthy-cpu")}, [], {}),
}
STARTING = ("warming_up", "none", "starting")
ALONE = {-1: ("warming_up", "none", "starting-alone")}
EXPECTED.update({
    # before Lightning's rank 0 re-executed itself, and mp.spawn's parent before its
    # children exist: one process, no peers known (rank unknown), busy: starting
    "thirdparty_lightning_starting_alone": (ALONE, [], {}),
    "thirdparty_spawn_starting_alone": (ALONE, [], {}),
    # rank 1 busy and not yet connected while rank 0 waits in the store: both are
    # starting (rank 0 waits for a peer that is on its way, not for one missing)
    "thirdparty_lightning_starting": ({0: ("warming_up", "none", "starting-ddp-setup"),
                                       1: ("warming_up", "none", "starting-ddp-setup")},
                                      [], {}),
    # spawn children without WORLD_SIZE in their environment: the world from the
    # launch, the store found on the wire, so `starting` applies
    "thirdparty_spawn_starting": ({0: STARTING, 1: STARTING}, [], {}),
    # both ranks in DDP's constructor (importing torch._dynamo), busy: not trained
    # yet, so not healthy; nor is either a straggler
    "thirdparty_spawn_starting_ddp_setup": ({0: ("warming_up", "none", "starting-ddp-setup"),
                                             1: ("warming_up", "none", "starting-ddp-setup")},
                                            [], {}),
})
# A rank killed under the daemon (tests/thirdparty/test_thirdparty_killed.py): the job was gone
# within a second; held, it is judged from how each process ended (probes/exits.py)
KILLED = ("dead", "culprit", "died-first")
AFTER = ("dead", "victim", "ended-after-peer")
EXPECTED.update({"thirdparty_spawn_killed": ({0: AFTER, 1: KILLED}, [1], {}),
                 "thirdparty_lightning_killed": ({0: AFTER, 1: KILLED}, [1], {}),
                 "thirdparty_torchrun_killed": ({0: AFTER, 1: KILLED}, [1], {}),
                 "thirdparty_spawn_oom_killed": (
                     {0: AFTER, 1: ("dead", "culprit", "oom-killed-first")}, [1], {})})
# Desync and bf16 from stacks, no heartbeats (tests/thirdparty/test_thirdparty_stacks.py): rank 1
# waits in a broadcast its peer never calls, rank 0 in DDP's gradient all-reduce
DESYNC_STACK = {0: ("desync", "victim", "desync-stack"),
                1: ("desync", "culprit", "desync-stack-deviant")}
EXPECTED.update({
    "thirdparty_spawn_desync": (DESYNC_STACK, [1], {}),
    # Lightning, half the data on rank 1: it left the epoch and waits in ModelCheckpoint's
    # epoch-end collective, rank 0 mid-epoch in the next step's broadcast
    "thirdparty_lightning_uneven": ({0: ("desync", "victim", "desync-stack"),
                                     1: ("desync", "culprit", "desync-left-loop")}, [1], {}),
    # Lightning bf16-mixed: its plugin's frames on both stacks; this CPU has avx512_bf16
    "thirdparty_lightning_bf16_desync": (DESYNC_STACK, [1], {}),
    "thirdparty_lightning_bf16_desync_no_cpu_bf16": (DESYNC_STACK, [1], {0: {"bf16_on_cpu"},
                                                                         1: {"bf16_on_cpu"}}),
    # accelerate --mixed_precision=bf16, healthy: rank 0's samples caught its forward
    # inside accelerate's autocast wrapper (rank 1's did not); this CPU has avx512_bf16
    "thirdparty_accelerate_bf16": ({0: (H, N, "healthy-cpu"), 1: (H, N, "healthy-cpu")}, [], {}),
    # torch.autocast("cuda") around a CPU model's forward: a bf16 flag with no effect
    "thirdparty_spawn_autocast_cuda": ({0: (H, N, "healthy-cpu"), 1: (H, N, "healthy-cpu")},
                                       [], {}),
})
# byhand: ranks started by hand, grouped by their connections (test_thirdparty_wire.py)
LAUNCHERS = ("spawn", "lightning", "accelerate", "torchrun", "mpirun", "srun", "byhand", "ray")
for _launcher in LAUNCHERS:
    for _state, _expected in THIRDPARTY.items():
        if os.path.exists(os.path.join(SNAPSHOTS, f"thirdparty_{_launcher}_{_state}.json")):
            EXPECTED[f"thirdparty_{_launcher}_{_state}"] = _expected
