# Sourced by build.sh and run.sh: the podman options that work on this machine,
# found once per base image and kept in $CACHE/podman-opts.
# PODMAN_OPTS are podman's global options (before the command), ULIMITS go to
# `podman run` and `podman build`:
#   --ulimit nofile=4096:4096   the unit's LimitNOFILE; podman's own default raises
#                               it to 1048576, which needs CAP_SYS_RESOURCE: a root
#                               inside a sandbox without it cannot start any container
#   --ulimit nproc=4096:4096    likewise
#   --runtime runc              where crun refuses this host's cgroups ("cgroups in
#                               hybrid mode not supported": v1 controllers beside an
#                               empty v2 hierarchy); runc runs there
# Usage: podman_opts BASE_IMAGE CACHE_DIR  -> fills the array PODMAN_OPTS
ULIMITS=(--ulimit nofile=4096:4096 --ulimit nproc=4096:4096)
podman_opts() {
    local base="$1" cache="$2" saved="$2/podman-opts" candidate
    PODMAN_OPTS=()
    if [ -s "$saved" ]; then
        read -r -a PODMAN_OPTS < "$saved"
        return 0
    fi
    for candidate in "" "--runtime runc"; do
        # shellcheck disable=SC2086 # the candidate is words, split on purpose
        if podman $candidate run --rm --network=none "${ULIMITS[@]}" "$base" true >/dev/null 2>"$cache/podman-probe.err"; then
            echo "$candidate" > "$saved"
            read -r -a PODMAN_OPTS < "$saved"
            return 0
        fi
    done
    echo "podman cannot run a container here: $(tail -1 "$cache/podman-probe.err")" >&2
    return 1
}
