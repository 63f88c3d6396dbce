#!/usr/bin/env bash
# Sets everything up (idempotent), then runs the demo or the whole test-suite.
#   bash dev.sh demo    the bundled trainer on 2 CPU ranks with a fault injected;
#                       ddpwatch names the culprit
#   bash dev.sh test    every test (pytest arguments may follow)
set -euo pipefail
cd "$(dirname "$0")"

# chromium: the incident page is opened headless (tests/alerts/test_incident_page.py);
# systemd: systemd-analyze checks the unit; strace: the unit's syscall filter is
# checked against what the probes really call (tests/hostile/test_hostile_surface.py);
# openmpi-bin: a real mpirun job (tests/thirdparty/test_thirdparty_jobs.py); mmdebstrap, podman,
# runc: the container image is built and run beside a real job (deploy/image,
# tests/deploy/test_deploy.py; runc where crun refuses the host's cgroups); tmux: the
# live view driven in a real terminal (tests/diagnose/test_diagnose_live.py). kubectl,
# which renders deploy/kubernetes, is no Debian package: these machines come with it
DEBIAN_PACKAGES=(prometheus prometheus-alertmanager iptables iproute2 chromium systemd strace openmpi-bin slurm-wlm
                 util-linux mmdebstrap podman runc tmux)
VENV=.venv

setup() {
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
        missing=()
        for pkg in "${DEBIAN_PACKAGES[@]}"; do
            dpkg -s "$pkg" >/dev/null 2>&1 || missing+=("$pkg")
        done
        if [ ${#missing[@]} -gt 0 ]; then
            echo "dev.sh: installing Debian packages: ${missing[*]}"
            apt-get update -qq
            DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
        fi
        # tracefs, as systemd mounts it at boot: the exits probe reads who sent a
        # rank its SIGTERM there (ddpwatch/observe/system/tracefs.py)
        if [ -d /sys/kernel/tracing ] && [ ! -d /sys/kernel/tracing/instances ]; then
            mount -t tracefs nodev /sys/kernel/tracing 2>/dev/null ||
                echo "dev.sh: cannot mount tracefs at /sys/kernel/tracing: a rank sent SIGTERM" \
                     "alone reads as its job stopped"
        fi
    else
        echo "dev.sh: not root: Debian packages (${DEBIAN_PACKAGES[*]}) not installed;" \
             "tests that need them will skip and say why"
    fi
    [ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
    # torch first and pinned: a bare 'torch' would pull a multi-GB CUDA build.
    "$VENV/bin/pip" install -q --disable-pip-version-check torch==2.13.0
    "$VENV/bin/pip" install -q --disable-pip-version-check -e '.[trainer,test]'
}

case "${1:-}" in
    demo) setup; shift; exec "$VENV/bin/python" scripts/demo.py "$@" ;;
    test) setup; shift; exec "$VENV/bin/python" -m pytest "$@" ;;
    *) echo "usage: bash dev.sh demo|test [args...]" >&2; exit 2 ;;
esac
