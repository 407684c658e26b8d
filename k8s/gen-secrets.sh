#!/usr/bin/env bash
# Create k8s/base/secrets/nats-users.env with a random password per NATS user and for the routes
# between the NATS servers (kept out of git). Run once before `kubectl apply -k k8s/base`;
# re-running keeps existing passwords and adds any that are missing, unless --rotate is given.
# (The same keys make the Secret of nats.auth.existingSecret for the Helm chart.)
set -euo pipefail
dir="$(cd "$(dirname "$0")" && pwd)/base/secrets"
file="$dir/nats-users.env"
mkdir -p "$dir"
umask 077
if [ "${1:-}" = "--rotate" ]; then rm -f "$file"; fi
touch "$file"
added=0
for user in DETECTOR SOLVER DEVICEPLUGIN KMOD_BRIDGE EVENTS_READER ROUTE; do
  if ! grep -q "^${user}_PASSWORD=" "$file"; then
    printf '%s_PASSWORD=%s\n' "$user" "$(head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n')" >> "$file"
    added=$((added + 1))
  fi
done
echo "$file: $added new password(s)"
