#!/usr/bin/env bash
# Build hloserve's container images on the local Docker daemon (docs/deployment.md, "Images").
#   bash scripts/images.sh base                 hloserve-base:bookworm from Debian's packages
#   bash scripts/images.sh cpu gateway [gpu]    the images of containers/*.Dockerfile
#   bash scripts/images.sh tags cpu gateway gpu  print the tags it builds (no Docker needed)
# Names: hloserve-worker-cpu, hloserve-gateway, hloserve-worker-gpu, each tagged with hloserve's
#   version (pyproject.toml; what deploy/kubernetes names) and `latest` (containers/compose.yaml,
#   the node files, the docker tests).
#   BASE_IMAGE=python:3.11-slim-bookworm bash scripts/images.sh cpu gateway   # a registry's base
# base: `debootstrap --variant=minbase` of Debian bookworm with python3.11, python3.11-venv,
#   libpython3.11 (the Python backend stub links it) and ca-certificates, then `docker import`
#   (python3-distutils too: it provides the python3.11-distutils python3.11-venv depends on,
#   a virtual package debootstrap's resolver does not follow).
#   Kept in the daemon and reused while its recipe (the label hloserve.base) is unchanged; cpu,
#   gateway and gpu build it first when BASE_IMAGE is this default and it is missing.
# Builds use the classic builder (no BuildKit syntax) with --network=host (a daemon started
# with --bridge=none has no other network for RUN steps). The host's pip configuration (index
# URLs, certificate authority) is written to containers/pip/ (git-ignored), which only the build
# stage of each Dockerfile copies: the final images do not keep it.
# Prints one "image TAG: SIZE, built in S s" line per image. Environment:
#   BASE_IMAGE   the Dockerfiles' base (default hloserve-base:bookworm)
#   TAG          tag of the built images besides `latest` (default: hloserve's version)
#   DEBIAN_MIRROR  debootstrap's mirror (default http://deb.debian.org/debian)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

DEFAULT_BASE=hloserve-base:bookworm
BASE_IMAGE="${BASE_IMAGE:-$DEFAULT_BASE}"
VERSION="$(sed -n 's/^version = "\(.*\)"$/\1/p' pyproject.toml | head -1)"
TAG="${TAG:-$VERSION}"
DEBIAN_MIRROR="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"
BASE_PACKAGES=python3.11,python3.11-venv,python3-distutils,libpython3.11,ca-certificates
# The recipe's identity: a base built from another recipe is rebuilt.
BASE_RECIPE="bookworm minbase $BASE_PACKAGES"
PIP="${PIP:-python3 -m pip}"

say() { echo "==> images: $*"; }

build_base() {
  local have
  have="$(docker image inspect -f '{{ index .Config.Labels "hloserve.base" }}' "$DEFAULT_BASE" \
    2>/dev/null || true)"
  if [ "$have" = "$BASE_RECIPE" ]; then
    say "$DEFAULT_BASE is present (reused)"
    return 0
  fi
  [ "$(id -u)" -eq 0 ] || { echo "debootstrap needs root" >&2; return 1; }
  if ! command -v debootstrap >/dev/null; then
    say "installing Debian's debootstrap"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive \
      apt-get install -y -qq --no-install-recommends debootstrap >/dev/null
  fi
  local dir start
  start=$(date +%s)
  dir="$(mktemp -d /tmp/hloserve-base.XXXXXX)"
  trap 'rm -rf "$dir"' RETURN
  say "debootstrap bookworm ($BASE_PACKAGES) from $DEBIAN_MIRROR"
  debootstrap --variant=minbase --include="$BASE_PACKAGES" bookworm "$dir/rootfs" \
    "$DEBIAN_MIRROR" >"$dir/debootstrap.log" 2>&1 || {
    tail -20 "$dir/debootstrap.log" >&2
    return 1
  }
  rm -rf "$dir"/rootfs/var/lib/apt/lists/* "$dir"/rootfs/var/cache/apt/archives/*.deb
  tar -C "$dir/rootfs" --numeric-owner -c . | docker import \
    --change "LABEL hloserve.base=\"$BASE_RECIPE\"" \
    --change 'ENV LANG=C.UTF-8 PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change 'CMD ["/bin/bash"]' - "$DEFAULT_BASE" >/dev/null
  report "$DEFAULT_BASE" "$start"
}

# The host's pip settings as a pip.conf for the build stage (index URLs reachable over the
# network, the certificate authority file copied beside it); file:// indexes and find-links
# on this host are left out: the build cannot see them.
pip_value() {
  local env_name
  env_name="PIP_$(echo "$1" | tr 'a-z-' 'A-Z_')"
  if [ -n "${!env_name:-}" ]; then
    echo "${!env_name}"
  else
    $PIP config get "global.$1" 2>/dev/null || true
  fi
}

stage_pip_config() {
  local out="$ROOT/containers/pip" conf cert index extra urls=() url
  conf="$out/pip.conf.new"
  echo "[global]" >"$conf"
  index="$(pip_value index-url)"
  case "$index" in http*) echo "index-url = $index" >>"$conf" ;; esac
  extra="$(pip_value extra-index-url)"
  for url in $extra; do
    case "$url" in http*) urls+=("$url") ;; esac
  done
  [ ${#urls[@]} -eq 0 ] || echo "extra-index-url = ${urls[*]}" >>"$conf"
  local trusted
  trusted="$(pip_value trusted-host)"
  [ -z "$trusted" ] || echo "trusted-host = $trusted" >>"$conf"
  cert="$(pip_value cert)"
  cert="${cert:-${REQUESTS_CA_BUNDLE:-}}"
  if [ -n "$cert" ] && [ -f "$cert" ]; then
    cp "$cert" "$out/ca.pem.new"
    echo "cert = /etc/hloserve-pip/ca.pem" >>"$conf"
  else
    : >"$out/ca.pem.new"
  fi
  echo "timeout = $(pip_value default-timeout | grep . || echo 60)" >>"$conf"
  # unchanged content keeps the build stage's layer cache
  for f in pip.conf ca.pem; do
    if cmp -s "$out/$f.new" "$out/$f"; then rm "$out/$f.new"; else mv "$out/$f.new" "$out/$f"; fi
  done
}

report() {
  local size
  size="$(docker image inspect -f '{{ .Size }}' "$1")"
  echo "image $1: $((size / 1000000)) MB, built in $(($(date +%s) - $2)) s"
}

build_image() {
  local dockerfile="$1" name="$2" start
  start=$(date +%s)
  say "docker build -f containers/$dockerfile -t $name:$TAG -t $name:latest (base $BASE_IMAGE)"
  DOCKER_BUILDKIT=0 docker build --network=host --build-arg "BASE_IMAGE=$BASE_IMAGE" \
    -f "containers/$dockerfile" -t "$name:$TAG" -t "$name:latest" . \
    >>"${HLOSERVE_IMAGES_LOG:-/dev/stdout}"
  report "$name:$TAG" "$start"
}

# target -> "Dockerfile image-name"
image_of() {
  case "$1" in
    cpu) echo "worker-cpu.Dockerfile hloserve-worker-cpu" ;;
    gateway) echo "gateway.Dockerfile hloserve-gateway" ;;
    gpu) echo "worker-gpu.Dockerfile hloserve-worker-gpu" ;;
    *) return 1 ;;
  esac
}

[ $# -gt 0 ] || { sed -n '2,5p' "$0"; exit 2; }
if [ "$1" = tags ]; then
  shift
  for target in "$@"; do
    read -r _ name < <(image_of "$target") || { echo "unknown image '$target'" >&2; exit 2; }
    echo "$name:$TAG $name:latest"
  done
  exit 0
fi
for target in "$@"; do
  case "$target" in
    base) build_base ;;
    cpu | gateway | gpu)
      [ "$BASE_IMAGE" != "$DEFAULT_BASE" ] || build_base
      stage_pip_config
      read -r dockerfile name < <(image_of "$target")
      build_image "$dockerfile" "$name"
      ;;
    *) echo "unknown image '$target' (base, cpu, gateway, gpu)" >&2; exit 2 ;;
  esac
done
