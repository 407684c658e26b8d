#!/usr/bin/env bash
# Create k8s/base/secrets/ (kept out of git) with the NATS secrets: nats-users.env, a random
# password for each of the two static NATS users (the auth callout's `auth`, the `installer`)
# and for the routes between the servers; nats-auth-issuer, the auth callout's issuer secret
# (random text; its account key is derived from it). Run once before `kubectl apply -k k8s/base`;
# re-running keeps what exists and adds what is missing, unless --rotate is given.
# (The same keys make the Secrets of nats.auth.existingSecret and existingIssuerSecret for the chart.)
set -euo pipefail
dir="$(cd "$(dirname "$0")" && pwd)/base/secrets"
file="$dir/nats-users.env"
issuer="$dir/nats-auth-issuer"
mkdir -p "$dir"
umask 077
random() { head -c "$1" /dev/urandom | od -An -tx1 | tr -d ' \n'; }
if [ "${1:-}" = "--rotate" ]; then rm -f "$file" "$issuer"; fi
touch "$file"
added=0
for user in AUTH INSTALLER ROUTE; do
  if ! grep -q "^${user}_PASSWORD=" "$file"; then
    # "p" first: nats-server reads $VAR values as config tokens, and hex of digits only (or
    # digits then "e" or "eb", a size) would be a number, not a password
    printf '%s_PASSWORD=p%s\n' "$user" "$(random 24)" >> "$file"
    added=$((added + 1))
  fi
done
if [ ! -s "$issuer" ]; then
  random 32 > "$issuer"
  added=$((added + 1))
fi
echo "$dir: $added new secret(s)"
