#!/usr/bin/env bash
# Runs the ddpwatch image on this node the way the Kubernetes DaemonSet does
# (deploy/kubernetes/daemonset.yaml), for a plain podman (or docker) host:
#   --pid=host       the daemon watches every rank on the node: their /proc
#                    entries, py-spy stacks, and their pids as the records name them
#   --network=host   the exits probe's process-events connector only hears the
#                    kernel in the node's own network namespace, the traffic probe
#                    captures the node's SYN/RST segments, and peers and Prometheus
#                    reach the daemon at the node's address
#   the five capabilities of systemd/ddpwatch.service's CapabilityBoundingSet,
#   and CAP_NET_BIND_SERVICE until the daemon holds its port; no new privileges;
#   a read-only root; /tmp in memory; podman's default seccomp profile, not the
#   unit's SystemCallFilter (README "What the container lacks")
#   port 195         the image's config (deploy/image/config.yaml) listens on
#                    127.0.0.1:195. On the node's network nothing holds the port
#                    while the container restarts (systemd/ddpwatch.socket does for
#                    the unit), so it is one below 1024, which no user without
#                    CAP_NET_BIND_SERVICE may bind (net.ipv4.ip_unprivileged_port_start);
#                    the daemon gives that capability up once bound and warns at
#                    start when its port is one anybody could take
#                    (ddpwatch/port_guard.py). DDPWATCH_LISTEN=0.0.0.0:195 (with
#                    DDPWATCH_TOKEN) opens it to peers and Prometheus.
#   /dev/shm/ddpwatch the node's record directory, read-only (only writers remove
#                    records: ddpwatch/heartbeat/retention.py)
#   /var/lib/ddpwatch incidents and their bundles, kept across restarts
#
#   bash deploy/image/run.sh [IMAGE] [-- extra podman run options]
# Environment: DDPWATCH_NAME (container name, default ddpwatch),
#   DDPWATCH_RECORDS (host directory of the records, default /dev/shm/ddpwatch),
#   DDPWATCH_STATE (host state directory, default /var/lib/ddpwatch),
#   DDPWATCH_IMAGE_CACHE (as build.sh), and the daemon's own DDPWATCH_* settings
#   (DDPWATCH_LISTEN, DDPWATCH_TOKEN...) are passed into the container when set.
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
CACHE="${DDPWATCH_IMAGE_CACHE:-/var/cache/ddpwatch-image}"
IMAGE="localhost/ddpwatch:latest"
if [ $# -gt 0 ] && [ "$1" != "--" ]; then IMAGE="$1"; shift; fi
[ "${1:-}" = "--" ] && shift
NAME="${DDPWATCH_NAME:-ddpwatch}"
RECORDS="${DDPWATCH_RECORDS:-/dev/shm/ddpwatch}"
STATE="${DDPWATCH_STATE:-/var/lib/ddpwatch}"

die() { echo "run.sh: error: $*" >&2; exit 1; }
command -v podman >/dev/null || die "podman not found: apt-get install podman"
podman image exists "$IMAGE" || die "no image $IMAGE: build it with deploy/image/build.sh"
# shellcheck source=deploy/image/podman-opts.sh
. "$HERE/podman-opts.sh"
podman_opts "$IMAGE" "$CACHE" || die "podman cannot start a container on this machine"

# The ranks create the record directory 0700 as their own (heartbeat/paths.py);
# made here only so the bind mount has something to mount.
mkdir -p "$RECORDS" "$STATE"
chmod 0700 "$STATE"

envs=()
for var in DDPWATCH_LISTEN DDPWATCH_TOKEN DDPWATCH_TICK_S DDPWATCH_LOG_FORMAT DDPWATCH_PEERS \
           DDPWATCH_PEER_TOKEN DDPWATCH_EXTERNAL_URL; do
    [ -n "${!var:-}" ] && envs+=(--env "$var")
done

exec podman "${PODMAN_OPTS[@]}" run --detach --replace --name "$NAME" \
    --pid=host --network=host \
    --cap-drop=all \
    --cap-add=CAP_SYS_PTRACE,CAP_DAC_READ_SEARCH,CAP_NET_RAW,CAP_SYS_ADMIN,CAP_NET_ADMIN \
    --cap-add=CAP_NET_BIND_SERVICE \
    --security-opt=no-new-privileges \
    --read-only --tmpfs /tmp:rw,size=16m,mode=1777 \
    "${ULIMITS[@]}" \
    --volume "$RECORDS:/dev/shm/ddpwatch:ro" \
    --volume "$STATE:/var/lib/ddpwatch:rw" \
    "${envs[@]}" "$@" "$IMAGE"
