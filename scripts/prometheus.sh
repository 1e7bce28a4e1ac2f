# Sourced by scripts/test.sh: make Debian's Prometheus binary available for the observability
# test (tests/observability/test_prometheus.py starts its own instance on a free port).
#   ensure_prometheus   returns 0 when `prometheus --version` works, installing Debian's
#                       prometheus package first when root (no service is started).
ensure_prometheus() {
  if command -v prometheus >/dev/null 2>&1; then
    return 0
  fi
  if [ "$(id -u)" -ne 0 ]; then
    echo "==> prometheus: not installed and not root: install Debian's prometheus package"
    return 1
  fi
  echo "==> prometheus: installing Debian's prometheus"
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive \
    apt-get install -y -qq --no-install-recommends prometheus >/dev/null
  command -v prometheus >/dev/null 2>&1
}
