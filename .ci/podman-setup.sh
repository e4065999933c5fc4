#!/usr/bin/env bash
# CI only: a real container engine for tests/gateway/test_docker_backend.py, with nothing downloaded but Debian
# packages. Rootful podman serves the Docker Engine API on a private socket; the test image is a rootfs of symlinks
# into the host's /usr, made with `podman import` (no registry is reachable). Containers of that image run the
# project's own Python, virtual environment and torch, bind-mounted read-only from the host by the test.
#
# Idempotent and quiet: progress goes to stderr, and stdout carries only `export` lines for the caller:
#     exports="$(bash .ci/podman-setup.sh)"; eval "$exports"     # fails the caller when the setup fails
#     bash .ci/podman-setup.sh --stop                             # remove Stellaris containers, stop the service
set -euo pipefail

SOCK=/run/stellaris-podman.sock
PIDFILE=/run/stellaris-podman.pid
LOG=/tmp/stellaris-podman-service.log
IMAGE=localhost/stellaris-function:test
CONF=/etc/containers/containers.conf
LABEL_FILTER=label=io.stellaris.app=stellaris

say() { echo "podman-setup: $*" >&2; }
answers() { podman --remote --url "unix://$SOCK" version >/dev/null 2>&1; }
remove_containers() {
    local ids
    ids="$(podman ps -aq --filter "$LABEL_FILTER" 2>/dev/null || true)"
    if [ -n "$ids" ]; then
        say "removing stale Stellaris containers: $(echo "$ids" | tr '\n' ' ')"
        # shellcheck disable=SC2086
        podman rm -f -t0 $ids >/dev/null
    fi
}
stop_service() {
    local pid
    pid="$(cat "$PIDFILE" 2>/dev/null || true)"
    if [ -n "$pid" ] && [ "$(cat "/proc/$pid/comm" 2>/dev/null || true)" = podman ]; then
        kill "$pid"
        for _ in $(seq 50); do [ -e "/proc/$pid" ] || break; sleep 0.1; done
    fi
    rm -f "$PIDFILE" "$SOCK"
}

if [ "${1:-}" = --stop ]; then
    if command -v podman >/dev/null; then remove_containers; fi
    stop_service
    say "stopped"
    exit 0
fi

# 1. Packages (≈10-15 s the first time; nothing when present).
if ! dpkg -s podman runc >/dev/null 2>&1; then
    say "installing podman and runc"
    export DEBIAN_FRONTEND=noninteractive
    if ! apt-get install -y -qq podman runc >/tmp/stellaris-podman-apt.log 2>&1; then
        apt-get update -qq >>/tmp/stellaris-podman-apt.log 2>&1
        apt-get install -y -qq podman runc >>/tmp/stellaris-podman-apt.log 2>&1 ||
            { tail -20 /tmp/stellaris-podman-apt.log >&2; exit 1; }
    fi
fi

# 2. Engine config: runc (crun rejects this machine's hybrid cgroups), no systemd, ulimits this machine allows, and an
# events log big enough for a whole CI run: podman 4.3 deletes the log when it passes its limit (1m by default),
# which lost a test's container start events late in `make test`.
nofile="$(ulimit -Hn)"
[ "$nofile" = unlimited ] && nofile=1048576
mkdir -p /etc/containers
conf="$(cat <<EOF
# Written by .ci/podman-setup.sh (CI only).
[containers]
default_ulimits = ["nofile=$nofile:$nofile", "nproc=32768:32768"]

[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"
events_logfile_max_size = "256m"
EOF
)"
if [ "$(cat "$CONF" 2>/dev/null || true)" != "$conf" ]; then
    printf '%s\n' "$conf" >"$CONF"
    if answers; then say "containers.conf changed: restarting the service"; stop_service; fi
fi

# 3. The Docker-API service, detached from this shell (its output must not hold the caller's pipe open), started in
#    / : a service whose working directory was deleted still answers, but fails every container start with
#    "write child: broken pipe" (reproduced: started from a directory, then the directory removed).
remove_containers
if answers && [[ "$(readlink "/proc/$(cat "$PIDFILE" 2>/dev/null || echo none)/cwd" 2>/dev/null)" == *" (deleted)" ]]; then
    say "the service's working directory was deleted: restarting it"
    stop_service
fi
if ! answers; then
    stop_service # a service from an earlier run that lost its socket
    (
        cd /
        setsid podman system service --time=0 "unix://$SOCK" </dev/null >>"$LOG" 2>&1 &
        echo $! >"$PIDFILE"
    )
    for _ in $(seq 100); do answers && break; sleep 0.1; done # bounded: 10 s
    answers || { say "the service did not answer on $SOCK; its log:"; tail -20 "$LOG" >&2; exit 1; }
    say "service answering on unix://$SOCK (pid $(cat "$PIDFILE"), log $LOG)"
fi

# 4. The test image, rebuilt only when its content changes. The container needs /usr, the Python install and
#    the project (with .venv) bind-mounted read-only: the test does that (DockerBackend volumes=...).
root="$(mktemp -d)"
tarball="$(mktemp)"
trap 'rm -rf "$root" "$tarball"' EXIT
mkdir -p "$root"/{usr,etc,tmp,var/tmp,root,home,proc,sys,dev,run}
chmod 1777 "$root/tmp" "$root/var/tmp"
for d in bin sbin lib lib64; do ln -s "usr/$d" "$root/$d"; done
cp /etc/ld.so.cache "$root/etc/"
printf 'root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n' >"$root/etc/passwd"
printf 'root:x:0:\nnogroup:x:65534:\n' >"$root/etc/group"
printf 'passwd: files\ngroup: files\nhosts: files dns\n' >"$root/etc/nsswitch.conf"
tar --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner -C "$root" -cf "$tarball" .
changes=(--change "ENV PATH=/usr/local/bin:/usr/bin:/bin" --change "ENV PYTHONDONTWRITEBYTECODE=1")
sha="$({ sha256sum <"$tarball"; echo "${changes[*]}"; } | sha256sum | cut -c1-64)"
have="$(podman image inspect --format '{{index .Config.Labels "io.stellaris.rootfs-sha256"}}' "$IMAGE" 2>/dev/null ||
    true)"
if [ "$have" != "$sha" ]; then
    podman import --quiet "${changes[@]}" --change "LABEL io.stellaris.rootfs-sha256=$sha" "$tarball" "$IMAGE" >/dev/null
    podman image prune -f >/dev/null # the previous build, now untagged
    say "built $IMAGE"
fi

echo "export DOCKER_HOST=unix://$SOCK"
echo "export STELLARIS_TEST_IMAGE=$IMAGE"
echo "export STELLARIS_REQUIRE_DOCKER=1"
