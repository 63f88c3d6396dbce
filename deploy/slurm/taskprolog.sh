#!/bin/sh
# SLURM TaskProlog: heartbeats on for every task of every job on this node.
# slurm.conf:   TaskProlog=/etc/slurm/ddpwatch-taskprolog.sh
# SLURM runs it as the job's user before each task and sets in the task's
# environment every `export NAME=value` line it prints (slurm.conf(5), TaskProlog).
#
# DDPWATCH_AUTO=1 makes any Python that calls init_process_group write heartbeats,
# where ddpwatch is installed in the job's Python (ddpwatch-auto.pth does nothing
# otherwise; README "Heartbeats"). A job that sets DDPWATCH_AUTO=0 itself (sbatch
# --export=ALL,DDPWATCH_AUTO=0) is left alone.
#
# DDPWATCH_DIR: one record directory per user. The writer refuses a directory
# another user owns (ddpwatch/heartbeat/paths.py, prepare_dir), so one shared
# /dev/shm/ddpwatch would serve only the first user to run on the node; the
# daemon finds each directory from the ranks' own DDPWATCH_DIR.
if [ "${DDPWATCH_AUTO:-}" != "0" ]; then
    echo "export DDPWATCH_AUTO=1"
    [ -n "${DDPWATCH_DIR:-}" ] || echo "export DDPWATCH_DIR=/dev/shm/ddpwatch-$(id -u)"
fi
