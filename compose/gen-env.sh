#!/usr/bin/env bash
# Write compose/.env from compose/.env.example with a random password per NATS user.
# Keeps an existing .env unless --rotate is given.
set -euo pipefail
dir="$(cd "$(dirname "$0")" && pwd)"
file="$dir/.env"
if [ -f "$file" ] && [ "${1:-}" != "--rotate" ]; then
  echo "keeping $file (use --rotate for new passwords)"; exit 0
fi
umask 077
while IFS= read -r line; do
  case "$line" in
    # "p" first: nats-server reads $VAR values as config tokens, and hex of digits only (or
    # digits then "e" or "eb", a size) would be a number, not a password
    *_PASSWORD=*) printf '%s=p%s\n' "${line%%=*}" "$(head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n')" ;;
    *) printf '%s\n' "$line" ;;
  esac
done < "$dir/.env.example" > "$file.new"
mv "$file.new" "$file"
echo "wrote $file"
