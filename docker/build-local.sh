#!/usr/bin/env bash
# Build the images without a container registry (no Docker Hub, no PyTorch index): only Debian's mirror and PyPI.
#   1. base:   Debian bookworm from `debootstrap --variant=minbase` with python3, python3-venv and python3-pip,
#              imported with `podman import` (the Dockerfiles' BASE_IMAGE; Debian's Python is 3.11, as the images').
#   2. redis:  the base + Valkey 8 from bookworm-backports as redis-server (compose.yaml's STELLARIS_REDIS_IMAGE).
#   3. function-cpu and gateway: `podman build --pull=never --network host` from the base, torch from a local wheel
#      folder (TORCH_WHEELS, mounted at /wheels) and pip trusting the machine's CA bundle (mounted with a pip.conf).
# The GPU image (Dockerfile.function) needs a CUDA base: build it where one can be pulled (docker/README.md).
#
#   bash docker/build-local.sh [--rebuild-base] [base|redis|function-cpu|gateway ...]    # default: all four
#
# Root (debootstrap, rootful podman). Settings (environment): TORCH_WHEELS (default /opt/wheels: a folder holding
# torch-2.13.0+cpu-cp311-*.whl), CA_BUNDLE (default /etc/ssl/certs/ca-certificates.crt), DEBIAN_MIRROR (default:
# the first Debian URI in /etc/apt/sources*, else http://deb.debian.org/debian), STELLARIS_VERSION (0.1.0).
# Each step prints its time on stderr; the images' names and sizes at the end.
set -euo pipefail
cd "$(dirname "$0")/.."

VERSION="${STELLARIS_VERSION:-0.1.0}"
BASE_IMAGE="${STELLARIS_BASE_IMAGE:-localhost/stellaris/debian-python:bookworm}"
REDIS_IMAGE="${STELLARIS_REDIS_IMAGE:-localhost/stellaris/redis:bookworm}"
TORCH_WHEELS="${TORCH_WHEELS:-/opt/wheels}"
CA_BUNDLE="${CA_BUNDLE:-/etc/ssl/certs/ca-certificates.crt}"

say() { echo "build-local: $*" >&2; }
die() { say "$*"; exit 1; }
timed() { # timed NAME COMMAND...: run, then print how long it took
    local name="$1" start=$SECONDS
    shift
    "$@"
    say "$name: $((SECONDS - start)) s"
}

debian_mirror() {
    local uri
    uri="$(grep -hoE '^(URIs:|deb) +https?://[^ ]+/debian/?( |$)' /etc/apt/sources.list /etc/apt/sources.list.d/* \
        2>/dev/null | grep -oE 'https?://[^ ]+' | head -1 || true)"
    echo "${DEBIAN_MIRROR:-${uri:-http://deb.debian.org/debian}}"
}

build_base() {
    command -v debootstrap >/dev/null || DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >&2
    local mirror root
    mirror="$(debian_mirror)"
    root="$(mktemp -d /var/tmp/stellaris-rootfs.XXXXXX)"
    # shellcheck disable=SC2064
    trap "rm -rf '$root'" RETURN
    say "debootstrap bookworm from $mirror"
    debootstrap --variant=minbase --include=python3,python3-venv,python3-pip,ca-certificates \
        bookworm "$root" "$mirror" >/tmp/stellaris-debootstrap.log 2>&1 ||
        { tail -20 /tmp/stellaris-debootstrap.log >&2; die "debootstrap failed (log above)"; }
    rm -rf "$root"/var/lib/apt/lists/* "$root"/var/cache/apt/*.bin "$root"/var/cache/apt/archives/*.deb
    tar --numeric-owner -C "$root" -c . | podman import --quiet \
        --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
        --change 'ENV LANG=C.UTF-8' --change 'CMD ["python3"]' - "$BASE_IMAGE" >/dev/null
}

# One podman build with the local base, the wheel folder and the CA bundle (pip.conf points pip at it).
build() { # build DOCKERFILE TAG [build args...]
    local file="$1" tag="$2"
    shift 2
    podman image exists "$BASE_IMAGE" || die "no base image $BASE_IMAGE: run '$0 base' first"
    local pipconf
    pipconf="$(mktemp)"
    printf '[global]\ncert = /etc/ssl/certs/ca-certificates.crt\n' >"$pipconf"
    podman build --pull=never --network host --layers \
        -f "$file" --ignorefile "$file.dockerignore" -t "$tag" \
        --build-arg "BASE_IMAGE=$BASE_IMAGE" "$@" \
        -v "$CA_BUNDLE:/etc/ssl/certs/ca-certificates.crt:ro" -v "$pipconf:/etc/pip.conf:ro" . >&2 ||
        { rm -f "$pipconf"; die "podman build -f $file failed"; }
    rm -f "$pipconf"
}

build_torch_image() { # build_torch_image DOCKERFILE TAG
    ls "$TORCH_WHEELS"/torch-2.13.0*.whl >/dev/null 2>&1 ||
        die "no torch-2.13.0 wheel in TORCH_WHEELS=$TORCH_WHEELS (pip download --no-deps torch==2.13.0 -d DIR)"
    build "$1" "$2" --build-arg TORCH_FIND_LINKS=/wheels -v "$TORCH_WHEELS:/wheels:ro"
}

rebuild_base=0
steps=()
for arg in "$@"; do
    case "$arg" in
        --rebuild-base) rebuild_base=1 ;;
        base | redis | function-cpu | gateway) steps+=("$arg") ;;
        *) die "unknown argument $arg (steps: base redis function-cpu gateway; --rebuild-base)" ;;
    esac
done
[ ${#steps[@]} -gt 0 ] || steps=(base redis function-cpu gateway)

total=$SECONDS
for step in "${steps[@]}"; do
    case "$step" in
        base)
            if [ "$rebuild_base" = 1 ] || ! podman image exists "$BASE_IMAGE"; then
                timed "base $BASE_IMAGE" build_base
            else
                say "base $BASE_IMAGE exists (--rebuild-base to make it again)"
            fi
            ;;
        redis)
            timed "redis $REDIS_IMAGE" build docker/Dockerfile.redis "$REDIS_IMAGE" \
                --build-arg "DEBIAN_MIRROR=$(debian_mirror)" ;;
        function-cpu)
            timed "function-cpu" build_torch_image docker/Dockerfile.function-cpu "stellaris/function-cpu:$VERSION" ;;
        gateway) timed "gateway" build_torch_image docker/Dockerfile.gateway "stellaris/gateway:$VERSION" ;;
    esac
done
say "all: $((SECONDS - total)) s"
podman images --format '{{.Repository}}:{{.Tag}} {{.Size}}' | grep -E 'stellaris/' >&2 || true
