# Sourced by scripts/test.sh: make a Docker daemon answer for the docker tests (marker `docker`).
#   ensure_docker   returns 0 when `docker info` works, starting one first if it can:
#     - a daemon already answering is used as is;
#     - as root: Debian's docker.io is installed if dockerd is missing, then
#       `dockerd --bridge=none --iptables=false --ip6tables=false` runs in the background
#       (containers use host networking; no bridge or iptables is needed), logging to
#       $HLOSERVE_DOCKERD_LOG. It keeps running after the tests so its image cache survives.
#   As root it also installs Debian's docker-compose (1.29) when missing: tests/containers runs
#   containers/compose.yaml with it. The images themselves are built by the tests, once per
#   session (scripts/images.sh; tests/node/docker_image.py).
#   Without a daemon the docker tests skip with the reason, unless HLOSERVE_REQUIRE_DOCKER=1.
HLOSERVE_DOCKERD_LOG="${HLOSERVE_DOCKERD_LOG:-/tmp/hloserve-dockerd.log}"

ensure_compose() {
  if ! command -v docker-compose >/dev/null 2>&1 && [ "$(id -u)" -eq 0 ]; then
    echo "==> docker: installing Debian's docker-compose"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive \
      apt-get install -y -qq --no-install-recommends docker-compose >/dev/null
  fi
}

ensure_docker() {
  if docker info >/dev/null 2>&1; then
    ensure_compose
    return 0
  fi
  if [ "$(id -u)" -ne 0 ]; then
    echo "==> docker: no daemon answers and not root: the docker tests will be skipped"
    return 1
  fi
  if ! command -v dockerd >/dev/null 2>&1; then
    echo "==> docker: installing Debian's docker.io"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive \
      apt-get install -y -qq --no-install-recommends docker.io >/dev/null
  fi
  echo "==> docker: starting dockerd (log: $HLOSERVE_DOCKERD_LOG)"
  nohup dockerd --bridge=none --iptables=false --ip6tables=false \
    >"$HLOSERVE_DOCKERD_LOG" 2>&1 </dev/null &
  local i
  for i in $(seq 1 60); do
    if docker info >/dev/null 2>&1; then
      ensure_compose
      return 0
    fi
    sleep 0.5
  done
  echo "==> docker: dockerd did not answer within 30 s; last log lines:"
  tail -20 "$HLOSERVE_DOCKERD_LOG" || true
  return 1
}
