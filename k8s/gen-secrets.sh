#!/usr/bin/env bash
# Create k8s/base/secrets/nats-users.env with a random password per NATS user
# (kept out of git). Run once before `kubectl apply -k k8s/base`; re-running keeps
# existing passwords unless --rotate is given.
set -euo pipefail
dir="$(cd "$(dirname "$0")" && pwd)/base/secrets"
file="$dir/nats-users.env"
mkdir -p "$dir"
if [ -f "$file" ] && [ "${1:-}" != "--rotate" ]; then
  echo "keeping $file (use --rotate for new passwords)"; exit 0
fi
umask 077
{
  for user in DETECTOR SOLVER DEVICEPLUGIN KMOD_BRIDGE EVENTS_READER; do
    printf '%s_PASSWORD=%s\n' "$user" "$(head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n')"
  done
} > "$file"
echo "wrote $file"
