#!/usr/bin/env bash
# Builds deploy/Containerfile and runs the image: the daemon comes up, serves a lock to
# the host's `sigma lock` (host network, loopback only), keeps its key in the volume,
# and stops cleanly on `podman stop`. Usage, from the repository root:
#
#   deploy/container-test.sh [path/to/sigma]          (default target/release/sigma)
#
# Needs podman (Debian: apt-get install podman). With no registry access, the base image
# is assembled from this machine's own copies of the libraries the binary links
# (glibc, libgcc_s: what distroless/cc provides). Set PODMAN to add options, e.g. on a
# machine whose sandbox refuses crun's rlimits and overlay mounts:
#   PODMAN="podman --storage-driver vfs --runtime runc" deploy/container-test.sh
set -euo pipefail
cd "$(dirname "$0")/.."
bin="${1:-target/release/sigma}"
podman_cmd=(${PODMAN:-podman})
command -v "${podman_cmd[0]}" >/dev/null || { echo "container-test: ${podman_cmd[0]} not found (Debian: apt-get install podman)" >&2; exit 2; }
[ -x "$bin" ] || { echo "container-test: $bin not built (cargo build --release -p sigma-daemon)" >&2; exit 2; }

work="$(mktemp -d)"
name="sigma-container-test-$$"
cleanup() { "${podman_cmd[@]}" rm -f "$name" >/dev/null 2>&1 || true; rm -rf "$work"; }
trap cleanup EXIT

# The build context: the binary and its libraries, nothing else.
mkdir -p "$work/ctx/base" "$work/ctx/target"
cp "$bin" "$work/ctx/target/sigma"
for lib in $(ldd "$bin" | grep -o '/[^ ]*'); do
  mkdir -p "$work/ctx/base$(dirname "$lib")"
  cp -L "$lib" "$work/ctx/base$lib"
done
printf 'FROM scratch\nCOPY base/ /\n' > "$work/ctx/Containerfile.base"
"${podman_cmd[@]}" build --quiet -f "$work/ctx/Containerfile.base" -t localhost/sigma-test-base "$work/ctx" >/dev/null
"${podman_cmd[@]}" build --quiet -f deploy/Containerfile --build-arg BASE=localhost/sigma-test-base \
  --build-arg BIN=target/sigma -t localhost/sigma-test "$work/ctx" >/dev/null
echo "container-test: image built"

state="$work/state"
mkdir -m 0777 "$state"
api_port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
"${podman_cmd[@]}" run -d --name "$name" --network host \
  --ulimit nofile=8192:8192 --ulimit nproc=4096:4096 \
  -v "$state:/var/lib/sigma" \
  -e SIGMA_LISTEN=/ip4/127.0.0.1/tcp/0 -e SIGMA_API="127.0.0.1:$api_port" -e SIGMA_METRICS=127.0.0.1:0 \
  -e SIGMA_LEASE_MS=1000 -e SIGMA_PING_INTERVAL=200ms -e SIGMA_PING_TIMEOUT=500ms \
  localhost/sigma-test >/dev/null
for _ in $(seq 1 100); do
  "${podman_cmd[@]}" logs "$name" 2>/dev/null | grep -q '^SIGMA_READY$' && break
  sleep 0.2
done
"${podman_cmd[@]}" logs "$name" 2>/dev/null | grep -q '^SIGMA_READY$' || { "${podman_cmd[@]}" logs "$name"; echo "container-test: FAIL: not ready" >&2; exit 1; }
peer=$("${podman_cmd[@]}" logs "$name" 2>/dev/null | sed -n 's/^SIGMA_PEER_ID=//p')
echo "container-test: daemon up, peer $peer"
[ -s "$state/key" ] || { echo "container-test: FAIL: no key file in the volume" >&2; exit 1; }
out=$("$bin" lock container-test --api "127.0.0.1:$api_port" --timeout 30s -- sh -c 'echo "held with token $SIGMA_FENCING_TOKEN"')
echo "container-test: $out"
"${podman_cmd[@]}" stop -t 20 "$name" >/dev/null
code=$("${podman_cmd[@]}" inspect -f '{{.State.ExitCode}}' "$name")
[ "$code" = 0 ] || { "${podman_cmd[@]}" logs "$name"; echo "container-test: FAIL: exit code $code after stop" >&2; exit 1; }
"${podman_cmd[@]}" logs "$name" 2>&1 | grep -q '"message":"stopped"' || { echo "container-test: FAIL: no clean stop in the log" >&2; exit 1; }
echo "container-test: PASS (stopped cleanly, exit 0; key kept in the volume)"
