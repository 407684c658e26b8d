#!/bin/sh
# The prepared real-GPU check (issue 19), for a machine with an NVIDIA card, its driver,
# root and runc (no Kubernetes):
#
#   tests/gpu/run.sh [OUT.json] [GPU_INDEX]      (defaults: ./gpu-check.json, 0)
#
# Runs tests/gpu/check.py: runc containers through gpushare-runtime on one card (the card
# through a signed container-devices-ids, a second container through a signed
# container-devices-from of the first), GPU work in each, MPS caps (a share allocating past
# its cap is refused while another runs), strace of a CUDA process (ioctl type 0x46 on
# /dev/nvidiactl and /dev/nvidia<N>), a killed share's GPU memory freed, the DRA path (claims
# prepared by the DRA driver's code as CDI specs, its MPS control daemon, the caps held; see
# tests/gpu/dra_check.py), and a tiny CUDA program when nvcc exists.  Writes one JSON of results; exit status 0 when every step
# passed or was skipped.  Where there is no GPU it writes the JSON with "skipped" and
# prints one line saying why, exit status 0.  Bounded to under 5 minutes.
set -u
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
out=${1:-$PWD/gpu-check.json}
index=${2:-0}
skip() {
  printf '{"version": 1, "skipped": "%s", "ok": null, "gpu": null, "steps": {}}\n' "$1" > "$out"
  echo "gpu check skipped: $1"
  exit 0
}
command -v nvidia-smi >/dev/null 2>&1 || skip "nvidia-smi not found: no NVIDIA driver on this machine"
nvidia-smi -L 2>/dev/null | grep -q "^GPU $index:" || skip "nvidia-smi lists no GPU $index"
[ "$(id -u)" = 0 ] || skip "needs root (runc containers and device nodes)"
command -v runc >/dev/null 2>&1 || skip "runc not found"
python=$repo/.venv/bin/python
[ -x "$python" ] || python=$(command -v python3) || skip "no python3 (run make deps first)"
exec timeout 290 "$python" "$here/check.py" "$out" "$index"
