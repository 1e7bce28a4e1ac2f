# HAProxy, the gateway's data plane (docs/gateway.md): Debian bookworm's `haproxy` (2.6.12).
#   source scripts/haproxy.sh && ensure_haproxy
ensure_haproxy() {
  if command -v haproxy >/dev/null 2>&1 || [ -x /usr/sbin/haproxy ]; then
    return 0
  fi
  echo "==> installing haproxy (the gateway's data plane)"
  if [ "$(id -u)" -eq 0 ]; then
    apt-get update -qq && apt-get install -y -qq haproxy >/dev/null
  else
    sudo apt-get update -qq && sudo apt-get install -y -qq haproxy >/dev/null
  fi
}
