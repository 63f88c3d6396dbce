#!/usr/bin/env bash
# Builds the ddpwatch container image from this repository with no registry pull:
# a Debian rootfs made by mmdebstrap (from Debian's archive), imported into podman
# as the base, then the project's wheel and its dependencies (from PyPI) installed
# into a virtualenv on it. Idempotent and cached:
#   * the rootfs is made once per package list and kept as a tarball in $CACHE;
#   * the base is imported once per rootfs (image localhost/ddpwatch-base:<hash>);
#   * the image is built once per content of the files that go into the wheel
#     (image localhost/ddpwatch:<version>-<hash>); a second run with nothing
#     changed prints the tag and returns in about a second.
# Prints the image's reference (and nothing else) on stdout; progress on stderr.
#
#   bash deploy/image/build.sh            # build if needed, print the tag
#   bash deploy/image/build.sh --save F   # also write it as an OCI archive to F
#
# Needs root, mmdebstrap and podman (dev.sh installs them). Environment:
#   DDPWATCH_IMAGE_CACHE   where the rootfs tarball and wheels are kept
#                          (default /var/cache/ddpwatch-image: outside the checkout,
#                          so a fresh clone, as CI makes, still finds it; inside
#                          it, /.image-cache/ is ignored by git)
#   DDPWATCH_IMAGE_NAME    the image's name (default localhost/ddpwatch)
#   DDPWATCH_DEBIAN_MIRROR a deb822 .sources file or a mirror URL for mmdebstrap
#                          (default: this machine's own Debian sources)
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
REPO="$(cd "$HERE/../.." && pwd)"
CACHE="${DDPWATCH_IMAGE_CACHE:-/var/cache/ddpwatch-image}"
NAME="${DDPWATCH_IMAGE_NAME:-localhost/ddpwatch}"
PYTHON="${PYTHON:-python3}"
SUITE=bookworm
# What the daemon runs besides Python (README "Running as root beside other
# users": ss, ip, nsenter and py-spy are found once at start):
#   python3 python3-venv  the interpreter the wheel is installed for (3.11, cp311)
#   iproute2              ss (sockets probe) and ip (interfaces in a rank's namespace)
#   util-linux            nsenter (essential in Debian; named so it is never dropped)
#   ca-certificates       webhooks over https
# py-spy comes from its PyPI wheel, a dependency of the project (setup.cfg).
PACKAGES=python3,python3-venv,iproute2,util-linux,ca-certificates

say() { echo "build.sh: $*" >&2; }
die() { echo "build.sh: error: $*" >&2; exit 1; }

SAVE=""
while [ $# -gt 0 ]; do
    case "$1" in
        --save) SAVE="${2:?--save needs a file}"; shift 2 ;;
        -h|--help) sed -n '2,24p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) die "unknown argument: $1 (see --help)" ;;
    esac
done

[ "$(id -u)" = 0 ] || die "needs root (mmdebstrap makes device nodes; podman stores images under /var/lib/containers)"
for tool in mmdebstrap podman; do
    command -v "$tool" >/dev/null || die "$tool not found: apt-get install $tool (dev.sh does)"
done
mkdir -p "$CACHE"

sha() { sha256sum | cut -c1-16; }
MIRROR="${DDPWATCH_DEBIAN_MIRROR:-}"
if [ -z "$MIRROR" ] && [ -f /etc/apt/sources.list.d/debian.sources ]; then
    MIRROR=/etc/apt/sources.list.d/debian.sources
fi
mirror_key="$MIRROR"
[ -f "$MIRROR" ] && mirror_key="$(cat "$MIRROR")"

# --- 1. the rootfs: once per suite, package list and mirror ----------------------
base_hash="$(printf '%s\n' "$SUITE" "$PACKAGES" "$mirror_key" | sha)"
rootfs="$CACHE/rootfs-$base_hash.tar"
if [ ! -s "$rootfs" ]; then
    say "making the Debian $SUITE rootfs with mmdebstrap (once; cached as $rootfs)"
    # --variant=essential: no apt, no init; the image never installs anything
    # after it is built. The docs, man pages and locales are dropped (dpkg filters).
    mmdebstrap --variant=essential --format=tar --include="$PACKAGES" \
        --aptopt='Acquire::Check-Valid-Until "false"' \
        --dpkgopt='path-exclude=/usr/share/man/*' \
        --dpkgopt='path-exclude=/usr/share/doc/*' \
        --dpkgopt='path-include=/usr/share/doc/*/copyright' \
        --dpkgopt='path-exclude=/usr/share/locale/*' \
        --dpkgopt='path-exclude=/usr/share/info/*' \
        --customize-hook='rm -rf "$1"/var/cache/apt/* "$1"/var/lib/apt/lists/* "$1"/var/log/*' \
        "$SUITE" "$rootfs.part" ${MIRROR:+"$MIRROR"} >&2 \
        || die "mmdebstrap failed (is Debian's archive reachable? see its output above)"
    mv "$rootfs.part" "$rootfs"
fi

base="localhost/ddpwatch-base:$base_hash"
if ! podman image exists "$base"; then
    say "importing the rootfs as $base"
    podman import "$rootfs" "$base" >/dev/null || die "podman import failed"
fi

# shellcheck source=deploy/image/podman-opts.sh
. "$HERE/podman-opts.sh"
podman_opts "$base" "$CACHE" || die "podman cannot start a container on this machine (see above)"

# --- 2. the wheels: once per content of what goes into the wheel ------------------
# Hashing the working tree (not the last commit) so an edit not yet committed is
# built too. The Containerfile and the image's config are hashed as well: they
# shape the image.
src_hash="$(cd "$REPO" && git ls-files -z --cached --others --exclude-standard -- \
        ddpwatch rules systemd grafana setup.cfg setup.py pyproject.toml deploy/image/Containerfile \
        deploy/image/config.yaml \
    | sort -z | xargs -0 sha256sum 2>/dev/null | sha)"
version="$(cd "$REPO" && "$PYTHON" -c 'import re;print(re.search(r"__version__\s*=\s*\"([^\"]+)\"", open("ddpwatch/__init__.py").read()).group(1))')"
tag="$NAME:$version-$src_hash"

if podman image exists "$tag"; then
    say "up to date: $tag"
else
    ctx="$CACHE/context-$src_hash"
    rm -rf "$ctx" && mkdir -p "$ctx/wheels"
    say "building the wheels (ddpwatch $version and its dependencies, no torch)"
    # The daemon never imports torch (docs/architecture.md): the wheel's
    # install_requires are psutil, PyYAML, prometheus-client and py-spy.
    # Built here for the base's Python (3.11, as on this Debian); --no-cache-dir
    # would refetch the dependencies every time, pip's cache keeps them.
    "$PYTHON" -m pip wheel --quiet --disable-pip-version-check -w "$ctx/wheels" "$REPO" >&2 \
        || die "pip wheel failed (see above)"
    ls "$ctx/wheels" | grep -qi '^torch' && die "torch ended up among the wheels; the daemon must not need it"
    cp "$HERE/config.yaml" "$ctx/config.yaml"
    cp "$HERE/Containerfile" "$ctx/Containerfile"
    say "building $tag"
    # --pull=never: the base is the local import, never a registry's.
    # --network=none: everything the build installs is in the context.
    podman "${PODMAN_OPTS[@]}" build --quiet --pull=never --network=none "${ULIMITS[@]}" \
        --build-arg "BASE=$base" \
        --label "org.opencontainers.image.version=$version" \
        --label "org.ddpwatch.source-hash=$src_hash" \
        -t "$tag" -t "$NAME:latest" "$ctx" >/dev/null \
        || die "podman build failed (see above)"
    rm -rf "$ctx"
fi
podman tag "$tag" "$NAME:latest" >/dev/null
# Earlier builds of this name are left to no one: drop them so the store stays one
# image deep (one still used by a container stays; podman refuses, and that is fine).
podman images --format '{{.Repository}}:{{.Tag}}' "$NAME" | grep -v -e ':latest$' -e "^$tag\$" \
    | xargs -r podman rmi >/dev/null 2>&1 || true

if [ -n "$SAVE" ]; then
    say "saving $tag to $SAVE"
    rm -f "$SAVE"
    podman save --quiet --format oci-archive -o "$SAVE" "$tag" || die "podman save failed"
fi
echo "$tag"
