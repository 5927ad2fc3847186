#!/usr/bin/env bash
# Installs the system programs the integration tests drive for real: PostgreSQL (store tests),
# Prometheus + promtool (dashboard queries and alert rules), amtool (the Compose stack's
# Alertmanager config), Chromium (the live page), and
# iproute2/util-linux (ip, unshare, setpriv: the Kubernetes pod run in a private namespace).
# Idempotent: does nothing when they are already there.
set -euo pipefail

missing=()
ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || missing+=(postgresql)
command -v prometheus >/dev/null 2>&1 && command -v promtool >/dev/null 2>&1 || missing+=(prometheus)
command -v amtool >/dev/null 2>&1 || missing+=(prometheus-alertmanager)
command -v chromium >/dev/null 2>&1 || missing+=(chromium)
# tests/deploy/test_pod.py runs the rendered pod in its own network/mount namespace.
command -v ip >/dev/null 2>&1 || missing+=(iproute2)
command -v unshare >/dev/null 2>&1 && command -v setpriv >/dev/null 2>&1 || missing+=(util-linux)

if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
  echo "sysdeps: missing ${missing[*]}; run as root or: sudo apt-get install -y ${missing[*]}" >&2
  exit 1
fi
echo "sysdeps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
# Debian starts services on install; tests run their own instances on free ports.
service postgresql stop >/dev/null 2>&1 || true
service prometheus stop >/dev/null 2>&1 || true
service prometheus-alertmanager stop >/dev/null 2>&1 || true
pkill -x prometheus >/dev/null 2>&1 || true
