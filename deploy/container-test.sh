#!/usr/bin/env bash
# Builds deploy/Containerfile from source and runs the image with a named volume: the
# daemon comes up as its non-root user, writes its key into the fresh volume, passes its
# HEALTHCHECK, serves a lock to the host's `sigma lock` (host network, loopback only),
# keeps its peer id across a new container on the same volume, and stops cleanly on
# `podman stop`. Usage, from the repository root:
#
#   deploy/container-test.sh [path/to/sigma]     (the host's client; default target/release/sigma)
#
# Needs podman (Debian: apt-get install podman). The build fetches crates from crates.io
# (host network) and pulls the BUILDER and BASE images named in the Containerfile. On a
# machine without access to an image registry, SIGMA_HOST_IMAGES=1 assembles both from
# this machine: the builder from its Rust toolchain (rustup's stable, or RUST_TOOLCHAIN=DIR),
# C compiler and make; the base from its glibc and libgcc_s (what distroless/cc holds).
# Set PODMAN to add options, e.g. where crun cannot run (cgroups v1 in hybrid mode):
#   PODMAN="podman --runtime runc" deploy/container-test.sh
set -euo pipefail
cd "$(dirname "$0")/.."
bin="${1:-target/release/sigma}"
podman_cmd=(${PODMAN:-podman})
command -v "${podman_cmd[0]}" >/dev/null || { echo "container-test: ${podman_cmd[0]} not found (Debian: apt-get install podman)" >&2; exit 2; }
[ -x "$bin" ] || { echo "container-test: $bin not built (cargo build --release -p sigma-daemon)" >&2; exit 2; }

work="$(mktemp -d)"
name="sigma-container-test-$$"
volume="sigma-container-test-$$"
cleanup() {
  "${podman_cmd[@]}" rm -f "$name" "$name-2" >/dev/null 2>&1 || true
  "${podman_cmd[@]}" volume rm -f "$volume" >/dev/null 2>&1 || true
  rm -rf "$work"
}
trap cleanup EXIT

build_args=()
if [ -n "${SIGMA_HOST_IMAGES:-}" ]; then
  # The base: the libraries the binary links, from this machine.
  if ! "${podman_cmd[@]}" image exists localhost/sigma-host-base; then
    mkdir -p "$work/base"
    for lib in $(ldd "$bin" | grep -o '/[^ ]*'); do
      mkdir -p "$work/base$(dirname "$lib")"
      cp -L "$lib" "$work/base$lib"
    done
    mkdir -m 1777 "$work/base/tmp"
    tar -C "$work/base" -c . | "${podman_cmd[@]}" import - localhost/sigma-host-base >/dev/null
    rm -rf "$work/base"
  fi
  # The builder: this machine's /usr (compiler, make, git, certificates) and Rust toolchain.
  if ! "${podman_cmd[@]}" image exists localhost/sigma-host-builder; then
    toolchain="${RUST_TOOLCHAIN:-$(rustup toolchain list -v | sed -n 's/^stable[^/]* \(\/.*\)$/\1/p' | head -1)}"
    [ -x "$toolchain/bin/cargo" ] || { echo "container-test: no Rust toolchain at '$toolchain' (RUST_TOOLCHAIN=DIR)" >&2; exit 2; }
    toolchain="$(realpath "$toolchain")"
    mkdir -p "$work/extra/root" && mkdir -m 1777 "$work/extra/tmp"
    tar -C / -c --exclude=usr/lib/jvm --exclude=usr/lib/google-cloud-sdk --exclude='usr/lib/go-*' \
        --exclude=usr/share/doc --exclude=usr/share/man --exclude=usr/local \
        --transform "s,^${toolchain#/},opt/rust," \
        usr bin lib lib64 sbin etc/ssl etc/ca-certificates etc/passwd etc/group etc/alternatives "${toolchain#/}" -C "$work/extra" root tmp 2>/dev/null \
      | "${podman_cmd[@]}" import --change 'ENV PATH=/opt/rust/bin:/usr/bin:/bin' \
          --change 'ENV CARGO_HOME=/usr/local/cargo' --change 'ENV HOME=/root' - localhost/sigma-host-builder >/dev/null
  fi
  build_args+=(--build-arg BUILDER=localhost/sigma-host-builder --build-arg BASE=localhost/sigma-host-base)
  echo "container-test: builder and base images assembled from this machine"
fi

commit="$(git rev-parse --short=12 HEAD 2>/dev/null || echo unknown)"
# Explicit limits: podman's defaults (nofile 1048576) are refused in some sandboxes.
limits=(--ulimit nofile=8192:8192 --ulimit nproc=4096:4096)
image="${SIGMA_TEST_IMAGE:-}"
if [ -z "$image" ]; then
  image=localhost/sigma-test
  start=$(date +%s)
  "${podman_cmd[@]}" build --format docker --network host -f deploy/Containerfile \
    --build-arg SIGMA_BUILD_COMMIT="$commit" "${build_args[@]}" -t "$image" . >"$work/build.log" 2>&1 \
    || { tail -40 "$work/build.log"; echo "container-test: FAIL: the image did not build" >&2; exit 1; }
  echo "container-test: image built from source in $(( $(date +%s) - start )) s"
else
  # SIGMA_TEST_IMAGE=NAME: test an image built before (from another commit, maybe).
  commit="$("${podman_cmd[@]}" run --rm "${limits[@]}" "$image" --version | sed -n 's/.*(commit \([^,]*\),.*/\1/p')"
  echo "container-test: testing image $image (commit $commit)"
fi
version=$("${podman_cmd[@]}" run --rm "${limits[@]}" "$image" --version)
echo "container-test: $version"
[[ "$version" == *"(commit $commit, protocol /sigma/"* ]] || { echo "container-test: FAIL: --version does not name commit $commit" >&2; exit 1; }
"${podman_cmd[@]}" image inspect -f '{{.Config.Healthcheck.Test}}' "$image" | grep -q 'sigma status' \
  || { echo "container-test: FAIL: no HEALTHCHECK in the image" >&2; exit 1; }

"${podman_cmd[@]}" volume create "$volume" >/dev/null
api_port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
run() {
  "${podman_cmd[@]}" run -d --name "$1" --network host "${limits[@]}" \
    -v "$volume:/var/lib/sigma" \
    -e SIGMA_LISTEN=/ip4/127.0.0.1/tcp/0 -e SIGMA_API="127.0.0.1:$api_port" -e SIGMA_METRICS=127.0.0.1:0 \
    -e SIGMA_LEASE_MS=1000 -e SIGMA_PING_INTERVAL=200ms -e SIGMA_PING_TIMEOUT=500ms \
    "$image" >/dev/null
  for _ in $(seq 1 100); do
    "${podman_cmd[@]}" logs "$1" 2>/dev/null | grep -q '^SIGMA_READY$' && break
    sleep 0.2
  done
  "${podman_cmd[@]}" logs "$1" 2>/dev/null | grep -q '^SIGMA_READY$' || { "${podman_cmd[@]}" logs "$1"; echo "container-test: FAIL: not ready" >&2; exit 1; }
  "${podman_cmd[@]}" logs "$1" 2>/dev/null | sed -n 's/^SIGMA_PEER_ID=//p'
}
peer=$(run "$name")
user=$("${podman_cmd[@]}" top "$name" user | tail -1 | tr -d ' ')
[ "$user" = 65532 ] || { echo "container-test: FAIL: the daemon runs as '$user', not 65532" >&2; exit 1; }
echo "container-test: daemon up as uid 65532, peer $peer"
mountpoint=$("${podman_cmd[@]}" volume inspect -f '{{.Mountpoint}}' "$volume")
# A new named volume takes the owner of the image's /var/lib/sigma (its mode is the
# engine's: podman leaves 0755); the key file is the daemon's own, 0600.
owner=$(stat -c '%u' "$mountpoint")
[ "$owner" = 65532 ] || { echo "container-test: FAIL: the named volume is owned by uid $owner, not 65532" >&2; exit 1; }
key=$(stat -c '%u %a' "$mountpoint/key" 2>/dev/null || echo none)
[ "$key" = "65532 600" ] && [ -s "$mountpoint/key" ] || { echo "container-test: FAIL: the key file in the volume: '$key' (uid, mode)" >&2; exit 1; }
echo "container-test: the named volume is the daemon's (uid 65532) and holds its key (mode 600)"
"${podman_cmd[@]}" healthcheck run "$name" || { echo "container-test: FAIL: the HEALTHCHECK failed" >&2; exit 1; }
echo "container-test: healthy"
out=$("$bin" lock container-test --api "127.0.0.1:$api_port" --timeout 30s -- sh -c 'echo "held with token $SIGMA_FENCING_TOKEN"')
echo "container-test: $out"
"${podman_cmd[@]}" stop -t 20 "$name" >/dev/null
code=$("${podman_cmd[@]}" inspect -f '{{.State.ExitCode}}' "$name")
[ "$code" = 0 ] || { "${podman_cmd[@]}" logs "$name"; echo "container-test: FAIL: exit code $code after stop" >&2; exit 1; }
"${podman_cmd[@]}" logs "$name" 2>&1 | grep -q '"message":"stopped"' || { echo "container-test: FAIL: no clean stop in the log" >&2; exit 1; }
again=$(run "$name-2")
[ "$again" = "$peer" ] || { echo "container-test: FAIL: a new container on the volume is peer $again, not $peer" >&2; exit 1; }
"${podman_cmd[@]}" stop -t 20 "$name-2" >/dev/null
echo "container-test: PASS (built offline from the lock file, healthy, stopped cleanly, peer id kept in the named volume)"
